"""The bench's figures as dataclasses: per engine and prompt length, per op family, and the report
with its ratios (`labkit bench --json` is `BenchReport.to_dict`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


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
    host_ms_per_step: float | None = None  # GPU decode: a warm step's host time, start to submit (median)
    dispatches_per_step: float | None = None  # GPU decode: dispatches a warm step records (median)
    recorded_ahead: float | None = None  # GPU decode: share of warm steps recorded while the step before ran
    detail: str = ""  # what the engine ran on, where it says (llama.cpp's Vulkan peer: device, revision)


@dataclass
class OpFamilyTime:
    """GPU time of one kernel family over a pass (timestamps), or one decode step (wall time alone)."""

    family: str
    ms: float
    dispatches: int  # the family's stages
    gflops: float | None = None  # matmuls: 2·T·K·N per ms
    gbps: float | None = None  # matmuls: GGUF weight bytes per ms


@dataclass
class BatchFigures:
    """`labkit bench --batch N`: a decode step of N sequences against one sequence's, in one run."""

    n: int
    step_s: float  # a batched step of n sequences (the median step, compiled)
    one_step_s: float  # one sequence's step through `generate` (its decode time over its tokens, a compile included)
    batch1_step_s: float  # one sequence's step through the same path and measure (the median step, compiled)
    dispatches: float = 0.0  # dispatches of a batched step

    @property
    def ratio(self) -> float:
        """A batched step's time over one sequence's, both the median compiled step of the same loop (the
        issue's target: at most 1.6 for 4)."""
        return self.step_s / self.batch1_step_s


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
    batch: BatchFigures | None = None  # --batch N

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
        if self.batch is not None:
            out[f"gpu batch of {self.batch.n} step / one sequence's step"] = self.batch.ratio
        return out | self.peer_ratios()

    def peer_ratios(self) -> dict[str, float]:
        """The GPU engine against llama.cpp's backends: decode rate ratios (> 1: labkit is faster) and
        prefill time ratios at the figure both measured (< 1: labkit is faster)."""
        out: dict[str, float] = {}
        gpu = self.engines.get("gpu")
        for peer in ("llamacpp", "llamacpp-vulkan"):
            eng = self.engines.get(peer)
            if gpu is None or eng is None:
                continue
            if gpu.decode_tok_s and eng.decode_tok_s:
                out[f"gpu/{peer} decode rate"] = gpu.decode_tok_s / eng.decode_tok_s
            theirs_at = {f.length: f for f in eng.lengths}
            for mine in gpu.lengths:
                theirs = theirs_at.get(mine.length)
                for kind in ("logits_all_s", "last_only_s") if theirs else ():
                    a, b = getattr(mine, kind), getattr(theirs, kind)
                    if a and b:
                        out[f"gpu/{peer} prefill T={mine.length} ({kind[:-2].replace('_', ' ')})"] = a / b
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
        skip = ("engines", "op_families", "decode_op_families", "ratios", "batch")
        rest = {k: v for k, v in data.items() if k not in skip}
        batch = BatchFigures(**data["batch"]) if data.get("batch") else None
        return cls(**rest, engines=engines, op_families=ops, decode_op_families=dec, batch=batch)

    def table(self) -> str:
        from labkit.bench.table import render

        return render(self)
