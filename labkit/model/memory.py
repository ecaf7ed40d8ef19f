"""The memory plan: what a model and a pass will hold, worked out before anything is allocated.

Both engines are sized from one plan, derived from the stage graph (each op declares its
output's shape, `Op.output`), liveness (labkit.model.liveness) and the capture policy:
- the GPU path: its weights (as the selected kernels read them), the KV cache, the regions of
  a pass and the host copies of its captures (lavapipe's device memory is host memory);
- the float64 reference: its weight cache (labkit.model.weight_cache), its live activations,
  its KV cache and its captures.
A plan over the budget is a MemoryBudgetError that names the parts and what to drop, raised
before the first allocation: never a bare MemoryError, the OOM killer or a wgpu error.

The budget is `labkit.open(model, memory="6GB")`, or by default a share of the memory the
machine has free when the lab opens (`default_budget`), for both engines together.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from labkit.errors import InvalidArgumentError, MemoryBudgetError
from labkit.model.graph import Stage
from labkit.model.liveness import last_readers
from labkit.model.weight_cache import CHUNK_BYTES
from labkit.ops import OPS
from labkit.ops.base import PassShape

DEFAULT_SHARE = 0.8  # of the memory available when a lab opens: the rest is the process's own and the OS's
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}  # fmt: skip


@dataclass(frozen=True)
class Budget:
    """Bytes a lab may hold, and where that figure came from (shown in the plan). A budget given
    as memory= bounds the whole process, so what it held when the lab opened (Python, libraries,
    earlier labs' data) is its `baseline`; the default is a share of what is free, which already
    leaves that out (baseline 0)."""

    nbytes: int
    source: str
    baseline: int = 0


def parse_size(size: int | float | str) -> int:
    """Bytes from 6_000_000_000, "6GB", "6 GB", "5.5GiB" or "512MB" (GB = 10⁹ bytes, GiB = 2³⁰)."""
    if isinstance(size, int | float) and not isinstance(size, bool):
        n = float(size)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(size))
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _UNITS:
            raise InvalidArgumentError(f"memory={size!r}: give bytes or a size such as '6GB', '512MB' or '5.5GiB'")
        n = float(m.group(1)) * _UNITS[unit]
    if not math.isfinite(n) or n <= 0:
        raise InvalidArgumentError(f"memory={size!r}: a budget must be a positive size")
    return int(n)


def proc_kib(path: str, key: str) -> int | None:
    """A `Key:   N kB` field of a /proc file (meminfo, self/status), in KiB; None where there is none."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def available_bytes() -> int:
    """Memory the machine has free now (MemAvailable: free pages plus what the kernel can reclaim)."""
    kib = proc_kib("/proc/meminfo", "MemAvailable")
    return kib * 1024 if kib is not None else os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def budget_of(memory: int | float | str | None) -> Budget:
    """The lab's budget: the one given, or DEFAULT_SHARE of what is free now."""
    if memory is not None:
        n = parse_size(memory)
        return Budget(n, f"memory={memory!r}", resident_bytes())
    free, share = available_bytes(), default_share()
    return Budget(int(share * free), f"default: {share:.0%} of the {gb(free)} available")


def default_share() -> float:
    """The share of free memory a lab's default budget takes: DEFAULT_SHARE, or LABKIT_MEMORY_SHARE
    (a JupyterHub that runs many kernels per machine sets it lower)."""
    text = os.environ.get("LABKIT_MEMORY_SHARE")
    if text is None:
        return DEFAULT_SHARE
    try:
        share = float(text)
    except ValueError:
        share = -1.0
    if not 0 < share <= 1:
        raise InvalidArgumentError(f"LABKIT_MEMORY_SHARE={text!r}: give a share of free memory in (0, 1]")
    return share


def resident_bytes() -> int:
    """This process's resident memory now (VmRSS)."""
    return 1024 * (proc_kib("/proc/self/status", "VmRSS") or 0)


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


@dataclass(frozen=True)
class MemoryPart:
    """One line of the plan: which engine holds it, what it is, its bytes, and how to make it smaller."""

    engine: str  # "gpu", "reference", or "process" (its baseline)
    # "weights", "kv cache", "recurrent state", "pass regions", "captures", "weight cache", "activations"
    part: str
    nbytes: int
    detail: str = ""
    drop: str = ""  # what to give up to shrink it ("" when it cannot shrink)


@dataclass(frozen=True)
class MemoryPlan:
    """The parts a lab will hold for a pass, against its budget. `table()` shows it; `check()` raises."""

    budget: Budget
    tokens: int
    parts: tuple[MemoryPart, ...] = field(default_factory=tuple)
    room: int | None = None  # bytes left for the reference's weight cache (None: the reference is not planned)

    def total(self, engine: str | None = None) -> int:
        return sum(p.nbytes for p in self.parts if engine is None or p.engine == engine)

    @property
    def fits(self) -> bool:
        return self.total() <= self.budget.nbytes

    def rows(self) -> list[dict]:
        return [{"engine": p.engine, "part": p.part, "bytes": p.nbytes, "detail": p.detail} for p in self.parts]

    def table(self) -> str:
        lines = [f"memory plan for {self.tokens} tokens; budget {gb(self.budget.nbytes)} ({self.budget.source})"]
        lines += [f"  {p.engine:9} {p.part:14} {gb(p.nbytes):>10}  {p.detail}" for p in self.parts]
        verdict = "fits" if self.fits else f"over the budget by {gb(self.total() - self.budget.nbytes)}"
        lines.append(f"  {'total':24} {gb(self.total()):>10}  {verdict}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_pretty_(self, p, cycle) -> None:  # IPython shows the table, not the dataclass
        p.text(self.table())

    def check(self, what: str) -> None:
        """MemoryBudgetError when the plan does not fit: the parts, largest first, and what to drop."""
        if self.fits:
            return
        parts = sorted(self.parts, key=lambda p: -p.nbytes)
        listed = "; ".join(f"{p.engine} {p.part} {gb(p.nbytes)}" for p in parts if p.nbytes)
        drops = list(dict.fromkeys(p.drop for p in parts if p.drop))
        raise MemoryBudgetError(
            f"{what} needs {gb(self.total())}, over the memory budget of {gb(self.budget.nbytes)} "
            f"({self.budget.source}): {listed}."
            + (f" To fit: {'; '.join(drops)}." if drops else "")
            + " Or open the lab with a larger memory= budget."
        )


# ----------------------------------------------------------------- sizes from the graph
def stage_shapes(graph: list[Stage], T: int, n_past: int = 0) -> dict[str, tuple[int, ...]]:
    """Each stage's output shape for a pass of T new tokens after n_past cached ones."""
    shapes: dict[str, tuple[int, ...]] = {}
    for st in graph:
        op = OPS[st.op]
        shapes[st.name] = op.output(st, PassShape(T, n_past)) if op.output else shapes[st.inputs[0]]
    return shapes


def stage_bytes(graph: list[Stage], T: int, itemsize: int, names=None, last_logits_only: bool = False) -> dict:
    """{stage: bytes of its output} for the stages in `names` (all when None). With
    `last_logits_only`, the unembedding and what follows hold one position."""
    shapes = stage_shapes(graph, T)
    first_head = next((i for i, st in enumerate(graph) if st.policy == "lm_head"), len(graph))
    out = {}
    for i, st in enumerate(graph):
        if names is None or st.name in names:
            n = math.prod(shapes[st.name])
            out[st.name] = itemsize * (n // T if last_logits_only and i >= first_head else n)
    return out


def peak_live_bytes(graph: list[Stage], T: int, itemsize: int, kept=frozenset()) -> int:
    """The most bytes of uncaptured stage outputs alive at once when each is freed after its last
    reader (a `kept` stage is counted with the captures instead)."""
    sizes = stage_bytes(graph, T, itemsize)
    last = last_readers(graph)
    live, peak = 0, 0
    frees: dict[int, int] = {}
    for i, st in enumerate(graph):
        if st.name not in kept:
            live += sizes[st.name]
            frees[last[st.name]] = frees.get(last[st.name], 0) + sizes[st.name]
        peak = max(peak, live)
        live -= frees.pop(i, 0)
    return peak


def kv_bytes(cfg, positions: int, itemsize: int) -> int:
    """K and V of `positions` for the attending layers (ModelConfig.cache_dims a token): it grows with the
    sequence."""
    return len(cfg.attention_layers) * positions * sum(cfg.cache_dims) * itemsize


def kv_detail(cfg, dtype: str) -> str:
    """The cache line's detail: its dtype, and for a latent attention what its row holds against every
    head's K and V (what MLA saves)."""
    if cfg.mla is None:
        return dtype
    k, v = cfg.cache_dims
    heads = cfg.n_heads * (cfg.mla.k_head + cfg.mla.v_head)
    return (f"{dtype}; a token and layer: the latent and rotary key ({k}) and the latent ({v}), where every head's "
            f"K and V would be {heads} ({heads / (k + v):.1f}x more)")  # fmt: skip


def state_bytes(cfg, itemsize: int) -> int:
    """Every recurrent layer's states (its conv state, and Mamba-2's scan state or the delta net's memory): one
    size at any length."""
    if cfg.ssm is None:
        return 0
    return len(cfg.state_layers) * (cfg.ssm.conv_state_size + cfg.ssm.scan_state_size) * itemsize


def state_part(engine: str, cfg, itemsize: int) -> list[MemoryPart]:
    """The recurrent state's part of a plan, where the model has one."""
    n = state_bytes(cfg, itemsize)
    what = f"{len(cfg.state_layers)} layers' conv and scan states, float{8 * itemsize}, the same at any length"
    return [MemoryPart(engine, "recurrent state", n, what)] if n else []


# what a reference pass holds besides its parts: a float64 row chunk, its float32 source, the product,
# and gguf.quants' temporaries over 8 MB of blocks (a streamed 8B-shape pass at 6 GB overshot by this)
WORKING_SET = 384 << 20
CAPTURE_HINT = 'capture less: names=["blk.*.resid_out", ...], layers=[...], positions="last"'


def weights_read_whole(graph: list[Stage]) -> set[str]:
    """The tensors a reference pass reads whole: matrices, vectors, biases, scales and sinks (an untied
    embedding is read by rows only; a 3-D expert tensor by experts)."""
    whole = lambda st, role: role != "weight" or OPS[st.op].weight in ("matrix", "vector")  # noqa: E731
    return {n for st in graph for role, n in st.tensors.items() if whole(st, role)}


def held_experts(gguf, graph: list[Stage]) -> set[str]:
    """The 3-D expert tensors the reference may hold whole: the small ones (a larger one is read an
    expert's rows at a time and never held: labkit.model.weight_cache.WeightCache.by_rows)."""
    experts = {st.weight for st in graph if OPS[st.op].weight == "experts"}
    return {n for n in experts if 8 * math.prod(gguf.tensors[n].shape) <= CHUNK_BYTES}


def reference_weight_bytes(gguf, graph: list[Stage], itemsize: int) -> int:
    """Bytes of every weight a reference pass reads whole, held at `itemsize` bytes a value."""
    names = weights_read_whole(graph) | held_experts(gguf, graph)
    return sum(itemsize * math.prod(gguf.tensors[n].shape) for n in names)


def reference_parts(gguf, graph: list[Stage], cfg, T: int, names, weight_itemsize: int,
                    weight_room: int) -> list[MemoryPart]:  # fmt: skip
    """The float64 reference's parts for a pass of T tokens capturing `names` (all when None): its
    live activations, KV cache and captures, and its weight cache in what room is left (the cache
    shrinks to `weight_room`, least recently used out first, down to one streamed row chunk)."""
    kept = {st.name for st in graph} if names is None else set(names)
    captures = sum(stage_bytes(graph, T, 8, kept).values())
    weights = reference_weight_bytes(gguf, graph, weight_itemsize)
    held = min(weights, weight_room)
    how = "all weights held" if held >= weights else f"{held / weights:.0%} of {gb(weights)} held, the rest streamed"
    return [
        MemoryPart("reference", "weight cache", held, f"{how} (float{8 * weight_itemsize})"),
        MemoryPart("reference", "working set", WORKING_SET, "a widened row chunk and dequantization temporaries"),
        MemoryPart("reference", "activations", peak_live_bytes(graph, T, 8, kept), "float64, freed after last reader"),
        MemoryPart("reference", "kv cache", kv_bytes(cfg, T, 8), kv_detail(cfg, "float64")),
        *state_part("reference", cfg, 8),
        MemoryPart("reference", "captures", captures, f"{len(kept)} stages, float64", CAPTURE_HINT),
    ]


def capture_fallbacks(graph: list[Stage]) -> list[tuple[str, list[str]]]:
    """Smaller captures to fall back to, largest first, when capturing every stage does not fit:
    (what it holds, in words; its stage names)."""
    every = [st.name for st in graph]
    no_maps = [st.name for st in graph if OPS[st.op].layout != "heads"]
    stream = [st.name for st in graph if st.layer is None or st.kind in ("resid_mid", "resid_out")]
    return [
        ("every stage but the attention maps", no_maps),
        ("the residual stream (embed, resid_mid and resid_out of every layer, output_norm, logits)", stream),
        ("the logits", [every[-1]]),
    ]
