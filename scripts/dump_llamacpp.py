"""Dump llama.cpp's intermediate tensors to an .npz, in llama.cpp's own names and layout.

What an engine developer would write with llama.cpp's eval callback, and nothing from
labkit: llama-cpp-python's low-level API runs one prompt, the callback (`cb_eval`) asks
for every graph node, and each F32 node is copied out with ggml's own
`ggml_backend_tensor_get`. Each array keeps ggml's 4 dimensions in numpy order (shape =
ne reversed: `attn_norm-0` is [1, 1, T, d_model], `kq-0` is [1, heads, T, n_kv] with the KV
axis padded). A name llama.cpp gives to several nodes (`Qcur-0` is the matmul, then the
rope) is keyed `name [OP]` for each of them. Flash attention is off, so `kq-L` and
`kq_soft_max-L` exist; only the last position's logits are requested unless
--all-logits, so llama.cpp prunes its last layer to that position, as it does by default.

    python scripts/dump_llamacpp.py MODEL.gguf --prompt "The color of the sky is" --out dump.npz
    python scripts/dump_llamacpp.py MODEL.gguf --tokens 2,818,2258 --out dump.npz --all-logits
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path

import numpy as np


class GgmlTensorHead(ctypes.Structure):
    """The start of ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, GGML_MAX_SRC 10)."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("buffer", ctypes.c_void_p),
        ("ne", ctypes.c_int64 * 4),
        ("nb", ctypes.c_size_t * 4),
        ("op", ctypes.c_int),
        ("op_params", ctypes.c_int32 * 16),
        ("flags", ctypes.c_int32),
        ("src", ctypes.c_void_p * 10),
        ("view_src", ctypes.c_void_p),
        ("view_offs", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("name", ctypes.c_char * 64),
    ]


def ggml_library(llama_cpp_module):
    lib_dir = Path(llama_cpp_module.__file__).parent / "lib"
    lib = ctypes.CDLL(str(next(lib_dir.glob("libggml-base.*"))))
    lib.ggml_op_name.restype = ctypes.c_char_p
    lib.ggml_op_name.argtypes = [ctypes.c_int]
    lib.ggml_nbytes.restype = ctypes.c_size_t
    lib.ggml_nbytes.argtypes = [ctypes.c_void_p]
    lib.ggml_backend_tensor_get.restype = None
    lib.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    return lib


class Recorder:
    """The eval callback: wants every F32 node, and keeps (name, op, array) in graph order."""

    def __init__(self, lib):
        self.lib, self.nodes, self.error = lib, [], None

    def __call__(self, t, ask, _user):
        try:
            head = GgmlTensorHead.from_address(t)
            if head.type != 0:  # F32 only
                return False
            if ask:
                return True
            nbytes = self.lib.ggml_nbytes(t)
            raw = np.empty(nbytes, dtype=np.uint8)
            self.lib.ggml_backend_tensor_get(t, raw.ctypes.data, 0, nbytes)
            shape = tuple(int(n) for n in head.ne)[::-1]
            strides = tuple(int(n) for n in head.nb)[::-1]
            array = np.lib.stride_tricks.as_strided(raw.view(np.float32), shape=shape, strides=strides).copy()
            self.nodes.append((head.name.decode(), self.lib.ggml_op_name(head.op).decode(), array))
            return True
        except BaseException as e:  # never let an exception cross into C
            self.error = e
            return False


def keyed(nodes):
    """{key: array}: the node's name, or `name [OP]` where llama.cpp gave several nodes that name."""
    counts = {}
    for name, _, _ in nodes:
        counts[name] = counts.get(name, 0) + 1
    out = {}
    for name, op, array in nodes:
        key = name if counts[name] == 1 else f"{name} [{op}]"
        n, base = 2, key
        while key in out:
            key, n = f"{base}#{n}", n + 1
        out[key] = array
    return out


def run(model_path: str, tokens: list[int] | None, prompt: str | None, all_logits: bool):
    import llama_cpp
    from llama_cpp import llama_cpp as L

    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    if not model:
        sys.exit(f"llama.cpp could not load {model_path}")
    if tokens is None:
        vocab = L.llama_model_get_vocab(model)
        buf = (L.llama_token * 4096)()
        n = L.llama_tokenize(vocab, prompt.encode(), len(prompt.encode()), buf, 4096, True, False)
        tokens = list(buf[:n])
    rec = Recorder(ggml_library(llama_cpp))
    callback = L.ggml_backend_sched_eval_callback(rec)
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(512, len(tokens))
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = 0  # disabled: kq and kq_soft_max stay tensors
    cp.cb_eval, cp.cb_eval_user_data = callback, None
    ctx = L.llama_init_from_model(model, cp)
    batch = L.llama_batch_init(len(tokens), 0, 1)
    for i, tok in enumerate(tokens):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1 if all_logits or i == len(tokens) - 1 else 0
    batch.n_tokens = len(tokens)
    rc = L.llama_decode(ctx, batch)
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    if rec.error is not None:
        raise rec.error
    if rc != 0:
        sys.exit(f"llama_decode returned {rc}")
    return tokens, keyed(rec.nodes)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--prompt")
    given.add_argument("--tokens", help="comma-separated ids")
    p.add_argument("--out", required=True)
    p.add_argument("--all-logits", action="store_true", help="every position's logits: nothing is pruned")
    args = p.parse_args(argv)
    ids = [int(t) for t in args.tokens.split(",")] if args.tokens else None
    tokens, arrays = run(args.model, ids, args.prompt, args.all_logits)
    np.savez(args.out, **arrays)
    print(f"{len(arrays)} tensors for tokens {','.join(map(str, tokens))} → {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
