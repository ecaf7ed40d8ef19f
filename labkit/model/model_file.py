"""Opening a model file: the one validation pass every engine and `labkit info` go through.

Each step checks what the next one relies on, so a malformed file is refused with a typed error
(labkit.errors.ModelFileError's subclasses) before anything is allocated: the bytes and the tensor
table (gguf_file), every key's type and every hyperparameter's range (config), then every tensor the
graph reads and the vocabulary (tensor_checks).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from labkit.errors import HyperparameterError, MetadataTypeError
from labkit.model.config import ModelConfig, config_from_metadata
from labkit.model.gguf_file import GgufFile, open_gguf
from labkit.model.graph import Stage, build_graph
from labkit.model.tensor_checks import check_tensors, check_vocabulary


@dataclass(frozen=True)
class ModelFile:
    """A checked model file: its mapped GGUF, the config its metadata gives, and its stage graph."""

    gguf: GgufFile
    config: ModelConfig
    graph: list[Stage]


def open_model_file(path: str | Path) -> ModelFile:
    f = open_gguf(path)
    try:
        cfg = config_from_metadata(f.metadata, set(f.tensors))  # every key's type, then its range
    except (MetadataTypeError, HyperparameterError) as e:  # the config names the key; the message, the file too
        raise type(e)(f"{f.path}: {e}") from None
    graph = build_graph(cfg)
    check_vocabulary(f.path, f.metadata, cfg)
    check_tensors(f.path, f.tensors, cfg, graph)
    return ModelFile(f, cfg, graph)
