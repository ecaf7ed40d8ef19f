"""Architectures as data: the ordered stages of a forward pass and the op each runs.

The float64 reference and the GPU executor both walk this same list (each a short loop
calling labkit.ops), so a stage name means the same tensor everywhere. A stage reads
earlier stages by name and at most one weight tensor (or a row range of one: phi3's fused
qkv and gate/up weights are split here, so `q`, `k`, `v`, `ffn_gate` and `ffn_up` keep
their names). Its KV-cache role is explicit: `kv_write` ("k"/"v") stores its output in
the layer's cache at n_past; `kv_read` names the caches it reads (all positions so far).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.model.config import ModelConfig
from labkit.model.rope_scaling import yarn_corr_dims


@dataclass(frozen=True)
class Stage:
    """One named step. `inputs` are earlier stage names; `weight`/`bias` are GGUF tensor names."""

    name: str
    op: str
    inputs: tuple[str, ...] = ()
    weight: str | None = None
    bias: str | None = None
    params: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)
    layer: int | None = None
    weight_rows: tuple[int, int] | None = None  # a row range of a fused weight
    kv_write: str | None = None  # "k" or "v": the output is this layer's cache at n_past
    kv_read: tuple[str, ...] = ()  # the caches of this layer it reads
    policy: str | None = None  # the host dispatch policy family that applies ("lm_head")
    # "conv" or "scan": the layer's recurrent state this stage reads and advances (ssm_conv, ssm_scan),
    # or, for a `state` stage, the state it captures as the pass leaves it
    state: str | None = None

    @property
    def tensors(self) -> dict[str, str]:
        """The GGUF tensors it reads, by role: its weight, bias, per-tensor scale, attention sinks, RoPE factors."""
        named = {"weight": self.weight, "bias": self.bias}
        named |= {role: self.params.get(role) for role in ("weight_scale", "sinks", "freq_factors")}
        return {role: name for role, name in named.items() if name}

    @property
    def kind(self) -> str:
        """The stage name without its layer prefix: `blk.3.q_rope` → `q_rope`."""
        return self.name.split(".", 2)[-1] if self.layer is not None else self.name


class _Builder:
    """Appends the stages of one layer (or the model's ends) with the layer prefix filled in."""

    def __init__(self, cfg: ModelConfig, layer: int | None, out: list[Stage]):
        self.cfg, self.layer, self.out = cfg, layer, out
        self.p = "" if layer is None else f"blk.{layer}."

    def add(self, kind: str, op: str, inputs: tuple[str, ...], weight: str | None = None, **kw) -> str:
        fields = {k: kw.pop(k) for k in ("bias", "weight_rows", "kv_write", "kv_read", "policy", "state") if k in kw}
        ins = tuple(i if "." in i or i == "embed" else self.p + i for i in inputs)
        self.out.append(Stage(self.p + kind, op, ins, weight and self.w(weight), params=kw, layer=self.layer, **fields))
        return self.p + kind

    def bias(self, matrix: str) -> str | None:
        """This layer's `<matrix>.bias` where the file has one (ModelConfig.biases)."""
        return self.p + matrix + ".bias" if matrix in self.cfg.biases else None

    def w(self, name: str) -> str:
        """A tensor's full name: `attn_q` is the layer's `attn_q.weight`; a full name stays (ssm_a has no suffix)."""
        return name if name.endswith(".weight") or name.startswith("blk.") else self.p + name + ".weight"

    def norm(self, kind: str, x: str, weight: str, group: int | None = None, width: int | None = None) -> str:
        d = self.cfg.d_model
        return self.add(kind, "rmsnorm", (x,), weight, eps=self.cfg.rms_eps, group=group or d, width=width or d)

    def linear(self, kind: str, x: str, weight: str, n_in: int, n_out: int, rows=None, bias=None, **kw) -> str:
        if self.cfg.weight_scales and self.layer is not None:  # bitnet: the product times `<weight>.scale`
            kw["weight_scale"] = self.p + weight + ".scale"
        return self.add(kind, "matmul", (x,), weight, weight_rows=rows, bias=bias, out=n_out, width=n_out, **kw,
                        **{"in": n_in})  # fmt: skip


def build_graph(cfg: ModelConfig) -> list[Stage]:
    """The stage list of a supported architecture, in execution order."""
    stages: list[Stage] = []
    top = _Builder(cfg, None, stages)
    top.add("embed", "embed", (), "token_embd.weight", scale=cfg.embed_scale, d_model=cfg.d_model)
    x = "embed"
    for L in range(cfg.n_layers):
        x = _layer(_Builder(cfg, L, stages), x)
    top.norm("output_norm", x, "output_norm.weight")
    head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    if cfg.final_softcap:
        top.linear("logits_raw", "output_norm", head, cfg.d_model, cfg.vocab_size, policy="lm_head")
        top.add("logits", "softcap", ("logits_raw",), cap=cfg.final_softcap, width=cfg.vocab_size)
    elif cfg.logit_scale != 1.0:  # Granite's muP: the logits divided by logit_scale
        top.linear("logits_raw", "output_norm", head, cfg.d_model, cfg.vocab_size, policy="lm_head")
        top.add("logits", "scale", ("logits_raw",), scale=1.0 / cfg.logit_scale, width=cfg.vocab_size)
    else:
        top.linear("logits", "output_norm", head, cfg.d_model, cfg.vocab_size, policy="lm_head")
    return stages


def _qkv(b: _Builder) -> None:
    """q, k, v from the normed input: three weights, or row ranges of phi3's fused attn_qkv."""
    cfg, qd, kvd = b.cfg, b.cfg.q_dim, b.cfg.kv_dim
    if cfg.fused_qkv:
        ranges = {"q": (0, qd), "k": (qd, qd + kvd), "v": (qd + kvd, qd + 2 * kvd)}
        for n, dim in (("q", qd), ("k", kvd), ("v", kvd)):
            b.linear(n, "attn_norm", "attn_qkv", cfg.d_model, dim, rows=ranges[n], kv_write="v" if n == "v" else None)
        return
    writes = {"v": "v", "k": None if cfg.rope else "k"}  # the keys are cached as rotated, where they rotate
    if cfg.attn_gate:  # Qwen3.5: each head's query, then its output gate; the queries taken out as `q`
        hd = cfg.head_dim
        b.linear("q_full", "attn_norm", "attn_q", cfg.d_model, 2 * qd)
        b.add("q", "columns", ("q_full",), groups=cfg.n_heads, width=hd, step=2 * hd, offset=0, **{"in": 2 * qd})
    for n, dim in (("k", kvd), ("v", kvd)) if cfg.attn_gate else (("q", qd), ("k", kvd), ("v", kvd)):
        bias = b.bias(f"attn_{n}")
        b.linear(n, "attn_norm", f"attn_{n}", cfg.d_model, dim, bias=bias, kv_write=writes.get(n))


def _attention(b: _Builder, x: str) -> str:
    cfg, L = b.cfg, b.layer
    if cfg.mla is not None:
        return _latent_attention(b, x)
    b.norm("attn_norm", x, "attn_norm")
    _qkv(b)
    q, k = "q", "k"
    if cfg.qk_norm:
        q = b.norm("q_norm", "q", "attn_q_norm", group=cfg.head_dim, width=cfg.q_dim)
        k = b.norm("k_norm", "k", "attn_k_norm", group=cfg.head_dim, width=cfg.kv_dim)
    if cfg.rope:
        q, k = _rope(b, q, k)
    heads = {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim}
    attn = {"scale": cfg.attn_scale, "window": cfg.layer_window(L), "softcap": cfg.attn_softcap, **heads}
    sinks = {"sinks": b.w("attn_sinks")} if cfg.attn_sinks else {}  # gpt-oss: a logit per head in the softmax
    # the keys are an input for the dependency: the kernel reads the keys of every position from the cache
    b.add("attn_scores", "attn_scores", (q, k), kv_read=("k",), **attn)
    b.add("attn_probs", "softmax", ("attn_scores",), n_heads=cfg.n_heads, **sinks)
    # input 2 (the queries) is what the fused tiers read instead of the probabilities
    ctx = b.add("attn_ctx", "attn_ctx", ("attn_probs", "v", q), kv_read=("k", "v"), **attn, **sinks)
    if cfg.sub_norms:  # bitnet: the heads' context normed before the output projection
        ctx = b.norm("attn_sub_norm", "attn_ctx", "attn_sub_norm", group=cfg.q_dim, width=cfg.q_dim)
    if cfg.attn_gate:  # Qwen3.5: the context times sigmoid of each head's gate
        ctx = b.add("attn_gated", "attn_gate", ("attn_ctx", "q_full"), n_heads=cfg.n_heads, head_dim=cfg.head_dim)
    bias = b.bias("attn_output")
    out = b.linear("attn_out", ctx, "attn_output", cfg.q_dim, cfg.d_model, bias=bias)
    return b.norm("post_attn_norm", out, "post_attention_norm") if cfg.sandwich_norms else out


def _latent_attention(b: _Builder, x: str) -> str:
    """llama.cpp's deepseek2 attention in its absorbed form (labkit.model.latent_attention): the query
    (through a low rank where the file has one), each token's latent and rotary key out of one projection,
    the heads' unrotated queries taken into the latent's space by attn_k_b, attention over the cached
    [latent; rotary key] as one shared key head, and each head's latent context up-projected by attn_v_b."""
    cfg, m, H = b.cfg, b.cfg.mla, b.cfg.n_heads
    d, qk = cfg.d_model, m.k_head
    b.norm("attn_norm", x, "attn_norm")
    if m.q_lora:
        b.linear("q_a", "attn_norm", "attn_q_a", d, m.q_lora)
        b.norm("q_a_norm", "q_a", "attn_q_a_norm", group=m.q_lora, width=m.q_lora)
        b.linear("q", "q_a_norm", "attn_q_b", m.q_lora, H * qk)
    else:
        b.linear("q", "attn_norm", "attn_q", d, H * qk)
    b.linear("kv_a", "attn_norm", "attn_kv_a_mqa", d, m.cached)
    b.add("kv_latent", "columns", ("kv_a",), groups=1, width=m.kv_lora, step=m.cached, offset=0, **{"in": m.cached})
    b.norm("kv_latent_norm", "kv_latent", "attn_kv_a_norm", group=m.kv_lora, width=m.kv_lora)
    b.add("k_pe", "columns", ("kv_a",), groups=1, width=m.rope, step=m.cached, offset=m.kv_lora, **{"in": m.cached})
    heads = {"groups": H, "step": qk, "in": H * qk}
    b.add("q_nope", "columns", ("q",), width=m.nope, offset=0, **heads)
    b.add("q_pe", "columns", ("q",), width=m.rope, offset=m.nope, **heads)
    rope = {"base": cfg.layer_rope_base(b.layer), "style": cfg.rope_style, "head_dim": m.rope, "rope_dim": m.rope}
    rope |= _rope_scaling(cfg, b.layer, rope["base"])
    b.add("q_pe_rope", "rope", ("q_pe",), n_heads=H, **rope)
    b.add("k_pe_rope", "rope", ("k_pe",), n_heads=1, **rope)
    b.add("q_absorbed", "head_matmul", ("q_nope",), "attn_k_b", heads=H, out=m.kv_lora, **{"in": m.nope})
    b.add("q_mla", "concat", ("q_absorbed", "q_pe_rope"), groups=H, widths=(m.kv_lora, m.rope))
    # the K cache's row: the normed latent, then the rotary key; the V cache's: the latent again (the values)
    b.add("k_mla", "concat", ("kv_latent_norm", "k_pe_rope"), groups=1, widths=(m.kv_lora, m.rope), kv_write="k")
    b.add("v_mla", "columns", ("kv_latent_norm",), groups=1, width=m.kv_lora, step=m.kv_lora, offset=0,
          kv_write="v", **{"in": m.kv_lora})  # fmt: skip
    attn = {"scale": cfg.attn_scale, "window": None, "softcap": 0.0, "n_heads": H, "n_kv_heads": 1}
    b.add("attn_scores", "attn_scores", ("q_mla", "k_mla"), kv_read=("k",), head_dim=m.cached, **attn)
    b.add("attn_probs", "softmax", ("attn_scores",), n_heads=H)
    b.add("attn_ctx_latent", "attn_ctx", ("attn_probs", "v_mla", "q_mla"), kv_read=("k", "v"), head_dim=m.kv_lora,
          **attn)  # fmt: skip
    b.add("attn_ctx", "head_matmul", ("attn_ctx_latent",), "attn_v_b", heads=H, out=m.v_head, **{"in": m.kv_lora})
    return b.linear("attn_out", "attn_ctx", "attn_output", H * m.v_head, d)


def _rope(b: _Builder, q: str, k: str) -> tuple[str, str]:
    """q_rope and k_rope (the rotated keys are what the cache holds): the stages the attention reads."""
    cfg, L = b.cfg, b.layer
    rope = {"base": cfg.layer_rope_base(L), "style": cfg.rope_style, "head_dim": cfg.head_dim, "rope_dim": cfg.rope_dim}
    rope |= _rope_scaling(cfg, L, rope["base"])
    rope |= {"freq_factors": cfg.rope_freq_factors} if cfg.rope_freq_factors else {}
    b.add("q_rope", "rope", (q,), n_heads=cfg.n_heads, **rope)
    b.add("k_rope", "rope", (k,), n_heads=cfg.n_kv_heads, kv_write="k", **rope)
    return "q_rope", "k_rope"


def _rope_scaling(cfg: ModelConfig, layer: int, base: float) -> dict[str, Any]:
    """The rope stage's scaling params ({} without scaling): ggml_rope_ext's freq_scale, ext_factor,
    attn_factor, and YaRN's correction dims for the layer's base."""
    sc = cfg.layer_rope_scaling(layer)
    if not sc.scales:
        return {}
    dims = yarn_corr_dims(cfg.rope_dim, sc.n_ctx_orig, base, sc.beta_fast, sc.beta_slow)
    yarn = {"n_ctx_orig": sc.n_ctx_orig, "beta_fast": sc.beta_fast, "beta_slow": sc.beta_slow}
    return {"freq_scale": sc.freq_scale, "ext_factor": sc.ext_factor, "attn_factor": sc.attn_factor, "corr_dims": dims,
            **yarn}  # fmt: skip


def _ffn(b: _Builder, x: str) -> str:
    cfg = b.cfg
    b.norm("ffn_norm", x, cfg.ffn_norm_tensor)
    if cfg.fused_gate_up:  # phi3: ffn_up holds the gate rows, then the up rows
        b.linear("ffn_gate", "ffn_norm", "ffn_up", cfg.d_model, cfg.d_ff, rows=(0, cfg.d_ff))
        b.linear("ffn_up", "ffn_norm", "ffn_up", cfg.d_model, cfg.d_ff, rows=(cfg.d_ff, 2 * cfg.d_ff))
        out = _glu_down(b, "ffn", "", cfg.d_ff)
    else:
        out = _glu_ffn(b, "ffn", "", cfg.d_ff)
    return b.norm("post_ffn_norm", out, "post_ffw_norm") if cfg.sandwich_norms else out


def _glu_ffn(b: _Builder, kind: str, suffix: str, d_ff: int) -> str:
    """A gated FFN on ffn_norm: stages `<kind>_gate`, `_up`, `_act`, `_down` reading the weights
    `ffn_gate<suffix>`, ... (a dense layer's: kind "ffn", no suffix; shared experts': "ffn_shexp", "_shexp")."""
    d = b.cfg.d_model
    b.linear(f"{kind}_gate", "ffn_norm", f"ffn_gate{suffix}", d, d_ff)
    b.linear(f"{kind}_up", "ffn_norm", f"ffn_up{suffix}", d, d_ff)
    return _glu_down(b, kind, suffix, d_ff)


def _glu_down(b: _Builder, kind: str, suffix: str, d_ff: int) -> str:
    """act(gate) · up, then the down projection (BitNet norms the activation first)."""
    cfg = b.cfg
    act = b.add(f"{kind}_act", "glu", (f"{kind}_gate", f"{kind}_up"), act=cfg.ffn_act, width=d_ff)
    if cfg.sub_norms:  # bitnet: the gated activation normed before the down projection
        act = b.norm("ffn_sub_norm", act, "ffn_sub_norm", group=d_ff, width=d_ff)
    return b.linear(f"{kind}_down", act, f"ffn_down{suffix}", d_ff, cfg.d_model)


def _moe_ffn(b: _Builder, x: str) -> str:
    """A mixture of experts (llama.cpp's build_moe_ffn): the router's logits, its probabilities, the k
    experts each token goes to and their weights, the selected experts' gated FFNs, their weighted sum.
    Under softmax_weight gating (gpt-oss) the top k are the logits' and there is no probabilities stage."""
    cfg = b.cfg
    n, k, f, d = cfg.n_expert, cfg.n_expert_used, cfg.d_ff_expert, cfg.d_model
    b.norm("ffn_norm", x, cfg.ffn_norm_tensor)
    b.linear("ffn_router", "ffn_norm", "ffn_gate_inp", d, n, bias=b.bias("ffn_gate_inp"))
    route = {"n_expert": n, "k": k, "norm": cfg.expert_weights_norm, "gating": cfg.expert_gating}
    if cfg.expert_groups:  # DeepSeek-V3's group-limited routing
        route |= {"groups": cfg.expert_groups, "groups_used": cfg.expert_groups_used}
    if cfg.expert_weights_scale != 1.0:  # DeepSeek's routed scaling factor
        route |= {"w_scale": cfg.expert_weights_scale}
    scores = "ffn_router"
    if cfg.expert_gating in ("softmax", "sigmoid"):
        scores = b.add("ffn_router_probs", "moe_router", ("ffn_router",), out="probs", **route)
    # a selection-only bias (exp_probs_b): the top k rank the probabilities plus it; the weights stage
    # binds it too, for the fault that adds it to the weights as well (moe_router=bias_in_weights)
    sel = {"bias": b.p + "exp_probs_b.bias"} if cfg.expert_selection_bias else {}
    b.add("ffn_topk", "moe_router", (scores,), out="ids", **route, **sel)
    b.add("ffn_expert_weights", "moe_router", (scores, "ffn_topk"), out="weights", **route, **sel)
    for kind, w in (("ffn_moe_gate", "ffn_gate_exps"), ("ffn_moe_up", "ffn_up_exps")):
        b.add(kind, "moe_matmul", ("ffn_norm", "ffn_topk"), w, bias=b.bias(w), k=k, out=f, per_slot=False,
              **{"in": d})  # fmt: skip
    b.add("ffn_moe_act", "glu", ("ffn_moe_gate", "ffn_moe_up"), act=cfg.ffn_act, width=k * f, k=k)
    b.add("ffn_moe_down", "moe_matmul", ("ffn_moe_act", "ffn_topk"), "ffn_down_exps", bias=b.bias("ffn_down_exps"), k=k,
          out=d, per_slot=True, **{"in": f})  # fmt: skip
    moe = b.add("ffn_moe_out", "moe_sum", ("ffn_moe_down", "ffn_expert_weights"), width=d)
    if not cfg.d_ff_shexp:
        return moe
    # shared experts (ERNIE 4.5, DeepSeek): a gated FFN every token runs, added to the mixture
    shared = _glu_ffn(b, "ffn_shexp", "_shexp", cfg.d_ff_shexp)
    if cfg.shexp_gate:  # Qwen3.5's MoE: the shared expert weighed by sigmoid of one logit a token
        b.linear("ffn_shexp_logit", "ffn_norm", "ffn_gate_inp_shexp", d, 1)
        return b.add("ffn_out", "gated_add", ("ffn_moe_out", shared, "ffn_shexp_logit"), width=d)
    return b.add("ffn_out", "add", ("ffn_moe_out", shared), width=d)


# the feed-forward block of a layer, by ModelConfig.layer_ffn
FFN_BUILDERS = {"dense": _ffn, "moe": _moe_ffn}


def _mamba2(b: _Builder, x: str) -> str:
    """llama.cpp's build_mamba2_layer: ssm_in's rows split into z, xBC and dt (+ its bias); the causal
    conv over xBC (+ bias, SiLU) continuing the layer's conv state; the selective scan over x, B, C
    and dt continuing its scan state; y + D·x; the grouped RMSNorm of y·silu(z); ssm_out. The two
    `state` stages capture each state as the pass leaves it."""
    cfg, s = b.cfg, b.cfg.ssm
    d, xbc, dt = cfg.d_model, s.d_inner, s.d_inner + s.conv_dim
    b.norm("attn_norm", x, "attn_norm")
    b.linear("ssm_z", "attn_norm", "ssm_in", d, s.d_inner, rows=(0, xbc))
    b.linear("ssm_xbc", "attn_norm", "ssm_in", d, s.conv_dim, rows=(xbc, dt))
    b.linear("ssm_dt", "attn_norm", "ssm_in", d, s.n_head, rows=(dt, s.d_in_proj), bias=b.p + "ssm_dt.bias")
    sizes = {"d_conv": s.d_conv, "d_inner": s.d_inner, "d_state": s.d_state, "n_head": s.n_head,
             "n_group": s.n_group, "channels": s.conv_dim}  # fmt: skip
    b.add("ssm_conv", "ssm_conv", ("ssm_xbc",), "ssm_conv1d", bias=b.p + "ssm_conv1d.bias", state="conv",
          out=s.conv_dim, **sizes)  # fmt: skip
    b.add("conv_state", "state", ("ssm_conv",), state="conv", size=s.conv_state_size)
    b.add("ssm_scan", "ssm_scan", ("ssm_conv", "ssm_dt"), b.p + "ssm_a", state="scan", **sizes)
    b.add("scan_state", "state", ("ssm_scan",), state="scan", size=s.scan_state_size)
    b.add("ssm_skip", "ssm_skip", ("ssm_scan", "ssm_conv"), b.p + "ssm_d", **sizes)
    group = s.d_inner // s.n_group
    b.add("ssm_norm", "gated_norm", ("ssm_skip", "ssm_z"), "ssm_norm", eps=cfg.rms_eps, group=group,
          width=s.d_inner, gate="before")  # fmt: skip
    return b.linear("ssm_out", "ssm_norm", "ssm_out", s.d_inner, d)


def _delta_net(b: _Builder, x: str) -> str:
    """llama.cpp's qwen35 build_layer_attn_linear: q, k, v in one projection (attn_qkv) through the
    causal conv (no bias) and SiLU, continuing the conv state; q and k L2-normed per head; the write
    strength beta = sigmoid(b) and the log-decay g = softplus(alpha + dt_bias)·A per value head; the
    gated delta rule continuing the recurrent state; the RMSNorm of each head's output gated after
    by silu(z); ssm_out. The two `state` stages capture each state as the pass leaves it."""
    cfg, s = b.cfg, b.cfg.ssm
    d, H, dk, key_dim = cfg.d_model, s.n_head, s.d_state, s.n_group * s.d_state
    b.norm("attn_norm", x, "attn_norm")
    b.linear("ssm_qkv", "attn_norm", "attn_qkv", d, s.conv_dim)
    b.linear("ssm_z", "attn_norm", "attn_gate", d, s.d_inner)
    r = H // s.n_group  # Qwen3-Next's ssm_ba: per key head, its r value heads' b, then their alpha
    ba = {"groups": s.n_group, "width": r, "step": 2 * r, "in": 2 * H}
    if cfg.fused_ba:
        b.linear("ssm_ba", "attn_norm", "ssm_ba", d, 2 * H)
        b.add("ssm_b", "columns", ("ssm_ba",), offset=0, **ba)
    else:
        b.linear("ssm_b", "attn_norm", "ssm_beta", d, H)
    b.add("ssm_beta", "sigmoid", ("ssm_b",), width=H)
    if cfg.fused_ba:
        b.add("ssm_alpha", "columns", ("ssm_ba",), offset=r, **ba)
    else:
        b.linear("ssm_alpha", "attn_norm", "ssm_alpha", d, H)
    b.add("ssm_g", "delta_decay", ("ssm_alpha",), b.p + "ssm_a", bias=b.p + "ssm_dt.bias", n_head=H, out=H)
    b.add("ssm_conv", "ssm_conv", ("ssm_qkv",), "ssm_conv1d", state="conv", out=s.conv_dim, channels=s.conv_dim,
          d_conv=s.d_conv)  # fmt: skip
    b.add("conv_state", "state", ("ssm_conv",), state="conv", size=s.conv_state_size)
    norm = {"group": dk, "width": key_dim, "eps": cfg.rms_eps, "channels": s.conv_dim, "repeat": H // s.n_group}
    b.add("ssm_q", "l2norm", ("ssm_conv",), offset=0, **norm)
    b.add("ssm_k", "l2norm", ("ssm_conv",), offset=key_dim, **norm)
    sizes = {"n_head": H, "n_k_head": s.n_group, "head_k": dk, "head_v": s.head_dim, "channels": s.conv_dim,
             "interleave": int(cfg.fused_ba)}  # fmt: skip
    b.add("ssm_delta", "delta_net", ("ssm_q", "ssm_k", "ssm_conv", "ssm_g", "ssm_beta"), state="scan",
          v_offset=2 * key_dim, **sizes)  # fmt: skip
    b.add("scan_state", "state", ("ssm_delta",), state="scan", size=s.scan_state_size)
    b.add("ssm_norm", "gated_norm", ("ssm_delta", "ssm_z"), "ssm_norm", eps=cfg.rms_eps, group=s.head_dim,
          width=s.d_inner, gate="after", w_groups=1)  # fmt: skip
    return b.linear("ssm_out", "ssm_norm", "ssm_out", s.d_inner, d)


def _ffn_block(b: _Builder, x: str) -> str:
    """A Nemotron-H layer that is its FFN (llama.cpp's build_ffn_layer): the layer's norm, the up projection,
    relu², the down projection (each with its bias where the file has one); no gate."""
    cfg, d = b.cfg, b.cfg.d_model
    b.norm("attn_norm", x, "attn_norm")
    b.linear("ffn_up", "attn_norm", "ffn_up", d, cfg.d_ff, bias=b.bias("ffn_up"))
    b.add("ffn_act", "relu_sqr", ("ffn_up",), width=cfg.d_ff)
    return b.linear("ffn_down", "ffn_act", "ffn_down", cfg.d_ff, d, bias=b.bias("ffn_down"))


# what a layer's block is, by ModelConfig.layer_mixer: what mixes the positions, or (Nemotron-H) its FFN
MIXERS = {"attention": _attention, "mamba2": _mamba2, "delta_net": _delta_net, "ffn": _ffn_block}


def _layer(b: _Builder, x: str) -> str:
    d, scale = b.cfg.d_model, b.cfg.residual_scale  # Granite's muP: each block's output scaled before it is added
    mixed = MIXERS[b.cfg.layer_mixer(b.layer)](b, x)
    if b.cfg.layer_ffn(b.layer) == "none":  # mamba2: the mixer's output is the layer's
        return b.add("resid_out", "add", (x, mixed), width=d, scale=scale)
    b.add("resid_mid", "add", (x, mixed), width=d, scale=scale)
    ffn = FFN_BUILDERS[b.cfg.layer_ffn(b.layer)](b, b.p + "resid_mid")
    return b.add("resid_out", "add", ("resid_mid", ffn), width=d, scale=scale)


def stage_names(graph: list[Stage]) -> list[str]:
    return [s.name for s in graph]
