"""Kernel variants: for every op family, named implementations with the same interface.

"default" is the correct variant of each family. Most variants are WGSL sources;
a few post-mortem faults live on the host side of a kernel (which kernel a path
picks, which windows get dispatched) and the sampler's are Python — each says
which in `kind`. Users add their own WGSL with `register_variant`.

Families and what they cover:
- `embed`, `rmsnorm`, `rope`, `softmax`, `attn_ctx`, `add`, `glu`: the stage op of that name;
- `attn_scores`: the scores stage; "default" picks a prefill kernel for a fresh prompt and a
  decode kernel for one new token (the two paths of post-mortem 000);
- `matmul_<fmt>` (`matmul_q8_0`, `matmul_q4_k`, ...): every matmul whose weight has that format;
- `lm_head`: which row windows of the logits matmul get dispatched;
- `sampling`: the host-side sampler (see labkit.sampling).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources

from labkit.errors import UnknownVariantError
from labkit.gpu.matmul import FORMATS as MATMUL_FORMATS
from labkit.gpu.matmul import format_name, wgsl_const


def kernel_file(name: str) -> str:
    """Text of labkit/gpu/kernels/<name>.wgsl."""
    try:
        return resources.files("labkit.gpu").joinpath("kernels", f"{name}.wgsl").read_text()
    except FileNotFoundError:
        raise UnknownVariantError(f"no kernel file {name}.wgsl") from None


@dataclass(frozen=True)
class PassShape:
    """What a variant may look at when choosing its kernel: tokens in this pass, cached before it."""

    T: int
    n_past: int


@dataclass(frozen=True)
class Variant:
    """One implementation of a family. `source(shape)` gives the WGSL for a pass of that shape."""

    family: str
    name: str
    doc: str
    source_for: Callable[[PassShape], str] = field(repr=False)
    kind: str = "wgsl"  # "wgsl", "dispatch" (host side of a kernel) or "sampler" (Python)
    faulty: bool = False
    # host-side hooks: which windows of a matmul get dispatched (lm_head)
    window_filter: Callable[[int, int], bool] | None = field(default=None, repr=False)
    # attn_ctx only: a fused kernel that reads q, K and V itself (scores/probs are not computed)
    fused: bool = False
    # fused attn_ctx only: workgroups(T, n_heads, out_size); None = one thread per output element
    workgroups: Callable[[int, int, int], int] | None = field(default=None, repr=False)

    def source(self, shape: PassShape | None = None) -> str:
        return self.source_for(shape or PassShape(T=2, n_past=0))

    def workgroup_count(self, T: int, n_heads: int, size: int) -> int:
        """Workgroups for a fused attn_ctx dispatch: the variant's own count, else one thread per
        output element (64 a workgroup)."""
        return self.workgroups(T, n_heads, size) if self.workgroups else -(-size // 64)


_REGISTRY: dict[str, dict[str, Variant]] = {}


def _add(v: Variant) -> Variant:
    _REGISTRY.setdefault(v.family, {})[v.name] = v
    return v


def _file(name: str) -> Callable[[PassShape], str]:
    return lambda shape: kernel_file(name)


def _matmul(fmt: str, quant: str | None = None, driver: str = "matmul") -> Callable[[PassShape], str]:
    from labkit.gpu.shader import compose

    return lambda shape: compose("common", quant or f"quant_{fmt}", driver)


def _attn_paths(prefill: str, decode: str, general: str = "attn_scores") -> Callable[[PassShape], str]:
    def pick(shape: PassShape) -> str:
        if shape.n_past == 0:
            return kernel_file(prefill)
        return kernel_file(decode if shape.T == 1 else general)

    return pick


def _register_builtins() -> None:
    for fam in ("embed", "rmsnorm", "rope", "softmax", "attn_ctx", "add", "glu"):
        _add(Variant(fam, "default", "the correct kernel", _file("scale" if fam == "embed" else fam)))
    _add(
        Variant(
            "attn_scores",
            "default",
            "prefill kernel for a fresh prompt, decode kernel for one new token",
            _attn_paths("attn_scores_prefill", "attn_scores_decode"),
        )
    )
    _add(Variant("attn_scores", "general", "one kernel for every pass shape (reads n_past)", _file("attn_scores")))
    _add(
        Variant(
            "attn_ctx",
            "streaming",
            "fused online-softmax attention: scores/probs are not materialized",
            _file("attn_streaming"),
            fused=True,
        )
    )
    tile = wgsl_const(kernel_file("attn_tiled"), "TILE", 8)  # queries per workgroup, read from the kernel
    _add(
        Variant(
            "attn_ctx",
            "tiled",
            f"fused attention, one workgroup per {tile} queries of a head, keys in chunks of 64",
            _file("attn_tiled"),
            fused=True,
            workgroups=lambda T, n_heads, size: -(-T // tile) * n_heads,
        )
    )
    for fmt in MATMUL_FORMATS.values():
        fam = f"matmul_{fmt}"
        _add(Variant(fam, "default", "rows per thread, token tiles (fastest on CPU adapters)", _matmul(fmt)))
        _add(
            Variant(
                fam,
                "wg_reduce",
                "one workgroup per row, shared-memory reduction (for real GPUs)",
                _matmul(fmt, driver="matmul_wg_reduce"),
            )
        )
    _add(
        Variant(
            "lm_head",
            "default",
            "every row window of the output matmul is dispatched",
            lambda shape: "",
            kind="dispatch",
        )
    )

    # ---- faulty variants behind the post-mortem cases
    _add(
        Variant(
            "matmul_q4_k",
            "mins_added",
            "Q4_K mins added instead of subtracted: negative weights come out positive (001/000)",
            _matmul("q4_k", quant="quant_q4_k_mins_added"),
            faulty=True,
        )
    )
    _add(
        Variant(
            "attn_scores",
            "decode_uses_prefill",
            "decode runs the prefill kernel, which assumes no cached "
            "positions: the new token attends to position 0 only (000, phase 1)",
            _attn_paths("attn_scores_prefill", "attn_scores_prefill", "attn_scores_prefill"),
            kind="dispatch",
            faulty=True,
        )
    )
    _add(
        Variant(
            "attn_ctx",
            "tiled_streaming_count",
            "the tiled tier dispatched with the streaming count (T x heads, not ceil(T/8) x heads): the "
            "extra workgroups find no head and return, so the numbers do not change (000, phase 2)",
            _file("attn_tiled"),
            kind="dispatch",
            fused=True,
            faulty=True,
            workgroups=lambda T, n_heads, size: T * n_heads,
        )
    )
    _add(
        Variant(
            "lm_head",
            "skip_last_window",
            "the last row window of the output matmul is never "
            "dispatched: those logits keep whatever the buffer held (002)",
            lambda shape: "",
            kind="dispatch",
            faulty=True,
            window_filter=lambda index, count: index < count - 1,
        )
    )
    _add(
        Variant(
            "rmsnorm",
            "scale_clamp",
            "norm weight read at a wrong block scale (1.688e-4, an I2_S-style clamp): tiny normalized outputs (003)",
            _file("rmsnorm_scale_clamp"),
            faulty=True,
        )
    )
    _add(
        Variant(
            "rmsnorm",
            "eps_outside",
            "eps added outside the square root (003, hypothesis C)",
            _file("rmsnorm_eps_outside"),
            faulty=True,
        )
    )
    _add(
        Variant(
            "rmsnorm",
            "offset_twice",
            "gemma's (1 + w) applied again to weights that already hold it",
            _file("rmsnorm_offset_twice"),
            faulty=True,
        )
    )
    _add(
        Variant(
            "softmax",
            "no_max_sub",
            "no max-subtraction: exp overflows to inf, inf/inf = NaN (003)",
            _file("softmax_no_max_sub"),
            faulty=True,
        )
    )
    _add(
        Variant(
            "softmax",
            "masked_nan",
            "a fully masked row gives NaN instead of zeros (003)",
            _file("softmax_masked_nan"),
            faulty=True,
        )
    )
    _add(
        Variant(
            "rope",
            "normal_pairs",
            "normal (2i, 2i+1) rope whatever the model's style: wrong on neox models (gemma3, qwen2)",
            _file("rope_normal_pairs"),
            faulty=True,
        )
    )


_register_builtins()
_BUILTIN = {(family, name) for family, named in _REGISTRY.items() for name in named}


def families() -> list[str]:
    return list(_REGISTRY)


def variants() -> dict[str, list[str]]:
    """{family: [variant names]} — "default" is the correct one of each."""
    return {f: list(v) for f, v in _REGISTRY.items()}


def get_variant(family: str, name: str = "default") -> Variant:
    family = resolve_family(family, name)
    if family not in _REGISTRY:
        raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(_REGISTRY)}")
    if name not in _REGISTRY[family]:
        raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(_REGISTRY[family])}")
    return _REGISTRY[family][name]


# DESIGN.md speaks of "attention" variants; the stages behind the word are two families.
FAMILY_ALIASES = {"attention": ("attn_ctx", "attn_scores")}


def resolve_family(family: str, name: str = "default") -> str:
    """The real family for `family` (an alias such as "attention" picks the one that has `name`)."""
    if family not in FAMILY_ALIASES:
        return family
    options = FAMILY_ALIASES[family]
    for real in options:
        if name in _REGISTRY.get(real, {}):
            return real
    known = sorted({n for real in options for n in _REGISTRY.get(real, {})})
    raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(known)}")


def check_selection(selection: dict[str, str]) -> dict[str, str]:
    """The selection with aliases resolved; UnknownVariantError for any op or name that does not exist."""
    out = {}
    for family, name in selection.items():
        real = resolve_family(family, name)
        get_variant(real, name)
        out[real] = name
    return out


def kernel_source(family: str, name: str = "default") -> str:
    """WGSL text of a registered variant (for "attn_scores" default: the prefill kernel)."""
    v = get_variant(family, name)
    if v.kind == "sampler":
        import inspect

        return inspect.getsource(v.source_for)
    return v.source()


def check_interface(family: str, name: str, wgsl: str) -> None:
    """VariantInterfaceError unless `wgsl` declares the same resources as the family's default
    variant: the same set of (@group, @binding, address space, access). Comments are ignored,
    `var<storage>` counts as `var<storage, read>`, a texture or sampler as var<handle>."""
    import re

    from labkit.errors import VariantInterfaceError

    comment = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
    decl = re.compile(r"((?:@\s*\w+\s*(?:\([^)]*\))?\s*)+)\bvar\b\s*(?:<([^>]*)>)?\s*\w+")
    attr = re.compile(r"@\s*(group|binding)\s*\(\s*(\d+)\s*\)")

    def bindings(src: str) -> dict[tuple[int, int], str]:
        out = {}
        for m in decl.finditer(comment.sub(" ", src)):
            attrs = dict(attr.findall(m.group(1)))
            if "binding" not in attrs:
                continue
            parts = [s.strip() for s in (m.group(2) or "handle").split(",")]
            if parts[0] == "storage" and len(parts) == 1:
                parts.append("read")
            out[(int(attrs.get("group", 0)), int(attrs["binding"]))] = f"var<{', '.join(parts)}>"
        return out

    want, got = bindings(get_variant(family).source()), bindings(wgsl)
    if got == want:
        return

    def at(key: tuple[int, int]) -> str:
        return f"@group({key[0]}) @binding({key[1]})"

    diffs = []
    for key in sorted(set(want) | set(got)):
        if key not in got:
            diffs.append(f"{at(key)} {want[key]} is missing")
        elif key not in want:
            diffs.append(f"{at(key)} {got[key]} is not in the interface")
        elif got[key] != want[key]:
            diffs.append(f"{at(key)} is {got[key]}, should be {want[key]}")
    expected = ", ".join(f"{at(k)} {want[k]}" for k in sorted(want))
    raise VariantInterfaceError(
        f"{family}/{name}: bindings differ from the {family} interface: {'; '.join(diffs)} (expected: {expected})"
    )


def register_variant(family: str, name: str, wgsl: str, doc: str = "user variant", faulty: bool = False) -> Variant:
    """Add a user's WGSL for an existing family, with the family's interface; compiled now, so a
    compile error surfaces here as ShaderCompileError with the WGSL line and the compiler's text,
    and bindings that differ from the family's default as VariantInterfaceError."""
    family = resolve_family(family)
    if (family, name) in _BUILTIN:
        raise UnknownVariantError(f"{family}/{name} is a shipped variant; register yours under another name")
    if family not in _REGISTRY:
        raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(_REGISTRY)}")
    if get_variant(family).kind != "wgsl":
        raise UnknownVariantError(f"{family} variants are not WGSL; register a {get_variant(family).kind} instead")
    from labkit.gpu.device import get_device
    from labkit.gpu.shader import compile_pipeline

    compile_pipeline(get_device(), wgsl, label=f"{family}/{name}")
    check_interface(family, name, wgsl)
    return _add(Variant(family, name, doc, lambda shape: wgsl, faulty=faulty))


def register_host_variant(variant: Variant) -> Variant:
    """Add a non-WGSL variant (sampler or dispatch policy); used by labkit.sampling."""
    return _add(variant)


def matmul_family(ggml_type: int) -> str:
    """`matmul_<fmt>` for a weight type; UnsupportedTensorTypeError (naming the type) otherwise."""
    return "matmul_" + format_name(ggml_type)
