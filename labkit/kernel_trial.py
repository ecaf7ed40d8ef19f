"""A WGSL kernel of your own, tried on the real model: registered under its op's interface, run in
place of the shipped kernel, compared with the float64 reference, its faulty stages named by
attribution, and timed against shipped kernels by the GPU's own timestamps.

What a kernel-writing lesson needs in one call each; an engine developer porting a kernel gets the
same check. The lab's variant selection is left as it was found."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from labkit.attribution import attribute
from labkit.compare import compare
from labkit.errors import InvalidArgumentError
from labkit.gpu.shader import register_variant
from labkit.ops.registry import check_key


@dataclass(frozen=True)
class KernelTrial:
    """One run of the model with a kernel swapped in, against the reference."""

    family: str
    variant: str
    first_divergence: str | None  # the first stage whose output leaves its precision's band
    guilty: list[str]  # the stages whose own error (inputs taken from the run) leaves it: the kernel's
    headline: str

    @property
    def correct(self) -> bool:
        return self.first_divergence is None and not self.guilty

    def text(self) -> str:
        if self.correct:
            return f"{self.family}/{self.variant}: {self.headline}"
        named = ", ".join(self.guilty[:4]) + (" …" if len(self.guilty) > 4 else "") if self.guilty else "none"
        return (
            f"{self.family}/{self.variant}: departs at {self.first_divergence}; "
            f"stages whose own error is out of band: {named}"
        )


def try_kernel(lab: Any, prompt: Any, family: str, wgsl: str, name: str = "mine", reference: Any = None) -> KernelTrial:
    """Register `wgsl` as `family/name` (checked and compiled: a ShaderCompileError names the WGSL
    line), run `prompt` with it in every layer, and judge it against the reference run (computed
    when not given) and by attribution, which names the stages the kernel itself got wrong."""
    register_variant(family, name, wgsl, doc="a kernel tried with labkit.kernel_trial")
    ref = reference if reference is not None else lab.reference(prompt)
    with _using(lab, family, name):
        run = lab.run(prompt)
    cmp = compare(run, ref)
    guilty = [] if cmp.first_divergence is None else attribute(run, lab, reference=ref).guilty
    return KernelTrial(family, name, cmp.first_divergence, guilty, cmp.headline())


@dataclass(frozen=True)
class KernelTimes:
    """GPU time of the stages a family's kernels compute, per variant, over alternating repeats."""

    model: str
    family: str
    kinds: tuple[str, ...]  # the stage kinds summed (a fused attention kernel skips scores and probs)
    ms: dict[str, list[float]] = field(default_factory=dict)  # variant -> each repeat's sum over layers

    def median(self, variant: str) -> float:
        return statistics.median(self.ms[variant])

    def ratio(self, variant: str, to: str) -> float:
        """How many times `to`'s time `variant` takes (above 1: slower)."""
        return self.median(variant) / self.median(to)


def time_kernels(lab: Any, prompt: Any, family: str, variants: list[str], kinds: tuple[str, ...],
                 repeats: int = 3) -> KernelTimes:  # fmt: skip
    """Each variant's GPU milliseconds for the stages of `kinds`, summed over the layers. Variants
    alternate within each repeat, so a run always recomputes from the first stage a switch changes
    and a slow moment of the machine falls on every variant alike."""
    times = KernelTimes(lab.name, family, tuple(kinds), {v: [] for v in variants})
    for _ in range(repeats):
        for v in variants:
            with _using(lab, family, v):
                stage_ms = lab.run(prompt, names=[]).timings.get("stage_ms", {})
            timed = [ms for stage, ms in stage_ms.items() if stage.rsplit(".", 1)[-1] in kinds]
            if not timed:
                why = "check the kinds" if stage_ms else "this adapter has no timestamp queries"
                raise InvalidArgumentError(f"no stage of {', '.join(kinds)} was timed ({why})")
            times.ms[v].append(sum(timed))
    return times


class _using:  # noqa: N801 (a context manager read as a phrase: `with _using(lab, ...)`)
    """`with _using(lab, family, variant):` the variant in every layer, the selection restored after."""

    def __init__(self, lab: Any, family: str, variant: str) -> None:
        self.lab, self.family, self.variant = lab, family, variant

    def __enter__(self) -> None:
        self.before = self.lab.selected.get(check_key(self.family, self.variant), "default")
        self.lab.use(self.family, self.variant)

    def __exit__(self, *exc: Any) -> None:
        self.lab.use(self.family, self.before)
