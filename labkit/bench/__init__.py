"""Benchmarks: prefill at several prompt lengths, decode, and a re-run after a switch, for the GPU
path, the float64 numpy reference and llama.cpp, measured in one process.

Every figure is the median of `repeats` runs after a warm-up, and is reported as a ratio against
the reference measured in the same run (speed on this machine depends on what else runs; ratios
taken together are what compare). Per op family, GPU time over a prefill comes from timestamp
queries; over one decode step, from each family's dispatches submitted alone and waited for
(lavapipe's timestamps misplace small dispatches); with the matmuls' GFLOP/s and GB/s (GGUF bytes
read). `labkit bench` prints the table; `--json` the data.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from labkit import progress as bars
from labkit.errors import LabkitError, TokenizerError
from labkit.lab import Lab
from labkit.lab import open as open_lab

GOLDEN_DIR = resources.files("labkit") / "data" / "golden"  # package data
TEXT = (
    " The sky is blue because air scatters the short wavelengths of sunlight more than the long ones,"
    " so blue light reaches the eye from every direction while red light travels straight on."
)


def peak_rss_mb() -> float:
    """This process's peak resident set. VmHWM, not getrusage: ru_maxrss survives exec, so a
    child of a big process (pytest) would report its parent's peak."""
    from labkit.model.memory import proc_kib

    kib = proc_kib("/proc/self/status", "VmHWM")
    return kib / 1024.0 if kib is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_model(cpuinfo: str | None = None) -> str:
    """The host CPU, as every figure names it: lavapipe's speed moves 2-3x with it. A VM often hides
    the part number ("AMD EPYC"), so the family and model, the clock, the core count and whether
    AVX-512 is there (llvmpipe then has 32 vector registers, not 16) come with the name.
    `cpuinfo`: the text of /proc/cpuinfo (read when None)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            import platform

            return platform.processor() or "unknown CPU"
    first: dict[str, str] = {}
    cores = 0
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        cores += key == "processor"
        first.setdefault(key, value.strip())
    if "model name" not in first:
        return "unknown CPU"
    simd = "AVX-512" if "avx512f" in first.get("flags", "").split() else "no AVX-512"
    mhz = f"{float(first['cpu MHz']):.0f} MHz, " if first.get("cpu MHz") else ""
    return (f"{first['model name']} (family {first.get('cpu family', '?')} model {first.get('model', '?')}, "
            f"{mhz}{cores} cores, {simd})")  # fmt: skip


@dataclass
class LengthFigures:
    """One engine at one prompt length: median seconds (None: not measured, with the reason in `note`)."""

    length: int
    logits_all_s: float | None = None  # logits at every position
    all_stages_s: float | None = None  # every stage captured
    last_only_s: float | None = None  # output_norm and the last position's logits
    note: str = ""


@dataclass
class EngineFigures:
    engine: str
    load_s: float
    lengths: list[LengthFigures]
    decode_tok_s: float | None = None
    rerun_after_switch_s: float | None = None
    peak_rss_mb: float | None = None


@dataclass
class OpFamilyTime:
    """GPU time of one kernel family over a pass (timestamps), or one decode step (wall time alone)."""

    family: str
    ms: float
    dispatches: int  # the family's stages
    gflops: float | None = None  # matmuls: 2·T·K·N per ms
    gbps: float | None = None  # matmuls: GGUF weight bytes per ms


@dataclass
class BenchReport:
    model: str
    adapter: str
    repeats: int
    engines: dict[str, EngineFigures]
    op_families: list[OpFamilyTime] = field(default_factory=list)
    op_families_at: int = 0
    decode_op_families: list[OpFamilyTime] = field(default_factory=list)  # one decode step after op_families_at
    cpu: str = ""  # the host CPU's model name
    file_mb: float | None = None  # the GGUF file's size
    variants: dict[str, str] = field(default_factory=dict)  # the GPU engine's selected kernels

    def ratios(self) -> dict[str, float]:
        """Time ratios against the reference (< 1: faster than it), and what capturing costs."""
        out: dict[str, float] = {}
        ref, gpu = self.engines.get("reference"), self.engines.get("gpu")
        for name, eng in self.engines.items():
            if name == "reference" or ref is None:
                continue
            for mine, theirs in zip(eng.lengths, ref.lengths):
                if mine.logits_all_s and theirs.logits_all_s:
                    out[f"{name}/reference prefill T={mine.length}"] = mine.logits_all_s / theirs.logits_all_s
            if eng.decode_tok_s and ref.decode_tok_s:
                out[f"{name}/reference decode rate"] = eng.decode_tok_s / ref.decode_tok_s
        for f in gpu.lengths if gpu else []:
            if f.all_stages_s and f.logits_all_s:
                out[f"gpu all stages / logits only T={f.length}"] = f.all_stages_s / f.logits_all_s
        return out

    def to_dict(self) -> dict:
        return dict(asdict(self), ratios=self.ratios())

    @classmethod
    def from_dict(cls, data: dict) -> BenchReport:
        """The inverse of to_dict (`labkit bench --json` output); the ratios are derived again."""
        engines = {
            k: EngineFigures(**{**v, "lengths": [LengthFigures(**f) for f in v["lengths"]]})
            for k, v in data["engines"].items()
        }
        ops = [OpFamilyTime(**o) for o in data.get("op_families", [])]
        dec = [OpFamilyTime(**o) for o in data.get("decode_op_families", [])]
        rest = {k: v for k, v in data.items() if k not in ("engines", "op_families", "decode_op_families", "ratios")}
        return cls(**rest, engines=engines, op_families=ops, decode_op_families=dec)

    def table(self) -> str:
        from labkit.bench.table import render

        return render(self)


def median_time(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def prompt_of(lab: Lab, length: int) -> list[int]:
    """`length` token ids of real text (BOS first), the text repeated as needed; token ids in
    turn for a vocabulary that cannot spell it (the tiny test models)."""
    try:
        ids = lab.tokenize(TEXT * 8)
    except TokenizerError:
        ids = [1 + i % (lab.config.vocab_size - 1) for i in range(length)]
    while len(ids) < length:
        ids += ids[1:]
    return ids[:length]


class Steps:
    """`say(what)` at the start of each measurement: a bar over the measurements (labkit.progress),
    the current one as its postfix; `bench: what` lines on stderr instead when bars are off
    (LABKIT_PROGRESS=0, or the CLI's stderr is a pipe or a file); nothing when quiet (--json)."""

    def __init__(self, total: int, quiet: bool = False):
        self.started = False
        self.bar = bars.bar(0 if quiet else total, "bench", "step")
        self.lines = not quiet and not bars.enabled()

    def __call__(self, msg: str) -> None:
        if self.lines:
            print(f"bench: {msg}", file=sys.stderr, flush=True)
        self.bar.set_postfix_str(msg, refresh=not self.started)
        if self.started:
            self.bar.update(1)  # the previous measurement is done (this redraws, at most every 0.1 s)
        self.started = True

    def close(self) -> None:
        if self.started:
            self.bar.update(1)
        self.bar.close()


def n_steps(engines: tuple[str, ...], lengths: tuple[int, ...]) -> int:
    """How many times run_bench says what it measures (at most: a length the reference cannot
    run skips its every-stage figure)."""
    per = {"gpu": 3 * len(lengths) + 5, "reference": 2 * len(lengths) + 2, "llamacpp": len(lengths) + 1}
    return sum(per.get(e, 0) for e in engines)


def progress(quiet: bool, total: int = 0) -> Steps:
    return Steps(total, quiet)


def measure(fn: Callable[[], object], repeats: int, what: str, say) -> tuple[float | None, str]:
    """(median seconds, "") or (None, why) when the engine cannot run it (a typed labkit error)."""
    say(what)
    try:
        return median_time(fn, repeats), ""
    except LabkitError as e:
        return None, f"{type(e).__name__}: {str(e).split('.')[0]}"


def run_bench(
    model: str = "gemma3-270m",
    lengths: tuple[int, ...] = (8, 128),
    repeats: int = 3,
    decode_tokens: int = 32,
    quiet: bool = False,
    engines: tuple[str, ...] = ("gpu", "reference", "llamacpp"),
    memory: str | None = None,
    variants: dict[str, str] | None = None,
) -> BenchReport:
    """GPU first (its peak RSS is then the GPU path's alone), then the reference, then llama.cpp.
    `model` is a registered name or a .gguf path; `memory` the labs' budget (labkit.open);
    `variants` the GPU engine's kernel selection ({family: variant}, as lab.use)."""
    from labkit.bench.engines import bench_gpu, bench_llamacpp, bench_reference, op_family_times

    say = progress(quiet, n_steps(engines, lengths))
    out: dict[str, EngineFigures] = {}
    lab = open_lab(model, memory=memory, variants=variants)
    try:
        with bars.quiet():  # one bar: the measured generates and passes show none of their own
            if "gpu" in engines:
                out["gpu"] = bench_gpu(lab, lengths, repeats, decode_tokens, say)
                ops_at = max((n for n in lengths if n <= 512), default=min(lengths))
                say(f"gpu time per op family, T={ops_at}")
                ops = op_family_times(lab, prompt_of(lab, ops_at))
                say(f"gpu time per op family, a decode step after {ops_at} tokens")
                dec_ops = op_family_times(lab, prompt_of(lab, ops_at), decode=True)
            else:
                ops, dec_ops, ops_at = [], [], 0
            if "reference" in engines:
                out["reference"] = bench_reference(model, lengths, repeats, decode_tokens, say, memory)
            if "llamacpp" in engines:
                lc = bench_llamacpp(lab, lengths, repeats, decode_tokens, say)
                if lc is not None:
                    out["llamacpp"] = lc
    finally:
        say.close()
    from labkit.gpu.device import get_device

    file_mb = lab.path.stat().st_size / 2**20
    return BenchReport(lab.name, get_device().name, repeats, out, ops, ops_at, dec_ops, cpu_model(), file_mb,
                       dict(variants or {}))  # fmt: skip


def save(report: BenchReport, path: Path) -> None:
    path.write_text(json.dumps(report.to_dict(), indent=1))
