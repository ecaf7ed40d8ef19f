"""The type of every metadata key labkit reads, checked once at open before any value is used.

llama.cpp's loader (`GGUFMeta::GKV::validate_type`) refuses a key of another type than it reads,
so a `block_count` stored as the string "2" never becomes 2. labkit is as strict on the kind
(integer, float, bool, string, array of one of them) and accepts any width of it: the GGUF spec
writes some counts as uint64 where llama.cpp's converters write uint32. Keys labkit does not read
are left alone, as llama.cpp leaves them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from labkit.errors import MetadataTypeError
from labkit.model.gguf_file import StringArray

INT, FLOAT, BOOL, STR = "an integer", "a float", "a bool", "a string"
EMPTY = "an empty array"  # of any item type: GGUF still says which, a Python list does not
PER_LAYER = "an integer, or an array of integers (one per layer)"  # llama.cpp's get_key_or_arr


def array_of(kind: str) -> str:
    return f"an array of {kind.split(' ', 1)[1]}s"


GENERAL_KEYS = {"general.architecture": STR, "general.name": STR, "general.file_type": INT}
_TOKEN_IDS = ("bos", "eos", "unknown", "padding", "seperator", "eot", "eom", "prefix", "suffix", "middle")
_FIM_IDS = ("fim_pre", "fim_suf", "fim_mid", "fim_pad", "fim_rep", "fim_sep")
TOKENIZER_KEYS = {
    "tokenizer.ggml.model": STR,
    "tokenizer.ggml.pre": STR,
    "tokenizer.ggml.tokens": array_of(STR),
    "tokenizer.ggml.scores": array_of(FLOAT),
    "tokenizer.ggml.token_type": array_of(INT),
    "tokenizer.ggml.merges": array_of(STR),
    "tokenizer.ggml.add_bos_token": BOOL,
    "tokenizer.ggml.add_eos_token": BOOL,
    "tokenizer.ggml.add_space_prefix": BOOL,
    **{f"tokenizer.ggml.{name}_token_id": INT for name in (*_TOKEN_IDS, *_FIM_IDS)},
}
# `<arch>.` + these: what config_from_metadata reads
ARCH_KEYS = {
    "context_length": INT,
    "embedding_length": INT,
    "block_count": INT,
    "vocab_size": INT,
    "feed_forward_length": PER_LAYER,
    "attention.head_count": PER_LAYER,
    "attention.head_count_kv": PER_LAYER,
    "attention.key_length": INT,
    "attention.value_length": INT,
    "attention.layer_norm_rms_epsilon": FLOAT,
    "attention.sliding_window": INT,
    "attention.sliding_window_pattern": INT,
    "attn_logit_softcapping": FLOAT,
    "final_logit_softcapping": FLOAT,
    "rope.freq_base": FLOAT,
    "rope.freq_base_swa": FLOAT,
    "rope.dimension_count": INT,
    "rope.scaling.type": STR,
    "rope.scaling.factor": FLOAT,
    "rope.scale_linear": FLOAT,
    "rope.scaling.attn_factor": FLOAT,
    "rope.scaling.yarn_log_multiplier": FLOAT,
    "rope.scaling.original_context_length": INT,
    "expert_count": INT,
    "expert_used_count": INT,
    "expert_feed_forward_length": PER_LAYER,
    "expert_shared_feed_forward_length": INT,
    "expert_weights_norm": BOOL,
    "leading_dense_block_count": INT,
    "interleave_moe_layer_step": INT,
    "ssm.conv_kernel": INT,
    "ssm.inner_size": INT,
    "ssm.state_size": INT,
    "ssm.time_step_rank": INT,
    "ssm.group_count": INT,
    "rope.scaling.finetuned": BOOL,
    "embedding_scale": FLOAT,
    "residual_scale": FLOAT,
    "attention.scale": FLOAT,
    "logit_scale": FLOAT,
}


def expected_kinds(arch: str | None) -> dict[str, str]:
    """{key: kind} for a file of `arch` (general and tokenizer keys only when it is unknown)."""
    arch_keys = {f"{arch}.{k}": v for k, v in ARCH_KEYS.items()} if arch else {}
    return {**GENERAL_KEYS, **TOKENIZER_KEYS, **arch_keys}


def kind_of(value: Any) -> str:
    """The kind of a value as labkit.model.gguf_file reads it (Python scalars, numpy or str arrays)."""
    if isinstance(value, (bool, np.bool_)):
        return BOOL
    if isinstance(value, (int, np.integer)):
        return INT
    if isinstance(value, (float, np.floating)):
        return FLOAT
    if isinstance(value, str):
        return STR
    if isinstance(value, np.ndarray):
        scalar = {"b": BOOL, "i": INT, "u": INT, "f": FLOAT}.get(value.dtype.kind)
        return array_of(scalar) if scalar else "an array"
    if isinstance(value, StringArray):
        return array_of(STR)
    if isinstance(value, (list, tuple)):  # a metadata dict written by hand (labkit.model.tiny)
        kinds = {kind_of(v) for v in value}
        return EMPTY if not kinds else array_of(kinds.pop()) if len(kinds) == 1 else "a mixed array"
    return type(value).__name__


def check_key_types(metadata: dict[str, Any]) -> None:
    """Refuse the first key labkit reads whose value is of another kind than it reads it as."""
    arch = metadata.get("general.architecture")
    for key, want in expected_kinds(arch if isinstance(arch, str) else None).items():
        if key not in metadata:
            continue
        got = kind_of(metadata[key])
        if got == want or (want == PER_LAYER and got in (INT, array_of(INT))) or (got == EMPTY and "array" in want):
            continue
        raise MetadataTypeError(f"{key} is {got} ({_short(metadata[key])}); labkit reads it as {want}")


def _short(value: Any) -> str:
    if isinstance(value, (np.ndarray, list, tuple)):  # the first few items only: it may be a vocabulary
        return f"{len(value)} items: {repr(list(value[:4]))[:-1]}, ...]" if len(value) > 4 else repr(list(value))
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
