"""A fast path for the C type strings wgpu-native's cffi bindings name, parsed once per process.

wgpu-py's wgpu-native backend uses cffi in ABI mode, and writes each struct it passes to the
driver as `ffi.new("WGPUBindGroupDescriptor *")`. cffi parses a type string it has not seen by
running pycparser over a preamble that declares every typedef of the header (about 440 lines):
about 40 ms a string on this kind of machine, and a first pass names some 46 of them, so every
process that touches the GPU paid 1.7 s before its first dispatch (a third of a SmolLM2 process's
first run; every notebook kernel and CLI call pays it).

Almost all of those strings are "NAME *" or "NAME[]" over a typedef the header declared or a C
primitive. For those, the type is cffi's own model object for a pointer to, or an array of, that
type: built here from the parser's declarations, it is the object the full parse returns (the tests
compare both for every string a pass uses). Anything else takes cffi's own path unchanged.
"""

from __future__ import annotations

import re
from typing import Any

_SIMPLE = re.compile(r"\s*(\w+)\s*(\*|\[\])?\s*")


def simple_type(parser: Any, cdecl: str) -> Any | None:
    """cffi's type for "NAME", "NAME *" or "NAME[]", NAME a declared typedef (as cffi looks names
    up: the header's typedefs first) or a C primitive; None for anything else."""
    from cffi import model

    m = _SIMPLE.fullmatch(cdecl)
    if m is None:
        return None
    name, suffix = m[1], m[2]
    declared = parser._declarations.get("typedef " + name)
    if declared is not None:
        base, quals = declared
        if quals:  # a qualified typedef: leave it to the full parse
            return None
    elif name in model.PrimitiveType.ALL_PRIMITIVE_TYPES:
        base = model.PrimitiveType(name)
    else:
        return None
    if suffix is None:
        return base
    return model.PointerType(base) if suffix == "*" else model.ArrayType(base, None)


def install(ffi: Any) -> None:
    """Give `ffi`'s parser the fast path (once; idempotent)."""
    parser = ffi._parser
    if getattr(parser, "_labkit_fast_types", False):
        return
    full = parser.parse_type

    def parse_type(cdecl: str) -> Any:
        fast = simple_type(parser, cdecl)
        return full(cdecl) if fast is None else fast

    parser.parse_type = parse_type
    parser._labkit_fast_types = True


def install_for_wgpu() -> None:
    """The fast path on wgpu-native's ffi, where that backend and cffi's parser are as expected."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi
    except ImportError:  # another backend: nothing to speed up
        return
    if hasattr(getattr(ffi, "_parser", None), "_declarations"):
        install(ffi)
