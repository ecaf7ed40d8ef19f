"""moe_router: a mixture of experts' routing, as llama.cpp's build_moe_ffn does it, in three stages:
`ffn_router_probs` (softmax of the router's logits over all experts), `ffn_topk` (the k most probable
experts, integer ids, most probable first: llama.cpp's argsort of the probabilities) and
`ffn_expert_weights` (their probabilities, gathered at the ids and renormalized to sum to 1 where the
model does). Under softmax_weight gating (gpt-oss) there are no probabilities: the top k are the
logits', and the weights are a softmax over the k selected logits. A selection-only bias (the stage's
`bias`: ERNIE 4.5's and DeepSeek-V3's exp_probs_b) is added to the scores the top k rank, never to
the weights.

One kernel serves the three (its `what` field says which result), so the family `moe_router`
holds the routers' real bugs as variants, bound per layer like any other. Its parts are functions
the kernel calls (select, weigh, normalize); a fault replaces one part, and shows at the first
stage whose result that part makes: a wrong id in `ffn_topk`, a wrong weight in
`ffn_expert_weights`.
"""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose

PARAMS = Params(T="u32", n_expert="u32", k="u32", what="u32", norm="u32", x_offset="u32", ids_offset="u32",
                gating="u32", has_bias="u32", groups="u32", groups_used="u32", w_scale="f32")  # fmt: skip
WHAT = {"probs": 0, "ids": 1, "weights": 2}  # which result a stage keeps (its `out` param)
GATING = {"softmax": 0, "softmax_weight": 1, "sigmoid": 2}  # llama.cpp's expert gating functions labkit computes
MAX_K = 32  # experts per token the kernel holds (Qwen3-30B-A3B: 8 of 128; gpt-oss: 4 of 32)
SUM_FLOOR = 6.103515625e-5  # llama.cpp clamps the weights' sum to f16's smallest normal before dividing
# moe_router_<part>.wgsl, each a function (or two) the kernel calls
PARTS = ("select", "score", "weigh", "normalize", "groups", "scale")


def softmax_rows(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def top_k(probs: np.ndarray, k: int) -> np.ndarray:
    """The k largest per row, largest first; a tie goes to the lower expert index."""
    return np.argsort(-probs, axis=-1, kind="stable")[:, :k]


def group_limited(scores: np.ndarray, groups: int, used: int) -> np.ndarray:
    """DeepSeek-V3's group-limited routing, as llama.cpp's build_moe_ffn does it: each group's score is
    the sum of its two best scores; experts outside the `used` best groups get -inf."""
    T, n = scores.shape
    g = scores.reshape(T, groups, n // groups)
    best2 = -np.sort(-g, axis=-1)[..., :2].sum(axis=-1)
    keep = np.zeros((T, groups), bool)
    np.put_along_axis(keep, top_k(best2, used), True, axis=-1)
    return np.where(keep[..., None], g, -np.inf).reshape(T, n)


def expert_weights(scores: np.ndarray, ids: np.ndarray, norm: bool, gating: str = "softmax") -> np.ndarray:
    """The selected experts' probabilities, renormalized over the k where the model does; under
    softmax_weight gating, the softmax of the selected logits."""
    w = np.take_along_axis(scores, np.asarray(ids, np.int64), axis=-1)
    if gating == "softmax_weight":
        w = softmax_rows(w)
    return w / np.maximum(w.sum(axis=-1, keepdims=True), SUM_FLOOR) if norm else w


def reference(stage, ref) -> np.ndarray:
    """`ref.forced_ids` ({layer: ids}), when given, replaces a layer's top-k with another run's
    choice (teacher-forced routing): a near-tie that float32 and float64 break differently then
    shows as a tie at `ffn_topk`, and every later stage compares on the same experts."""
    P = stage.params
    if P["out"] == "probs":
        return 1.0 / (1.0 + np.exp(-ref.x[0])) if P.get("gating") == "sigmoid" else softmax_rows(ref.x[0])
    if P["out"] == "weights":
        return expert_weights(ref.x[0], ref.x[1], P["norm"], P.get("gating", "softmax")) * P.get("w_scale", 1.0)
    forced = getattr(ref, "forced_ids", None) or {}
    if stage.layer in forced:
        return np.asarray(forced[stage.layer], np.int32)
    bias = ref.weight(stage.bias) if stage.bias else 0.0  # ranks the experts, never weighs them
    scores = ref.x[0] + bias
    if P.get("groups", 0) > 1:
        scores = group_limited(scores, P["groups"], P["groups_used"])
    return top_k(scores, P["k"]).astype(np.int32)


def plan(stage, gpu):
    P = stage.params
    x = gpu.input(0)  # the logits (probs), else the probabilities
    ids = gpu.input(1) if P["out"] == "weights" else x  # the weights' ids (the others bind x there, unread)
    bias = gpu.vector(stage.bias) if stage.bias else x.buffer  # the selection bias (x there, unread, if none)
    T = x.shape[0]
    out = gpu.output((T, P["n_expert"]) if P["out"] == "probs" else (T, P["k"]))
    values = {
        "T": T,
        "n_expert": P["n_expert"],
        "k": P["k"],
        "what": WHAT[P["out"]],
        "norm": int(P["norm"]),
        "x_offset": x.offset,
        "ids_offset": ids.offset,
        "gating": GATING[P.get("gating", "softmax")],
        "has_bias": int(bool(stage.bias)),
        "groups": P.get("groups", 0),
        "groups_used": P.get("groups_used", 0),
        "w_scale": P.get("w_scale", 1.0),
    }
    gpu.dispatch([x.buffer, ids.buffer, out.buffer, bias], values, ceil_div(T, 64))
    return out


def shapes(stage) -> tuple[list[str], str]:
    P = stage.params
    n, k = P["n_expert"], P["k"]
    scores = "ffn_router" if P.get("gating") == "softmax_weight" else "ffn_router_probs"
    ins = {"probs": [f"ffn_router [T, {n}]"], "ids": [f"{scores} [T, {n}]"],
           "weights": [f"{scores} [T, {n}]", f"ffn_topk [T, {k}] int32"]}  # fmt: skip
    out = {"probs": f"[T, {n}]", "ids": f"[T, {k}] int32", "weights": f"[T, {k}]"}
    return ins[P["out"]], out[P["out"]]


def router_source(fault_part: str = "", fault: str = "") -> str:
    """The kernel: its parts, with `fault` (moe_router_<fault>.wgsl) in the place of `fault_part`."""
    parts = [f"moe_router_{fault if p == fault_part else p}" for p in PARTS]
    return compose(*parts, "moe_router")


def _kernel(name: str, doc: str, part: str = "") -> Kernel:
    src = router_source(part, name)
    return Kernel("moe_router", name, doc, lambda shape: src, faulty=bool(part))


FAULTS = (
    ("expert_index_off_by_one", "select",
     "each selected expert's id one too high (modulo the expert count): the right ranking and weights, the "
     "neighbouring expert run. Expert ids slip where engines offset or pad them: vllm-project/vllm-xpu-kernels#405 "
     "(the reference MoE indexed local experts without subtracting the rank's first expert, Qwen3-30B-A3B), "
     "huggingface/transformers#48653 (invalid router indices filled with num_experts, one past the last expert)"),
    ("softmax_after_topk", "weigh",
     "the softmax taken over the k selected logits instead of over all experts (each weight p / Σ of the k "
     "probabilities). With renormalized weights "
     "(qwen3moe, Mixtral) the two agree exactly; without renormalization every weight grows. The order is a "
     "model's own and ports mix it up: Lightning-AI/litgpt#2013 (softmax after top-k where HF's Mixtral takes "
     "it before: same experts, other weights), NVIDIA/Megatron-LM#955, HabanaAI/vllm-fork#1852 (gpt-oss)"),
    ("softmax_before_topk", "weigh",
     "the reverse, on a model whose weights are a softmax over the k selected logits (gpt-oss): the softmax "
     "taken over all experts first and gathered at the top k, so the same experts get weights that sum to "
     "less than 1. pytorch/torchtitan#2258 (gpt-oss with route_norm=False: the softmax over all expert "
     "logits, where the paper takes it over the selected ones), vllm-project/vllm-gaudi#970 (gpt-oss's "
     "accuracy fixed by taking top k of the logits, then the softmax)"),
    ("no_renormalize", "normalize",
     "the selected weights used as they are, not divided by their sum, where the model renormalizes "
     "(norm_topk_prob): every expert's output scaled down by the k probabilities' sum. pytorch/torchtitan#1448 "
     "(DeepSeek-V3's router without norm_topk_prob: a converted Moonlight checkpoint trained with a huge grad "
     "norm), sgl-project/sglang#35160 (the renormalize flag's other arm returned raw logits as weights)"),
    ("groups_ignored", "groups",
     "DeepSeek-V3's group-limited routing skipped: the top k over every expert, not only those of the best "
     "groups (each scored by its two best). Tokens reach experts the model never routes them to. "
     "vllm-project/vllm#13474 (grouped top k scored groups by their best expert and masked the others with 0, "
     "not -inf, so masked groups' experts could still be picked), EricLBuehler/mistral.rs#1278 (the group-limited "
     "greedy top k of DeepSeek V2/V3)"),
    ("no_routed_scale", "scale",
     "the routed scaling factor (routed_scaling_factor, 2.5 on DeepSeek-V3) never applied: the routed experts' "
     "sum too small beside the shared expert's. vllm-project/vllm#32437 (the TRT-LLM INT4 MoE path passed "
     "routed_scaling_factor=None), sgl-project/sglang-jax#1282 (the factor applied only when the weights were "
     "renormalized)"),
    ("routed_scale_twice", "scale",
     "the routed scaling factor applied twice (in the router and after the experts): the routed share scaled by "
     "its square. vllm-project/vllm#24119 (DeepSeek-R1's GSM8K from 0.95 to 0.66 after #23123 moved the factor "
     "into grouped top k), sgl-project/sglang#35152 (two-batch overlap's epilogue multiplied again)"),
    ("bias_in_weights", "score",
     "the selection bias (exp_probs_b, DeepSeek-V3's e_score_correction_bias) added to the weights too, "
     "where it only ranks the experts: the same experts, weights that lean towards the biased ones. "
     "vllm-project/vllm#12002 (fixes #11971: DeepSeek-V3's gate weights gathered from the biased scores), "
     "huggingface/transformers#41647 (DeepSeek-V3's routing took its weights from the biased tensor after "
     "#40132), huggingface/transformers#41663 (the same in dots1)"),
)  # fmt: skip

SOFTMAX_WEIGHT_FORMULA = "ids = topk(logits, k); w = softmax(logits[ids])   (softmax_weight gating: gpt-oss)"
SELECTION_BIAS_FORMULA = "p = softmax(logits); ids = topk(p + b, k); w = p[ids] / Σ p[ids]  (b ranks only: exp_probs_b)"


DEEPSEEK_FORMULA = (
    "p = sigmoid(logits); ids = topk(p + b, k) within the best groups (each group's two best "
    "p + b summed); w = p[ids] (/ Σ p[ids] where the model renormalizes) · routed scale"
)


def formula_of(stage) -> str:
    if stage.params.get("gating") == "softmax_weight":
        return SOFTMAX_WEIGHT_FORMULA
    if stage.params.get("gating") == "sigmoid":
        return DEEPSEEK_FORMULA
    return SELECTION_BIAS_FORMULA if stage.bias else OP.formula


OP = Op(
    output=lambda st, s: (s.T, st.params["n_expert"] if st.params["out"] == "probs" else st.params["k"]),
    name="moe_router",
    what="routes each token to k experts: probabilities, the top k, and their weights",
    formula="p = softmax(logits); ids = topk(p, k); w = p[ids] / Σ p[ids]  (renormalized where the model does)",
    formula_of=formula_of,
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    kernels=(
        _kernel("default", "the correct router: softmax over all experts, top k, renormalized"),
        *(_kernel(name, doc, part) for name, part, doc in FAULTS),
    ),  # fmt: skip
)
