"""Re-check one stage of an engine's run with numpy and gguf only (no labkit): exit 1 when the
engine's output is outside its band, 0 when it is inside.

Written into a reproducer by `labkit repro` / `Attribution.repro`, beside `stage.json` (the
stage, its op and parameters, the weights' GGUF names, types and shapes, the limit) and
`inputs.npz` (the stage's inputs as the engine had them, its output, and the weights' raw
GGUF blocks when they fit). The ops below are labkit's float64 reference functions, copied in
when the file is written, so the check computes exactly what labkit's reference computes.

    python check_stage.py [--gguf MODEL.gguf]   # the file, when the weights were not stored
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

# --- ops: replaced by their source when written into a reproducer ---
from labkit.errors import UnsupportedArchitectureError  # noqa: F401 (rope raises it)
from labkit.ops.attn_ctx import context
from labkit.ops.attn_scores import attention_mask, scores  # noqa: F401 (scores calls attention_mask)
from labkit.ops.glu import gelu_tanh, silu, swiglu_oai
from labkit.ops.rmsnorm import rmsnorm
from labkit.ops.rope import rope, scaling_of
from labkit.ops.softcap import softcap
from labkit.ops.softmax import softmax

# --- end of ops ---

HERE = Path(__file__).resolve().parent
ACTIVATIONS = {"gelu_tanh": gelu_tanh, "silu": silu}


def weight(spec: dict, data, gguf_path: str | None, name: str, rows=None) -> np.ndarray:
    """A weight dequantized by gguf.quants, from the stored blocks or from the GGUF file."""
    import gguf
    from gguf.quants import dequantize

    info = spec["weights"][name]
    key = f"weight:{name}"
    if key in data.files:
        raw = data[key]
    else:
        reader = gguf.GGUFReader(gguf_path or spec["gguf"])
        raw = next(t for t in reader.tensors if t.name == name).data
    w = dequantize(np.asarray(raw), gguf.GGMLQuantizationType[info["type"]]).reshape(info["shape"])
    return w.astype(np.float64) if rows is None else w[rows[0] : rows[1]].astype(np.float64)


def run_stage(st: dict, vals: dict, ctx: dict) -> np.ndarray:
    """One stage in float64: the op of labkit's reference on the values computed so far."""
    op, P, xs = st["op"], st["params"], [vals[n] for n in st["inputs"]]
    W = ctx["weight"]
    if op == "rmsnorm":
        return rmsnorm(xs[0], W(st["weight"]), P["eps"], P["group"])
    if op == "matmul":
        y = xs[0] @ W(st["weight"], st["weight_rows"]).T
        return y + W(st["bias"]) if st["bias"] else y
    if op == "rope":
        rot = (P["n_heads"], P["head_dim"], P["rope_dim"], P["base"], P["style"])
        factors = W(P["freq_factors"]) if P.get("freq_factors") else None
        return rope(xs[0], ctx["positions"], *rot, scaling=scaling_of(P), freq_factors=factors)
    if op == "attn_scores":
        args = (P["n_heads"], P["n_kv_heads"], P["head_dim"], P["scale"], P["window"], P["softcap"])
        return scores(xs[0], ctx["cache"](st, "k", vals), ctx["n_past"], *args)
    if op == "softmax":
        if P.get("sinks"):
            raise SystemExit("check_stage: a softmax with sinks (gpt-oss) is not re-checked here")
        return softmax(xs[0])
    if op == "attn_ctx":
        return context(xs[0], ctx["cache"](st, "v", vals), P["n_heads"], P["n_kv_heads"], P["head_dim"])
    if op == "glu":
        return swiglu_oai(xs[0], xs[1]) if P["act"] == "swiglu_oai" else ACTIVATIONS[P["act"]](xs[0]) * xs[1]
    if op == "add":
        return xs[0] + xs[1]
    if op == "embed":
        return W(st["weight"])[ctx["ids"]] * P["scale"]
    if op == "softcap":
        return softcap(xs[0], P["cap"])
    raise SystemExit(f"check_stage: no op {op!r}")


def nmse(a: np.ndarray, b: np.ndarray) -> float:
    """Σ(a−b)² / Σb² over the elements finite on both sides (as labkit.compare)."""
    both = np.isfinite(a) & np.isfinite(b)
    num, den = float(np.sum((a - b)[both] ** 2)), float(np.sum(b[both] ** 2))
    return num / den if den > 0 else num


def main(argv: list[str]) -> int:
    spec = json.loads((HERE / "stage.json").read_text())
    data = np.load(HERE / "inputs.npz")
    gguf_path = argv[argv.index("--gguf") + 1] if "--gguf" in argv else None
    vals = {n: data[f"input:{n}"].astype(np.float64) for n in spec["inputs"]}

    def cache(st: dict, kind: str, now: dict) -> np.ndarray:
        past = f"past_{kind}:{st['layer']}"
        this = now[spec["kv_writers"][f"{st['layer']}:{kind}"]]
        return np.concatenate([data[past].astype(np.float64), this]) if past in data.files else this

    ctx = {
        "weight": lambda name, rows=None: weight(spec, data, gguf_path, name, rows),
        "ids": data["ids"], "positions": data["positions"], "n_past": spec["n_past"], "cache": cache,
    }  # fmt: skip
    for st in spec["segment"]:
        vals[st["name"]] = run_stage(st, vals, ctx)
    expected, engine = vals[spec["stage"]], data["engine_output"].astype(np.float64)
    local, limit = nmse(engine, expected), spec["limit"]
    made_nan = bool(np.any(np.isnan(engine) & ~np.isnan(expected)))
    bad = made_nan or local > limit
    verdict = "OUTSIDE the band" if bad else "inside the band"
    band = f"{spec['k']:g}x band {spec['band']:.1e}"
    print(f"{spec['name']}: local nmse {local:.3e}, limit {limit:.1e} ({band}): {verdict}")
    if made_nan:
        print(f"  the engine wrote NaN where the float64 recomputation has none ({int(np.isnan(engine).sum())})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
