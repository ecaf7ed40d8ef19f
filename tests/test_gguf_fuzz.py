"""Fuzzing the GGUF reader: mutated real headers and tiny files, where only labkit.errors may escape.

Every case is a file on disk that `labkit.open` reads the way a user's file is read: the header
parsed from the map, the config and the stage graph built from the metadata. Mutations: random
bytes flipped, length and count fields set to huge or zero values, type codes changed, and the
file cut at random places. A fresh seed per session, in every failure message; under 60 s.
"""

from __future__ import annotations

import struct
import time

import numpy as np
import pytest

import labkit
from labkit.errors import LabkitError
from labkit.model.gguf_file import open_gguf

SEED = int(np.random.SeedSequence().entropy % 2**32)
HEADER_BYTES = 1 << 20  # the first MiB of a real model: metadata, vocabulary, part of the tensor table


def pick(values: list[int], rng: np.random.Generator) -> int:
    """One of the Python ints (rng.choice would round 2**64 - 1 through a float)."""
    return values[int(rng.integers(len(values)))]


def mutate(data: bytes, rng: np.random.Generator) -> bytes:
    """One mutation of a GGUF file's bytes (the magic kept, mostly, so the parser goes deep)."""
    b = bytearray(data)
    kind = rng.integers(0, 6)
    n = len(b)
    if kind == 0:  # flip a few random bytes past the magic
        for i in rng.integers(4, n, size=int(rng.integers(1, 8))):
            b[i] ^= int(rng.integers(1, 256))
    elif kind == 1:  # a u64 length or count set to a huge, zero or off-by-one value
        i = int(rng.integers(8, n - 8))
        value = pick([0, 1, 2**31, 2**32 - 1, 2**63 - 1, 2**64 - 1, n, n + 1], rng)
        b[i : i + 8] = struct.pack("<Q", value)
    elif kind == 2:  # a u32 type code set to an unknown or another known code
        i = int(rng.integers(8, n - 4))
        b[i : i + 4] = struct.pack("<I", pick([0, 7, 8, 9, 12, 13, 39, 99, 2**32 - 1], rng))
    elif kind == 3:  # cut the file
        del b[int(rng.integers(0, n)) :]
    elif kind == 4:  # the header counts themselves
        off = pick([8, 16], rng)
        b[off : off + 8] = struct.pack("<Q", pick([0, 1, 3, 10**6, 2**40, 2**64 - 1], rng))
    else:  # a random run of bytes overwritten
        i = int(rng.integers(4, n))
        b[i : i + 16] = rng.integers(0, 256, size=16, dtype=np.uint8).tobytes()
    return bytes(b)


def check_file(path, data: bytes, what: str) -> None:
    path.write_bytes(data)
    try:
        open_gguf(path)
        labkit.open(path)
    except LabkitError:
        pass
    except Exception as e:  # noqa: BLE001 (the point: nothing else may escape)
        pytest.fail(f"{what}: {type(e).__name__} escaped: {e}")


@pytest.mark.parametrize("source", ["tiny", "gemma3-header"])
def test_fuzz_gguf_reader(tmp_path, tiny_model, source):
    if source == "tiny":
        data = tiny_model("gemma3", "Q8_0").read_bytes()
        budget, n_cases = 25.0, 400
    else:
        from labkit.model.registry import resolve_model

        with open(resolve_model("gemma3-270m")[1], "rb") as f:
            data = f.read(HEADER_BYTES)
        budget, n_cases = 25.0, 150
    rng = np.random.default_rng(SEED + (0 if source == "tiny" else 1))
    t0, done = time.perf_counter(), 0
    for i in range(n_cases):
        if time.perf_counter() - t0 > budget:
            break
        case = mutate(data, rng)
        check_file(tmp_path / f"fuzz-{i}.gguf", case, f"{source} case {i} (seed {SEED})")
        done += 1
    assert done >= 50, f"only {done} cases in {budget} s"
