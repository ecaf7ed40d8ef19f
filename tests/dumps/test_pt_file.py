""".pt files read without torch and without running pickled code (labkit.dumps.pt_file).

Real torch writes the files whose tensors must come back exactly (every dtype, strided views,
parameters, nested dicts); hand-built pickles try every way a hostile file runs code (a global
outside the allowlist, reached directly, through a reduce, nested inside a valid tensor dict,
or through a persistent id), and each must be refused with a typed error before anything in
it runs.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import labkit
from labkit.dumps.pt_file import PtTensor, UnsafePickleError, read_pt
from labkit.errors import DumpsFileError

HAVE_TORCH = importlib.util.find_spec("torch") is not None

_WRITE = r"""
import sys, torch, numpy as np
torch.manual_seed(0)
t = {
    "f32": torch.randn(3, 5), "bf16": torch.randn(4, 6).to(torch.bfloat16), "f16": torch.randn(7).half(),
    "f64": torch.randn(2, 2, dtype=torch.float64), "ids": torch.tensor([[5, 9, 2]]),
    "col": torch.randn(6, 4)[:, 1], "slice": torch.randn(10)[3:8], "T": torch.randn(3, 4).t(),
    "param": torch.nn.Parameter(torch.randn(3)), "mask": torch.tensor([True, False]),
}
obj = {"tensors": t, "meta": {"dtype": torch.bfloat16, "size": torch.Size([4, 6]), "step": 3, "names": ["a", "b"]}}
torch.save(obj, sys.argv[1] + "/all.pt")
np.savez(sys.argv[1] + "/want.npz", **{k: v.detach().float().numpy() if v.dtype == torch.bfloat16
                                       else v.detach().numpy() for k, v in t.items()})
"""


@pytest.mark.skipif(not HAVE_TORCH, reason="needs torch (the hf extra) to write real .pt files")
def test_real_torch_files_come_back_exactly(tmp_path):
    subprocess.run([sys.executable, "-c", _WRITE, str(tmp_path)], check=True, timeout=300)
    got = read_pt(tmp_path / "all.pt")
    want = np.load(tmp_path / "want.npz")
    for name in want.files:
        t = got["tensors"][name]
        assert isinstance(t, PtTensor)
        assert t.array.shape == want[name].shape and np.array_equal(t.array, want[name]), name
    assert got["tensors"]["bf16"].stored == "bfloat16" and got["tensors"]["bf16"].array.dtype == np.float32
    assert got["tensors"]["ids"].array.dtype == np.int64
    assert got["meta"] == {"dtype": "bfloat16", "size": (4, 6), "step": 3, "names": ["a", "b"]}


# ----------------------------------------------------------------- hostile pickles
_RAN: list[str] = []


def _record(what: str) -> None:
    """What a hostile pickle would run: anything appended here means the reader executed it."""
    _RAN.append(what)


class _Reduce:
    def __init__(self, func, args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


def _pt(tmp_path: Path, obj, name: str = "evil.pt", persistent=None) -> Path:
    """A torch.save-shaped zip around a pickle of `obj` (protocol 2, as torch writes)."""
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    if persistent is not None:
        p.persistent_id = persistent
    p.dump(obj)
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("evil/data.pkl", buf.getvalue())
        z.writestr("evil/version", "3\n")
    return path


@pytest.mark.parametrize(
    "payload, named",
    [
        (_Reduce(_record, ("direct",)), "test_pt_file._record"),
        (_Reduce(eval, ("__import__('os').getpid()",)), "builtins.eval"),
        (_Reduce(getattr, (object, "__subclasses__")), "builtins.getattr"),
        (_Reduce(subprocess.call, (["true"],)), "subprocess.call"),
        ({"model.layers.0.mlp": [1.0, {"x": _Reduce(_record, ("nested",))}]}, "test_pt_file._record"),
        (_Reduce(np.load, ("/etc/passwd",)), "numpy.load"),
    ],
    ids=["own-function", "eval", "getattr", "subprocess", "nested-in-a-dict", "numpy"],
)
def test_a_pickle_that_imports_anything_else_is_refused(tmp_path, payload, named):
    _RAN.clear()
    path = _pt(tmp_path, payload)
    with pytest.raises(UnsafePickleError, match=named.replace(".", r"\.")) as e:
        read_pt(path)
    assert isinstance(e.value, DumpsFileError)
    assert _RAN == [], "the hostile callable ran"


def test_a_persistent_id_that_is_no_storage_is_refused(tmp_path):
    path = _pt(tmp_path, {"x": "marker"}, persistent=lambda obj: ("module", "os.system") if obj == "marker" else None)
    with pytest.raises(UnsafePickleError, match="no tensor storage"):
        read_pt(path)


def test_load_dumps_refuses_a_hostile_pt_with_a_typed_error(tmp_path, smollm):
    _RAN.clear()
    path = _pt(tmp_path, {"model.embed_tokens": _Reduce(_record, ("via load_dumps",))}, "Pass00000.pt")
    with pytest.raises(UnsafePickleError, match="refused before anything in it ran"):
        labkit.load_dumps(path, smollm, names="hf", tokens=[1, 2])
    assert _RAN == []


def test_the_cli_says_one_line_for_a_hostile_pt(tmp_path):
    path = _pt(tmp_path, _Reduce(eval, ("1",)), "Pass00000.pt")
    cmd = [sys.executable, "-m", "labkit.cli", "compare", "smollm2-135m", "--tokens", "1,2", "--dumps", str(path)]
    cmd += ["--names", "sglang"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert lines[-1].startswith("labkit: error:") and "builtins.eval" in lines[-1], done.stderr[-800:]
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("body", [b"not a zip", b"PK\x03\x04 truncated"])
def test_a_file_that_is_not_a_torch_archive_is_a_typed_error(tmp_path, body):
    path = tmp_path / "x.pt"
    path.write_bytes(body)
    with pytest.raises(DumpsFileError, match="not a torch.save zip archive"):
        read_pt(path)


def test_a_tensor_that_reaches_past_its_storage_is_refused(tmp_path):
    """A valid-looking rebuild whose size runs past the storage's bytes: an error, not a read out of bounds."""
    import labkit.dumps.pt_file as pt

    class Storage:  # pickled as the persistent id ('storage', FloatStorage, '0', 'cpu', 4)
        pass

    storage = Storage()
    rebuild = _Reduce(pt._rebuild_tensor, (storage, 0, (100,), (1,), False, None))
    buf = io.BytesIO()
    p = pickle.Pickler(buf, protocol=2)
    p.persistent_id = lambda obj: ("storage", _FloatStorage, "0", "cpu", 4) if obj is storage else None
    p.dump(rebuild)
    data = buf.getvalue().replace(b"labkit.dumps.pt_file\n_rebuild_tensor", b"torch._utils\n_rebuild_tensor_v2")
    data = data.replace(b"test_pt_file\n_FloatStorage", b"torch\nFloatStorage")
    path = tmp_path / "big.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("big/data.pkl", data)
        z.writestr("big/data/0", np.arange(4, dtype="<f4").tobytes())
    with pytest.raises(DumpsFileError, match="reaches element 99 of a storage of 4"):
        read_pt(path)


class _FloatStorage:
    """Pickled by reference, as torch pickles its storage types; renamed to torch.FloatStorage above."""
