"""The memory plan (labkit.model.memory) and the streaming reference (labkit.model.weight_cache).

Expected values come from gguf.quants (an independent dequantizer) and from the reference run
under an unbounded budget; budgets in the tests are derived from each plan's own parts, so a
change in a part's size moves the budget with it and the check still bites where it should."""

from __future__ import annotations

import json
import warnings
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize as oracle_dequantize
from test_dequant import random_tensor

import labkit
from labkit.cli import main
from labkit.errors import InvalidArgumentError, MemoryBudgetError, MemoryBudgetWarning
from labkit.model.dequant import SUPPORTED_TYPES
from labkit.model.gguf_file import open_gguf
from labkit.model.liveness import last_readers
from labkit.model.memory import parse_size, peak_live_bytes, stage_shapes
from labkit.model.weight_cache import WeightCache

T = GGMLQuantizationType
PROMPT = [1, 5, 9, 33, 2, 7, 11, 40]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_model("llama", "Q4_K")


# ----------------------------------------------------------------- sizes and budgets
@pytest.mark.parametrize(
    "text,want",
    [
        ("6GB", 6 * 10**9),
        ("6 GB", 6 * 10**9),
        ("5.5GiB", int(5.5 * 2**30)),
        ("512MB", 512 * 10**6),
        (1234, 1234),
        ("2048", 2048),
        ("1tb", 10**12),
    ],  # fmt: skip
)
def test_parse_size(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("bad", ["6XB", "", "-1GB", "0", "GB", "nan", 0, -5])
def test_parse_size_rejects_nonsense(bad):
    with pytest.raises(InvalidArgumentError, match="memory="):
        parse_size(bad)


def test_default_budget_is_below_what_is_free(tiny, monkeypatch):
    from labkit.model.memory import available_bytes

    lab = labkit.open(tiny)
    assert 0 < lab.budget.nbytes < available_bytes() * 1.05 and "available" in lab.budget.source
    assert labkit.open(tiny, memory="3GB").budget.nbytes == 3 * 10**9
    monkeypatch.setenv("LABKIT_MEMORY_SHARE", "0.25")
    assert labkit.open(tiny).budget.nbytes < 0.26 * available_bytes()
    monkeypatch.setenv("LABKIT_MEMORY_SHARE", "2")
    with pytest.raises(InvalidArgumentError, match="LABKIT_MEMORY_SHARE"):
        labkit.open(tiny)


# ----------------------------------------------------------------- float32 storage is exact
@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES), ids=lambda t: T(t).name)
@pytest.mark.parametrize("chunked", [False, True], ids=["whole", "row-chunks"])
def test_weight_cache_holds_exactly_what_gguf_quants_gives(qtype, chunked, tmp_path, monkeypatch):
    """Random blocks of every type labkit reads: the float32 and the float64 tiers of the cache both
    hold gguf.quants' values exactly (float32 widens to float64 without rounding), whether a weight
    is decoded whole or, as a large one is, a row chunk at a time widened as it is written."""
    rng = np.random.default_rng(int(qtype))
    qtype = T(qtype)
    block = GGML_QUANT_SIZES[qtype][0]
    raw = random_tensor(rng, qtype, 5, 3 if block > 1 else 96)
    path = tmp_path / f"{qtype.name}.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_tensor("w", raw, raw_dtype=qtype)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file()
    w.close()
    want = oracle_dequantize(raw, qtype)
    assert want.dtype == np.float32  # so storing float32 loses nothing
    if chunked:  # 5 rows in chunks of 2, 2 and 1 (float64 bytes): edges inside and an odd last chunk
        from labkit.model import weight_cache

        monkeypatch.setattr(weight_cache, "CHUNK_BYTES", 2 * 8 * want.shape[-1])
    f = open_gguf(path)
    for capacity, dtype in ((None, np.float64), (10**9, np.float32)):
        cache = WeightCache(f, capacity)
        cache.set_capacity(capacity if capacity is None else 8 * want.size * 4 - 1)  # just too small for f64
        got = cache.get("w")
        assert got.dtype == dtype
        assert np.array_equal(got, want.astype(dtype), equal_nan=True), f"{qtype.name}: cache differs from gguf.quants"


# ----------------------------------------------------------------- the streaming reference
def test_reference_under_a_tight_budget_equals_the_unbounded_one(tiny, monkeypatch):
    """float32 held, the rest streamed in row chunks: the same float64 values as every weight held in
    float64, on a first pass and on a second that finds the held third (plain LRU would have evicted
    each weight just before the next pass read it: no hits at all). The process baseline is held
    steady: in a worker that ran other files, resident memory moving between passes moved the room."""
    import labkit.memory_fit
    import labkit.model.memory

    for module in (labkit.memory_fit, labkit.model.memory):  # at open and at every pass alike
        monkeypatch.setattr(module, "resident_bytes", lambda: 10**8)
    free = labkit.open(tiny).reference(PROMPT)
    from labkit.model import weight_cache
    from labkit.model.memory import weights_read_whole

    old = weight_cache.CHUNK_BYTES
    weight_cache.CHUNK_BYTES = 4096  # row chunks of a few rows: every streamed product crosses chunk edges
    try:
        lab = labkit.open(tiny, memory="1TB")  # a process budget: what the process holds counts
        plan = lab.memory(tokens=len(PROMPT), engine="reference")
        fixed = plan.total() - next(p.nbytes for p in plan.parts if p.part == "weight cache")
        weights = sum(4 * np.prod(t.shape) for t in open_gguf(tiny).tensors.values())
        from labkit.memory_fit import UNPLANNED_SHARE as share  # the budget's share the cache leaves unplanned

        budget = -(-(fixed + weights // 3) * share // (share - 1))  # a third of the float32 weights fits
        lab.budget = replace(lab.budget, nbytes=int(budget))
        cache = lab.reference_engine.weights = WeightCache(lab.gguf)  # its own, not the file's shared one
        first = lab.reference(PROMPT)
        loads, held = cache.loads, len(cache)
        second = lab.reference(PROMPT)
    finally:
        weight_cache.CHUNK_BYTES = old
    read = len(weights_read_whole(lab.graph))
    assert cache.dtype == np.float32 and 0 < cache.nbytes <= weights // 3 + 1 and 0 < held < read
    assert loads == read and cache.loads - loads == read - held, (loads, cache.loads, read, held)
    for name in free.stages:
        for tight in (first, second):
            np.testing.assert_allclose(tight[name], free[name], rtol=1e-12, atol=1e-12, err_msg=name)


def test_a_full_cache_streams_rather_than_evict_what_the_last_two_passes_read(tiny):
    """The cache's own policy, weight by weight: a full cache streams what does not fit rather than
    evict what this pass or the last one read; a weight neither read goes, least recently used
    first; the memory plan's bound (shrink_to) evicts whatever it must."""
    f = open_gguf(tiny)
    shapes: dict[tuple, list[str]] = {}
    for n, t in f.tensors.items():
        shapes.setdefault(tuple(t.shape), []).append(n)
    a, b, c = next(names for shape, names in shapes.items() if len(shape) == 2 and len(names) >= 3)[:3]
    cache = WeightCache(f)
    cache.set_capacity(2 * 4 * int(np.prod(f.tensors[a].shape)))  # float32, room for two of the three
    assert cache.dtype == np.float32
    t = f.tensors[c]
    x = np.random.default_rng(0).standard_normal((3, t.n_cols))

    def product(name: str) -> np.ndarray:  # x @ W.T on gguf.quants' values
        w = oracle_dequantize(np.asarray(f.raw(name)), T(t.ggml_type)).reshape(t.n_rows, t.n_cols)
        return x @ w.astype(np.float64).T

    want = product(c)
    held = lambda: [n for n in (a, b, c) if n in cache]  # noqa: E731
    cache.begin_pass()
    cache.get(a), cache.get(b)
    np.testing.assert_allclose(cache.matmul(x, c), want, rtol=1e-12, atol=1e-12)  # streamed: this pass read a, b
    assert held() == [a, b] and cache.evictions == 0
    cache.get(c)  # dequantized whole and handed back, not held
    assert held() == [a, b] and cache.evictions == 0
    cache.begin_pass()
    cache.get(b), cache.get(c)  # a, which the last pass read, stays; c is not held
    assert held() == [a, b] and cache.evictions == 0
    cache.begin_pass()
    cache.get(c)  # a: read by neither this pass nor the last, it goes
    assert held() == [b, c] and cache.evictions == 1
    cache.shrink_to(cache.held_bytes(c))  # the plan's bound takes b although this pass read it
    assert held() == [c] and cache.evictions == 2
    cache.begin_pass()
    cache.get(a)  # room without evicting
    cache.begin_pass(), cache.begin_pass()
    np.testing.assert_allclose(cache.matmul(x, b), product(b), rtol=1e-12, atol=1e-12)
    assert held() == [a, b] and cache.evictions == 3  # c and a both stale: c, the least recently used, went


def test_reference_frees_what_no_later_stage_reads(tiny):
    """With only the logits captured, the outputs alive at once stay at the plan's peak, far below
    every stage's output; with everything captured, everything stays."""
    lab = labkit.open(tiny)
    eng = lab.reference_engine
    caps = eng.forward(PROMPT, capture=["logits"])
    assert list(caps) == ["logits"]
    got, peak = eng.peak_live_bytes, peak_live_bytes(lab.graph, len(PROMPT), 8, {"logits"})
    every = sum(a.nbytes for a in lab.reference(PROMPT).captures.values())
    assert got == peak and peak < every / 5, (got, peak, every)


def test_liveness_last_readers():
    from labkit.model.graph import Stage

    g = [Stage("a", "add"), Stage("b", "add", ("a",)), Stage("c", "add", ("a", "b")), Stage("d", "add", ("b",))]
    assert last_readers(g) == {"a": 2, "b": 3, "c": 2, "d": 3}


def test_op_output_shapes_match_what_the_reference_computes(tiny):
    lab = labkit.open(tiny)
    ref = lab.reference(PROMPT)
    shapes = stage_shapes(lab.graph, len(PROMPT))
    for name in lab.stages:
        assert ref[name].shape == shapes[name], name


# ----------------------------------------------------------------- budgets that do not fit
def test_gpu_pass_over_the_budget_is_a_typed_error_before_any_allocation(tiny):
    lab = labkit.open(tiny, memory="100KB")
    held = lab.executor.gpu_bytes()  # the file's weight store is shared: an earlier test may have filled it
    with pytest.raises(MemoryBudgetError, match=r"gpu weights .*To fit") as e:
        lab.run(PROMPT, names=["logits"])
    assert "memory=" in str(e.value)
    assert lab.executor.gpu_bytes() == held  # nothing was uploaded


def test_reference_over_the_budget_is_a_typed_error(tiny):
    lab = labkit.open(tiny, memory="10KB")
    with pytest.raises(MemoryBudgetError, match="reference"):
        lab.reference(PROMPT, names=["logits"])


def test_default_capture_keeps_what_fits_and_says_so_once(tiny, monkeypatch):
    import labkit.memory_fit

    monkeypatch.setattr(labkit.memory_fit, "resident_bytes", lambda: 10**8)  # a steady process baseline
    T = 250  # long enough for attention maps of a few MB
    ids = [1 + i % 500 for i in range(T)]
    whole = labkit.open(tiny).run(ids)
    lab = labkit.open(tiny, memory="1TB")  # a process budget: its baseline counts, as it will below
    full = lab.memory(tokens=T, engine="gpu")
    maps = sum(4 * np.prod(s) for n, s in stage_shapes(lab.graph, T).items() if n.endswith(("scores", "probs")))
    # everything but the attention maps fits (they count twice: their regions and their captures)
    lab.budget = replace(lab.budget, nbytes=int(full.total() - maps / 2))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        run = lab.run(ids)
        lab.run(ids)
    said = [x for x in w if issubclass(x.category, MemoryBudgetWarning)]
    assert len(said) == 1 and "attention maps" in str(said[0].message) and "names=" in str(said[0].message)
    assert "blk.0.attn_scores" not in run.captures and "blk.0.attn_out" in run.captures
    np.testing.assert_array_equal(run["logits"], whole["logits"])
    with pytest.raises(MemoryBudgetError):  # every stage asked for by name: no silent cut
        lab.run(ids, names=lab.stages)


def test_a_process_budget_counts_what_the_process_held_at_open(tiny):
    from labkit.model.memory import resident_bytes

    lab = labkit.open(tiny, memory="50GB")
    base = next(p for p in lab.memory(tokens=4).parts if p.engine == "process")
    assert 0.5 * resident_bytes() < base.nbytes <= resident_bytes() * 1.5
    assert base.nbytes >= lab.budget.baseline  # never less than when the lab opened
    assert not any(p.engine == "process" for p in labkit.open(tiny).memory(tokens=4).parts)


def test_memory_table_and_cli_info(tiny, capsys):
    from labkit.model.memory import gb, resident_bytes

    budget = resident_bytes() + 2 * 10**9  # a process budget: 2 GB on top of what this process holds
    lab = labkit.open(tiny, memory=budget)
    plan = lab.memory(tokens=16)
    assert {(p.engine, p.part) for p in plan.parts} >= {("gpu", "weights"), ("reference", "weight cache")}
    assert plan.total() == sum(r["bytes"] for r in plan.rows()) and plan.fits
    assert f"budget {gb(budget)}" in plan.table()
    assert main(["info", str(tiny), "--tokens", "16", "--memory", str(budget), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fits"] and data["budget"] == budget
    kinds = {t["name"]: t["kernel"] for t in data["tensors"]}
    assert kinds["blk.0.attn_q.weight"].startswith("matmul_q4_k/") and kinds["blk.0.attn_norm.weight"].startswith(
        "rmsnorm"
    )
    assert main(["info", str(tiny), "--memory", "12XB"]) == 1
    assert capsys.readouterr().err.startswith("labkit: error: memory=")


def test_gpu_weights_narrow_tier_by_tier_when_the_repacked_layout_does_not_fit(tiny_model, monkeypatch):
    """Q4_0 repacked to int8 takes 1.25 bytes a value; its grouped blocks and its GGUF bytes 0.5625
    (the blocks' textures are padded to whole texture rows). A budget below the repacked plan keeps
    the blocks layout (its own drivers), one below that the GGUF bytes (the raw-bytes kernels); each
    is said once, and each computes what the repacked layout computes."""
    import labkit.memory_fit

    monkeypatch.setattr(labkit.memory_fit, "resident_bytes", lambda: 10**8)  # a steady process baseline
    tiny = tiny_model("llama", "Q4_0", d_model=1024, d_ff=4096, n_heads=8, n_kv_heads=4, head_dim=128, vocab=2048)
    ids = PROMPT
    want = labkit.open(tiny).run(ids, names=["logits"])["logits"]
    probe = labkit.open(tiny, memory="1TB")
    totals, weights = {}, {}
    for layout in ("repacked", "blocks", "gguf"):
        probe.executor.weight_layout = layout
        plan = probe.memory(tokens=len(ids), capture=["logits"], engine="gpu")
        totals[layout], weights[layout] = plan.total(), next(p.nbytes for p in plan.parts if p.part == "weights")
    assert totals["gguf"] < totals["blocks"] < totals["repacked"], totals
    assert weights["blocks"] < 0.6 * weights["repacked"], weights
    tiers = [
        ((totals["blocks"] + totals["repacked"]) // 2, "blocks", "blocks", "blocks layouts"),
        ((totals["gguf"] + totals["blocks"]) // 2, "gguf", "row", "GGUF bytes"),
    ]
    for budget, layout, kernel, said in tiers:
        lab = labkit.open(tiny, memory="1TB")
        lab.budget = replace(probe.budget, nbytes=budget)  # the baseline the totals were planned on
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = lab.run(ids, names=["logits"])["logits"]
            lab.run(ids, names=["logits"])
        told = [str(x.message) for x in w if issubclass(x.category, MemoryBudgetWarning)]
        assert len(told) == 1 and said in told[0], told
        assert lab.executor.weight_layout == layout and lab.kernels()["q"]["kernel"] == kernel, lab.kernels()["q"]
        assert "memory budget" in lab.kernels()["q"]["why"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        if layout == "blocks":  # a tighter budget later narrows on from the blocks to GGUF bytes
            lab.budget = replace(probe.budget, nbytes=tiers[1][0])
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                lab.run(ids, names=["logits"])
            assert lab.executor.weight_layout == "gguf" and lab.kernels()["q"]["kernel"] == "row"
            assert [str(x.message) for x in w if issubclass(x.category, MemoryBudgetWarning)][0].count("GGUF") == 1


def test_k_quant_weights_stay_near_their_gguf_width(tiny_model):
    """The blocks layout (the default for Q4_K, Q5_K and Q6_K on CPU adapters) holds each GGUF
    block in whole texels: Q4_K's 144 and Q5_K's 176 bytes as they are, Q6_K's 210 in 224; the
    int8 layout takes over 1.8x. The plan counts what the store then holds."""
    for wtype, most in (("Q4_K", 1.0), ("Q5_K", 1.0), ("Q6_K", 224 / 210)):
        lab = labkit.open(tiny_model("llama", wtype))
        ex = lab.executor
        plan = next(p for p in lab.memory(tokens=4, engine="gpu").parts if p.part == "weights")
        assert "repacked blocks" in plan.detail, plan
        lab.run(PROMPT[:4], names=["logits"])
        assert ex.gpu_bytes() == plan.nbytes, (ex.gpu_bytes(), plan)
        held = {w.name: sum(win.nbytes for win in w.windows) for w in ex.store._repacked.values()}
        ours = [n for n in held if lab.gguf.tensors[n].type_name == wtype]
        assert len(ours) >= 7, held  # every matmul of a layer at least
        for n in ours:  # each window's texture is padded to whole texture rows (128 KiB)
            file_bytes = lab.gguf.tensors[n].nbytes
            assert file_bytes * most <= held[n] < file_bytes * most + 8192 * 16, (n, held[n], file_bytes)
        file_bytes = sum(lab.gguf.tensors[n].nbytes for n in ours)
        ex.variants["matmul_" + wtype.lower()] = "repacked"
        int8 = next(p for p in lab.memory(tokens=4, engine="gpu").parts if p.part == "weights")
        assert "repacked int8" in int8.detail and int8.nbytes > plan.nbytes + 0.8 * file_bytes, (wtype, int8)
