"""Progress bars on long work (labkit.progress): a bar on stderr for generate, the reference's first
dequantization and bench; none under `quiet()`, LABKIT_PROGRESS=0 or the CLI's --json; and the
same results with bars on or off."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import labkit
from labkit import progress

BAR = "%|"  # tqdm's text bar: "generate:  50%|█████     | 6/12 [...]"


def python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """`python -c code args...` with stderr a pipe (tqdm writes its bar to it as to a terminal)."""
    base = {k: v for k, v in os.environ.items() if k != "LABKIT_PROGRESS"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env={**base, **(env or {})})  # fmt: skip


GENERATE = """
import sys, labkit
from labkit import progress
lab = labkit.open(sys.argv[1])
if sys.argv[2] == "quiet":
    with progress.quiet():
        g = lab.generate([1, 5, 9], max_new_tokens=6)
else:
    g = lab.generate([1, 5, 9], max_new_tokens=6)
print(g.ids)
"""


@pytest.fixture(scope="module")
def tiny(tiny_model):
    return tiny_model("llama", "Q8_0")


def test_generate_shows_a_bar_over_new_tokens(tiny):
    p = python(GENERATE, str(tiny), "on")
    assert p.returncode == 0, p.stderr
    assert "generate" in p.stderr and BAR in p.stderr and "/6 [" in p.stderr and "tok/s" in p.stderr, p.stderr


@pytest.mark.parametrize("how", ["quiet", "env"])
def test_no_bar_under_quiet_or_LABKIT_PROGRESS_0(tiny, how):
    env = {"LABKIT_PROGRESS": "0"} if how == "env" else None
    p = python(GENERATE, str(tiny), "quiet" if how == "quiet" else "on", env=env)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert len(json.loads(p.stdout)) == 6


def cli_on_a_terminal(*args: str, tmp_path) -> tuple[int, str, str]:
    """`labkit args...` with stderr a pseudo-terminal (what a person at a shell sees): (code, stdout, stderr)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 24 rows, 100 columns
    out = tmp_path / "stdout.txt"
    env = {k: v for k, v in os.environ.items() if k != "LABKIT_PROGRESS"}
    with out.open("w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "labkit.cli", *args], stdout=f, stderr=slave, env=env)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    return proc.wait(timeout=300), out.read_text(), err.decode("utf-8", "replace")


def test_cli_bars_on_a_terminal_and_none_with_json(tiny, tmp_path):
    """`labkit compare` (a GPU pass and the reference's first dequantization): on a terminal, the
    dequantization bar; with --json, JSON on stdout and nothing on stderr, terminal or not."""
    args = ["compare", str(tiny), "--tokens", "1,5,9"]
    code, out, err = cli_on_a_terminal(*args, tmp_path=tmp_path)
    assert code == 0, err
    assert "dequantizing weights" in err and BAR in err and "tensor" in err, err
    code, out, err = cli_on_a_terminal(*args, "--json", tmp_path=tmp_path)
    assert code == 0, err
    assert json.loads(out)["b"] == "reference"
    assert err == ""
    p = subprocess.run([sys.executable, "-m", "labkit.cli", *args, "--json"], capture_output=True, text=True,
                       timeout=300, env={k: v for k, v in os.environ.items() if k != "LABKIT_PROGRESS"})  # fmt: skip
    assert p.returncode == 0 and json.loads(p.stdout)["b"] == "reference" and p.stderr == ""


def test_cli_without_a_terminal_draws_no_bar(tiny):
    """stderr a pipe or a file (a log): no bar, so an error stays one `labkit: error:` line."""
    p = python("import sys; from labkit.cli import main; sys.exit(main(sys.argv[1:]))", "compare", str(tiny),
               "--tokens", "1,5,9")  # fmt: skip
    assert p.returncode == 0 and p.stderr == "", p.stderr


def test_bars_do_not_change_results(tiny):
    lab = labkit.open(tiny)
    was = progress.enabled()
    try:
        progress.set_enabled(True)
        on = lab.generate([1, 5, 9], max_new_tokens=6).ids, lab.generate_reference([1, 5, 9], max_new_tokens=4).ids
        progress.set_enabled(False)
        lab2 = labkit.open(tiny)  # a fresh reference: its first dequantization again, without a bar
        off = lab2.generate([1, 5, 9], max_new_tokens=6).ids, lab2.generate_reference([1, 5, 9], max_new_tokens=4).ids
    finally:
        progress.set_enabled(was)
    assert on == off


class Recorder:
    """progress.bar's stand-in: remembers every bar's total, desc and how far it got."""

    def __init__(self):
        self.bars: list[Recorder.Bar] = []

    class Bar:
        def __init__(self, total, desc, unit):
            self.total, self.desc, self.unit, self.n, self.closed = total, desc, unit, 0, False

        def update(self, n=1):
            self.n += n

        def set_postfix_str(self, s="", refresh=True):
            pass

        def close(self):
            self.closed = True

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.close()

    def __call__(self, total, desc, unit="it", min_total=2):
        if not progress.enabled() or total < min_total:  # as progress.bar: no bar
            return progress._Silent()
        self.bars.append(Recorder.Bar(total, desc, unit))
        return self.bars[-1]


@pytest.fixture
def rec(monkeypatch) -> Recorder:
    """Bars on, and recorded instead of drawn."""
    r = Recorder()
    monkeypatch.setattr(progress, "bar", r)
    monkeypatch.setattr(progress, "_enabled", True)
    return r


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_first_dequantization_bar_counts_every_weight(tiny_model, rec, arch):
    """The bar over the reference's first pass ends at its total (every weight read whole, the tied
    embedding included; the embedding's rows are not), and a later pass has nothing to dequantize."""
    from labkit.model.weight_cache import release_all

    release_all()  # labs of this file share one cache: an earlier test's may still hold the weights
    lab = labkit.open(tiny_model(arch, "Q8_0"))
    lab.reference([1, 5, 9])
    (first,) = [b for b in rec.bars if "dequantizing" in b.desc]
    assert first.total == first.n == len(lab.reference_engine.weights) > 0 and first.closed
    lab.reference([1, 5])
    assert [b for b in rec.bars if "dequantizing" in b.desc] == [first]


def test_generate_bar_counts_new_tokens_and_closes(tiny, rec):
    lab = labkit.open(tiny)
    g = lab.generate([1, 5, 9], max_new_tokens=5)
    (b,) = [b for b in rec.bars if b.desc == "generate"]
    assert (b.total, b.n, b.unit, b.closed) == (5, len(g.ids), "tok", True)


def test_bench_steps_end_at_their_total(tiny, rec):
    """run_bench's bar: one step per measurement, as many as n_steps says (no llama.cpp here)."""
    from labkit.bench import n_steps, run_bench

    run_bench(str(tiny), (3,), repeats=1, decode_tokens=3, engines=("gpu", "reference"))
    (b,) = [b for b in rec.bars if b.desc == "bench"]
    assert b.total == b.n == n_steps(("gpu", "reference"), (3,)) and b.closed
    assert [x.desc for x in rec.bars] == ["bench"]  # the measured passes draw no bars of their own


def test_in_a_jupyter_kernel_a_bar_is_a_widget_that_ends_full():
    """In a real kernel a bar is tqdm's widget, kept when the work ends, full and green: JupyterLab
    showed a closed one as its first text, "0%| | 0/236", after the cell had finished."""
    import nbformat
    from nbclient import NotebookClient

    code = (
        "from labkit import progress\n"
        "b = progress.bar(5, 'work')\n"
        "for _ in range(5):\n    b.update(1)\n"
        "b.close()\n"
        "print(b.leave, b.n, b.total, b.container.children[1].value, b.container.children[1].bar_style, "
        "b.container.layout.display)"
    )
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = nb.cells[0].outputs
    assert any("application/vnd.jupyter.widget-view+json" in o.get("data", {}) for o in outputs), outputs
    printed = "".join(o.get("text", "") for o in outputs if o.output_type == "stream" and o.name == "stdout")
    assert printed.split() == ["True", "5", "5", "5.0", "success", "inline-flex"], printed  # shown, not closed
