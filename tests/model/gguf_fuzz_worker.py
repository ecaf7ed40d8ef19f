"""The GGUF fuzzer's worker: structure-level and byte-level mutants of valid files, each opened the
way a user's file is opened, in a process of its own under an address-space cap.

Run by tests/model/test_gguf_fuzz.py as `python gguf_fuzz_worker.py SEED CAP_BYTES SOURCE:PATH:N:SECONDS ...`;
prints one JSON line: cases per outcome, and every case where anything but a labkit.errors
exception escaped (a bare MemoryError under the cap counts as one). SOURCE "tiny" files are small
whole models (a mutant that opens runs a reference pass); "header" files are real models, of
which the header is mutated and the data left as a sparse tail of the original length.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import struct
import sys
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf_struct import (
    ARRAY,
    BOOL,
    F32,
    F64,
    STRING,
    U32,
    Layout,
    array,
    read_layout,
    scalar,
    string,
    walk,
)

GGML_TYPES = sorted(int(t) for t in GGML_QUANT_SIZES)
HUGE = [0, 1, 2, 3, 7, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def pick(values: list, rng: np.random.Generator):
    """One of the values as it is (rng.choice would round 2**64 - 1 through a float)."""
    return values[int(rng.integers(len(values)))]


def field_values(kind: str, old: int, rng: np.random.Generator) -> list[int]:
    """Values worth writing into a structural field of this kind."""
    near = [max(old - 1, 0), old + 1, old * 2, old // 2]
    if kind in ("value type", "array item type"):
        return list(range(14)) + [99, 2**32 - 1]
    if kind == "tensor type":
        return GGML_TYPES + [4, 5, 40, 99, 2**31]
    if kind == "tensor dimension count":
        return [0, 1, 2, 3, 4, 5, 8, 2**32 - 1]
    if kind == "tensor offset":
        return [*near, old + 4, old + 32, max(old - 32, 0), 0, 2**40, 2**64 - 32]
    if kind == "version":
        return [0, 1, 2, 3, 4, 3 << 24]
    return [*near, *HUGE, int(rng.integers(0, 2**16))]


def patch_field(data: bytes, fields: list[tuple[int, int, str]], rng: np.random.Generator) -> bytes:
    """One structural field (a count, length, type, dimension or offset) set to a telling value."""
    kinds = sorted({k for _, _, k in fields})
    kind = pick(kinds, rng)
    at, width, _ = pick([f for f in fields if f[2] == kind], rng)
    code = "<I" if width == 4 else "<Q"
    (old,) = struct.unpack_from(code, data, at)
    value = pick(field_values(kind, old, rng), rng) % (2 ** (8 * width))
    b = bytearray(data)
    struct.pack_into(code, b, at, value)
    return bytes(b)


INT_KEYS = ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
            "attention.head_count_kv", "attention.key_length", "context_length", "rope.dimension_count",
            "vocab_size", "attention.value_length"]  # fmt: skip
FLOAT_KEYS = ["rope.freq_base", "attention.layer_norm_rms_epsilon", "rope.scaling.factor",
              "rope.scaling.yarn_log_multiplier", "rope.scaling.attn_factor"]  # fmt: skip
FLOATS = [0.0, -1.0, 5e-324, 1e-30, 1e30, 1e308, float("inf"), float("nan"), -1 / (0.1 * 1.3862943611198906)]


def mutate_layout(L: Layout, rng: np.random.Generator) -> Layout:
    """A file rewritten with one change to its keys or tensor table (tiny files: cheap to write)."""
    arch = next(v[8:].decode() for k, _, v in L.kvs if k == "general.architecture")
    kind = int(rng.integers(0, 9))
    if kind == 0:  # an integer hyperparameter set to a telling value
        return L.set(f"{arch}.{pick(INT_KEYS, rng)}", scalar(U32, pick([0, 1, 2, 3, 5, 7, 64, 1000, 2**31], rng)))
    if kind == 1:  # a float hyperparameter, in either width, under YaRN scaling half the time
        value = pick(FLOATS, rng)
        wide = rng.integers(2) or value == 1e308  # float32 cannot hold 1e308
        L = L.set(f"{arch}.{pick(FLOAT_KEYS, rng)}", scalar(F64, value) if wide else scalar(F32, value))
        return L.set(f"{arch}.rope.scaling.type", string("yarn")) if rng.integers(2) else L
    if kind == 2:  # a key's value of another type
        key = pick([k for k, _, _ in L.kvs], rng)
        other = pick([string("2"), scalar(F32, 2.0), scalar(BOOL, True), scalar(U32, 2), array(U32, [2, 2]),
                      array(STRING, ["a"]), (ARRAY, struct.pack("<IQ", ARRAY, 0))], rng)  # fmt: skip
        return L.set(key, other)
    if kind == 3:  # a key dropped
        return L.drop_key(pick([k for k, _, _ in L.kvs], rng))
    if kind == 4:  # a key written twice
        return replace(L, kvs=[*L.kvs, pick(L.kvs, rng)])
    t = pick(L.tensors, rng)
    if kind == 5:  # a tensor dropped, or written twice
        drop = rng.integers(2) == 0
        tensors = [x for x in L.tensors if x is not t] if drop else [*L.tensors, t]
        return replace(L, tensors=tensors)
    if kind == 6:  # its dimensions reversed, cut or grown
        ne = pick([t.ne[::-1], [t.ne[0] // 2, *t.ne[1:]], [*t.ne, 1], t.ne[:1], [t.ne[0] * 2, *t.ne[1:]]], rng)
        return L.with_tensor(t.name, ne=ne)
    if kind == 7:  # another type, the bytes kept
        return L.with_tensor(t.name, ggml_type=pick(GGML_TYPES + [99], rng))
    return L.with_tensor(t.name, offset=pick([0, 4, 32, 2**20], rng))


def mutate_bytes(data: bytes, rng: np.random.Generator) -> bytes:
    """Byte-level: a few bytes flipped, a run overwritten, or the file cut."""
    b = bytearray(data)
    kind = rng.integers(0, 3)
    if kind == 0:
        for i in rng.integers(4, len(b), size=int(rng.integers(1, 8))):
            b[i] ^= int(rng.integers(1, 256))
    elif kind == 1:
        i = int(rng.integers(4, len(b)))
        b[i : i + 16] = rng.integers(0, 256, size=16, dtype=np.uint8).tobytes()
    else:
        del b[int(rng.integers(0, len(b))) :]
    return bytes(b)


def try_case(path: Path, run: bool) -> str:
    """The outcome's name: an error class, "opened" or "ran"; raises what should not escape."""
    import labkit
    from labkit.errors import LabkitError

    try:
        lab = labkit.open(path)
        if not run:
            return "opened"
        out = lab.reference([1, 2, 3], names=["logits"])
        assert out["logits"].shape[-1] == lab.config.vocab_size
        return "ran"
    except LabkitError as e:
        return type(e).__name__


def fuzz_source(kind: str, src: Path, n: int, seconds: float, rng: np.random.Generator, tmp: Path) -> Counter:
    original = src.read_bytes() if kind == "tiny" else _header_of(src)
    size = src.stat().st_size
    walker = walk(original)[0]
    layout, fields = read_layout(original) if kind == "tiny" else (None, walker.fields)
    header = original[: walker.pos]
    outcomes: Counter = Counter()
    t0, runs = time.perf_counter(), 0  # data-only mutants run so far
    for i in range(n):
        if time.perf_counter() - t0 > seconds:
            break
        how = int(rng.integers(0, 10))
        if kind == "tiny" and how < 4:
            case, label = mutate_layout(layout, rng).to_bytes(), "layout"
        elif how < 9:
            case, label = patch_field(original, fields, rng), "field"
        else:
            case, label = mutate_bytes(original, rng), "bytes"
        path = tmp / f"{kind}-{i}.gguf"
        with open(path, "wb") as f:
            f.write(case)
            if kind == "header":
                f.truncate(size)  # the data, as a sparse tail: the header is what is mutated
        header_changed = case[: len(header)] != header
        before = peak_rss_kb()
        try:  # every tiny mutant that opens with another header runs; of data-only ones, the first ten
            outcome = try_case(path, run=kind == "tiny" and (header_changed or runs < 10))
        except Exception as e:  # noqa: BLE001 (the point: nothing else may escape)
            outcome = "ESCAPED"
            outcomes[f"escaped: {label} case {i} of {src.name}: {type(e).__name__}: {str(e)[:200]}"] += 1
        runs += outcome == "ran" and not header_changed
        grew = peak_rss_kb() - before
        if grew > 100 << 10:  # a case that raised the peak by over 100 MB: named in the report
            outcomes[f"grew: {grew >> 10} MB, {label} case {i} of {src.name} ({outcome})"] += 1
        outcomes[outcome] += 1
        outcomes["structure-level" if label != "bytes" else "byte-level"] += 1
        path.unlink()
        if kind == "header":
            gc.collect()  # a Lab's cycles hold the map of a file the size of the real model
    return outcomes


def _header_of(src: Path) -> bytes:
    """The bytes up to the end of the tensor table (a real model's header, its vocabulary included)."""
    with open(src, "rb") as f:
        data = f.read(64 << 20)
    return data[: walk(data)[0].pos]


def main(argv: list[str]) -> None:
    seed, cap = int(argv[0]), int(argv[1])
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    warnings.simplefilter("ignore")  # mutants with tensors no stage reads warn, as they should
    rng = np.random.default_rng(seed)
    total: Counter = Counter()
    from labkit import progress

    with tempfile.TemporaryDirectory() as tmp, progress.quiet():
        for spec in argv[2:]:
            kind, path, n, seconds = spec.split(":")
            total += fuzz_source(kind, Path(path), int(n), float(seconds), rng, Path(tmp))
    print(json.dumps({"outcomes": dict(total), "maxrss_kb": peak_rss_kb(), "pid": os.getpid()}))


def peak_rss_kb() -> int:
    """This process's own peak RSS (VmHWM: ru_maxrss survives exec, so it would report the parent's)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")))


if __name__ == "__main__":
    main(sys.argv[1:])
