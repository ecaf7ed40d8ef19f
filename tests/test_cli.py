"""The `labkit` command: JSON shapes, the engines, and one-line errors with exit code 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFWriter

import labkit as lk
import labkit.model.tiny as tiny
from labkit import cli
from labkit.errors import (
    GpuLimitError,
    ShaderCompileError,
    TokenIdError,
    TokenizerError,
    UnknownVariantError,
    UnsupportedArchitectureError,
    UnsupportedTensorTypeError,
    VariantInterfaceError,
)
from labkit.gpu.dispatch import grid
from labkit.lab import Lab
from labkit.model.vocab_rules import BYTE_ENCODER as _BYTE_ENCODER
from labkit.ops.registry import variants

from conftest import free_port, golden


def labkit(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "labkit.cli", *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(p: subprocess.CompletedProcess, needle: str = "") -> str:
    """A finished `labkit` process failed with one `labkit: error:` line holding `needle`; the line."""
    return check_one_line(p.returncode, p.stderr, needle)


def test_models_json():
    p = labkit("models", "--json")
    names = [m["name"] for m in json.loads(p.stdout)]
    assert names == ["gemma3-270m", "smollm2-135m", "tiny-qwen3moe", "tiny-bitnet", "tiny-ernie4_5-moe", "tiny-gpt-oss",
                     "tiny-mamba2", "tiny-granitehybrid", "tiny-qwen35", "tiny-nemotron_h",
                     "tiny-qwen3next", "tiny-qwen35moe", "tiny-deepseek2"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gemma3-270m", "smollm2-135m"])
def test_run_reference_json(model):
    p = labkit(
        "run", model, "--engine", "reference", "--prompt", "The color of the sky is", "--json", "--max-new-tokens", "2"
    )
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    entry = golden(model)["prompts"][0]
    assert data["tokens"] == entry["tokens"]
    assert set(data) >= {"model", "tokens", "top", "generated", "timings", "variants"}
    assert data["top"][0]["piece"] == " a" and set(data["top"][0]) == {"id", "piece", "logit", "prob"}
    if model == "gemma3-270m":
        assert [t["piece"] for t in data["top"][:3]] == [" a", " the", " blue"]
    assert data["generated"]["ids"] == entry["greedy"][:2]


@pytest.mark.slow
def test_run_gpu_is_the_default_engine():
    p = labkit("run", "smollm2-135m", "--prompt", "The color of the sky is", "--json", "--top", "3")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["engine"] == "gpu" and len(data["top"]) == 3 and data["top"][0]["id"] == 253


def test_info_names_the_adapter():
    p = labkit("info", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["backend"] and d["limits"]["max-storage-buffer-binding-size"] > 0


def test_errors_are_one_line(tmp_path, tiny_model):
    assert_one_line_error(labkit("run", str(tmp_path / "missing.gguf"), "--prompt", "x"), "no such file")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    assert_one_line_error(labkit("run", str(bad), "--prompt", "x"), "not a GGUF file")
    cut = tmp_path / "cut.gguf"
    src = tiny_model("llama", "Q8_0").read_bytes()
    cut.write_bytes(src[: len(src) // 2])
    assert_one_line_error(labkit("run", str(cut), "--prompt", "x"), "truncated")
    assert_one_line_error(labkit("run", "no-such-model", "--prompt", "x"), "unknown model")
    long_prompt = "word " * 9000  # > 8192 tokens, < the 128 KiB argv limit
    assert_one_line_error(labkit("run", "smollm2-135m", "--prompt", long_prompt), "exceeds the context")
    assert_one_line_error(labkit("run", "smollm2-135m", "--prompt", "x", "--variant", "nonsense"), "op=name")


# ---- bad input: one line, exit 2, typed errors in the library, nothing on disk modified


class _ByteVocabWriter(GGUFWriter):
    """GGUFWriter whose token list starts with GPT-2's 256 byte characters: any text tokenizes."""

    def add_token_list(self, tokens) -> None:
        super().add_token_list([_BYTE_ENCODER[b] for b in range(256)] + list(tokens)[256:])


@pytest.fixture(scope="module")
def byte_model(tmp_path_factory):
    """Factory: byte_model(weight_type, **spec) -> a tiny model that can tokenize any text."""
    made: dict = {}

    def make(weight_type: str = "Q8_0", **kw) -> Path:
        key = (weight_type, tuple(sorted(kw.items())))
        if key not in made:
            path = tmp_path_factory.mktemp("bytevocab") / f"tiny-{weight_type.lower()}.gguf"
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(tiny, "GGUFWriter", _ByteVocabWriter)
                made[key] = tiny.write_tiny_model(path, tiny.TinySpec(weight_type=weight_type, **kw))
        return made[key]

    return make


def snapshot(*paths: Path) -> dict:
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in paths}


def check_one_line(code: int, err: str, needle: str = "", want_code: int = 1) -> str:
    assert code == want_code, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("labkit: error:"), err
    assert "Traceback" not in err
    assert needle in lines[0], lines[0]
    return lines[0]


def call_main(capsys, *argv: str) -> tuple[int, str]:
    """labkit.cli.main in this process: (exit code, stderr)."""
    try:
        code = cli.main(list(argv))
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def wgsl_with_unknown_identifier() -> tuple[str, int]:
    """add.wgsl with `foo(1u)` inserted before its bounds check: (source, 1-based line of foo)."""
    lines = lk.kernel_source("add").splitlines()
    at = next(i for i, ln in enumerate(lines) if "if (i >= P.n)" in ln)
    lines.insert(at, "    let zz = foo(1u);")
    return "\n".join(lines) + "\n", at + 1


@pytest.mark.parametrize(
    "argv, needle",
    [
        ([], "required: cmd"),
        (["frob"], "invalid choice: 'frob'"),
        (["run", "m", "--prompt", "x", "--engine", "foo"], "--engine: invalid choice: 'foo'"),
        (["run", "m", "--prompt", "x", "--top", "x"], "--top: invalid int value: 'x'"),
        (["run", "m", "--prompt", "x", "--top", "-1"], "--top: must be >= 0"),
        (["run", "m", "--prompt", "x", "--max-new-tokens", "-3"], "--max-new-tokens: must be >= 0"),
        (["run", "m"], "required: --prompt"),
        (["run", "m", "--prompt", "x", "--bogus"], "unrecognized arguments: --bogus"),
        (["compare", "m", "--prompt", "x", "--against", "nope"], "--against: invalid choice: 'nope'"),
        (["run", "m", "--prompt", "x", "--wgsl", "add=mine"], "op=name=file"),
    ],
)
def test_usage_errors_are_one_line(capsys, argv, needle):
    check_one_line(*call_main(capsys, *argv), needle)


def test_usage_error_from_the_command_line():
    assert_one_line_error(labkit("run", "m", "--prompt", "x", "--engine", "foo"), "invalid choice")


def test_bad_models_are_one_line_and_untouched(tmp_path, tiny_model, byte_model):
    mamba = tiny_model("mamba", "Q8_0")
    q1 = byte_model("Q1_0")  # llama.cpp's 1-bit type: neither gguf.quants nor labkit reads it
    plain = tiny_model("llama", "Q8_0")  # its vocabulary has no byte tokens: text cannot be tokenized
    small = byte_model("Q8_0")
    before = snapshot(mamba, q1, plain, small)
    assert_one_line_error(labkit("run", str(mamba), "--prompt", "x"), "architecture 'mamba' is not supported")
    for engine in ("gpu", "reference"):
        line = assert_one_line_error(labkit("run", str(q1), "--prompt", "hi", "--engine", engine))
        assert "Q1_0" in line, line
    assert_one_line_error(labkit("run", str(plain), "--prompt", "hello"), "no token for the byte(s)")
    assert_one_line_error(labkit("run", str(small), "--prompt", "a" * 300), "exceeds the context")
    assert_one_line_error(labkit("run", str(small), "--prompt", "x", "--variant", "add=nope"), "unknown variant")
    assert_one_line_error(labkit("run", str(small), "--prompt", "x", "--variant", "frob=x"), "unknown op family")
    assert snapshot(mamba, q1, plain, small) == before


def test_bad_models_raise_typed_errors(tiny_model, byte_model):
    with pytest.raises(UnsupportedArchitectureError, match="mamba"):
        lk.open(str(tiny_model("mamba", "Q8_0")))
    lab = lk.open(str(byte_model("Q1_0")))
    with pytest.raises(UnsupportedTensorTypeError):
        lab.run("hi")
    with pytest.raises(UnsupportedTensorTypeError):
        lab.reference("hi")
    plain = lk.open(str(tiny_model("llama", "Q8_0")))
    with pytest.raises(TokenizerError, match="0x65") as e:
        plain.tokenize("hello")
    assert isinstance(e.value, ValueError)  # still a ValueError for old callers
    with pytest.raises(TokenIdError) as e:
        plain.piece(10**6)
    assert isinstance(e.value, IndexError)
    with pytest.raises(UnknownVariantError):
        lk.open(str(byte_model("Q8_0")), variants={"add": "nope"})
    with pytest.raises(GpuLimitError):
        grid(-1)


def test_user_wgsl_from_the_command_line(tmp_path, byte_model):
    model = byte_model("Q8_0")
    bad, line = wgsl_with_unknown_identifier()
    files = {"bad": bad, "good": lk.kernel_source("add") + "// my copy\n"}
    composed = lk.kernel_source("matmul_q8_0", "row")
    files["iface"] = composed.replace("var<storage, read> X: array<f32>", "var<storage, read_write> X: array<f32>")
    assert files["iface"] != composed
    for name, text in files.items():
        (tmp_path / f"{name}.wgsl").write_text(text)
    paths = [model, *(tmp_path / f"{n}.wgsl" for n in files)]
    before = snapshot(*paths)

    err = assert_one_line_error(labkit("run", str(model), "--prompt", "x", "--wgsl", f"add=mine={tmp_path}/bad.wgsl"))
    assert f"line {line}" in err and "foo" in err, err
    err = assert_one_line_error(
        labkit("compare", str(model), "--prompt", "x", "--wgsl", f"matmul_q8_0=mm={tmp_path}/iface.wgsl")
    )
    assert "@binding(1)" in err and "read_write" in err, err
    assert_one_line_error(
        labkit("run", str(model), "--prompt", "x", "--wgsl", f"add=m={tmp_path}/no.wgsl"), "no such file"
    )
    assert_one_line_error(labkit("run", str(model), "--prompt", "x", "--wgsl", f"frob=m={tmp_path}/good.wgsl"), "frob")

    p = labkit("run", str(model), "--prompt", "hi", "--json", "--wgsl", f"add=mine={tmp_path}/good.wgsl")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["variants"] == {"add": "mine"}
    assert snapshot(*paths) == before


def test_register_variant_checks_compile_and_interface():
    bad, line = wgsl_with_unknown_identifier()
    with pytest.raises(ShaderCompileError) as e:
        lk.register_variant("add", "broken", bad)
    assert f"line {line}" in str(e.value) and "foo(1u)" in str(e.value)
    src = lk.kernel_source("add")
    wrong = src.replace("var<uniform> P: Params", "var<storage, read> P: Params")
    wrong += "@group(0) @binding(4) var<storage, read_write> Z: array<f32>;\n"
    with pytest.raises(VariantInterfaceError) as e:
        lk.register_variant("add", "wrong", wrong)
    msg = str(e.value)
    assert "@binding(3) is var<storage, read>, should be var<uniform>" in msg, msg
    assert "@binding(4) var<storage, read_write> is not in the interface" in msg, msg
    composed = lk.kernel_source("matmul_q4_k", "row")  # common + quant_q4_k + matmul, composed
    writes_x = composed.replace("var<storage, read> X: array<f32>", "var<storage, read_write> X: array<f32>")
    assert writes_x != composed
    with pytest.raises(VariantInterfaceError, match=r"@binding\(1\) is var<storage, read_write>, should be"):
        lk.register_variant("matmul_q4_k", "writes_x", writes_x)
    assert {"broken", "wrong"}.isdisjoint(variants()["add"]) and "writes_x" not in variants()["matmul_q4_k"]


def test_internal_errors_are_one_line_with_exit_3(capsys, monkeypatch):
    def boom(args):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(cli, "cmd_models", boom)
    monkeypatch.delenv("LABKIT_TRACEBACK", raising=False)
    err = check_one_line(*call_main(capsys, "models"), "internal error: RuntimeError: first line", want_code=3)
    assert "second line" in err and "LABKIT_TRACEBACK=1" in err
    monkeypatch.setenv("LABKIT_TRACEBACK", "1")
    with pytest.raises(RuntimeError):
        cli.main(["models"])


def test_lab_without_jupyter_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))  # no jupyter beside it
    monkeypatch.setenv("PATH", str(tmp_path))  # and none on PATH
    code = cli.main(["lab"])
    check_one_line(code, capsys.readouterr().err, "`jupyter` is not on PATH")


def test_lab_serves_the_walkthrough(tmp_path):
    """`labkit lab` (what `make lab` runs) starts JupyterLab, as root too, with the walkthrough open."""
    import time
    import urllib.request

    port = free_port()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), BROWSER="true")
    args = ["lab", "--no-browser", f"--port={port}", "--ServerApp.token=", "--ServerApp.ip=127.0.0.1"]
    proc = subprocess.Popen([sys.executable, "-m", "labkit.cli", *args], env=env, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(240):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/api/contents/notebooks", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()[-2000:]
                time.sleep(0.5)
        else:
            pytest.fail("JupyterLab did not answer")
        names = [c["name"] for c in json.loads(body)["content"]]
        assert "01_walkthrough.ipynb" in names
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_compare_against_llamacpp_honours_engine(capsys, monkeypatch, byte_model):
    """Side a of `compare --against llamacpp` is the engine asked for (llama.cpp stubbed by the reference)."""
    calls = []

    def fake_oracle(self, prompt):
        calls.append("oracle")
        return self.reference(prompt)

    def no_gpu(self, *a, **kw):
        raise AssertionError("--engine reference must not run the GPU")

    monkeypatch.setattr(Lab, "oracle", fake_oracle)
    monkeypatch.setattr(Lab, "run", no_gpu)
    code = cli.main(
        [
            "compare",
            str(byte_model("Q8_0")),
            "--prompt",
            "hi",
            "--against",
            "llamacpp",
            "--engine",
            "reference",
            "--json",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and calls == ["oracle"], out
    assert json.loads(out)


def test_cases_and_variants_json():
    p = labkit("cases", "--json")
    assert p.returncode == 0, p.stderr
    listed = json.loads(p.stdout)
    assert {c["name"] for c in listed} >= {"q4k-sign", "sky-kaw", "lm-head-unwritten", "norm-cascade", "top-p-order"}
    assert all(c["model"] and c["fault"] for c in listed)
    assert {c["name"] for c in listed if not c["postmortem"]} == {"moe-router", "batch-crosstalk"}  # no post-mortem
    p = labkit("variants", "--json")
    assert p.returncode == 0, p.stderr
    docs = json.loads(p.stdout)
    assert docs["rope"]["normal_pairs"] and docs["attn_workgroups"]["streaming_count"]
    assert set(docs) == set(variants())


@pytest.mark.slow
def test_case_from_the_command_line_exits_0_with_a_passed_report():
    """`labkit case NAME --json`, end to end in a fresh process (the other cases run in test_cases.py)."""
    p = labkit("case", "top-p-order", "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["passed"] is True and report["name"] == "top-p-order"
    assert report["first_divergence"] == report["expected_divergence"]
    assert all(s["faulty"]["present"] and not s["fixed"]["present"] for s in report["symptoms"])
    assert all(c["fixed"]["passed"] for c in report["checklist"])
    assert_one_line_error(labkit("case", "no-such-case"), "no-such-case")


@pytest.mark.slow
def test_non_editable_install_runs_a_case(tmp_path):
    """`pip install .` (a wheel, not the editable checkout) carries its package data: the kernels
    beside the ops, the post-mortems and the golden files, read through importlib.resources."""
    import shutil

    root, src, target = Path(__file__).resolve().parents[1], tmp_path / "src", tmp_path / "site"
    shutil.copytree(root / "labkit", src / "labkit", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(root / name, src / name)  # a copy: the build writes build/ and *.egg-info beside it
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    p = subprocess.run([*pip, str(src)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (target / "labkit" / "__editable__").exists() and all(
        (target / "labkit" / "ops" / f).is_file()
        for f in (
            "rope/rope.wgsl",
            "rope/faults/rope_normal_pairs.wgsl",
            "lib/common.wgsl",
            "matmul/formats/quant_q4_k.wgsl",
        )
    )
    script = tmp_path / "run_installed.py"
    script.write_text(
        "import sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import labkit\n"
        "from labkit.bench import GOLDEN_DIR\n"
        "from labkit.casebook import get_case\n"
        "from labkit.cli import main\n"
        "assert labkit.__file__.startswith(sys.argv[1]), labkit.__file__\n"
        "pm = get_case('norm-cascade').postmortem_path\n"
        "assert str(pm).startswith(sys.argv[1]) and 'RMSNorm' in pm.read_text(), pm\n"
        "assert str(GOLDEN_DIR).startswith(sys.argv[1]) and (GOLDEN_DIR / 'gemma3-270m.json').is_file()\n"
        "sys.exit(main(['case', 'norm-cascade', '--json']))\n"
    )
    p = subprocess.run([sys.executable, str(script), str(target)], capture_output=True, text=True, cwd=tmp_path,
                       timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    report = json.loads(p.stdout)
    assert report["passed"] and report["first_divergence"] == "blk.0.attn_norm"


def test_bench_lengths_json(tiny_model):
    """`labkit bench --lengths --json`: every engine at every length (llama.cpp cannot load a tiny
    file and is left out), the re-run and per-op figures, ratios derived again on load."""
    from labkit.bench import BenchReport

    model = tiny_model("llama", "Q8_0")
    p = labkit("bench", str(model), "--lengths", "3,17", "--repeats", "1", "--decode-tokens", "3", "--json")
    assert p.returncode == 0, p.stderr
    assert "bench:" not in p.stderr  # --json is quiet
    report = BenchReport.from_dict(json.loads(p.stdout))
    assert set(report.engines) == {"gpu", "reference"}
    gpu = report.engines["gpu"]
    assert [f.length for f in gpu.lengths] == [3, 17]
    assert all(f.logits_all_s and f.all_stages_s and f.last_only_s for f in gpu.lengths)
    assert gpu.decode_tok_s > 0 and gpu.rerun_after_switch_s > 0 and gpu.peak_rss_mb > 0
    # the host's part of a warm step is inside the step's wall time; a step runs every layer's stages
    assert 0 < gpu.host_ms_per_step < 1e3 / gpu.decode_tok_s
    assert gpu.dispatches_per_step >= 2 * 7  # two layers of the tiny llama, at least seven dispatches each
    assert report.engines["reference"].host_ms_per_step is None
    from labkit.gpu.device import get_device  # the bench's process has this one's environment

    assert gpu.recorded_ahead == (1.0 if get_device().has_spare_core else 0.0)
    fams = {o.family: o for o in report.op_families}
    assert fams["matmul_q8_0"].gflops > 0 and fams["matmul_q8_0"].gbps > 0
    step = {o.family: o for o in report.decode_op_families}
    assert step["matmul_q8_0"].gbps > 0 and step["matmul_q8_0"].dispatches == fams["matmul_q8_0"].dispatches
    assert "gpu/reference prefill T=17" in report.ratios()
    assert_one_line_error(labkit("bench", str(model), "--lengths", "3,x"), "--lengths")
    assert_one_line_error(labkit("bench", str(model), "--engines", "gpu,vllm"), "vllm")


def _cpuinfo(name: str, family: int, model: int, mhz: str, flags: str, n: int) -> str:
    one = f"processor\t: {{i}}\nvendor_id\t: x\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: {name}\n"
    return "\n".join(one.format(i=i) + f"cpu MHz\t\t: {mhz}\nflags\t\t: fpu sse2 {flags}\n" for i in range(n))


def test_cpu_model_says_what_a_vm_hides():
    """A VM's cpuinfo names the part vaguely ("AMD EPYC"): the figures' CPU line adds the family and
    model, the clock, the cores and AVX-512 (llvmpipe's vector registers: 32 with it, 16 without)."""
    from labkit.bench import cpu_model

    amd = _cpuinfo("AMD EPYC", 25, 1, "2445.404", "avx avx2 fma", 2)
    assert cpu_model(amd) == "AMD EPYC (family 25 model 1, 2445 MHz, 2 cores, no AVX-512)"
    xeon = _cpuinfo("Intel(R) Xeon(R) Processor", 6, 207, "2100.000", "avx2 avx512f avx512bw", 4)
    assert cpu_model(xeon) == "Intel(R) Xeon(R) Processor (family 6 model 207, 2100 MHz, 4 cores, AVX-512)"
    assert cpu_model("processor\t: 0\n") == "unknown CPU"
    assert " cores, " in cpu_model() and "family " in cpu_model()  # this host's /proc/cpuinfo parses
