"""What an op is: the parts every op module declares once, and the two engines call.

An op module (labkit/ops/<op>.py, its WGSL beside it) holds, like an op of ratchet:
- `reference(stage, ref)`: the float64 numpy function;
- `params`: its kernels' uniform struct, declared once by field name and type, packed by
  name and checked against the WGSL `struct Params` when a kernel is loaded;
- `plan(stage, gpu)`: how the GPU executor dispatches it (buffers, values, workgroup count);
- `explain`: what it computes, the formula, and the shapes of its inputs and output;
- `kernels` and `policies`: its variants, correct, fast and faulty, declared beside it.
The KV-cache role (which stage writes the cache at n_past, which reads it) is a field of
the stage (labkit.model.graph.Stage), not of the op.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache, lru_cache
from importlib import resources
from typing import Any, Protocol

import numpy as np

from labkit.errors import KernelInterfaceError, UnknownVariantError
from labkit.ops.quant_tables import tables_wgsl


@dataclass(frozen=True)
class PassShape:
    """What a kernel may look at when choosing its source: tokens in this pass, cached before it."""

    T: int
    n_past: int


@cache
def wgsl_index() -> dict[str, str]:
    """Every kernel file under labkit/ops by its name: {stem: path inside labkit}. A file lives in its
    op's package (ops/rope/rope.wgsl), a fault in the op's faults/, what several ops share in ops/lib/;
    compose() names files by stem, so each stem is one file (two of one name are refused here)."""
    out: dict[str, str] = {}

    def walk(folder, rel: str) -> None:
        for entry in sorted(folder.iterdir(), key=lambda e: e.name):
            if entry.is_dir() and entry.name != "__pycache__":
                walk(entry, f"{rel}/{entry.name}")
            elif entry.name.endswith(".wgsl"):
                stem = entry.name[: -len(".wgsl")]
                if stem in out:
                    raise UnknownVariantError(
                        f"two kernel files named {entry.name}: {out[stem]} and {rel}/{entry.name}"
                    )
                out[stem] = f"{rel}/{entry.name}"

    walk(resources.files("labkit.ops"), "ops")
    return out


def wgsl_path(name: str) -> str:
    """Where kernel file `name` lives inside labkit (ops/rope/rope_scale.wgsl): what errors name."""
    if name == "quant_tables":
        return "ops/quant_tables.py (generated)"
    path = wgsl_index().get(name)
    if path is None:
        raise UnknownVariantError(f"no kernel file {name}.wgsl under labkit/ops")
    return path


@cache
def wgsl_file(name: str) -> str:
    """Text of kernel file `name` (kernels live beside the op that dispatches them: `wgsl_index`); read
    once per process, not once per dispatch. `quant_tables` is generated from gguf.quants
    (ops/quant_tables.py): the I-quant grids and FP4 values a block reader may index."""
    if name == "quant_tables":
        return tables_wgsl()
    return resources.files("labkit").joinpath(wgsl_path(name)).read_text()


# ----------------------------------------------------------------- uniform parameters
_STRUCT = re.compile(r"struct\s+Params\s*\{([^}]*)\}", re.DOTALL)
_FIELD = re.compile(r"(\w+)\s*:\s*(u32|i32|f32)")
_PACK = {"u32": "I", "i32": "i", "f32": "f"}


@lru_cache(maxsize=512)
def wgsl_params(source: str) -> tuple[tuple[str, str], ...]:
    """The (name, type) fields of `struct Params` in a WGSL source, in order; () if it has none."""
    comment = re.sub(r"//[^\n]*", "", source)
    m = _STRUCT.search(comment)
    return tuple(_FIELD.findall(m.group(1))) if m else ()


@dataclass(frozen=True)
class Params:
    """A kernel family's uniform struct, declared once: `Params(T="u32", base="f32", ...)`.

    Fields whose WGSL name starts with `_` are padding and are packed as zero."""

    fields: dict[str, str]

    def __init__(self, **fields: str):
        object.__setattr__(self, "fields", dict(fields))

    def check(self, source: str, label: str) -> None:
        """KernelInterfaceError naming the first field where the WGSL struct and this declaration differ."""
        got = {n: t for n, t in wgsl_params(source) if not n.startswith("_")}
        for name, typ in self.fields.items():
            if name not in got:
                raise KernelInterfaceError(f"{label}: struct Params lacks field {name!r} ({typ}); {self._want()}")
            if got[name] != typ:
                raise KernelInterfaceError(
                    f"{label}: struct Params field {name!r} is {got[name]}, should be {typ}; {self._want()}"
                )
        extra = [n for n in got if n not in self.fields]
        if extra:
            raise KernelInterfaceError(f"{label}: struct Params has unknown field {extra[0]!r}; {self._want()}")

    def pack(self, source: str, values: dict[str, Any]) -> bytes:
        """The uniform bytes for `source`'s struct layout, each field taken from `values` by name."""
        fmt, names, pad = _packing(source)
        data = struct.pack(fmt, *(0 if n is None else values[n] for n in names))
        return data + pad if data else b"\0" * 16

    def _want(self) -> str:
        return "expected fields: " + ", ".join(f"{n}: {t}" for n, t in self.fields.items())


# ----------------------------------------------------------------- variants
@dataclass(frozen=True)
class Kernel:
    """One WGSL implementation of a kernel family, with the family's interface.

    `source_for(shape)` may pick a different file per pass shape (prefill vs decode paths).
    `prefer` marks the correct kernel that "default" means on that adapter kind ("cpu"/"gpu")."""

    family: str
    name: str
    doc: str
    source_for: Callable[[PassShape], str] = field(repr=False)
    faulty: bool = False
    workgroups: Callable[[int, int, int], int] | None = field(default=None, repr=False)  # (T, heads, size)
    prefer: str | None = None
    reads: tuple[int, ...] | None = None  # the stage inputs it reads (None: all); unread producers are skipped
    repack: Callable[[], str] | None = field(default=None, repr=False)  # matmuls: WGSL that repacks W first
    # matmuls: the decode source fused with the next stage's op ("add", "glu"); None: never fused
    epilogue: Callable[[str], str] | None = field(default=None, repr=False)
    # matmuls: the source fused for a pass of 2 to `epilogue_tokens` tokens, (op, T) -> WGSL (a batch's decode step)
    few_epilogue: Callable[[str, int], str] | None = field(default=None, repr=False)
    epilogue_tokens: int = 1

    def source(self, shape: PassShape | None = None) -> str:
        """The WGSL for a pass of `shape`; by default a prompt's (16 tokens: a matmul's prefill
        driver, which prompts of up to 3 tokens do not run)."""
        return self.source_for(shape or PassShape(T=16, n_past=0))

    @property
    def fused(self) -> bool:
        """A kernel that reads only some of its stage's inputs does the work of the stages it skips
        (the fused attention tiers read q and the caches, not the probabilities)."""
        return self.reads is not None


@dataclass(frozen=True)
class Policy:
    """A host-side dispatch choice: which row windows get dispatched, how many workgroups."""

    family: str
    name: str
    doc: str
    faulty: bool = False
    window_filter: Callable[[int, int], bool] | None = field(default=None, repr=False)
    workgroups: Callable[[int, int, int], int] | None = field(default=None, repr=False)
    every_stage: bool = True  # False: only stages whose `policy` names this family (the unembedding)
    # in a batch, whose cache sequence k's stage reads: (k) -> another sequence's index (labkit.gpu.batch_plan)
    cache_of: Callable[[int], int] | None = field(default=None, repr=False)


def from_file(name: str) -> Callable[[PassShape], str]:
    return lambda shape: wgsl_file(name)


# ----------------------------------------------------------------- explanations
@dataclass(frozen=True)
class Explanation:
    """What one stage computes, for people: shown by `lab.explain` and every widget."""

    stage: str
    op: str
    what: str
    formula: str
    inputs: tuple[tuple[str, str], ...]  # (name, shape)
    output: str  # shape
    kv: str = ""  # its KV-cache role, if any
    role: str = ""  # what this stage does in the transformer (its kind's row: labkit.model.stage_kinds)

    def __str__(self) -> str:
        ins = ", ".join(f"{n} {s}" for n, s in self.inputs) or "token ids"
        lines = [f"{self.stage}: {self.role}"] if self.role else []
        lines += [f"{self.stage} ({self.op}): {self.what}", f"  {self.formula}", f"  in: {ins}  →  out: {self.output}"]
        if self.kv:
            lines.append(f"  KV cache: {self.kv}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        from html import escape

        ins = ", ".join(f"<code>{escape(n)}</code> {escape(s)}" for n, s in self.inputs) or "token ids"
        kv = f"<br>KV cache: {escape(self.kv)}" if self.kv else ""
        role = f" — {escape(self.role)}" if self.role else ""
        return (
            f"<div class='labkit-explain'><b>{escape(self.stage)}</b>{role}<br>"
            f"<i>{escape(self.op)}</i>: {escape(self.what)}: <code>{escape(self.formula)}</code><br>"
            f"in: {ins} → out: {escape(self.output)}{kv}</div>"
        )


# ----------------------------------------------------------------- what the engines hand an op
class RefInputs(Protocol):
    """What the float64 reference gives an op: its inputs, weights, positions and this layer's cache."""

    x: list[np.ndarray]
    ids: np.ndarray
    positions: np.ndarray
    n_past: int

    def weight(self, name: str) -> np.ndarray: ...
    def matmul(self, x: np.ndarray, name: str, rows: tuple[int, int] | None) -> np.ndarray: ...  # x @ W.T, f64
    def cached(self, kind: str) -> np.ndarray: ...  # this layer's K or V, cached and new positions

    # optional: `angle_dtype`, what rope computes its angles in (float64 when absent; float32 where
    # labkit.attribution emulates an engine's precision)


class GpuStage(Protocol):
    """What the GPU executor gives an op's `plan`: regions, buffers, and one way to dispatch."""

    T: int
    n_past: int
    kernel: Kernel

    def input(self, i: int) -> Any: ...  # Region
    def output(self, shape: tuple[int, ...]) -> Any: ...  # Region (in the KV cache for a writer)
    def cache(self, kind: str) -> Any: ...  # this layer's K or V buffer
    # rows of a buffer: bound as the buffer, or as a texture where the kernel declares one
    def rows(self, buffer: Any, offset: int, stride: int, width: int, rows: int) -> Any: ...
    def vector(self, name: str) -> Any: ...  # a 1-D tensor as an f32 buffer
    def experts(self, name: str, rows_per_expert: int) -> Any: ...  # a 3-D expert tensor, whole experts per window
    def policy(self, family: str) -> Policy: ...
    def dispatch(self, buffers: list, values: dict[str, Any], workgroups: int) -> None: ...
    # epilogue: (the next stage's op, extra bindings, Params values) computed in the same dispatch
    def matmul(self, x: Any, out: Any, rows_T: int, x_skip: int, window_filter: Any, epilogue: Any) -> None: ...
    # the next stage when it fuses into this one (labkit.gpu.fusion): (Epilogue, its other input, its region)
    def fused_next(self, shape: tuple[int, ...]) -> Any: ...
    def temp(self, shape: tuple[int, ...], what: str) -> Any: ...  # a Region that is not the output
    # one dispatch of another op's kernel, as selected for this stage's layer (a matmul's bias add)
    def dispatch_op(self, op: str, operands: list, values: dict[str, Any], workgroups: int) -> None: ...


@dataclass(frozen=True)
class Op:
    """One op: see the module docstring. `family(stage, types)` names the kernel family that runs a
    stage (an op's own name, or per weight format for matmul)."""

    name: str
    what: str
    formula: str
    params: Params | None
    reference: Callable[..., np.ndarray] = field(repr=False)
    plan: Callable[..., Any] = field(repr=False)
    shapes: Callable[..., tuple[list[str], str]] = field(repr=False)
    kernels: tuple[Kernel, ...] = ()
    policies: tuple[Policy, ...] = ()
    family: Callable[..., str] | None = field(default=None, repr=False)
    # (family, adapter kind, weight layout) -> (the variant "default" means, why or ""): a family
    # whose default depends on the weight layout the memory plan allows (the matmuls' table)
    default_variant: Callable[[str, str, str], tuple[str, str]] | None = field(default=None, repr=False)
    # stage -> (the variant "default" means for this stage, why), or None: a default a stage's own shapes decide
    # (attention scores whose query rows are too wide for a texture read them from a buffer)
    stage_default: Callable[[Any], tuple[str, str] | None] | None = field(default=None, repr=False)
    weight: str | None = None  # how its weight reaches the GPU: "matrix" (GGUF bytes), "vector" (f32), "rows"
    chunked_output: bool = False  # its output may exceed one storage binding (bound per token chunk)
    # the Params fields that move with a decode step's position (labkit.gpu.compiled_step), and the
    # rule for a workgroup count that does: (stage, kernel source, T, n_past) -> workgroups
    step_fields: tuple[str, ...] = ()
    step_workgroups: Callable[..., int] | None = field(default=None, repr=False)
    # its output's shape for a pass (the memory plan sizes both engines by it); None: its first input's
    output: Callable[[Any, PassShape], tuple[int, ...]] | None = field(default=None, repr=False)
    layout: str = "rows"  # "rows": [positions, width] float32/64; "heads": [heads, queries, keys]
    # it reads its tokens' positions (rope): a batch of sequences runs it once per sequence (labkit.model.batch_stages)
    per_sequence: bool = False
    # the formula of one stage where a family computes it otherwise (gpt-oss's sinks, its clamped SwiGLU)
    formula_of: Callable[[Any], str] | None = field(default=None, repr=False)

    def stage_formula(self, stage: Any) -> str:
        return self.formula_of(stage) if self.formula_of else self.formula

    def family_of(self, stage: Any, tensor_type: Callable[[str], int]) -> str:
        return self.family(stage, tensor_type) if self.family else self.name

    def policy_families(self, stage: Any) -> list[str]:
        """The dispatch-policy families that apply to a stage of this op."""
        fams = dict.fromkeys(p.family for p in self.policies if p.every_stage or stage.policy == p.family)
        return list(fams)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# ----------------------------------------------------------------- composing and reading WGSL
# Composed sources mark where each kernel file starts with this comment (see `compose`).
FILE_MARK = "// ==== file: "


@lru_cache(maxsize=1024)
def compose(*names: str) -> str:
    """Kernel files concatenated in order, each preceded by a FILE_MARK line (matmul: common +
    the format's quant reader + a driver). Cached, so a kernel's source is one string object:
    the caches keyed by source (pipelines, Params layouts, constants) hash it once, not per
    dispatch."""
    return "\n".join(f"{FILE_MARK}{_mark_name(n)}\n{wgsl_file(n)}" for n in names)


def _mark_name(name: str) -> str:
    return "quant_tables.wgsl" if name == "quant_tables" else wgsl_path(name)


@lru_cache(maxsize=4096)
def _packing(source: str) -> tuple[str, tuple[str | None, ...], bytes]:
    """The struct format, field names (None for padding) and the zeros that round the bytes up to 16, of
    a source's Params (cached: asked per dispatch)."""
    layout = wgsl_params(source)
    fmt = "<" + "".join(_PACK[t] for _, t in layout)
    return fmt, tuple(None if n.startswith("_") else n for n, _ in layout), b"\0" * (-struct.calcsize(fmt) % 16)


@lru_cache(maxsize=4096)
def wgsl_const(source: str, name: str, default: int) -> int:
    """The value of `const NAME: u32 = N;` in a WGSL source (how kernels declare their geometry)."""
    m = re.search(rf"\bconst\s+{name}\s*(?::\s*u32\s*)?=\s*(\d+)u?\s*;", source)
    return int(m.group(1)) if m else default
