"""The variant registries: WGSL kernels and host dispatch policies, read from the op modules.

(The third kind, samplers, lives with the sampler in labkit.sampling.) A selection maps a
family, or one layer's family (`blk.5.rope`), to a variant name; "default" is the correct
variant, and for families with an adapter preference (the matmuls) it means the kernel
shaped for this adapter: repacked int8 tiles on a CPU, a workgroup per row on a GPU.
Users add WGSL with `register_variant`; nothing else writes here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from labkit.errors import UnknownVariantError, VariantInterfaceError
from labkit.ops import OPS
from labkit.ops.base import Kernel, Policy

KERNELS: dict[str, dict[str, Kernel]] = {}
POLICIES: dict[str, dict[str, Policy]] = {}
for _op in OPS.values():
    for _k in _op.kernels:
        KERNELS.setdefault(_k.family, {})[_k.name] = _k
    for _p in _op.policies:
        POLICIES.setdefault(_p.family, {})[_p.name] = _p
SHIPPED = {(f, n) for reg in (KERNELS, POLICIES) for f, named in reg.items() for n in named}
OP_OF_FAMILY = {k.family: op.name for op in OPS.values() for k in op.kernels}

# DESIGN.md speaks of "attention" variants; the stages behind the word are two families.
FAMILY_ALIASES = {"attention": ("attn_ctx", "attn_scores")}
_LAYER_KEY = re.compile(r"^blk\.(\d+)\.(.+)$")


def adapter_kind(adapter_type: str) -> str:
    """ "cpu" for a CPU adapter (lavapipe), "gpu" for every other adapter type."""
    return "cpu" if adapter_type == "CPU" else "gpu"


def variants() -> dict[str, list[str]]:
    """{family: [variant names]} of the three registries (kernels, policies, samplers); "default" first."""
    from labkit.sampling import SAMPLERS

    out = {}
    for reg in (KERNELS, POLICIES, {"sampling": SAMPLERS}):
        for fam, named in reg.items():
            out[fam] = ["default"] + [n for n in named if n != "default"]
    return out


def preferred(family: str, adapter: str) -> Kernel | None:
    """The correct kernel "default" stands for on this adapter kind, where a family has one."""
    return next((k for k in KERNELS.get(family, {}).values() if k.prefer == adapter), None)


def get_kernel(family: str, name: str = "default", adapter: str = "cpu") -> Kernel:
    named = KERNELS.get(family)
    if named is None:
        raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(variants())}")
    if name == "default" and "default" not in named:
        return preferred(family, adapter) or preferred(family, "cpu")
    if name not in named:
        raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(variants()[family])}")
    return named[name]


def get_policy(family: str, name: str = "default") -> Policy:
    named = POLICIES.get(family)
    if named is None:
        raise UnknownVariantError(f"unknown dispatch policy {family!r}; policies: {', '.join(POLICIES)}")
    if name not in named:
        raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(named)}")
    return named[name]


def describe(family: str, name: str) -> str:
    """The one-line doc of a kernel, policy or sampler variant."""
    if family == "sampling":
        from labkit.sampling import sampler_order

        return (sampler_order(name).__doc__ or "").split("\n")[0]
    if family in POLICIES:
        return get_policy(family, name).doc
    if name == "default" and "default" not in KERNELS.get(family, {}):
        cpu, gpu = (getattr(preferred(family, kind), "name", "?") for kind in ("cpu", "gpu"))
        return f"the kernel shaped for the adapter: {cpu} on a CPU, {gpu} on a GPU"
    return get_kernel(family, name).doc


def is_faulty(family: str, name: str) -> bool:
    """Whether a kernel, policy or sampler variant is one of the deliberately broken ones."""
    if family == "sampling":
        from labkit.sampling import FAULTY_SAMPLERS

        return name in FAULTY_SAMPLERS
    if family in POLICIES:
        return get_policy(family, name).faulty
    return name != "default" and get_kernel(family, name).faulty


def resolve_family(family: str, name: str = "default") -> str:
    """The real family for `family` (an alias such as "attention" picks the one that has `name`)."""
    if family not in FAMILY_ALIASES:
        return family
    options = FAMILY_ALIASES[family]
    for real in options:
        if name in variants().get(real, []):
            return real
    known = sorted({n for real in options for n in variants().get(real, [])})
    raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(known)}")


def check_key(key: str, name: str) -> str:
    """A selection key with its alias resolved: `family` or `blk.L.family`; UnknownVariantError
    for a family or variant that does not exist."""
    m = _LAYER_KEY.match(key)
    scope, family = (f"blk.{m.group(1)}.", m.group(2)) if m else ("", key)
    family = resolve_family(family, name)
    if name not in variants().get(family, []) and not (family in KERNELS and name == "default"):
        if family not in variants():
            raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(variants())}")
        raise UnknownVariantError(f"unknown variant {name!r} of {family}; known: {', '.join(variants()[family])}")
    return scope + family


def check_selection(selection: dict[str, str]) -> dict[str, str]:
    """The selection with aliases resolved; UnknownVariantError for any family or name that does not exist."""
    return {check_key(key, name): name for key, name in selection.items()}


def selected(selection: dict[str, str], family: str, layer: int | None) -> str:
    """The variant a stage of `layer` runs for `family`: its layer's binding, else the family's."""
    if layer is not None:
        scoped = selection.get(f"blk.{layer}.{family}")
        if scoped is not None:
            return scoped
    return selection.get(family, "default")


def kernel_source(family: str, name: str = "default", adapter: str = "cpu") -> str:
    """WGSL text of a registered kernel (for "attn_scores" default: the prefill kernel; for a
    repacked matmul: its prefill driver, which reads the weight repacked by `repack_source`);
    "default" is the one for `adapter` ("cpu" or "gpu": labkit.kernel_source passes the device's)."""
    family = resolve_family(family, name)
    if family == "sampling":
        import inspect

        from labkit.sampling import sampler_order

        return inspect.getsource(sampler_order(name))
    if family in POLICIES:
        raise UnknownVariantError(f"{family} variants are host dispatch policies, not WGSL")
    return get_kernel(family, name, adapter).source()


def _bindings(src: str) -> dict[tuple[int, int], str]:
    """{(group, binding): 'var<space, access>'} of a WGSL source; comments ignored."""
    comment = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
    decl = re.compile(r"((?:@\s*\w+\s*(?:\([^)]*\))?\s*)+)\bvar\b\s*(?:<([^>]*)>)?\s*\w+")
    attr = re.compile(r"@\s*(group|binding)\s*\(\s*(\d+)\s*\)")
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


def _binding_types(src: str) -> list[str]:
    """The declared types of a source's bindings, in order (`array<u32>` for GGUF bytes, `array<vec4<u32>>`
    for the repacked layout): what tells a matmul driver on raw bytes from one on repacked weights."""
    comment = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
    return re.findall(r"@binding\(\s*\d+\s*\)\s*var\b[^:]*:\s*([^;]+);", comment.sub(" ", src))


def _unread_bindings(src: str) -> list[str]:
    """Bindings a source declares and never names again: WebGPU's automatic layout leaves them out,
    so binding the family's buffers to the kernel would fail at its first dispatch."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", src, flags=re.DOTALL)
    decl = re.compile(r"((?:@\s*\w+\s*(?:\([^)]*\))?\s*)+)\bvar\b\s*(?:<[^>]*>)?\s*(\w+)")
    binding = re.compile(r"@\s*binding\s*\(\s*(\d+)\s*\)")
    found = [(binding.search(m.group(1)), m.group(2)) for m in decl.finditer(code)]
    return [f"@binding({b.group(1)}) {n}" for b, n in found if b and len(re.findall(rf"\b{n}\b", code)) == 1]


def check_interface(family: str, name: str, wgsl: str) -> Kernel:
    """The shipped kernel whose bindings `wgsl` declares (same set of @group/@binding, address
    space and access; where several match, the one with the same binding types), checked for its
    struct Params too; VariantInterfaceError otherwise."""
    got = _bindings(wgsl)
    shipped = [k for k in KERNELS[family].values() if (family, k.name) in SHIPPED]
    alike = [k for k in shipped if _bindings(k.source()) == got]
    if alike:
        OPS[OP_OF_FAMILY[family]].params.check(wgsl, f"{family}/{name}")

        types = _binding_types(wgsl)
        return next((k for k in alike if _binding_types(k.source()) == types), alike[0])
    want = _bindings(shipped[0].source())

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


def register_variant(family: str, name: str, wgsl: str, doc: str = "user variant", faulty: bool = False,
                     compile: Callable[[str, str], Any] | None = None) -> Kernel:  # fmt: skip
    """Add a user's WGSL kernel to an existing family, with the family's interface. `compile(wgsl,
    label)` compiles it now (the GPU's, handed down by labkit.gpu.shader.register_variant, which
    `labkit.register_variant` is): a compile error is a ShaderCompileError with the WGSL line and the
    compiler's text; bindings that differ, or one never used, are a VariantInterfaceError, a different
    struct Params a KernelInterfaceError."""
    family = resolve_family(family)
    if family in POLICIES or family == "sampling":
        raise UnknownVariantError(f"{family} variants are host-side (policies or samplers), not WGSL")
    if family not in KERNELS:
        raise UnknownVariantError(f"unknown op family {family!r}; families: {', '.join(variants())}")
    if (family, name) in SHIPPED or name == "default":
        raise UnknownVariantError(f"{family}/{name} is a shipped variant; register yours under another name")
    like = check_interface(family, name, wgsl)  # the interface first: a renamed field also breaks compiling
    if compile is not None:
        compile(wgsl, f"{family}/{name}")
    unread = _unread_bindings(wgsl)  # after compiling: a line that does not compile may be what reads it
    if unread:
        raise VariantInterfaceError(
            f"{family}/{name}: {', '.join(unread)} declared but never used: WebGPU drops an unused binding from "
            "the kernel's layout, and the family binds every one; read it (where it is optional, behind a "
            "check of its Params field)"
        )
    kernel = Kernel(family, name, doc, lambda shape: wgsl, faulty=faulty, reads=like.reads, workgroups=like.workgroups,
                    repack=like.repack)  # fmt: skip
    KERNELS[family][name] = kernel
    global _GENERATION
    _GENERATION += 1
    return kernel


_GENERATION = 0  # bumped by every registration: a cached selection of kernels is stale after one


def registry_generation() -> int:
    """How many user variants were registered so far (a kernel of the same name may be replaced)."""
    return _GENERATION
