"""A corpus of malformed GGUF files, one per kind of defect, each refused with its own typed error.

Each file is a valid tiny llama (Q8_0) with one defect written at the struct level
(tests/model/gguf_struct.py: gguf.GGUFWriter refuses to write most of these). The defects are the ones
llama.cpp's gguf.cpp and llama-model-loader.cpp refuse, and the ones its fuzzing history and the
GGUF advisories found. Every file is refused by `labkit.open`, by `labkit info` and by `labkit run`
with one `labkit: error:` line and exit 1, and is left as it was on disk.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import replace

import numpy as np
import pytest
from gguf_struct import (
    ARRAY,
    BOOL,
    F32,
    F64,
    I32,
    STRING,
    U32,
    U64,
    Layout,
    array,
    gstr,
    read_layout,
    scalar,
    string,
    u32,
    u64,
)

import labkit
from labkit import cli
from labkit.errors import (
    DuplicateTensorError,
    GgufFormatError,
    HyperparameterError,
    MetadataKeyError,
    MetadataTypeError,
    MissingTensorError,
    ModelFileError,
    ModelFileWarning,
    TensorDimensionsError,
    TensorOffsetError,
    TensorShapeMismatchError,
    TensorTableError,
    TruncatedFileError,
    UnknownTensorTypeError,
    VocabularyError,
)

Q8_0 = 8


@pytest.fixture(scope="module")
def valid(tiny_model) -> tuple[bytes, Layout, int]:
    """The tiny file's bytes, its Layout, and where its tensor 8's table entry starts."""
    data = tiny_model("llama", "Q8_0").read_bytes()
    layout, fields = read_layout(data)
    assert layout.to_bytes() == data, "the struct-level writer must give back the file it read"
    return data, layout, [at for at, _, kind in fields if kind == "tensor name length"][8]


def _dup_key(L: Layout) -> Layout:  # a second block_count that would run another layer count
    return replace(L, kvs=[*L.kvs, ("llama.block_count", *scalar(U32, 1))])


def _empty_key(L: Layout) -> Layout:
    return replace(L, kvs=[("", *scalar(U32, 1)), *L.kvs])


def _dup_tensor(L: Layout) -> Layout:  # a second token_embd, all zeros: the one a lax reader keeps
    t = L.tensors[L.tensor("token_embd.weight")]
    return replace(L, tensors=[*L.tensors, replace(t, data=bytes(len(t.data)))])


def _nested(L: Layout) -> Layout:  # an array of arrays, nested 10 000 deep
    depth = 10_000
    payload = (u32(ARRAY) + u64(1)) * depth + u32(U32) + u64(1) + u32(7)
    return L.set("general.nested", (ARRAY, payload))


def _drop(L: Layout, name: str) -> Layout:
    return replace(L, tensors=[t for t in L.tensors if t.name != name])


def _narrow_embd(L: Layout) -> Layout:  # token_embd 224 wide in a 256-wide model
    t = L.tensors[L.tensor("token_embd.weight")]
    rows = t.ne[1]
    return L.with_tensor(t.name, ne=[224, rows], data=t.data[: rows * 224 // 32 * 34])


def _transposed(L: Layout) -> Layout:
    t = L.tensors[L.tensor("blk.0.ffn_up.weight")]
    return L.with_tensor(t.name, ne=t.ne[::-1])


def _offset(L: Layout, name: str, delta: int) -> Layout:
    offsets, at = {}, 0
    for t in L.tensors:
        offsets[t.name] = at
        at = -(-(at + len(t.data)) // L.alignment) * L.alignment
    return L.with_tensor(name, offset=offsets[name] + delta)


def _overlap(L: Layout) -> Layout:
    first, second = L.tensors[0], L.tensors[1]
    return L.with_tensor(second.name, offset=0 if first.offset is None else first.offset)


def _cut(data: bytes, at: int) -> bytes:
    return data[:at]


def _string_past_end(L: Layout) -> Layout:
    return L.set("general.name", (STRING, u64(10**9) + b"labkit"))


def _array_past_end(L: Layout) -> Layout:
    return L.set("general.tags", (ARRAY, u32(U32) + u64(2**40) + u32(1)))


def _strings_past_end(L: Layout) -> Layout:
    return L.set("general.tags", (ARRAY, u32(STRING) + u64(10**7) + gstr("a")))


def _yarn(factor: float, log_mul: float):
    def change(L: Layout) -> Layout:
        L = L.set("llama.rope.scaling.type", string("yarn")).set("llama.rope.scaling.factor", scalar(F64, factor))
        return L.set("llama.rope.scaling.yarn_log_multiplier", scalar(F64, log_mul))

    return change


def _scores(n: int):
    return lambda L: L.set("tokenizer.ggml.scores", array(F32, [0.5] * n))


# (id, defect: Layout -> Layout | bytes -> bytes, error class, message fragment)
LAYOUT_DEFECTS = [
    ("bad magic", lambda L: replace(L, magic=b"GGUG"), GgufFormatError, "not a GGUF file"),
    ("version 1", lambda L: replace(L, version=1), GgufFormatError, "version 1"),
    ("big-endian version", lambda L: replace(L, version=3 << 24), GgufFormatError, "big-endian"),
    ("tensor count past the file", lambda L: replace(L, n_tensors=2**40), GgufFormatError, "can hold"),
    ("key count past the file", lambda L: replace(L, n_kv=2**62), GgufFormatError, "can hold"),
    ("string length past the file", _string_past_end, TruncatedFileError, "general.name"),
    ("array count past the file", _array_past_end, TruncatedFileError, "general.tags"),
    ("string array count past the file", _strings_past_end, TruncatedFileError, "claims 10000000 strings"),
    ("value type 13", lambda L: L.set("general.odd", (13, u32(0))), GgufFormatError, "value type 13"),
    ("array of type 99", lambda L: L.set("general.odd", (ARRAY, u32(99) + u64(0))), GgufFormatError, "type 99"),
    ("deeply nested arrays", _nested, GgufFormatError, "nested arrays"),
    ("empty key", _empty_key, MetadataKeyError, "is empty"),
    ("key written twice", _dup_key, MetadataKeyError, "'llama.block_count' is written twice"),
    (
        "block_count as a string",
        lambda L: L.set("llama.block_count", string("2")),
        MetadataTypeError,
        "llama.block_count is a string",
    ),
    ("block_count as a float", lambda L: L.set("llama.block_count", scalar(F32, 2.0)), MetadataTypeError, "a float"),
    (
        "head_count as strings",
        lambda L: L.set("llama.attention.head_count", array(STRING, ["4", "4"])),
        MetadataTypeError,
        "an array of strings",
    ),
    (
        "rope base as an integer",
        lambda L: L.set("llama.rope.freq_base", scalar(U32, 10000)),
        MetadataTypeError,
        "llama.rope.freq_base is an integer",
    ),
    (
        "add_bos_token as u8",
        lambda L: L.set("tokenizer.ggml.add_bos_token", scalar(0, 1)),
        MetadataTypeError,
        "add_bos_token",
    ),
    (
        "tokens as integers",
        lambda L: L.set("tokenizer.ggml.tokens", array(I32, list(range(512)))),
        MetadataTypeError,
        "tokenizer.ggml.tokens is an array of integers",
    ),
    (
        "alignment not a power of two",
        lambda L: L.set("general.alignment", scalar(U32, 48)),
        GgufFormatError,
        "not a power of two",
    ),
    ("alignment as u64", lambda L: L.set("general.alignment", scalar(U64, 32)), MetadataTypeError, "general.alignment"),
    ("alignment zero", lambda L: L.set("general.alignment", scalar(U32, 0)), GgufFormatError, "power of two"),
    (
        "5 dimensions",
        lambda L: L.with_tensor("output_norm.weight", ne=[256, 1, 1, 1, 1]),
        TensorDimensionsError,
        "5 dimensions",
    ),
    (
        "0 dimensions: a scalar, as gguf.cpp reads it",
        lambda L: L.with_tensor("output_norm.weight", ne=[]),
        TensorShapeMismatchError,
        r"'output_norm.weight' has shape \[1\].*\[256\]",
    ),
    (
        "a zero dimension",
        lambda L: L.with_tensor("blk.0.attn_q.weight", ne=[256, 0]),
        TensorDimensionsError,
        "zero dimension",
    ),
    (
        "dimensions past int64",
        lambda L: L.with_tensor("blk.0.attn_q.weight", ne=[2**32, 2**32]),
        TensorDimensionsError,
        "past int64",
    ),
    (
        "a negative dimension",
        lambda L: L.with_tensor("blk.0.attn_q.weight", ne=[256, 2**64 - 256]),
        TensorDimensionsError,
        "negative dimension",
    ),
    (
        "a string array past labkit's limit",
        lambda L: L.set("general.tags", (ARRAY, u32(STRING) + u64(2**25))),
        GgufFormatError,
        "at most 16777216",
    ),
    (
        "a per-layer head count of 0",
        lambda L: L.set("llama.attention.head_count", array(U32, [4, 0])),
        HyperparameterError,
        r"head_count\[1\] is 0",
    ),
    (
        "value_length 0",
        lambda L: L.set("llama.attention.value_length", scalar(U32, 0)),
        HyperparameterError,
        "value_length is 0",
    ),
    ("a rope factor whose reciprocal overflows", _yarn(5e-324, 0.0), HyperparameterError, "rope.scaling.factor"),
    (
        "a YaRN multiplier that zeroes its magnitude",
        _yarn(4.0, -1 / (0.1 * math.log(4.0))),
        HyperparameterError,
        "yarn_log_multiplier",
    ),
    (
        "unknown ggml type",
        lambda L: L.with_tensor("blk.0.attn_q.weight", ggml_type=99),
        UnknownTensorTypeError,
        "ggml type 99",
    ),
    (
        "a removed ggml type (Q4_2)",
        lambda L: L.with_tensor("blk.0.attn_q.weight", ggml_type=4),
        UnknownTensorTypeError,
        "ggml type 4",
    ),
    (
        "row not a whole number of blocks",
        lambda L: L.with_tensor("blk.0.attn_q.weight", ne=[100, 256]),
        TensorDimensionsError,
        "Q8_0 blocks of 32",
    ),
    ("name of 64 bytes", lambda L: L.with_tensor("output_norm.weight", name="n" * 64), TensorTableError, "64 bytes"),
    ("two tensors named alike", _dup_tensor, DuplicateTensorError, "'token_embd.weight'"),
    (
        "offset not aligned",
        lambda L: _offset(L, "blk.0.attn_k.weight", 4),
        TensorOffsetError,
        "not a multiple of general.alignment",
    ),
    ("tensors overlapping", _overlap, TensorOffsetError, "overlap"),
    ("a gap between tensors", lambda L: _offset(L, "blk.1.attn_k.weight", 64), TensorOffsetError, "back to back"),
    (
        "a tensor past the end",
        lambda L: _offset(L, L.tensors[-1].name, 2**20).to_bytes()[: len(L.to_bytes())],
        TruncatedFileError,
        "needs bytes up to",
    ),
    (
        "head_count 0",
        lambda L: L.set("llama.attention.head_count", scalar(U32, 0)),
        HyperparameterError,
        "head_count is 0",
    ),
    (
        "head_count_kv 3 of 4 heads",
        lambda L: L.set("llama.attention.head_count_kv", scalar(U32, 3)),
        HyperparameterError,
        "not a multiple of head_count_kv 3",
    ),
    (
        "embedding_length 0",
        lambda L: L.set("llama.embedding_length", scalar(U32, 0)),
        HyperparameterError,
        "embedding_length is 0",
    ),
    (
        "block_count 10^9",
        lambda L: L.set("llama.block_count", scalar(U32, 10**9)),
        HyperparameterError,
        "block_count is 1000000000",
    ),
    (
        "block_count past the layers",
        lambda L: L.set("llama.block_count", scalar(U32, 3)),
        HyperparameterError,
        "block_count is 3, but the file has tensors for 2 layer",
    ),
    ("block_count missing", lambda L: L.drop_key("llama.block_count"), HyperparameterError, "lacks required key"),
    (
        "per-layer head counts of another length",
        lambda L: L.set("llama.attention.head_count", array(U32, [4, 4, 4])),
        HyperparameterError,
        "3 entries",
    ),
    ("rope dims odd", lambda L: L.set("llama.rope.dimension_count", scalar(U32, 63)), HyperparameterError, "even"),
    (
        "rope dims past the head",
        lambda L: L.set("llama.rope.dimension_count", scalar(U32, 128)),
        HyperparameterError,
        "rope.dimension_count is 128",
    ),
    (
        "rope base NaN",
        lambda L: L.set("llama.rope.freq_base", scalar(F32, float("nan"))),
        HyperparameterError,
        "freq_base is nan",
    ),
    (
        "rms epsilon negative",
        lambda L: L.set("llama.attention.layer_norm_rms_epsilon", scalar(F64, -1e-5)),
        HyperparameterError,
        "epsilon is -1e-05",
    ),
    ("token_embd narrower than the model", _narrow_embd, TensorShapeMismatchError, r"\[512, 224\].*\[512, 256\]"),
    ("a weight stored transposed", _transposed, TensorShapeMismatchError, "transposed"),
    (
        "a layer's tensor missing",
        lambda L: _drop(L, "blk.1.ffn_down.weight"),
        MissingTensorError,
        "'blk.1.ffn_down.weight'",
    ),
    (
        "vocabulary narrower than vocab_size",
        lambda L: L.set("tokenizer.ggml.tokens", array(STRING, ["a", "b"])),
        VocabularyError,
        "2 tokens",
    ),
    ("scores of another length", _scores(7), VocabularyError, "scores has 7 entries for 512 tokens"),
    (
        "token types of another length",
        lambda L: L.set("tokenizer.ggml.token_type", array(I32, [1] * 3)),
        VocabularyError,
        "token_type has 3 entries",
    ),
    (
        "no vocabulary",
        lambda L: L.drop_key("tokenizer.ggml.tokens").drop_key("llama.vocab_size"),
        VocabularyError,
        "no vocabulary",
    ),
    ("vocab_size a bool", lambda L: L.set("llama.vocab_size", scalar(BOOL, True)), MetadataTypeError, "a bool"),
]
BYTE_DEFECTS = [  # (id, bytes -> bytes, class, fragment)
    ("cut inside the keys", lambda b: _cut(b, 200), TruncatedFileError, "can hold"),
    ("cut inside the vocabulary", lambda b: _cut(b, 2000), TruncatedFileError, "tokenizer.ggml.tokens"),
    ("cut inside the tensor table", None, TruncatedFileError, "tensor 8's table entry"),
    ("last tensor cut short", lambda b: _cut(b, len(b) - 100), TruncatedFileError, "truncated file"),
    ("too short to be GGUF", lambda b: _cut(b, 10), TruncatedFileError, "too short"),
]


def _check_refused(path, cls, fragment, capsys) -> None:
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with pytest.raises(cls, match=fragment) as refused:
        labkit.open(path)
    assert isinstance(refused.value, ModelFileError), f"{type(refused.value).__name__} is no ModelFileError"
    for argv in (["info", str(path)], ["run", str(path), "--prompt", "hi", "--engine", "reference"]):
        capsys.readouterr()
        assert cli.main(argv) == 1, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("labkit: error: ") and "internal error" not in err[0], err
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before, "the file was changed on disk"


@pytest.mark.parametrize("what, defect, cls, fragment", LAYOUT_DEFECTS, ids=[d[0] for d in LAYOUT_DEFECTS])
def test_a_malformed_file_is_refused_with_its_typed_error(tmp_path, valid, capsys, what, defect, cls, fragment):
    path = tmp_path / "defect.gguf"
    out = defect(valid[1])
    path.write_bytes(out if isinstance(out, bytes) else out.to_bytes())
    _check_refused(path, cls, fragment, capsys)


@pytest.mark.parametrize("what, defect, cls, fragment", BYTE_DEFECTS, ids=[d[0] for d in BYTE_DEFECTS])
def test_a_cut_file_is_refused(tmp_path, valid, capsys, what, defect, cls, fragment):
    path = tmp_path / "cut.gguf"
    data, _, tensor_8 = valid
    path.write_bytes(defect(data) if defect else data[: tensor_8 + 11])
    _check_refused(path, cls, fragment, capsys)


def test_the_valid_file_opens_as_written(tmp_path, valid):
    path = tmp_path / "valid.gguf"
    path.write_bytes(valid[1].to_bytes())
    lab = labkit.open(path)
    assert lab.config.n_layers == 2 and len(lab.gguf.tensors) == len(valid[1].tensors)


def _length_at(data: bytes, text: bytes) -> int:
    """Where the u64 length before `text` (a key name or string value) sits in the file."""
    return data.index(struct.pack("<Q", len(text)) + text)


@pytest.mark.parametrize(
    "where, cls, fragment",
    [("tensor name", TensorTableError, "ggml allows 63"), ("key name", MetadataKeyError, "key names of fewer"),
     ("string value", GgufFormatError, "strings of at most")],
)  # fmt: skip
def test_a_length_spanning_the_file_is_refused_without_copying_it(tmp_path, valid, where, cls, fragment):
    """A misread length can reach the file's end: the name or string is refused from its length, and
    at most its first bytes are read (the fuzzer saw a 64 MiB key name reach 2.3 GB of peak RSS)."""
    import tracemalloc

    data, _, tensor_8 = valid
    at = {"tensor name": tensor_8, "key name": _length_at(data, b"general.architecture"),
          "string value": _length_at(data, b"llama")}[where]  # fmt: skip
    tail = 32 << 20
    b = bytearray(data)
    struct.pack_into("<Q", b, at, len(data) + tail - at - 64)
    path = tmp_path / "long_name.gguf"
    with open(path, "wb") as f:
        f.write(b)
        f.truncate(len(data) + tail)
    tracemalloc.start()
    try:
        with pytest.raises(cls, match=fragment):
            labkit.open(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < tail // 4, f"{peak / 2**20:.1f} MiB allocated to refuse one {where}"


def test_names_of_invalid_utf8_stay_apart(tmp_path, valid):
    """Two keys whose bytes differ are two keys, even where neither is UTF-8 (no duplicate made up)."""
    L = valid[1]
    kvs = [*L.kvs, ("general.X", *scalar(U32, 1)), ("general.Y", *scalar(U32, 2))]
    data = replace(L, kvs=kvs).to_bytes()
    path = tmp_path / "utf8.gguf"
    path.write_bytes(data.replace(b"general.X", b"general.\xff").replace(b"general.Y", b"general.\xfe"))
    meta = labkit.open(path).gguf.metadata
    assert meta["general.\\xff"] == 1 and meta["general.\\xfe"] == 2


def test_a_tensor_no_stage_reads_is_named_in_a_warning(tmp_path, valid):
    L = valid[1]
    extra = type(L.tensors[0])("blk.0.unused.weight", [32], 0, struct.pack("<32f", *np.ones(32)))
    path = tmp_path / "extra.gguf"
    path.write_bytes(replace(L, tensors=[*L.tensors, extra]).to_bytes())
    with pytest.warns(ModelFileWarning, match="blk.0.unused.weight"):
        lab = labkit.open(path)
    assert "blk.0.unused.weight" in lab.gguf.tensors


def test_merges_naming_tokens_the_vocabulary_lacks_are_refused(tmp_path, valid):
    L = valid[1].set("tokenizer.ggml.merges", array(STRING, ["<t1> <t2>", "<t1> <nope>"]))
    path = tmp_path / "merges.gguf"
    path.write_bytes(L.to_bytes())
    lab = labkit.open(path)  # the merges are read with the tokenizer, on first use
    with pytest.raises(VocabularyError, match=r"merges\[1\].*'<nope>'"):
        lab.tokenize("hello")
    bad = valid[1].set("tokenizer.ggml.merges", array(STRING, ["<t1><t2>"]))
    path.write_bytes(bad.to_bytes())
    with pytest.raises(VocabularyError, match="not two tokens"):
        labkit.open(path).tokenize("hello")


def test_a_per_layer_array_of_one_value_reads_as_that_value(tmp_path, valid):
    L = valid[1].set("llama.attention.head_count_kv", array(U32, [2, 2]))
    path = tmp_path / "per-layer.gguf"
    path.write_bytes(L.to_bytes())
    assert labkit.open(path).config.n_kv_heads == 2


def test_the_transformers_dumper_refuses_a_malformed_file_before_transformers_reads_it(tmp_path, valid, capsys):
    from labkit.dumps import hf_hooks

    path = tmp_path / "twice.gguf"
    path.write_bytes(_dup_key(valid[1]).to_bytes())
    assert hf_hooks.main([str(path), "--tokens", "1,2", "--out", str(tmp_path / "d.npz")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "written twice" in err[0] and not (tmp_path / "d.npz").exists()
