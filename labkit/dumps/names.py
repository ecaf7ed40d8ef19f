"""Other engines' tensor names → labkit stage names, as data.

A preset is a list of rules, each a pattern with `{L}` for the layer and the stage kind(s)
it holds. Each was checked against the library's own source (the module docstrings below
name what), because several names that look alike hold another quantity:

- llama.cpp (`"llamacpp"`): the eval callback's node names, from the oracle's own mapping
  table (labkit.oracle.llamacpp.MAPPINGS), so the two never drift apart. A name llama.cpp
  gives several nodes (`Qcur-0` is the MUL_MAT, then the ROPE) takes its op in brackets:
  `Qcur-0 [ROPE]`. Its `kq-L` is the raw q·k, so it is scaled and masked on the way in.
- Hugging Face transformers (`"hf"`): module paths as forward hooks see them. A llama's
  `post_attention_layernorm` is labkit's `ffn_norm`; a gemma's is `post_attn_norm`. A llama's
  q and k come out in another order within each head: llama.cpp's converter permutes q_proj
  and k_proj rows to rotate (2i, 2i+1) pairs (convert_hf_to_gguf.py, LlamaModel.permute), and
  transformers undoes that when it loads a GGUF file (modeling_gguf_pytorch_utils.py,
  LlamaConverter's reverse_permute), so its q holds each head's halves: they are put back
  in the file's order on the way in (`gguf_rows`). Proven on a real transformers run.
- TransformerLens (`"transformerlens"`): hook names. Its `ln*.hook_normalized` is x/rms
  *before* the weight (with fold_ln the weight is folded into the next matrix), so the
  norm weight is applied on the way in; `hook_attn_out`/`hook_mlp_out` come after gemma's
  post-norms; `hook_k`/`hook_v` hold the KV heads only.
- a user mapping: {their name or regex (with `{L}`): stage name (with `{L}`)}.

Read for this: transformers 5.23.0 and 4.57.1 (models/{llama,gemma2,gemma3,phi3,qwen2,qwen3}),
TransformerLens' components/ and weight_conversions/ (2026-07). One difference between versions:
gemma2's `embed_tokens` output is scaled by sqrt(d_model) in transformers 5 (as labkit's `embed`),
unscaled in 4.x (the model scales after it); a 4.x gemma2 dump fails `embed` by that factor.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from labkit.captures import TOP_LEVEL_KINDS
from labkit.errors import UnknownPresetError
from labkit.model.config import ModelConfig
from labkit.model.graph import Stage

PRESETS = ("llamacpp", "hf", "transformerlens", "sglang", "trtllm")
_LAYER = r"(?P<L>\d+)"


@dataclass(frozen=True)
class Target:
    """Where one foreign tensor (or one column block of a fused one) lands."""

    stage: str
    # "" | "scores" (raw q·k → scaled and masked) | "times_weight" (norm before its weight)
    # | "gguf_rows" (a head's halves → the GGUF file's interleaved rows)
    convert: str = ""
    columns: tuple[int, int] | None = None  # the column range of a fused tensor (q;k;v or gate;up)


@dataclass(frozen=True)
class Rule:
    """`pattern` (a regex, `{L}` = the layer) holds the stage kind(s) `kinds`; several kinds are
    column blocks of one fused tensor, in order."""

    pattern: str
    kinds: tuple[str, ...]
    convert: str = ""
    layer_offset: int = 0  # TransformerLens' hook_resid_pre of block L is resid_out of block L-1
    beyond: str = ""  # the kind when layer + offset is past the last layer (the next layer's norm → output_norm)


@dataclass(frozen=True)
class NameMap:
    """One model's rules under one preset (or a user mapping)."""

    preset: str
    rules: tuple[Rule, ...]
    notes: tuple[tuple[str, str], ...]  # (pattern, why it is no stage) for names people will dump
    graph: Mapping[str, Stage]
    prefer: tuple[str, ...] = ()  # the preset's own layouts: they break a tie between shape readings

    def resolve(self, name: str) -> list[Target] | str:
        """The targets of a foreign name, or why it has none."""
        for rule in self.rules:
            m = re.fullmatch(rule.pattern.replace("{L}", _LAYER), name)
            if m:
                return self._targets(rule, m)
        for pattern, why in self.notes:
            if re.fullmatch(pattern.replace("{L}", _LAYER), name):
                return why
        return f"matches no stage under the {self.preset!r} names"

    def _targets(self, rule: Rule, m: re.Match) -> list[Target] | str:
        layer = int(m.group("L")) + rule.layer_offset if "L" in m.groupdict() else None
        kinds = rule.kinds
        if rule.beyond and layer is not None and f"blk.{layer}.{kinds[0]}" not in self.graph:
            kinds, layer = (rule.beyond,), None
        stages = [_stage_name(kind, layer) for kind in kinds]
        absent = [s for s in stages if s not in self.graph]
        if absent:
            return f"this model has no stage {absent[0]}"
        if len(stages) == 1:
            return [Target(stages[0], rule.convert)]
        # a fused q;k;v: the GGUF row order applies to q and k only
        converts = [rule.convert if rule.convert != "gguf_rows" or k in _QK_KINDS else "" for k in kinds]
        return [Target(s, c, self.graph[s].weight_rows) for s, c in zip(stages, converts)]


def _stage_name(kind: str, layer: int | None) -> str:
    """A stage kind (or a user's stage name, `{L}` for the layer) at a layer."""
    if "{L}" in kind:
        return kind.replace("{L}", str(layer))
    if layer is None or kind.startswith("blk.") or kind in TOP_LEVEL_KINDS:
        return kind
    if layer < 0:  # the residual before block 0 is the embedding
        return "embed"
    return f"blk.{layer}.{kind}"


# ----------------------------------------------------------------- llama.cpp
# Stages the oracle finds by what a node reads, whose node does carry a name in these archs.
_LLAMACPP_NAMED = {"llama": {"attn_out": "attn_out-{L}"}, "qwen2": {"attn_out": "attn_out-{L}"}}


def _llamacpp(cfg: ModelConfig) -> tuple[list[Rule], list[tuple[str, str]]]:
    """From the oracle's table: one rule per (node name, op); names that need no op also match bare."""
    from labkit.oracle.llamacpp import mapping

    by_name: dict[str, dict[str, list[tuple[str, str]]]] = {}
    for kind, pick in mapping(cfg.arch, cfg).items():
        if pick.reads is not None:
            continue  # an unnamed node_N: found by what it reads, which a dump does not record
        convert = "scores" if pick.layout == "scores" else ""
        by_name.setdefault(pick.name, {}).setdefault(pick.op, []).append((kind, convert))
    for kind, name in _LLAMACPP_NAMED.get(cfg.arch, {}).items():
        by_name.setdefault(name, {}).setdefault("MUL_MAT", []).append((kind, ""))
    rules, notes = [], []
    for name, ops in by_name.items():
        pat = re.escape(name).replace(r"\{L\}", "{L}")
        for op, kinds in ops.items():
            rule_kinds = tuple(k for k, _ in kinds)
            rules.append(Rule(pat + re.escape(f" [{op}]"), rule_kinds, kinds[0][1]))
            if len(ops) == 1:
                rules.append(Rule(pat, rule_kinds, kinds[0][1]))
        if len(ops) > 1:
            which = ", ".join(f"'{name} [{op}]'" for op in ops)
            notes.append((pat, f"llama.cpp names {len(ops)} nodes so; add the op: {which}"))
    op = r"(?: \[\w+\](?:#\d+)?)?"  # the `name [OP]` the dump gives a name llama.cpp repeats
    notes += [
        (r"node_\d+", "an unnamed llama.cpp node (its stage is found by what it reads, which a dump lacks)"),
        ("norm-{L}" + op, "the RMS norm before its weight; attn_norm-L/ffn_norm-L are the weighted ones"),
        (r".* \((reshaped|view|permuted|cont|copy|transposed)\)", "a view or copy llama.cpp made of a named node"),
    ]
    return rules, notes


# ----------------------------------------------------------------- Hugging Face
_HF = r"(?:[\w.]*\.)?"  # any module prefix: model., model.language_model., ...
# Architectures whose q/k rows llama.cpp's converter permutes (HF's rotate-halves → pairs).
QK_PERMUTED = ("llama",)
_QK_KINDS = ("q", "k", "q_rope", "k_rope")


def _qk_convert(cfg: ModelConfig, kind: str) -> str:
    return "gguf_rows" if kind in _QK_KINDS and cfg.arch in QK_PERMUTED else ""


def _hf(cfg: ModelConfig) -> tuple[list[Rule], list[tuple[str, str]]]:
    layer = _HF + r"layers\.{L}\."
    if cfg.fused_qkv:
        qkv = [Rule(layer + r"self_attn\.qkv_proj", ("q", "k", "v"))]
    else:
        qkv = [Rule(layer + rf"self_attn\.{n}_proj", (n,), _qk_convert(cfg, n)) for n in "qkv"]
    if cfg.fused_gate_up:
        mlp = [Rule(layer + r"mlp\.gate_up_proj", ("ffn_gate", "ffn_up"))]
    else:
        mlp = [Rule(layer + r"mlp\.gate_proj", ("ffn_gate",)), Rule(layer + r"mlp\.up_proj", ("ffn_up",))]
    if cfg.sandwich_norms:  # gemma: four norms per layer
        norms = [
            Rule(layer + r"post_attention_layernorm", ("post_attn_norm",)),
            Rule(layer + r"pre_feedforward_layernorm", ("ffn_norm",)),
            Rule(layer + r"post_feedforward_layernorm", ("post_ffn_norm",)),
        ]
    else:  # llama family: post_attention_layernorm is the FFN's pre-norm
        norms = [Rule(layer + r"post_attention_layernorm", ("ffn_norm",))]
    rules = [
        Rule(_HF + r"embed_tokens", ("embed",)),
        Rule(layer + r"input_layernorm", ("attn_norm",)),
        *qkv,
        Rule(layer + r"self_attn\.q_norm", ("q_norm",)),
        Rule(layer + r"self_attn\.k_norm", ("k_norm",)),
        Rule(layer + r"self_attn\.o_proj", ("attn_out",)),
        Rule(layer + r"self_attn", ("attn_out",)),  # the attention module's output[0] is o_proj's
        *norms,
        *mlp,
        Rule(layer + r"mlp\.down_proj", ("ffn_down",)),
        Rule(layer + r"mlp", ("ffn_down",)),
        Rule(_HF + r"layers\.{L}", ("resid_out",)),  # the decoder layer's output[0]
        Rule(_HF + r"(?:model|language_model)\.norm", ("output_norm",)),
        Rule(_HF + r"lm_head", ("logits_raw" if cfg.final_softcap else "logits",)),
    ]
    notes = [
        (layer + r"mlp\.(act_fn|activation_fn)", "act(gate) alone; labkit's ffn_act is act(gate)·up (no HF module)"),
        (_HF + r"rotary_emb", "the cos/sin tables, not a hidden state"),
    ]
    return rules, notes


# ----------------------------------------------------------------- TransformerLens
def _transformerlens(cfg: ModelConfig) -> tuple[list[Rule], list[tuple[str, str]]]:
    b = r"blocks\.{L}\."
    sandwich = cfg.sandwich_norms  # hook_attn_out / hook_mlp_out come after ln1_post / ln2_post
    rules = [
        Rule(r"hook_embed", ("embed",)),
        Rule(b + r"hook_resid_pre", ("resid_out",), layer_offset=-1),
        Rule(b + r"ln1\.hook_normalized", ("attn_norm",), "times_weight"),
        Rule(b + r"attn\.hook_q", ("q",), _qk_convert(cfg, "q")),  # from HF's weights: halves
        Rule(b + r"attn\.hook_k", ("k",), _qk_convert(cfg, "k")),
        Rule(b + r"attn\.hook_v", ("v",)),
        Rule(b + r"attn\.hook_rot_q", ("q_rope",), _qk_convert(cfg, "q_rope")),  # rotated as halves
        Rule(b + r"attn\.hook_rot_k", ("k_rope",), _qk_convert(cfg, "k_rope")),
        Rule(b + r"attn\.hook_attn_scores", ("attn_scores",)),
        Rule(b + r"attn\.hook_pattern", ("attn_probs",)),
        Rule(b + r"attn\.hook_z", ("attn_ctx",)),
        Rule(b + r"hook_attn_out", ("post_attn_norm" if sandwich else "attn_out",)),
        Rule(b + r"hook_resid_mid", ("resid_mid",)),
        Rule(b + r"ln2\.hook_normalized", ("ffn_norm",), "times_weight"),
        Rule(b + r"mlp\.hook_pre", ("ffn_gate",)),
        Rule(b + r"mlp\.hook_pre_linear", ("ffn_up",)),
        Rule(b + r"mlp\.hook_post", ("ffn_act",)),
        Rule(b + r"hook_mlp_out", ("post_ffn_norm" if sandwich else "ffn_down",)),
        Rule(b + r"hook_resid_post", ("resid_out",)),
        Rule(r"ln_final\.hook_normalized", ("output_norm",), "times_weight"),
        Rule(r"logits", ("logits",)),  # run_with_cache returns the logits beside the cache
    ]
    notes = [
        (r"(?:blocks\.{L}\.)?ln\w*\.hook_scale", "the RMS itself, one number per position"),
        (b + r"ln[12]_post\.hook_normalized", "the post-norm before its weight; hook_attn_out/hook_mlp_out hold it"),
        (b + r"attn\.[qk]_norm\.hook_\w+", "q/k norm flattened to [batch·pos·heads, d_head], before its weight"),
        (b + r"attn\.hook_result", "per-head outputs before they are summed (use_attn_result)"),
    ]
    return rules, notes


# ----------------------------------------------------------------- SGLang
# Architectures whose layers SGLang builds llama-style: fused qkv_proj and gate_up_proj, and RMSNorm
# fused with the residual add (python/sglang/srt/models/{llama,qwen2,qwen3}.py).
LLAMA_STYLE = ("llama", "qwen2", "qwen3")


def _llama_style(cfg: ModelConfig, preset: str) -> None:
    if cfg.arch not in LLAMA_STYLE:
        raise UnknownPresetError(
            f"the {preset!r} names know {', '.join(LLAMA_STYLE)} layers, not {cfg.arch}'s: "
            f"map its names with a dict {{their name: stage}}"
        )


def _sglang(cfg: ModelConfig) -> tuple[list[Rule], list[tuple[str, str]]]:
    """SGLang's module paths (tensor_dump_forward_hook.py hooks leaf modules and `model`; its dumper's
    non-intrusive mode names a module's output `non_intrusive__{path}.output`). A tuple output is
    kept as a list, read here as `name[i]`: an RMSNorm fused with the residual add returns
    (norm(x + residual), x + residual) from layer 0's post-attention norm on (layernorm.py); a
    linear layer returns (out, None), kept as the bare tensor; rotary_emb returns (q, k) rotated.
    Its q and k follow the Hugging Face checkpoint it loads (halves), like the hf preset's."""
    _llama_style(cfg, "sglang")
    pre = r"(?:non_intrusive__)?(?:[\w.]*\.)?"
    out = r"(?:\.output)?"
    layer = pre + r"layers\.{L}\."
    item = r"(?:\[{i}\](?:\.output)?|\.output\[{i}\])".format  # a tuple's i-th: `x[1]`, the dumper's `x.output[1]`
    first, second = f"(?:{out}|{item(i=0)})", item(i=1)
    last = f"blk.{cfg.n_layers - 1}.resid_out"
    rules = [
        Rule(pre + r"embed_tokens" + out, ("embed",)),
        Rule(layer + r"input_layernorm" + first, ("attn_norm",)),
        Rule(layer + r"input_layernorm" + second, ("resid_out",), layer_offset=-1),
        Rule(layer + r"self_attn\.qkv_proj" + out, ("q", "k", "v"), _qk_convert(cfg, "q")),
        Rule(layer + r"self_attn\.q_norm" + out, ("q_norm",)),
        Rule(layer + r"self_attn\.k_norm" + out, ("k_norm",)),
        Rule(layer + r"self_attn\.rotary_emb" + item(i=0), ("q_rope",), _qk_convert(cfg, "q_rope")),
        Rule(layer + r"self_attn\.rotary_emb" + item(i=1), ("k_rope",), _qk_convert(cfg, "k_rope")),
        Rule(layer + r"self_attn\.attn" + out, ("attn_ctx",)),
        Rule(layer + r"self_attn\.o_proj" + out, ("attn_out",)),
        Rule(layer + r"post_attention_layernorm" + first, ("ffn_norm",)),
        Rule(layer + r"post_attention_layernorm" + second, ("resid_mid",)),
        Rule(layer + r"mlp\.gate_up_proj" + out, ("ffn_gate", "ffn_up")),
        Rule(layer + r"mlp\.act_fn" + out, ("ffn_act",)),  # SiluAndMul: act(gate)·up, as labkit's
        Rule(layer + r"mlp\.down_proj" + out, ("ffn_down",)),
        Rule(pre + r"norm" + first, ("output_norm",)),
        Rule(pre + r"norm" + second, (last,)),
    ]
    notes = [
        (pre + r"forward_batch_info\.\w+" + out, "the pass's token ids, positions or lengths (read, not compared)"),
        (r"(?:non_intrusive__)?(?:model|logits_processor)" + out,
         "the previous pass's final output: SGLang writes a pass's file before its top-level module returns"),
        (pre + r"lm_head" + out, "not called by SGLang (its logits processor reads the weight); tied: the embedding"),
        (r"(?:input_ids|positions|seq_lens|req_pool_indices|rids)", "the pass's ids, positions or lengths"),
    ]  # fmt: skip
    return rules, notes


# ----------------------------------------------------------------- TensorRT-LLM
def _trtllm(cfg: ModelConfig) -> tuple[list[Rule], list[tuple[str, str]]]:
    """TensorRT-LLM's PyTorch backend, `debug_mode(model, dest)` (tensorrt_llm/_torch/debug/debug_hook.py):
    one file per tensor, `{call}.{Class}-{call}.{Class}-...-{input|output}.{name}.pt`, where each
    number counts calls inside the parent's current call (the model: embedding 1, layer L is L+2).
    A module's inputs are dumped before it runs and again, named as its forward's parameters, before
    its outputs after it runs; an output past the parameters is numbered. So a linear's output is
    `output.1`; an RMSNorm called on (h, residual) gives `output.2` (the norm) and `output.3` (the sum);
    called on h alone its norm lands under `output.residual`. Layers call, in order: their input
    norm (every layer in Qwen; layer 0 only in Llama, whose layers end with the next layer's
    norm, fused with the residual add, or the model's), attention (qkv_proj, then o_proj: rope runs
    inside the fused attention kernel, so q_rope and the maps have no file), the post-attention norm,
    GatedMLP (gate_up_proj, down_proj; the activation is a function: no file). q and k follow the
    Hugging Face checkpoint (halves)."""
    _llama_style(cfg, "trtllm")
    model = r"\d+\.\w*Model-"
    layer = model + r"{L}\.\w*DecoderLayer-"
    attn = layer + r"\d+\.\w*Attention-"
    mlp = layer + r"\d+\.GatedMLP-"
    last = f"blk.{cfg.n_layers - 1}.resid_out"

    def rule(pattern: str, kinds: tuple[str, ...], offset: int = -2, **kw) -> Rule:
        return Rule(pattern + r"(?:\.pt)?", kinds, layer_offset=offset, **kw)

    rules = [
        Rule(model + r"1\.Embedding-output\.1(?:\.pt)?", ("embed",)),
        rule(layer + r"1\.RMSNorm-output\.(?:residual|2)", ("attn_norm",)),  # the layer's own input norm
        rule(layer + r"1\.RMSNorm-output\.3", ("resid_out",), -3),
        rule(attn + r"1\.Linear-output\.1", ("q", "k", "v"), convert=_qk_convert(cfg, "q")),
        rule(attn + r"[23]\.Linear-output\.1", ("attn_out",)),
        rule(attn + r"[23]\.Linear-input\.input", ("attn_ctx",)),  # o_proj's input: the attention's output
        rule(layer + r"[23]\.RMSNorm-output\.2", ("ffn_norm",)),
        rule(layer + r"[23]\.RMSNorm-output\.3", ("resid_mid",)),
        rule(mlp + r"1\.Linear-output\.1", ("ffn_gate", "ffn_up")),
        rule(mlp + r"2\.Linear-output\.1", ("ffn_down",)),
        rule(mlp + r"2\.Linear-input\.input", ("ffn_act",)),  # down_proj's input: swiglu's output
        rule(layer + r"[45]\.RMSNorm-output\.2", ("attn_norm",), -1, beyond="output_norm"),  # the next layer's
        rule(layer + r"[45]\.RMSNorm-output\.3", ("resid_out",)),
        Rule(model + r"\d+\.RMSNorm-output\.(?:2|residual)(?:\.pt)?", ("output_norm",)),
        Rule(model + r"\d+\.RMSNorm-output\.3(?:\.pt)?", (last,)),
        Rule(r"\d+\.LMHead-output\.1(?:\.pt)?", ("logits_raw" if cfg.final_softcap else "logits",)),
    ]
    notes = [
        (r"[\w.-]*-input\.\w+(?:\.pt)?", "a module's input, dumped before it runs (TensorRT-LLM dumps inputs too)"),
        (r"[\w.-]*-output\.(?:input|x|hidden_states|residual|position_ids|targets)(?:\.pt)?",
         "a module's input, dumped again after it ran (its outputs follow, numbered)"),
        (r"[\w.-]*-\d+\.AllReduce-[\w.]+", "the all-reduce of a linear's output: that output itself on one rank"),
        (layer + r"output\.[\w.]+", "the layer's (next norm, residual): the same tensors as its last RMSNorm's"),
        (layer + r"\d+\.(?:\w*Attention|GatedMLP)-output\.\w+(?:\.pt)?",
         "the attention's or MLP's output: the same tensor as its o_proj's or down_proj's"),
    ]  # fmt: skip
    return rules, notes


_BUILDERS = {
    "llamacpp": _llamacpp, "hf": _hf, "transformerlens": _transformerlens, "sglang": _sglang, "trtllm": _trtllm,
}  # fmt: skip
PREFER = {"llamacpp": ("thd", "tw", "hqk"), "hf": ("tw", "hqk"), "transformerlens": ("thd", "tw", "hqk"),
          "sglang": ("tw", "hqk"), "trtllm": ("tw", "hqk")}  # fmt: skip


def user_rules(mapping: Mapping[str, str], graph: Mapping[str, Stage]) -> list[Rule]:
    """{their name or regex, `{L}` for the layer: stage name, `{L}` for the layer} → rules.
    Keys match whole names (re.fullmatch); a name without regex characters matches itself."""
    rules = []
    for key, stage in mapping.items():
        probe = stage.replace("{L}", "0")
        if probe not in graph:
            raise UnknownPresetError(f"names mapping: {key!r} → {stage!r}, which is no stage of this model")
        rules.append(Rule(key, (stage,)))
    return rules


def name_map(names: str | Mapping[str, str], cfg: ModelConfig, graph: list[Stage]) -> NameMap:
    """The NameMap of a preset name or a user mapping, for this model."""
    stages = {s.name: s for s in graph}
    if isinstance(names, Mapping):
        return NameMap("user", tuple(user_rules(names, stages)), (), stages)
    if names not in _BUILDERS:
        raise UnknownPresetError(
            f"unknown names preset {names!r}: use one of {', '.join(PRESETS)}, or a dict {{their name: stage}}"
        )
    rules, notes = _BUILDERS[names](cfg)
    return NameMap(names, tuple(rules), tuple(notes), stages, PREFER[names])
