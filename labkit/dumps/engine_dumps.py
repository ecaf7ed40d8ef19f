"""Write a transformers run of a GGUF file as SGLang or TensorRT-LLM would dump it, for tests and
for people without those engines' GPUs.

    python -m labkit.dumps.engine_dumps MODEL.gguf --tokens 1,2,3 --engine sglang|sglang-dumper|trtllm
        --out DIR [--dtype bfloat16] [--scale MODULE=FACTOR]...

Neither engine runs without CUDA, so this writes their files from a real transformers pass (its
forward hooks, labkit.dumps.hf_hooks), with real torch.save, under each engine's own names, file
layout and tensor layouts, read from their sources (labkit.dumps.names and labkit.dumps.steps cite
them): fused q;k;v and gate;up outputs, RMSNorm fused with the residual add returning
(norm, sum), [tokens, features] tensors with no batch axis, SGLang's lists for tuple outputs and
its `forward_batch_info` ids, TensorRT-LLM's call-index paths with every module's inputs dumped
before and after it runs. Each tensor is the quantity the engine's module computes, in the run's
dtype: a fused projection is the concatenation of the unfused ones, the fused norm's sum is the
residual transformers adds. Llama-style models only (llama, qwen2, qwen3 without q/k norms).
Needs torch and transformers (the `hf` extra); labkit is not imported.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from labkit.dumps.hf_hooks import hooked_pass, load_model


class _Pass:
    """One transformers pass, read the way the engines' modules see it."""

    def __init__(self, out: dict, inputs: dict, rope: tuple, tokens: list[int], n_heads: int, n_kv: int):
        import torch

        self.o, self.i, self.tokens = out, inputs, tokens
        self.n_layers = 1 + max(int(k.split(".")[2]) for k in out if k.startswith("model.layers."))
        self.cos, self.sin = rope
        self.n_heads, self.n_kv, self.cat = n_heads, n_kv, torch.cat

    def L(self, layer: int, name: str):
        return self.o[f"model.layers.{layer}.{name}"]

    def qkv(self, layer: int):
        return self.cat([self.L(layer, f"self_attn.{p}_proj") for p in "qkv"], dim=-1)

    def gate_up(self, layer: int):
        return self.cat([self.L(layer, "mlp.gate_proj"), self.L(layer, "mlp.up_proj")], dim=-1)

    def ctx(self, layer: int):  # attention's output before o_proj (what SGLang's RadixAttention returns)
        return self.i[f"model.layers.{layer}.self_attn.o_proj"]

    def act(self, layer: int):  # act(gate)·up: down_proj's input
        return self.i[f"model.layers.{layer}.mlp.down_proj"]

    def resid_mid(self, layer: int):  # the post-attention norm's input is the residual sum
        return self.i[f"model.layers.{layer}.post_attention_layernorm"]

    def resid_out(self, layer: int):
        return self.o[f"model.layers.{layer}"]

    def roped(self, layer: int):
        """(q, k) rotated by transformers' own apply_rotary_pos_emb, flat [tokens, heads·dim]."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        T = len(self.tokens)
        q = self.L(layer, "self_attn.q_proj").view(1, T, self.n_heads, -1).transpose(1, 2)
        k = self.L(layer, "self_attn.k_proj").view(1, T, self.n_kv, -1).transpose(1, 2)
        qr, kr = apply_rotary_pos_emb(q, k, self.cos[None], self.sin[None])
        return tuple(t.transpose(1, 2).reshape(T, -1).contiguous() for t in (qr, kr))


def sglang_pass(p: _Pass) -> dict:
    """SGLang's Pass file: {leaf module path: output, or [outputs] for a tuple}, with the batch's ids."""
    import torch

    d = {"model.embed_tokens": p.o["model.embed_tokens"]}
    for L in range(p.n_layers):
        m = f"model.layers.{L}."
        norm = p.L(L, "input_layernorm")
        d[m + "input_layernorm"] = norm if L == 0 else [norm, p.resid_out(L - 1)]
        d[m + "self_attn.qkv_proj"] = p.qkv(L)
        d[m + "self_attn.rotary_emb"] = list(p.roped(L))
        d[m + "self_attn.attn"] = p.ctx(L)
        d[m + "self_attn.o_proj"] = p.L(L, "self_attn.o_proj")
        d[m + "post_attention_layernorm"] = [p.L(L, "post_attention_layernorm"), p.resid_mid(L)]
        d[m + "mlp.gate_up_proj"] = p.gate_up(L)
        d[m + "mlp.act_fn"] = p.act(L)
        d[m + "mlp.down_proj"] = p.L(L, "mlp.down_proj")
    d["model.norm"] = [p.o["model.norm"], p.resid_out(p.n_layers - 1)]
    ids = torch.tensor(p.tokens, dtype=torch.int64)
    d["model.forward_batch_info.input_ids"] = ids
    d["model.forward_batch_info.positions"] = torch.arange(len(ids), dtype=torch.int64)
    d["model.forward_batch_info.seq_lens"] = torch.tensor([len(ids)], dtype=torch.int64)
    return d


def write_sglang(p: _Pass, out: Path) -> None:
    """`--debug-tensor-dump-output-folder`: TP0_PP0_Rank0_pid{pid}/Pass00000.pt."""
    import torch

    folder = out / "TP0_PP0_Rank0_pid4242"
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(sglang_pass(p), folder / "Pass00000.pt")


def write_sglang_dumper(p: _Pass, out: Path) -> None:
    """The dumper's non-intrusive mode: one {"value", "meta"} file per tensor, tags in its name."""
    import torch

    folder = out / "dump_20261125_120000_000"
    folder.mkdir(parents=True, exist_ok=True)
    items = {
        ("non_intrusive__" + k + ".output" if k.startswith("model.layers") or k in ("model.embed_tokens", "model.norm")
         else k.rsplit(".", 1)[-1]): v
        for k, v in sglang_pass(p).items()
    }  # fmt: skip
    for i, (name, value) in enumerate(items.items()):
        meta = {"step": 0, "rank": 0, "dump_index": i, "name": name, "world_rank": 0, "world_size": 1}
        tags = "___".join(f"{k}={meta[k]}" for k in ("step", "rank", "dump_index", "name"))
        torch.save({"value": value, "meta": meta}, folder / f"{tags}.pt")


class _TrtllmFiles:
    """TensorRT-LLM's debug_hook naming: each module call dumps its positional inputs before it runs
    (`input.{param}`), and inputs then outputs after it runs (`output.{param}`, then `output.{n}`
    once past the forward's parameters). `after` holds an input's value after the call where the
    module changed it in place (flashinfer's fused add + RMSNorm)."""

    def __init__(self, folder: Path):
        self.folder, self.files = folder, {}

    def module(self, path: str, params: list[str], args: list, outputs: list, after: list | None = None) -> None:
        def label(j: int) -> str:
            return params[j] if j < len(params) else str(j)

        for j, a in enumerate(args):
            self.files[f"{path}-input.{label(j)}"] = a
        for j, t in enumerate(list(after or args) + list(outputs)):
            self.files[f"{path}-output.{label(j)}"] = t

    def linear(self, path: str, x, y) -> None:
        self.module(path, ["input"], [x], [y])

    def save(self) -> None:
        import torch

        self.folder.mkdir(parents=True, exist_ok=True)
        for name, t in self.files.items():
            torch.save(t.contiguous(), self.folder / f"{name}.pt")


_NORM = ["hidden_states", "residual"]
_ATTN = ["position_ids", "hidden_states", "attn_metadata"]
_MLP = ["x", "all_rank_num_tokens"]


def write_trtllm(p: _Pass, out: Path) -> None:
    """`debug_mode(model, out)` on a Llama (its decoder layers end with the next layer's norm)."""
    import torch

    f = _TrtllmFiles(out / "rank0")
    top = "1.LlamaModel"
    embed = p.o["model.embed_tokens"]
    f.module(f"{top}-1.Embedding", ["input"], [torch.tensor(p.tokens, dtype=torch.int64)], [embed])
    for L in range(p.n_layers):
        layer = f"{top}-{L + 2}.LlamaDecoderLayer"
        n = 1
        if L == 0:
            f.module(f"{layer}-1.RMSNorm", _NORM, [embed], [p.L(0, "input_layernorm")])
            n = 2
        attn = f"{layer}-{n}.LlamaAttention"
        f.module(attn, _ATTN, [], [p.L(L, "self_attn.o_proj")])
        f.linear(f"{attn}-1.Linear", p.L(L, "input_layernorm"), p.qkv(L))
        f.linear(f"{attn}-2.Linear", p.ctx(L), p.L(L, "self_attn.o_proj"))
        f.linear(f"{attn}-2.Linear-1.AllReduce", p.L(L, "self_attn.o_proj"), p.L(L, "self_attn.o_proj"))
        before = embed if L == 0 else p.resid_out(L - 1)
        post = [p.L(L, "post_attention_layernorm"), p.resid_mid(L)]
        f.module(f"{layer}-{n + 1}.RMSNorm", _NORM, [p.L(L, "self_attn.o_proj"), before], post, after=post)
        mlp = f"{layer}-{n + 2}.GatedMLP"
        f.module(mlp, _MLP, [post[0]], [p.L(L, "mlp.down_proj")])
        f.linear(f"{mlp}-1.Linear", post[0], p.gate_up(L))
        f.linear(f"{mlp}-2.Linear", p.act(L), p.L(L, "mlp.down_proj"))
        nxt = p.L(L + 1, "input_layernorm") if L + 1 < p.n_layers else p.o["model.norm"]
        fused = [nxt, p.resid_out(L)]
        f.module(f"{layer}-{n + 3}.RMSNorm", _NORM, [p.L(L, "mlp.down_proj"), p.resid_mid(L)], fused, after=fused)
        f.module(layer, ["position_ids", "hidden_states", "attn_metadata", "residual"], [], fused)
    logits = p.o["lm_head"][-1:]  # the logits processor keeps the last position before the LM head
    f.linear("2.LMHead", p.o["model.norm"][-1:], logits)
    f.save()


WRITERS = {"sglang": write_sglang, "sglang-dumper": write_sglang_dumper, "trtllm": write_trtllm}


@dataclass(frozen=True)
class DumpJob:
    """One engine's dump folder of one pass: `scale` is ((MODULE, FACTOR), ...), a fault inside it."""

    engine: str
    out: Path
    dtype: str = "float32"
    scale: tuple[tuple[str, float], ...] = ()


def write_dumps(gguf: Path, tokens: list[int], jobs: list[DumpJob]) -> None:
    """Write each job's folder: one transformers load per dtype and one pass per distinct fault, so
    several engines and faults cost one load (most of a job's time)."""
    for dtype in dict.fromkeys(j.dtype for j in jobs):
        model = load_model(gguf, dtype)
        heads = model.config.num_attention_heads, model.config.num_key_value_heads  # from the file's metadata
        for scale in dict.fromkeys(j.scale for j in jobs if j.dtype == dtype):
            p = _Pass(*hooked_pass(model, tokens, dict(scale)), tokens, *heads)
            for job in (j for j in jobs if j.dtype == dtype and j.scale == scale):
                WRITERS[job.engine](p, job.out)
                print(f"{job.engine} dumps of {len(tokens)} tokens to {job.out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labkit.dumps.engine_dumps", description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--tokens", required=True, help="comma-separated token ids")
    ap.add_argument("--engine", required=True, choices=sorted(WRITERS))
    ap.add_argument("--out", type=Path, required=True, help="the dump folder to write")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--scale", action="append", default=[], help="MODULE=FACTOR: multiply a module's output")
    a = ap.parse_args(argv)
    scale = tuple((k, float(v)) for k, v in (s.split("=", 1) for s in a.scale))
    write_dumps(a.gguf, [int(t) for t in a.tokens.split(",")], [DumpJob(a.engine, a.out, a.dtype, scale)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
