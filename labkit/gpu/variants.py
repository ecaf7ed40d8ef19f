"""Kernel variants: for every op family, named WGSL sources with the same interface.

"default" is the correct kernel of each family. Users add their own with
`register_variant`; the executor asks `source(family, name)` for the WGSL to
compile. Matmul families are per weight format (`matmul_q4_k`, ...): their
source is the shared readers + the format's block code + the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources

from gguf import GGMLQuantizationType

from labkit.errors import UnknownVariantError

MATMUL_FORMATS = {
    GGMLQuantizationType.F32: "f32",
    GGMLQuantizationType.F16: "f16",
    GGMLQuantizationType.Q8_0: "q8_0",
    GGMLQuantizationType.Q4_0: "q4_0",
    GGMLQuantizationType.Q4_1: "q4_1",
    GGMLQuantizationType.Q5_0: "q5_0",
    GGMLQuantizationType.Q4_K: "q4_k",
    GGMLQuantizationType.Q5_K: "q5_k",
    GGMLQuantizationType.Q6_K: "q6_k",
}

# Families whose default is a single kernel file of the same name.
SIMPLE_FAMILIES = ("embed", "rmsnorm", "rope", "attn_scores", "softmax", "attn_ctx", "add", "glu")
_SIMPLE_FILES = {"embed": "scale"}


def kernel_file(name: str) -> str:
    """Text of labkit/gpu/kernels/<name>.wgsl."""
    try:
        return resources.files("labkit.gpu").joinpath("kernels", f"{name}.wgsl").read_text()
    except FileNotFoundError:
        raise UnknownVariantError(f"no kernel file {name}.wgsl") from None


@dataclass(frozen=True)
class Variant:
    family: str
    name: str
    doc: str
    source: Callable[[], str]
    faulty: bool = False


_REGISTRY: dict[str, dict[str, Variant]] = {}


def _add(v: Variant) -> None:
    _REGISTRY.setdefault(v.family, {})[v.name] = v


def _matmul_source(fmt: str, quant_file: str | None = None, driver: str = "matmul") -> Callable[[], str]:
    def build() -> str:
        return "\n".join([kernel_file("common"), kernel_file(quant_file or f"quant_{fmt}"), kernel_file(driver)])

    return build


for _fam in SIMPLE_FAMILIES:
    _add(
        Variant(
            _fam,
            "default",
            "the correct kernel",
            (lambda f=_fam: kernel_file(_SIMPLE_FILES.get(f, f))),
        )
    )
for _fmt in MATMUL_FORMATS.values():
    _add(
        Variant(
            f"matmul_{_fmt}",
            "default",
            "one weight row per thread, token tiles",
            _matmul_source(_fmt),
        )
    )
    _add(
        Variant(
            f"matmul_{_fmt}",
            "wg_reduce",
            "one workgroup per row, shared-memory reduction",
            _matmul_source(_fmt, driver="matmul_wg_reduce"),
        )
    )


def families() -> list[str]:
    return list(_REGISTRY)


def variants() -> dict[str, list[str]]:
    """{family: [variant names]} — "default" is the correct one of each."""
    return {f: list(v) for f, v in _REGISTRY.items()}


def get_variant(family: str, name: str = "default") -> Variant:
    if family not in _REGISTRY:
        raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(_REGISTRY)}")
    if name not in _REGISTRY[family]:
        raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(_REGISTRY[family])}")
    return _REGISTRY[family][name]


def kernel_source(family: str, name: str = "default") -> str:
    """WGSL text of a registered variant."""
    return get_variant(family, name).source()


def register_variant(
    family: str,
    name: str,
    wgsl: str,
    doc: str = "user variant",
    faulty: bool = False,
    check: bool = True,
) -> Variant:
    """Add a user's WGSL for an existing family; compiled now so errors surface here."""
    if family not in _REGISTRY:
        raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(_REGISTRY)}")
    v = Variant(family, name, doc, lambda: wgsl, faulty)
    if check:
        from labkit.gpu.device import get_device
        from labkit.gpu.shader import compile_pipeline

        compile_pipeline(get_device(), wgsl, label=f"{family}/{name}")
    _add(v)
    return v


def matmul_family(ggml_type: int) -> str:
    from labkit.errors import UnsupportedTensorTypeError

    try:
        return "matmul_" + MATMUL_FORMATS[GGMLQuantizationType(ggml_type)]
    except (KeyError, ValueError):
        raise UnsupportedTensorTypeError(
            f"no GPU matmul for ggml type {ggml_type} ({GGMLQuantizationType(ggml_type).name})"
        ) from None
