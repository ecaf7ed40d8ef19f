"""run.save / labkit.load_run: one .safetensors file, bit-exact both ways (poison NaN payloads
included), with what produced the run in its metadata; a loaded run opens in every widget.
And `labkit diff-weights`: a single corrupted block is found, identical files are identical."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from test_cli import assert_one_line_error

import labkit
from labkit.captures import POISON_BITS
from labkit.errors import RunFileError
from labkit.model.corrupt import flip_scale_signs
from labkit.model.tiny import TinySpec, write_tiny_model


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and np.ascontiguousarray(a).tobytes() == b.tobytes()


def _round_trip(run, tmp_path, **kw):
    path = tmp_path / "run.safetensors"
    run.save(path)
    return labkit.load_run(path, **kw)


def test_debug_run_with_unwritten_logits_round_trips_bit_exactly(tiny_model, tmp_path):
    lab = labkit.open(tiny_model("llama"), variants={"lm_head": "skip_last_window"}, debug=True, window_bytes=4096)
    run = lab.run([1, 5, 9, 33])
    assert run.unwritten["logits"] > 0  # the faulty lm_head left poison behind
    back = _round_trip(run, tmp_path, model=lab)
    assert set(back.captures) == set(run.captures)
    for name, a in run.captures.items():
        assert _same_bits(a, back[name]), name
    poison = np.ascontiguousarray(back["logits"]).view(np.uint32) == POISON_BITS
    assert int(poison.sum()) == run.unwritten["logits"]
    for field in ("model", "engine", "tokens", "stages", "variants", "unwritten", "precision", "n_past"):
        assert getattr(back, field) == getattr(run, field), field
    assert back.timings["total_s"] == run.timings["total_s"] and back.debug
    assert back.stats("logits") == run.stats("logits")
    assert back.top(3) == run.top(3)  # pieces come from the model given to load_run


def test_reference_and_dumps_runs_keep_precision_positions_and_unmapped(tiny_model, tmp_path):
    lab = labkit.open(tiny_model("llama"))
    ids = [1, 5, 9, 33]
    ref = lab.reference(ids)
    assert _same_bits(_round_trip(ref, tmp_path)["logits"], ref["logits"])  # float64 stays float64
    dumps = {"model.norm": ref["output_norm"][-1:].astype(np.float16), "junk": np.ones(2, np.float16)}
    mine = labkit.load_dumps(dumps, lab, names="hf", tokens=ids)
    back = _round_trip(mine, tmp_path)
    assert (back.precision, back.positions, back.unmapped) == ("float16", {"output_norm": (3,)}, mine.unmapped)
    assert labkit.compare(back, ref).passed


def test_a_loaded_run_opens_in_every_widget(tiny_model, tmp_path):
    from labkit.viz import figures, widgets

    lab = labkit.open(tiny_model("llama"))
    ids = [1, 5, 9, 33]
    back = _round_trip(lab.run(ids), tmp_path)  # no model given: its name opens the tokenizer lazily
    n = lab.config.n_layers
    widgets.stage_explorer(back, n).refresh()
    widgets.attention_explorer(back, n)
    stepper = widgets.stage_stepper(back, lab.reference(ids))
    stepper.go("logits")
    assert "ok" in stepper.title.value
    figures.show(back, "blk.0.ffn_down")
    assert back._repr_html_().count("labkit-run") == 1


def test_load_run_errors(tmp_path):
    with pytest.raises(RunFileError, match="no such file"):
        labkit.load_run(tmp_path / "absent.safetensors")
    from safetensors.numpy import save_file

    save_file({"x": np.ones(3, np.float32)}, str(tmp_path / "plain.safetensors"))
    with pytest.raises(RunFileError, match="not a run saved by labkit"):
        labkit.load_run(tmp_path / "plain.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00nope!")
    with pytest.raises(RunFileError, match="cannot read"):
        labkit.load_run(tmp_path / "junk.safetensors")


def _lying_run(tmp_path, **changes) -> object:
    """A run saved by labkit, its metadata then rewritten with `changes` (a string each)."""
    from safetensors.numpy import save_file

    meta = {"format": "labkit-run/1", "model": "tiny", "engine": "reference", "precision": "float64", "n_past": "0",
            "tokens": "[1, 2, 3]", "stages": json.dumps(["blk.0.attn_norm", "logits"]), "positions": "{}"}  # fmt: skip
    meta.update(changes)
    path = tmp_path / "lying.safetensors"
    caps = {"blk.0.attn_norm": np.ones((3, 8), np.float32), "logits": np.ones((1, 16), np.float32)}
    save_file(caps, str(path), metadata=meta)
    return path


@pytest.mark.parametrize(
    "changes, fragment",
    [
        ({"tokens": "[1, 2"}, "'tokens' is not JSON"),
        ({"tokens": '["a"]'}, "'tokens' is not a list of int"),
        ({"positions": "[]"}, "'positions' is not a dict"),
        ({"n_past": "minus one"}, "n_past"),
        ({"positions": '{"logits": [0, 1]}'}, "has shape \\[1, 16\\], but the run lists 2 positions"),
        ({"positions": '{"logits": [7]}'}, "not within the run's 3 tokens"),
        ({"positions": '{"blk.9.v": [2]}'}, "did not capture"),
        ({"heads": '{"logits": [0, 1, 2]}'}, "3 heads"),
        ({"stages": '["logits"]'}, "not among the run's stages"),
        ({"timings": "[1.5]"}, "'timings' is not a dict"),
        ({"unwritten": '{"logits": "many"}'}, "'unwritten' is not a dict of int"),
    ],
)
def test_a_saved_run_whose_metadata_contradicts_its_captures_is_refused(tmp_path, changes, fragment):
    path = _lying_run(tmp_path, **{"positions": '{"logits": [2]}', **changes})
    with pytest.raises(RunFileError, match=fragment):
        labkit.load_run(path)


def test_a_consistent_hand_written_run_loads(tmp_path):
    run = labkit.load_run(_lying_run(tmp_path, positions='{"logits": [2]}'))
    assert run.positions == {"logits": (2,)} and run.tokens == [1, 2, 3]


# ----------------------------------------------------------------- diff-weights
def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("weight_type", ["Q8_0", "Q4_K", "Q6_K", "F32"])
def test_diff_weights_finds_one_corrupted_block_and_nothing_else(weight_type, tmp_path):
    src = write_tiny_model(tmp_path / "a.gguf", TinySpec(weight_type=weight_type))
    before = src.read_bytes()
    bad = flip_scale_signs(src, tmp_path / "b.gguf", "blk.1.ffn_up.weight", block=37)
    assert src.read_bytes() == before  # the source is never written
    diff = labkit.diff_weights(src, bad)
    assert [t.name for t in diff.differing] == ["blk.1.ffn_up.weight"], diff.table()
    row = diff.differing[0]
    per_row = {"Q8_0": 256 // 32, "Q4_K": 1, "Q6_K": 1, "F32": 256}[weight_type]  # blocks per row of 256
    assert (row.blocks_differing, row.first_row) == (1, 37 // per_row)
    # one block of 512 rows × 256: a sign flip moves about 4x its energy share (~1/128); random blocks vary
    assert 0 < row.nmse < 5e-2
    assert diff.first_difference == "blk.1.ffn_up.weight" and not diff.identical


def test_diff_weights_identical_files_and_the_cli(tmp_path):
    a = write_tiny_model(tmp_path / "a.gguf", TinySpec())
    b = tmp_path / "copy.gguf"
    b.write_bytes(a.read_bytes())
    assert labkit.diff_weights(a, b).identical
    p = cli("diff-weights", str(a), str(b))
    assert p.returncode == 0 and "identical" in p.stdout, p.stderr
    c = write_tiny_model(tmp_path / "c.gguf", TinySpec(weight_type="F32", n_layers=3))
    p = cli("diff-weights", str(a), str(c), "--json")
    assert p.returncode == 1, p.stderr
    data = json.loads(p.stdout)
    status = {t["name"]: t["status"] for t in data["tensors"]}
    assert status["blk.0.attn_q.weight"] == "type" and status["blk.2.attn_q.weight"] == "extra"
    # same seed: the embedding and norms agree; the first matmul weight (graph order) changed type
    assert data["first_difference"] == "blk.0.attn_q.weight"
    assert "llama.block_count" in data["metadata_differing"]
    assert_one_line_error(cli("diff-weights", str(a), str(tmp_path / "none.gguf")), "no such file")


def test_cli_compare_dumps_errors_are_one_line(tiny_model, tmp_path):
    path = str(tiny_model("llama"))
    np.savez(tmp_path / "d.npz", **{"weird.name": np.ones((1, 4, 256), np.float32)})
    base = ("compare", path, "--tokens", "1,5,9,33", "--dumps")
    assert_one_line_error(cli(*base, str(tmp_path / "d.npz"), "--names", "pytorch"), "unknown names preset")
    assert_one_line_error(cli(*base, str(tmp_path / "none.npz")), "no such file")
    assert_one_line_error(cli(*base, str(tmp_path / "d.npz")), "none of the 1 dumped names")
    (tmp_path / "map.json").write_text(json.dumps({"weird.name": "blk.0.attn_norm"}))
    p = cli(*base, str(tmp_path / "d.npz"), "--names", str(tmp_path / "map.json"), "--json")
    assert p.returncode in (0, 1) and json.loads(p.stdout)["stages"][0]["stage"] == "blk.0.attn_norm", p.stderr
    assert_one_line_error(cli("compare", path, "--tokens", "1,x", "--dumps", "d.npz"), "comma-separated ids")


def test_a_run_of_chosen_positions_and_heads_round_trips(tiny_model, tmp_path):
    """An attention map's positions are its query axis (axis 1), its heads axis 0: a saved run of
    both loads back as it was."""
    lab = labkit.open(tiny_model("llama"))
    run = lab.run([1, 5, 9, 33], positions=[1, 3])
    run.heads = {"blk.0.attn_probs": (0, 1, 2, 3)}
    maps = [n for n in run.captures if n.endswith("attn_probs")]
    assert maps and run.positions.get(maps[0]) == (1, 3) and run[maps[0]].shape[1] == 2
    back = _round_trip(run, tmp_path, model=lab)
    assert back.positions == run.positions and back.heads == run.heads
    assert all(_same_bits(a, back[n]) for n, a in run.captures.items())


def test_a_serving_path_run_keeps_its_path_and_position(tiny_model, tmp_path):
    """A run computed in micro-batches after a kept prefix saves how it was computed (`path`) and
    where it starts (`n_past`)."""
    lab = labkit.open(tiny_model("llama"))
    run = lab.run([5, 9, 33, 2, 8], state=lab.prefill([1, 7]), ubatch=2)
    assert run.path == "prefix=2,ubatch=2" and run.n_past == 2
    back = _round_trip(run, tmp_path, model=lab)
    assert back.path == run.path and back.n_past == 2
    assert all(_same_bits(a, back[n]) for n, a in run.captures.items())
