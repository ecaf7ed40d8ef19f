"""Sweeps on real Dask processes: a LocalCluster of 2 worker processes, a scheduler and 2 workers
this test starts itself (the CLI against them), a real model swept, ddmin reducing a prompt."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from labkit.errors import InputFileError, InvalidArgumentError, UnknownVariantError
from labkit.sweeps import load_results, parse_selection, read_prompts, reduce_prompt, save_results, sweep, throughput

distributed = pytest.importorskip("distributed")
BIN = Path(sys.executable).parent
PROMPTS = [[1, 5, 9, 7, 3], [1, 4, 4, 9, 2, 7, 7, 3, 8], [1, 11, 2]]


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")
    c = distributed.Client(cluster)
    yield c
    c.close()
    cluster.close()


def test_sweep_two_worker_processes(client, tiny_model):
    """A fault must fit the model: normal (2i, 2i+1) rope is wrong on neox gemma and right on llama."""
    gemma, llama = str(tiny_model("gemma3", "Q8_0")), str(tiny_model("llama", "Q8_0"))
    df = sweep([gemma, llama], PROMPTS, [{}, {"rope": "normal_pairs"}], client=client, progress=False)
    assert len(df) == 12 and ("error" not in df or df["error"].isna().all())
    defaults = df[df["variants"] == "default"]
    assert not defaults["diverged"].any(), defaults[["model", "first_divergence"]]
    bad = df[(df["variants"] == "rope=normal_pairs") & df["model"].str.contains("gemma3")]
    assert bad["diverged"].all() and set(bad["first_divergence_kind"]) == {"q_rope"}
    assert (bad["first_divergence_position"] >= 1).all()  # position 0 has no rotation
    fine = df[(df["variants"] == "rope=normal_pairs") & df["model"].str.contains("llama")]
    assert not fine["diverged"].any()
    assert set(df["n_tokens"]) == {5, 9, 3} and df["top1_agree"].all()
    assert {f"nmse.{k}" for k in ("q_rope", "attn_probs", "logits")} <= set(df.columns)
    # two worker processes, each opening a model at most once
    workers = set(client.scheduler_info()["workers"])
    assert set(df["worker"]) <= workers and df["worker"].nunique() == 2, set(df["worker"])
    opened = df[df["open_s"] > 0].groupby(["worker", "model"]).size()
    assert (opened <= 1).all(), opened


def test_a_prompts_selections_on_one_worker_share_its_reference_pass(tiny_model):
    """Tasks run in this process, as a worker runs them: the second selection of a prompt compares
    with the reference its first made; another prompt makes its own, and the first prompt's is then
    made again. The kept reference gives the verdict a freshly made one gives, to the last NMSE."""
    from labkit.sweeps.task import run_task

    model = str(tiny_model("gemma3", "Q8_0"))
    a, b, bad = PROMPTS[0], PROMPTS[1], {"rope": "normal_pairs"}
    rows = [run_task(model, p, v, "reference") for p, v in ((a, {}), (a, bad), (b, bad), (a, bad))]
    assert not any("error" in r for r in rows), rows
    assert [r["against_kept"] for r in rows[1:]] == [True, False, False]
    kept, fresh = rows[1], rows[3]  # the same task: against the kept reference, and a new one
    assert kept["diverged"] and kept["first_divergence_kind"] == "q_rope"
    verdict = [k for k in fresh if k.startswith("nmse.") or k.startswith("first_divergence")]
    assert len(verdict) > 5 and {k: kept[k] for k in verdict} == {k: fresh[k] for k in verdict}


def test_a_failing_task_is_an_error_row(client, tiny_model, tmp_path):
    model = str(tiny_model("llama", "Q8_0"))
    df = sweep(model, [[1, 5, 9], [1, 99999], "x" * 4], [{}], client=client, progress=False)
    errors = df[df["error"].notna()]
    assert len(df) == 3 and len(errors) >= 1
    assert "PromptTooLongError" in set(errors["error_type"]), errors[["prompt", "error"]]
    assert pd.isna(df.loc[0, "error"]) and df.loc[0, "n_tokens"] == 3  # the good prompt ran
    # the Parquet round trip keeps every column, the values and the configuration
    path = tmp_path / "sweep.parquet"
    save_results(df, path, df.attrs["labkit.sweep"])
    back, config = load_results(path)
    assert list(back.columns) == list(df.columns)
    assert config == json.loads(json.dumps(df.attrs["labkit.sweep"])) and back.attrs["labkit.sweep"] == config
    assert back["error_type"].tolist() == df["error_type"].tolist()
    assert [list(t) for t in back["tokens"][:2]] == [[1, 5, 9], [1, 99999]] and back["prompt"][2] == "x" * 4
    with pytest.raises(InputFileError, match="not a labkit sweep"):
        df.to_parquet(tmp_path / "plain.parquet")
        load_results(tmp_path / "plain.parquet")


def test_real_model_sweep(client):
    """SmolLM2, 8 prompts x 3 selections: none, normal rope (its own: harmless), the norm scale clamped."""
    prompts = [
        "The color of the sky is",
        "Water boils at",
        "The capital of France is",
        "One, two, three,",
        "def add(a, b):",
        "In 1969 the first person walked on",
        "The quick brown fox jumps over the lazy",
        "Photosynthesis turns sunlight into",
    ]
    sels = [{}, {"rope": "normal_pairs"}, {"rmsnorm": "scale_clamp"}]
    df = sweep("smollm2-135m", prompts, sels, client=client, progress=False)
    assert len(df) == 24 and ("error" not in df or df["error"].isna().all())
    by = {v: df[df["variants"] == v] for v in df["variants"].unique()}
    assert not by["default"]["diverged"].any() and not by["rope=normal_pairs"]["diverged"].any()
    assert by["rmsnorm=scale_clamp"]["diverged"].all()
    assert set(by["rmsnorm=scale_clamp"]["first_divergence_kind"]) == {"attn_norm"}
    rate = throughput(df)
    assert rate["tasks"] == 24 and rate["tasks_per_min"] > 0 and 0 <= rate["open_share"] < 1


def test_reduce_keeps_the_divergence_kind(client, tiny_model):
    model = str(tiny_model("gemma3", "Q8_0"))
    long = [1] + [3 + (i * 7) % 40 for i in range(23)]
    red = reduce_prompt(model, long, {"rope": "normal_pairs"}, client=client)
    assert red.kind == "q_rope" and red.first_divergence.endswith("q_rope")
    assert len(red.tokens) < len(long) and red.tokens[0] == 1  # BOS kept
    assert len(red.tokens) == 2, red.summary()  # one rotated token after BOS is all the fault needs
    assert red.rounds >= 3 and red.tested > red.rounds and red.history == sorted(red.history, reverse=True)
    assert len(red.history) == red.rounds, (red.rounds, red.history)  # one length a round, the last included
    assert red.history[-1] == len(red.tokens) - 1  # the body's length, after the BOS
    with pytest.raises(InvalidArgumentError, match="does not diverge"):
        reduce_prompt(model, long, {}, client=client)


def test_a_reduction_that_stops_above_one_token_counts_its_last_round(client, tmp_path):
    """A sliding-window fault needs a prompt past the window (tiny Gemma 3's is 6): the reduction stops at 7
    tokens when a whole round finds nothing smaller, and that round is in the history like the others."""
    from labkit.model.tiny import TinySpec, write_tiny_model

    model = str(write_tiny_model(tmp_path / "tiny-gemma3.gguf", TinySpec(arch="gemma3", sliding_window=6)))
    long = [(7 * i + 3) % 200 + 10 for i in range(32)]
    red = reduce_prompt(model, long, {"attn_scores": "window_off_by_one"}, client=client)
    assert len(red.tokens) == 7 and red.kind == "attn_scores", red.summary()
    assert len(red.history) == red.rounds and red.history[-1] == 7, (red.rounds, red.history)
    assert red.history[-2] == 7, "the last round found nothing smaller: the round before it reached 7"


def test_selection_and_prompt_files(tmp_path):
    assert parse_selection("rope=normal_pairs,softmax=no_max_sub") == {"rope": "normal_pairs", "softmax": "no_max_sub"}
    assert parse_selection("default") == {}
    for bad in ("rope", "rope=", "=x"):
        with pytest.raises(InvalidArgumentError):
            parse_selection(bad)
    with pytest.raises(UnknownVariantError):
        parse_selection("rope=nope")
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    (tmp_path / "p.jsonl").write_text('"one"\n{"prompt": "two"}\n{"tokens": [1, 2]}\n')
    assert read_prompts(tmp_path / "p.txt") == ["one", "two"]
    assert read_prompts(tmp_path / "p.jsonl") == ["one", "two", [1, 2]]
    (tmp_path / "bad.jsonl").write_text('{"nope": 1}\n')
    with pytest.raises(InputFileError, match="bad.jsonl:1"):
        read_prompts(tmp_path / "bad.jsonl")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_cli_against_a_scheduler_and_two_workers(tiny_model, tmp_path):
    """`dask scheduler` and two `dask worker` processes on 127.0.0.1, started and stopped here; the
    sweep's tasks ran on those workers, and reduce runs there too."""
    port = free_port()
    addr = f"tcp://127.0.0.1:{port}"
    dask = str(BIN / "dask")
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    scheduler = [dask, "scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address", ":0"]
    procs = [subprocess.Popen(scheduler, **quiet)]
    try:
        for name in ("w1", "w2"):
            worker = [dask, "worker", addr, "--nthreads", "1", "--name", name, "--no-nanny"]
            procs.append(subprocess.Popen(worker, **quiet))
        with distributed.Client(addr, timeout="30s") as c:
            c.wait_for_workers(2, timeout=60)
            workers = set(c.scheduler_info()["workers"])
        model = str(tiny_model("gemma3", "Q8_0"))
        prompts = tmp_path / "p.jsonl"
        prompts.write_text("\n".join(json.dumps({"tokens": p}) for p in PROMPTS * 2))
        out = tmp_path / "r.parquet"
        cmd = [str(BIN / "labkit"), "sweep", model, "--prompts", str(prompts), "--variant", "rope=normal_pairs",
               "--variant", "default", "--scheduler", addr, "--out", str(out), "--json"]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        data = json.loads(p.stdout)
        assert len(data["rows"]) == 12 and data["config"]["scheduler"] == addr
        ran_on = {r["worker"] for r in data["rows"]}
        assert ran_on <= workers and len(ran_on) == 2, (ran_on, workers)
        df, config = load_results(out)
        assert len(df) == 12 and config["variants"] == ["rope=normal_pairs", "default"]
        cmd = [str(BIN / "labkit"), "reduce", model, "--tokens", ",".join(map(str, PROMPTS[1])), "--variant",
               "rope=normal_pairs", "--scheduler", addr, "--json"]  # fmt: skip
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        red = json.loads(p.stdout)
        assert red["kind"] == "q_rope" and len(red["tokens"]) == 2
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
