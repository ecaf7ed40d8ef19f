"""Dump a Hugging Face transformers run of a GGUF file, module by module, for `load_dumps(names="hf")`.

    python -m labkit.dumps.hf_hooks MODEL.gguf --tokens 1,2,3 --out dump.pt [--dtype bfloat16]
        [--scale MODULE=FACTOR]...

transformers loads the GGUF file itself (`from_pretrained(dir, gguf_file=...)`, dequantized
to the chosen dtype), and a forward hook on every named module keeps its output: the way
people dump a transformers or vLLM model to compare with another engine. `--scale` multiplies
one module's output by a factor inside the run (a fault for testing tools that localize
faults; later modules read the faulty value). Needs torch, transformers and accelerate (the
`hf` extra); labkit itself is not imported, so this runs in any environment that has those.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from labkit.errors import LabkitError


def dump(gguf: Path, tokens: list[int], dtype: str = "float32", scale: dict[str, float] | None = None) -> dict:
    """{module path: output tensor in the run's dtype}, batch dim dropped."""
    return dump_with_inputs(gguf, tokens, dtype, scale)[0]


def dump_with_inputs(
    gguf: Path, tokens: list[int], dtype: str = "float32", scale: dict[str, float] | None = None
) -> tuple[dict, dict, tuple]:
    """(outputs, first inputs, rope's (cos, sin)) of every named module of a transformers run:
    what another engine's module tree sees is put together from these (labkit.dumps.engine_dumps)."""
    return hooked_pass(load_model(gguf, dtype), tokens, scale)


def load_model(gguf: Path, dtype: str = "float32"):
    """transformers' own model of the GGUF file, dequantized to `dtype`, in eval mode. The file is
    checked first as labkit.open checks it: transformers' reader trusts every count it reads."""
    from labkit.model.model_file import open_model_file

    open_model_file(gguf)
    import torch
    from transformers import AutoModelForCausalLM

    with _gguf_read_once():
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype))
    return model.eval()


def hooked_pass(model, tokens: list[int], scale: dict[str, float] | None = None) -> tuple[dict, dict, tuple]:
    """One forward pass of a loaded model with a hook on every named module (removed afterwards, so
    one load serves several passes): (outputs, first inputs, rope's (cos, sin))."""
    import torch

    out: dict[str, np.ndarray] = {}
    inputs: dict = {}
    rope: list = []

    def hook(name):
        def keep(module, args, output):
            if name.endswith("rotary_emb") and isinstance(output, tuple):
                rope[:] = [t.detach()[0].clone() for t in output]
            t = output[0] if isinstance(output, tuple) else output
            if not torch.is_tensor(t):
                return None
            if scale and name in scale:
                t = t * scale[name]
                output = (t, *output[1:]) if isinstance(output, tuple) else t
            out[name] = t.detach()[0].clone()
            return output if scale and name in scale else None

        return keep

    def pre_hook(name):
        def keep(module, args):
            if args and torch.is_tensor(args[0]):
                inputs[name] = args[0].detach()[0].clone()

        return keep

    handles = []
    for name, module in model.named_modules():
        if name:
            handles += [module.register_forward_hook(hook(name)), module.register_forward_pre_hook(pre_hook(name))]
    try:
        with torch.no_grad():
            model(torch.tensor([tokens]), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    return out, inputs, tuple(rope)


@contextmanager
def _gguf_read_once() -> Iterator[None]:
    """transformers' GGUF loader parses the file's metadata three times (config, tokenizer, weights)
    and rebuilds gguf's tensor-name map once per module (about 400 for SmolLM2): most of a load
    (of 39 s for SmolLM2-135M on a 2-core host). Within one load each is read or built once; both
    are read-only, and gguf's own functions are put back afterwards. The metadata is parsed by
    FastGGUFReader (the same fields as gguf-py's reader, in a 20th of the time at Gemma's vocab)."""
    import gguf

    from labkit.dumps.fast_gguf_reader import FastGGUFReader

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    opened: dict[tuple, gguf.GGUFReader] = {}

    def read(path, mode: str = "r") -> gguf.GGUFReader:  # the config asks by another spelling of the path
        key = (os.path.realpath(path), mode)
        if key not in opened:
            opened[key] = FastGGUFReader(path, mode)
        return opened[key]

    gguf.GGUFReader = read
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m labkit.dumps.hf_hooks", description=__doc__.split("\n\n")[0])
    p.add_argument("gguf", type=Path)
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", type=Path, required=True, help="a .pt file (torch.save, dtypes kept) or an .npz (float32)")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--scale", action="append", default=[], help="MODULE=FACTOR: multiply a module's output")
    a = p.parse_args(argv)
    scale = {k: float(v) for k, v in (s.split("=", 1) for s in a.scale)}
    try:
        save(dump(a.gguf, [int(t) for t in a.tokens.split(",")], a.dtype, scale), a.out)
    except LabkitError as e:
        print(f"labkit: error: {e}", file=sys.stderr)
        return 1
    return 0


def save(tensors: dict, out: Path) -> None:
    """A .pt file (torch.save, dtypes kept), or an .npz (float32)."""
    if out.suffix == ".npz":
        np.savez(out, **{k: t.float().numpy() for k, t in tensors.items()})
    else:
        import torch

        torch.save(tensors, out)
    print(f"{len(tensors)} modules to {out}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
