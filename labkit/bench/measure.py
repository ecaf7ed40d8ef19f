"""What every bench figure is measured with: the host's name and peak RSS, medians after a warm-up,
prompts of a given length, the progress steps."""

from __future__ import annotations

import resource
import statistics
import sys
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from labkit import progress as bars
from labkit.errors import LabkitError, TokenizerError
from labkit.lab import Lab

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


def n_steps(engines: tuple[str, ...], lengths: tuple[int, ...], batch: bool = False) -> int:
    """How many times run_bench says what it measures (at most: a length the reference cannot
    run skips its every-stage figure)."""
    per = {"gpu": 3 * len(lengths) + 5 + int(batch), "reference": 2 * len(lengths) + 2, "llamacpp": len(lengths) + 1,
           "llamacpp-vulkan": 1}  # fmt: skip
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
