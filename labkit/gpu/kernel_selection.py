"""Which kernel runs each stage: a pure function of the graph, the selected variants, the adapter
kind and the weight layout, worked out once per selection and not every decode step.

`select_kernels` returns a `SelectedKernels`: each stage's kernel and why (what `lab.kernels()`
lists), the stages no kernel reads (a fused attention tier reads q, not the probabilities), and
each stage's signature (what its output depends on besides the data), which the plan cache and
reruns after `lab.use` compare to find the first stage a switch changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from labkit.model.graph import Stage
from labkit.ops import OPS
from labkit.ops.base import Kernel, Policy
from labkit.ops.registry import adapter_kind, get_kernel, get_policy, selected


@dataclass(frozen=True)
class KernelChoice:
    """Which kernel runs a stage, and why (`lab.kernels()` lists these)."""

    family: str
    kernel: Kernel
    why: str


class SelectionKey(NamedTuple):
    """Everything a selection depends on besides the graph and the file."""

    variants: tuple  # sorted (key, name) pairs of `lab.use`
    adapter_type: str  # "CPU", "DiscreteGPU", ...
    # "repacked": the default layouts; "blocks": each format's blocks layout where it has one (near
    # its GGUF width), else GGUF bytes; "gguf": the raw-bytes kernels
    weight_layout: str
    registry: int  # the registry's generation (user variants registered)


class SelectedKernels(NamedTuple):
    """Every stage's kernel under one selection (`SelectionKey`), worked out once for the graph."""

    choices: dict[str, KernelChoice]  # stage name -> its kernel and why
    kernels: dict[str, Kernel]
    skipped: set[str]  # stages no later stage reads under these kernels
    signatures: list[tuple]  # per stage, in graph order


def choose(st: Stage, family: str, variants: dict[str, str], adapter_type: str, weight_layout: str) -> KernelChoice:
    """The kernel of one stage: the selected variant, or the default for the adapter and, where the
    op's default depends on it (the matmuls' table, labkit.ops.matmul.table), the weight layout."""
    adapter = adapter_kind(adapter_type)
    name = selected(variants, family, st.layer)
    if name != "default":
        key = f"blk.{st.layer}.{family}"
        return KernelChoice(
            family, get_kernel(family, name, adapter), f"selected ({key if key in variants else family})"
        )
    rule = OPS[st.op].default_variant if st.op in OPS else None
    by_stage = OPS[st.op].stage_default(st) if st.op in OPS and OPS[st.op].stage_default else None
    why = ""
    if by_stage is not None:
        name, why = by_stage
    elif rule is not None:
        name, why = rule(family, adapter, weight_layout)
    kernel = get_kernel(family, name, adapter)
    if not why:
        why = f"default on a {adapter_type} adapter ({adapter})" if kernel.prefer else "default"
    return KernelChoice(family, kernel, why)


def stage_policy(st: Stage, family: str, variants: dict[str, str]) -> Policy:
    return get_policy(family, selected(variants, family, st.layer))


def select_kernels(
    graph: list[Stage], tensor_type: Callable[[str], int], variants: dict[str, str], key: SelectionKey
) -> SelectedKernels:
    """Every stage's kernel, the stages left unread, and the signatures, under `key`."""
    choices = {
        st.name: choose(st, OPS[st.op].family_of(st, tensor_type), variants, key.adapter_type, key.weight_layout)
        for st in graph
    }
    kernels = {name: c.kernel for name, c in choices.items()}
    skipped = unread_stages(graph, kernels)
    signatures = [
        (kernels[st.name].family, kernels[st.name].name, st.name in skipped)
        + tuple(stage_policy(st, f, variants).name for f in OPS[st.op].policy_families(st))
        for st in graph
    ]
    return SelectedKernels(choices, kernels, skipped, signatures)


def unread_stages(graph: list[Stage], kernels: dict[str, Kernel]) -> set[str]:
    """Stages no later stage reads under these kernels (a fused tier reads q, not the probabilities).
    Derived from the graph backwards; cache writers, the stages that advance or capture a recurrent
    state (the next pass reads it), and the last stage are always needed."""
    needed = {graph[-1].name}
    for st in reversed(graph):
        if st.name in needed or st.kv_write or st.state:
            needed.add(st.name)
            needed.update(reads(st, kernels[st.name]))
    return {st.name for st in graph} - needed


def reads(st: Stage, kernel: Kernel) -> tuple[str, ...]:
    """The stage inputs a kernel reads (a fused attention tier reads q, not the probabilities)."""
    return st.inputs if kernel.reads is None else tuple(st.inputs[i] for i in kernel.reads)
