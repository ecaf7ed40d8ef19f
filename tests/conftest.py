"""Shared fixtures: the real models (opened once per session), tiny synthetic models, golden files."""

from __future__ import annotations

import ctypes
import gc
import importlib.util
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest

# Labs opened by the suite (and the notebooks and processes it starts) take 30% of what is free
# as their default budget, not 80%: the suite holds many labs in one process, and a budget that
# leaves Gemma's reference its float64 tier (2.1 GB) in every module would pass 8 GB.
os.environ.setdefault("LABKIT_MEMORY_SHARE", "0.3")
# Under two or more test workers each worker's lavapipe draws on one thread, not one per core (the
# workers, and the kernels and processes they start, inherit it): a dispatch split over two threads
# waits for both, and beside another worker one of them is often descheduled. The same 100 GPU-heavy
# tests, 2 workers, 2 cores: 208-213 s against 228 s with lavapipe's default.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("LP_NUM_THREADS", "1")

import labkit  # noqa: E402
from labkit.model.tiny import TinySpec, write_tiny_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "labkit" / "data" / "golden"
REAL_MODELS = ("gemma3-270m", "smollm2-135m")
HAVE_LLAMA = importlib.util.find_spec("llama_cpp") is not None
needs_llama = pytest.mark.skipif(not HAVE_LLAMA, reason="needs the oracle extra (llama-cpp-python)")


# `make test` runs two pytest workers (pytest-xdist, `-n 2 --dist loadfile`): a worker takes
# whole files, so module fixtures are made once. Files that read, in their process, what another
# file ran (tests/notebook_outputs: the live lessons the browser test saved, the case notebooks'
# printed reports) go to one worker together, the writer first.
SHARED_RUNS = {"test_browser.py": "lessons", "test_lessons.py": "lessons", "test_case_notebooks.py": "cases",
               "test_cases.py": "cases"}  # fmt: skip
# The longest groups start first, so that neither worker is left with one at the end (a hint
# for balance, measured on this suite; the order within a group stays as collected).
LONG_FIRST = ["lessons", "cases", "test_blind_cases.py", "test_compiled_step.py", "test_planner.py",
              "test_attribution.py", "test_real_shapes.py", "test_notebooks.py", "test_cli.py"]  # fmt: skip


def run_group(path: str) -> str:
    """The worker group of a test file: its pair's name in SHARED_RUNS, or the file's own name."""
    name = path.split("::", 1)[0].rsplit("/", 1)[-1]
    return SHARED_RUNS.get(name, name)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """loadfile, with SHARED_RUNS' pairs as one unit, in collection order (see LONG_FIRST)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return run_group(nodeid)

    config.option.loadscopereorder = False
    return FileGroups(config, log)


def pytest_collection_modifyitems(config, items):
    """In a worker, the LONG_FIRST groups first; the order within a group stays as collected."""
    if hasattr(config, "workerinput"):
        rank = {g: i for i, g in enumerate(LONG_FIRST)}
        items.sort(key=lambda item: rank.get(run_group(item.nodeid), len(rank)))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under LABKIT_STRICT=1 (what `make test` and CI set) a skip is a failure: every dependency
    (models, llama-cpp-python, chromium, lavapipe) is installed there, so a skip means a check
    silently did not run."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("LABKIT_STRICT") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.longrepr = f"skipped under LABKIT_STRICT=1: {reason}"


@pytest.fixture(scope="module", autouse=True)
def _give_back_freed_memory():
    """After each test module, collect its labs and hand malloc's free pages back to the OS
    (glibc's malloc_trim): lavapipe's and numpy's freed arenas otherwise stay in the process, and
    the suite's peak RSS crept up module by module. Once a module, not once a test (that was 30%
    slower for the suite)."""
    yield
    give_back_memory()


@pytest.fixture
def gives_back_memory():
    """For a test that opens a lab of its own (a real model with a variant): collect it and trim
    malloc after the test, not at the module's end, so a module of such tests holds one at a time."""
    yield
    give_back_memory()


def give_back_memory() -> None:
    """Collect unreachable labs (they hold reference cycles) and trim malloc's free pages."""
    gc.collect()
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc: nothing to trim
        return None


_LIBC = _libc()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (for a JupyterLab server under test)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def llamacpp_greedy(path, prompt: list[int], n: int) -> list[int]:
    """llama.cpp decoding the file greedily, token by token on its own cache (its recurrent state too)."""
    from llama_cpp import Llama

    llm = Llama(str(path), n_ctx=64, n_batch=64, n_threads=2, verbose=False, logits_all=True)
    llm.eval(prompt)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        llm.eval([out[-1]])
    return out


def compare_with_fault_at(lab, variant: str, stage: str, ids: list[int]):
    """`compare` of a GPU run with `variant` ("family=name") bound to `stage`'s layer against the reference;
    the lab's selection put back."""
    family, name = variant.split("=")
    key = f"blk.{stage.split('.')[1]}.{family}"
    lab.use(key, name)
    try:
        return labkit.compare(lab.run(ids), lab.reference(ids))
    finally:
        lab.use(key, "default")


def golden(model: str) -> dict:
    return json.loads((GOLDEN / f"{model}.json").read_text())


def check_against_golden(logits: np.ndarray, entry: dict, tol: float = 0.5, raw_tol: float = 0.75) -> None:
    """Same top-1, top-5 sets overlapping in ≥ 4, top-10 logits within `tol` of llama.cpp's.

    llama.cpp quantizes activations to 8 bits inside its matmuls, which moves all its logits
    together by up to ~0.6 on longer prompts (measured: 0.62 on the 22-token code prompt of
    gemma3). A common shift leaves the softmax unchanged, so `tol` applies once the mean
    offset over the top-10 is removed, and the raw difference must stay within `raw_tol`.
    """
    want_ids = [t["id"] for t in entry["top"]]
    got_ids = list(np.argsort(-logits, kind="stable")[:10])
    text = entry["text"]
    assert got_ids[0] == want_ids[0], f"{text!r}: top-1 {got_ids[0]} != llama.cpp {want_ids[0]}"
    overlap = len(set(got_ids[:5]) & set(want_ids[:5]))
    assert overlap >= 4, f"{text!r}: top-5 overlap {overlap} ({got_ids[:5]} vs {want_ids[:5]})"
    d = np.array([logits[t["id"]] - t["logit"] for t in entry["top"]])
    shape_err = float(np.max(np.abs(d - d.mean())))
    assert shape_err <= tol, f"{text!r}: top-10 logits differ by {shape_err:.3f} > {tol} beyond a shift"
    assert float(np.max(np.abs(d))) <= raw_tol, f"{text!r}: top-10 logit max |diff| {np.abs(d).max():.3f}"


@pytest.fixture(scope="session")
def gemma():
    return _open_cached("gemma3-270m")


@pytest.fixture(scope="session")
def smollm():
    return _open_cached("smollm2-135m")


@pytest.fixture(scope="session")
def real_lab(request):
    """Parametrize indirectly with a model name; labs are cached for the session."""
    return _open_cached(request.param)


_LABS: dict[str, labkit.Lab] = {}


def _open_cached(name: str) -> labkit.Lab:
    """The session's one lab of a real model, which `gemma`, `smollm`, `real_lab` and the modules'
    helpers share: each lab holds its GPU weights and its reference's dequantized weights, a GB
    or two for gemma3-270m, and the suite must stay under 8 GB."""
    if name not in _LABS:
        _LABS[name] = labkit.open(name)
    return _LABS[name]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    """Factory: tiny_model(arch, weight_type, **spec) -> path (written once per spec)."""
    made: dict[TinySpec, Path] = {}

    def make(arch: str = "llama", weight_type: str = "Q8_0", **kw) -> Path:
        spec = TinySpec(arch=arch, weight_type=weight_type, **kw)
        if spec not in made:
            name = f"tiny-{arch}-{weight_type.lower()}-{abs(hash(spec)) % 10**8}.gguf"
            made[spec] = write_tiny_model(tiny_dir / name, spec)
        return made[spec]

    return make


@pytest.fixture
def llama_loadable_tiny(tmp_path, monkeypatch):
    """Tiny F32 models llama.cpp can load: its gpt2 vocab loader needs at least one merge."""
    import gguf

    orig = gguf.GGUFWriter.add_token_merges
    monkeypatch.setattr(
        gguf.GGUFWriter, "add_token_merges", lambda self, merges: orig(self, list(merges) or ["<t1> <t2>"])
    )

    def make(arch: str, weight_type: str = "F32") -> Path:
        spec = TinySpec(arch=arch, weight_type=weight_type, embed_type=weight_type, seed=3)
        return write_tiny_model(tmp_path / f"tiny-{arch}-{weight_type.lower()}.gguf", spec)

    return make


@pytest.fixture(scope="module", autouse=True)
def _release_reference_weights():
    """Each module's reference weights go with it: the labs shared across the session keep their
    GPU weights, but the float64 weight caches (2.1 GB for Gemma) are dequantized again where a
    later module needs them, so the suite's peak stays under 8 GB."""
    yield
    from labkit.model.weight_cache import release_all

    release_all()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item):
    """LABKIT_RSS_LOG=FILE: after each test, its name with the process's resident and peak memory
    (MB), to find what holds memory in a suite that must stay under 8 GB."""
    log = os.environ.get("LABKIT_RSS_LOG")
    if not log:
        return
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    rss, hwm = (int(status[k].split()[0]) // 1024 for k in ("VmRSS", "VmHWM"))
    with open(log, "a") as f:
        f.write(f"{rss}\t{hwm}\t{item.nodeid}\n")
