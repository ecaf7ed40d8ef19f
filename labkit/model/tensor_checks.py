"""The file against its own hyperparameters: every tensor the graph reads is there at the shape the
config implies, the vocabulary agrees with itself and with token_embd. Checked at open, after the
config and graph are built and before anything is allocated, as llama.cpp's `create_tensor` checks
each tensor ("wrong shape; expected ..., got ...") and counts the rest ("wrong number of tensors").
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from labkit.errors import (
    HyperparameterError,
    MissingTensorError,
    ModelFileWarning,
    TensorShapeMismatchError,
    VocabularyError,
)
from labkit.model.config import ModelConfig
from labkit.model.file_tensors import file_tensors
from labkit.model.gguf_file import TensorInfo
from labkit.model.graph import Stage


def check_tensors(path: Path, tensors: dict[str, TensorInfo], cfg: ModelConfig, graph: list[Stage]) -> None:
    """Refuse a tensor the graph reads that is absent or of another shape; warn of the ones no
    stage reads (llama.cpp refuses those; labkit names them and runs)."""
    _check_layer_count(path, tensors, cfg)
    readers = _first_readers(graph)
    for want in file_tensors(cfg, graph):
        got = tensors.get(want.name)
        if got is None:
            raise MissingTensorError(
                f"{path}: tensor {want.name!r}, read by stage {readers[want.name]}, is not in the file"
            )
        if got.shape != want.shape:
            raise TensorShapeMismatchError(
                f"{path}: tensor {want.name!r} has shape {list(got.shape)}; the file's hyperparameters make it "
                f"{list(want.shape)} (read by stage {readers[want.name]}{_hint(got.shape, want.shape)})"
            )
    unread = [n for n in tensors if n not in readers]
    if unread:
        shown = ", ".join(unread[:5]) + (f" and {len(unread) - 5} more" if len(unread) > 5 else "")
        warnings.warn(f"{path}: {len(unread)} tensor(s) no stage of {cfg.arch} reads: {shown}", ModelFileWarning, 2)


def _check_layer_count(path: Path, tensors: dict[str, TensorInfo], cfg: ModelConfig) -> None:
    """block_count against the layers the file has tensors for: the message a missing layer deserves."""
    present = {int(m.group(1)) for m in map(_BLK.match, tensors) if m}
    have = max(present) + 1 if present else 0
    if cfg.n_layers > have:
        key = f"{cfg.arch}.block_count"
        where = f"tensors for {have} layer(s), blk.0 to blk.{have - 1}" if have else "no layer tensors (blk.N.*)"
        raise HyperparameterError(f"{path}: {key} is {cfg.n_layers}, but the file has {where}")


_BLK = re.compile(r"blk\.(\d{1,4})\.")


def _first_readers(graph: list[Stage]) -> dict[str, str]:
    readers: dict[str, str] = {}
    for st in graph:
        for name in st.tensors.values():
            readers.setdefault(name, st.name)
    return readers


def _hint(got: tuple[int, ...], want: tuple[int, ...]) -> str:
    return "; stored transposed?" if len(got) == 2 and got == want[::-1] else ""


def check_vocabulary(path: Path, meta: dict[str, Any], cfg: ModelConfig) -> None:
    """The tokenizer's arrays have one entry per token, and as many tokens as the model's vocabulary
    (llama.cpp reads n_vocab from the tokens and requires token_embd to match it)."""
    tokens, key = meta.get("tokenizer.ggml.tokens"), f"{cfg.arch}.vocab_size"
    if not cfg.vocab_size:
        if tokens is not None:
            what = "tokenizer.ggml.tokens is empty"
        else:
            what = f"{key} is 0" if key in meta else f"neither tokenizer.ggml.tokens nor {key}"
        raise VocabularyError(f"{path}: no vocabulary: {what}")
    if tokens is None:
        return
    n = len(tokens)
    if n != cfg.vocab_size:
        raise VocabularyError(f"{path}: tokenizer.ggml.tokens has {n} tokens, but {key} is {cfg.vocab_size}")
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        values = meta.get(key)
        if values is not None and len(values) != n:
            raise VocabularyError(f"{path}: {key} has {len(values)} entries for {n} tokens")
    scores = meta.get("tokenizer.ggml.scores")
    if scores is not None and not np.isfinite(scores).all():
        raise VocabularyError(
            f"{path}: tokenizer.ggml.scores has {int((~np.isfinite(scores)).sum())} non-finite entries"
        )
