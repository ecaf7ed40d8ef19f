"""A reproducer for one stage: what an engine developer attaches to a bug report.

`Attribution.repro(stage, out=DIR)` (and `labkit repro`) writes a new directory with:
- `inputs.npz`: the stage's inputs as the engine had them (`input:<stage>`), its output
  (`engine_output`), the float64 recomputation (`expected`), the token ids and positions,
  the KV cache before a decode step (`past_k:<layer>`), and each weight's raw GGUF blocks
  (`weight:<name>`) when they fit in WEIGHT_BYTES;
- `stage.json`: the stage (or segment), its ops and parameters, the weights' GGUF names,
  types and shapes, the band, the limit and the verdict;
- `check_stage.py`: re-checks the stage with numpy and gguf only, exit 1 when outside;
- `test_backend_ops.txt` and `.json`: the ops in the form llama.cpp's test-backend-ops reads
  (`--test-file`), and the same with names (labkit.attribution.ggml_ops);
- `attribution.jsonl`: every stage's row of the attribution.
"""

from __future__ import annotations

import inspect
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from labkit.attribution import check_stage
from labkit.attribution.ggml_ops import ggml_ops
from labkit.attribution.segments import Segment, kv_writers
from labkit.errors import InvalidArgumentError
from labkit.ops import attn_ctx, attn_scores, glu, rmsnorm, rope, softcap, softmax

WEIGHT_BYTES = 64 << 20  # raw GGUF blocks stored in inputs.npz up to this size; larger: read from the file
_OPS_MARK = ("# --- ops: replaced by their source when written into a reproducer ---", "# --- end of ops ---")
_OP_FUNCTIONS = (rmsnorm.rmsnorm, rope.scaling_of, rope.scaled_angles, rope.rope, attn_scores.attention_mask,
                 attn_scores.scores, softmax.softmax, attn_ctx.context, glu.gelu_tanh, glu.silu, glu.swiglu_oai,
                 softcap.softcap)  # fmt: skip


@dataclass(frozen=True)
class Repro:
    """What was written, and the verdict the check script will give."""

    directory: Path
    files: tuple[str, ...]
    stage: str
    guilty: bool


def write_repro(att: Any, stage: str, out: str | Path) -> Repro:
    """`att.repro(stage, out)` for an Attribution (labkit.attribution.report, which calls this)."""
    run, lab, ctx, segments = att._repro
    row = att.row(stage)
    seg: Segment = segments[row.stage]
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise InvalidArgumentError(f"{out} exists and is not empty: a reproducer goes into a new directory")
    out.mkdir(parents=True, exist_ok=True)
    stages = [ctx.by_name[n] for n in seg.stages]
    weights = sorted({w for st in stages for w in st.tensors.values()})  # rope_freqs, sinks, scales too
    arrays = _arrays(run, ctx, seg, stages, weights, lab)
    np.savez_compressed(out / "inputs.npz", **arrays)
    spec = _spec(att, row, seg, stages, weights, lab, arrays)
    (out / "stage.json").write_text(json.dumps(spec, indent=1))
    (out / "check_stage.py").write_text(check_script())
    ops = ggml_ops(stages, ctx, lab)
    (out / "test_backend_ops.json").write_text(json.dumps(ops, indent=1))
    (out / "attribution.jsonl").write_text(att.to_jsonl() + "\n")
    files = ("inputs.npz", "stage.json", "check_stage.py", "test_backend_ops.json", "attribution.jsonl")
    if ops["test_file"]:  # `test-backend-ops --test-file test_backend_ops.txt`, with this ggml's op ids
        (out / "test_backend_ops.txt").write_text(ops["test_file"])
        files += ("test_backend_ops.txt",)
    return Repro(out, files, row.name, row.guilty)


def _arrays(run, ctx, seg: Segment, stages, weights: list[str], lab) -> dict[str, np.ndarray]:
    from labkit.attribution.evaluate import evaluate

    arrays = {f"input:{n}": np.asarray(run.captures[n]) for n in seg.inputs}
    arrays["engine_output"] = np.asarray(run.captures[seg.stage])
    arrays["expected"] = evaluate(seg, run.captures, ctx)
    arrays["ids"], arrays["positions"] = np.asarray(ctx.ids), np.asarray(ctx.positions)
    for st in stages:
        for kind in st.kv_read:
            if (st.layer, kind) in ctx.past:
                arrays[f"past_{kind}:{st.layer}"] = ctx.past[(st.layer, kind)]
    if sum(lab.gguf.tensors[w].nbytes for w in weights) <= WEIGHT_BYTES:
        for w in weights:
            t = lab.gguf.tensors[w]
            arrays[f"weight:{w}"] = np.frombuffer(lab.gguf.raw(w), np.uint8).reshape(t.n_rows, -1)
    return arrays


def _spec(att: Any, row, seg: Segment, stages, weights, lab, arrays) -> dict:
    writers = kv_writers(lab.graph)
    layers = {st.layer for st in stages if st.kv_read}
    return {
        "model": lab.name, "gguf": str(lab.path), "engine": att.engine, "precision": att.precision,
        "stage": row.stage, "name": row.name, "inputs": list(seg.inputs), "n_past": att.n_past,
        "segment": [_stage_dict(st) for st in stages],
        "kv_writers": {f"{L}:{k}": writers[(L, k)] for L in layers for k in ("k", "v")},
        "weights": {w: {"type": lab.gguf.tensors[w].type_name, "shape": list(lab.gguf.tensors[w].shape),
                        "stored": f"weight:{w}" in arrays} for w in weights},
        "local": row.local, "band": row.band, "k": att.k, "limit": row.limit, "guilty": row.guilty,
        "verdict": "guilty" if row.guilty else "ok", "row": asdict(row),
    }  # fmt: skip


def _stage_dict(st) -> dict:
    return {"name": st.name, "op": st.op, "inputs": list(st.inputs), "weight": st.weight, "bias": st.bias,
            "weight_rows": st.weight_rows, "params": dict(st.params), "layer": st.layer,
            "kv_read": list(st.kv_read)}  # fmt: skip


def check_script() -> str:
    """check_stage.py with labkit's reference op functions copied in place of their imports."""
    text = inspect.getsource(check_stage)
    head, rest = text.split(_OPS_MARK[0])
    _, tail = rest.split(_OPS_MARK[1])
    ops = "\n\n".join(inspect.getsource(f) for f in _OP_FUNCTIONS)
    prelude = "import math\n\n\nclass UnsupportedArchitectureError(ValueError):\n    pass\n\n\n"
    return head + "# labkit's float64 reference ops (labkit/ops), copied\n" + prelude + ops + tail
