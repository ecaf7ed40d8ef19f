"""A segment's stages as ggml ops, in the form llama.cpp's test-backend-ops reads.

`test-backend-ops --test-file FILE` builds one generic test case per line of a file that
`test-export-graph-ops` writes (ggml tests/test-backend-ops.cpp, make_test_cases_from_file;
llama.cpp PR 19896, which replaced its first JSON form with this text form):

    op type ne0 ne1 ne2 ne3 16 p0 … p15 n_src {type ne0 … ne3 nb0 … nb3}* name

with ggml's integer op and type ids, op_params as 16 int32 (floats as their bits), and nb in
bytes. The op ids move between ggml versions, so they are read from the ggml library that
llama-cpp-python ships (`ggml_op_name`); without it only the JSON is written. The JSON holds
the same fields with names beside the ids (the PR's first form: op, op_name, type, type_name,
ne, op_params, sources, name), for people and for other tools.

What a labkit stage is in ggml: matmul → MUL_MAT (weight src0, activations src1); rmsnorm →
RMS_NORM then MUL by the weight; rope → ROPE (mode 0 normal, 2 neox); attn_scores → MUL_MAT of
k and q (then SOFT_MAX does labkit's softmax, with the scale applied before it); attn_ctx →
MUL_MAT of v and the probabilities; glu → GLU (SWIGLU 2, GEGLU 1) in its split form; add →
ADD; embed → GET_ROWS. A softcap has no single ggml op and is left out, with a note.
"""

from __future__ import annotations

import struct

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from labkit.ops.rope import scaling_of

F32, I32 = GGMLQuantizationType.F32, GGMLQuantizationType.I32
_GLU = {"silu": 2, "gelu_tanh": 1, "swiglu_oai": 3}  # ggml_glu_op: SWIGLU, GEGLU, SWIGLU_OAI
_ROPE_MODE = {"normal": 0, "neox": 2}


def _bits(x: float) -> int:
    return struct.unpack("<i", struct.pack("<f", float(x)))[0]


def _tensor(qtype: int, ne: list[int]) -> dict:
    """A contiguous ggml tensor: ne (fastest first) and nb in bytes."""
    ne = [*ne, 1, 1, 1][:4]
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
    nb0 = size
    nb1 = size * ne[0] // block
    nb = [nb0, nb1, nb1 * ne[1], nb1 * ne[1] * ne[2]]
    return {"type": int(qtype), "type_name": GGMLQuantizationType(qtype).name.lower().replace("_k", "_K"),
            "ne": ne, "nb": nb}  # fmt: skip


def _op(name: str, out_ne: list[int], sources: list[dict], params: list[int] = (), stage: str = "") -> dict:
    p = [*params, *[0] * 16][:16]
    out = _tensor(F32, out_ne)
    return {"op": None, "op_name": name, "type": out["type"], "type_name": "f32", "ne": out["ne"], "op_params": p,
            "sources": sources, "name": stage}  # fmt: skip


def f32(*ne: int) -> dict:
    return _tensor(F32, list(ne))


def _weight(gguf, name: str, rows: int | None = None) -> dict:
    """A GGUF weight as ggml sees it: ne = [columns, rows] (a fused weight's row range: its rows)."""
    t = gguf.tensors[name]
    return _tensor(t.ggml_type, [t.n_cols, rows or t.n_rows])


def stage_ops(st, T: int, n_keys: int, gguf) -> list[dict]:
    """The ggml ops of one labkit stage on a pass of T tokens over n_keys cached positions."""
    P = st.params
    if st.op == "matmul":
        w = _weight(gguf, st.weight, P["out"])
        return [_op("MUL_MAT", [P["out"], T], [w, f32(w["ne"][0], T)], stage=st.name)]
    if st.op == "rmsnorm":
        g, n = P["group"], P["width"] // P["group"]
        norm = _op("RMS_NORM", [g, n, T], [f32(g, n, T)], [_bits(P["eps"])], st.name)
        return [norm, _op("MUL", [g, n, T], [f32(g, n, T), f32(g)], stage=st.name)]
    if st.op == "rope" and P.get("freq_factors"):  # the factors are src[2]: not in the file form
        return [{"op": None, "op_name": None, "name": st.name, "note": "rope with rope_freqs: src[2] factors"}]
    if st.op == "rope":
        hd, H = P["head_dim"], P["n_heads"]
        sc = scaling_of(P)  # ggml_rope_ext's op params: n_ctx_orig, base, then the scaling and YaRN's betas
        params = [0, P["rope_dim"], _ROPE_MODE[P["style"]], 0, P.get("n_ctx_orig", 0), _bits(P["base"])]
        params += [_bits(sc[k]) for k in ("freq_scale", "ext_factor", "attn_factor")]
        params += [_bits(P.get(k, 0.0)) for k in ("beta_fast", "beta_slow")]
        return [_op("ROPE", [hd, H, T], [f32(hd, H, T), _tensor(I32, [T])], params, st.name)]
    if st.op == "attn_scores":
        hd, H, KV = P["head_dim"], P["n_heads"], P["n_kv_heads"]
        return [_op("MUL_MAT", [n_keys, T, H], [f32(hd, n_keys, KV), f32(hd, T, H)], stage=st.name)]
    if st.op == "softmax" and P.get("sinks"):  # sinks are src[2] after a missing mask: not in the file form
        return [{"op": None, "op_name": None, "name": st.name, "note": "softmax with sinks: src[2] after no mask"}]
    if st.op == "softmax":
        return [_op("SOFT_MAX", [n_keys, T, P["n_heads"]], [f32(n_keys, T, P["n_heads"])], [_bits(1.0)], st.name)]
    if st.op == "attn_ctx":
        hd, H, KV = P["head_dim"], P["n_heads"], P["n_kv_heads"]
        return [_op("MUL_MAT", [hd, T, H], [f32(n_keys, hd, KV), f32(n_keys, T, H)], stage=st.name)]
    if st.op == "glu":
        n = P["width"]
        oai = [_bits(1.702), _bits(7.0)] if P["act"] == "swiglu_oai" else []  # alpha, limit (ggml_swiglu_oai)
        return [_op("GLU", [n, T], [f32(n, T), f32(n, T)], [_GLU[P["act"]], 0, *oai], st.name)]
    if st.op == "add":
        n = P.get("width") or 0
        return [_op("ADD", [n, T], [f32(n, T), f32(n, T)], stage=st.name)]
    if st.op == "embed":
        w = _weight(gguf, st.weight)
        return [_op("GET_ROWS", [w["ne"][0], T], [w, _tensor(I32, [T])], stage=st.name)]
    return [{"op": None, "op_name": None, "name": st.name, "note": f"{st.op}: no single ggml op"}]


def ggml_ops(stages, ctx, lab) -> dict:
    """{"ops": [...], "test_file": text for --test-file or None, "ggml": where the op ids came from}."""
    T, n_keys = len(ctx.ids), ctx.n_past + len(ctx.ids)
    ops = [op for st in stages for op in stage_ops(st, T, n_keys, lab.gguf)]
    ids = op_ids({op["op_name"] for op in ops if op["op_name"]})
    for op in ops:
        op["op"] = ids.get(op["op_name"]) if ids else None
    text = "".join(_line(op) for op in ops if op.get("op") is not None) if ids else None
    origin = "ggml_op_name of llama-cpp-python's ggml" if ids else "no ggml library here: op ids left out"
    return {"format": "test-backend-ops --test-file (llama.cpp PR 19896)", "ggml": origin, "ops": ops,
            "test_file": text}  # fmt: skip


def _line(op: dict) -> str:
    head = [op["op"], op["type"], *op["ne"], 16, *op["op_params"], len(op["sources"])]
    srcs = [v for s in op["sources"] for v in (s["type"], *s["ne"], *s["nb"])]
    return " ".join(map(str, [*head, *srcs, op["name"] or "-"])) + "\n"


def op_ids(names: set[str]) -> dict[str, int]:
    """ggml's integer op ids for these names, from the installed ggml; {} without it. Stops at the
    last name found, so it never reads past ggml's table."""
    try:
        import llama_cpp

        from labkit.oracle.llamacpp_run import _Ggml

        lib = _Ggml(llama_cpp).lib
    except Exception:
        return {}
    found: dict[str, int] = {}
    for i in range(256):
        if len(found) == len(names):
            break
        name = lib.ggml_op_name(i).decode()
        if name in names:
            found[name] = i
    return found if len(found) == len(names) else {}
