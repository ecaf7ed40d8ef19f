"""A struct-level GGUF reader and writer for the tests, independent of labkit's reader.

`gguf.GGUFWriter` refuses to write most malformed files, so the corpus and the fuzzer write their
own bytes: a valid file is read into a `Layout` (keys with their raw value bytes, tensor rows with
their data), changed, and written back; `fields()` lists the byte position of every structural
field (counts, lengths, types, dimensions, offsets) for in-place mutation.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field, replace

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR_CODES = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
                U64: "<Q", I64: "<q", F64: "<d"}  # fmt: skip


def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b)) + b


def scalar(vtype: int, v) -> tuple[int, bytes]:
    return vtype, struct.pack(SCALAR_CODES[vtype], v)


def string(s: str) -> tuple[int, bytes]:
    return STRING, gstr(s)


def array(item_type: int, items: list, count: int | None = None) -> tuple[int, bytes]:
    """(ARRAY, payload); `count` overrides the written count (a lie about the length)."""
    n = len(items) if count is None else count
    body = b"".join(gstr(x) if item_type == STRING else struct.pack(SCALAR_CODES[item_type], x) for x in items)
    return ARRAY, u32(item_type) + u64(n) + body


@dataclass
class Tensor:
    name: str
    ne: list[int]  # ggml order: ne[0] is the row length
    ggml_type: int
    data: bytes
    offset: int | None = None  # relative to the data section; None: laid after the previous one


@dataclass
class Layout:
    """A GGUF file as fields: everything `to_bytes` needs, each overridable to write a defect."""

    version: int = 3
    kvs: list[tuple[str, int, bytes]] = field(default_factory=list)  # (key, value type, value bytes)
    tensors: list[Tensor] = field(default_factory=list)
    alignment: int = 32
    magic: bytes = b"GGUF"
    n_tensors: int | None = None  # None: the true counts
    n_kv: int | None = None

    def key(self, name: str) -> int:
        return next(i for i, (k, _, _) in enumerate(self.kvs) if k == name)

    def set(self, name: str, value: tuple[int, bytes]) -> Layout:
        """A copy with key `name` given another value (added when absent)."""
        kvs = list(self.kvs)
        entry = (name, *value)
        try:
            kvs[self.key(name)] = entry
        except StopIteration:
            kvs.append(entry)
        return replace(self, kvs=kvs)

    def drop_key(self, name: str) -> Layout:
        return replace(self, kvs=[kv for kv in self.kvs if kv[0] != name])

    def tensor(self, name: str) -> int:
        return next(i for i, t in enumerate(self.tensors) if t.name == name)

    def with_tensor(self, which: str, **changes) -> Layout:
        tensors = list(self.tensors)
        i = self.tensor(which)
        tensors[i] = replace(tensors[i], **changes)
        return replace(self, tensors=tensors)

    def to_bytes(self) -> bytes:
        head = [self.magic, u32(self.version)]
        head += [u64(len(self.tensors) if self.n_tensors is None else self.n_tensors)]
        head += [u64(len(self.kvs) if self.n_kv is None else self.n_kv)]
        head += [gstr(k) + u32(t) + v for k, t, v in self.kvs]
        offsets, at = [], 0
        for t in self.tensors:
            off = at if t.offset is None else t.offset
            offsets.append(off)
            at = max(at, off + len(t.data))
            at = -(-at // self.alignment) * self.alignment
        for t, off in zip(self.tensors, offsets):
            head.append(gstr(t.name) + u32(len(t.ne)) + b"".join(u64(d) for d in t.ne) + u32(t.ggml_type) + u64(off))
        header = b"".join(head)
        pad = -len(header) % self.alignment
        blob = bytearray(at)
        for t, off in zip(self.tensors, offsets):
            blob[off : off + len(t.data)] = t.data
        return header + b"\0" * pad + bytes(blob)


class _Walker:
    def __init__(self, b: bytes):
        self.b, self.pos = b, 0
        self.fields: list[tuple[int, int, str]] = []  # (byte position, width, kind)

    def take(self, n: int) -> bytes:
        out = self.b[self.pos : self.pos + n]
        self.pos += n
        return out

    def num(self, code: str, kind: str | None = None) -> int:
        if kind:
            self.fields.append((self.pos, struct.calcsize(code), kind))
        return struct.unpack(code, self.take(struct.calcsize(code)))[0]

    def string(self, kind: str = "string length") -> bytes:
        return self.take(self.num("<Q", kind))

    def value(self, vtype: int) -> None:
        if vtype == STRING:
            self.string()
        elif vtype == ARRAY:
            item = self.num("<I", "array item type")
            n = self.num("<Q", "array count")
            for _ in range(n):
                self.value(item)
        else:
            self.take(struct.calcsize(SCALAR_CODES[vtype]))


def walk(b: bytes) -> tuple[_Walker, list[tuple[str, int, bytes]], list[tuple[str, list[int], int, int]]]:
    """Walk a file's header: (the walker, past the tensor table), its keys and its tensor rows."""
    w = _Walker(b)
    assert w.take(4) == b"GGUF"
    w.num("<I", "version")
    n_tensors, n_kv = w.num("<Q", "tensor count"), w.num("<Q", "key count")
    kvs = []
    for _ in range(n_kv):
        key = w.string("key length").decode()
        vtype = w.num("<I", "value type")
        start = w.pos
        w.value(vtype)
        kvs.append((key, vtype, b[start : w.pos]))
    rows = []
    for _ in range(n_tensors):
        name = w.string("tensor name length").decode()
        n_dims = w.num("<I", "tensor dimension count")
        ne = [w.num("<Q", "tensor dimension") for _ in range(n_dims)]
        rows.append((name, ne, w.num("<I", "tensor type"), w.num("<Q", "tensor offset")))
    return w, kvs, rows


def read_layout(b: bytes) -> tuple[Layout, list[tuple[int, int, str]]]:
    """A valid file's Layout, and its structural fields as (byte position, width, kind)."""
    w, kvs, rows = walk(b)
    version = struct.unpack_from("<I", b, 4)[0]
    alignment = next((struct.unpack("<I", v)[0] for k, _, v in kvs if k == "general.alignment"), 32)
    data_start = -(-w.pos // alignment) * alignment
    starts = sorted(off for *_, off in rows)
    size_of = dict(zip(starts, [b - a for a, b in zip(starts, [*starts[1:], len(b) - data_start])]))
    tensors = [Tensor(n, ne, t, b[data_start + off : data_start + off + size_of[off]]) for n, ne, t, off in rows]
    return Layout(version, kvs, tensors, alignment), w.fields
