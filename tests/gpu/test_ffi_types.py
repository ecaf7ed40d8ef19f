"""The fast path for cffi's type strings (labkit.gpu.ffi_types) gives cffi's own types.

Checked against cffi's full parse (pycparser over the header's typedefs) for every type string
wgpu-native's ffi has named once a real pass and a decode step ran, and on a small cdef of our
own for the forms that must fall back.
"""

from __future__ import annotations

import cffi

import labkit
from labkit.gpu.ffi_types import install, simple_type


def full_parse(parser, cdecl: str):
    """cffi's own parse, past any fast path installed on the instance."""
    return type(parser).parse_type(parser, cdecl)


def test_every_type_string_of_a_pass_is_cffis_own_type(tiny_model):
    from wgpu.backends.wgpu_native._ffi import ffi

    lab = labkit.open(tiny_model("llama"))
    lab.run([1, 2, 3])
    lab.generate([1, 2], max_new_tokens=2)
    names = [k for k in ffi._parsed_types if isinstance(k, str)]
    fast = 0
    for cdecl in names:
        got = simple_type(ffi._parser, cdecl)
        if got is None:
            continue
        fast += 1
        want = full_parse(ffi._parser, cdecl)
        assert got == want, f"{cdecl!r}: {got} != {want}"
        with ffi._lock:  # cffi's ctype cache is read under its lock
            same = ffi._get_cached_btype(got) is ffi._get_cached_btype(want)
        assert same and ffi._parsed_types[cdecl][0] is ffi.typeof(cdecl), cdecl
    assert getattr(ffi._parser, "_labkit_fast_types", False), "get_device installs the fast path"
    assert fast >= 40, f"only {fast} of {len(names)} strings took the fast path: {sorted(names)}"


def test_other_forms_take_cffis_own_parse():
    ffi = cffi.FFI()
    ffi.cdef("typedef struct { int a; float b[3]; } Foo; typedef const Foo CFoo; struct Bar { int x; };")
    install(ffi)
    install(ffi)  # idempotent
    p = ffi._parser
    assert simple_type(p, "Foo *") == full_parse(p, "Foo *")
    assert simple_type(p, "Foo[]") == full_parse(p, "Foo[]")
    for prim in ("int", "uint8_t *", "char[]", "intptr_t"):
        assert simple_type(p, prim) == full_parse(p, prim), prim
    for other in ("CFoo *", "struct Bar *", "unsigned int *", "Foo[4]", "Foo **", "void(Foo *, int)", "Unknown *"):
        assert simple_type(p, other) is None, other
    arr = ffi.new("Foo[]", 2)  # both paths give usable types
    arr[1].b[2] = 1.5
    assert ffi.sizeof(arr) == 2 * ffi.sizeof("Foo") and arr[1].b[2] == 1.5
    assert ffi.typeof("CFoo *") is ffi.typeof("CFoo *")
