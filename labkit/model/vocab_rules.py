"""llama.cpp's vocabulary rules as data (`llama-vocab.cpp`): token types and attribute bits, the
pre-tokenizer regexes per `tokenizer.ggml.pre`, the by-name fix-ups of special tokens, and GPT-2's
byte-to-unicode map. Kept apart from the tokenizer so that the rules can be read, and checked
against llama.cpp, as one table.
"""

from __future__ import annotations

from dataclasses import dataclass

# tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL = 0, 1, 2, 3
TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = 4, 5, 6

# llama.cpp's llama_token_attr bit flags
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

TYPE_TO_ATTR = {
    TYPE_UNKNOWN: ATTR_UNKNOWN,
    TYPE_UNUSED: ATTR_UNUSED,
    TYPE_NORMAL: ATTR_NORMAL,
    TYPE_CONTROL: ATTR_CONTROL,
    TYPE_USER_DEFINED: ATTR_USER_DEFINED,
    TYPE_BYTE: ATTR_BYTE,
}

# --- llama.cpp pre-tokenizer regexes (llm_tokenizer_bpe), applied one after the other ---------
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(frozen=True)
class PreType:
    regexes: tuple[str, ...]
    ignore_merges: bool = False
    add_bos: bool = False  # llama.cpp's default before tokenizer.ggml.add_bos_token
    clean_spaces: bool = True  # llama_detokenize drops " " before ?!., etc.


PRE_TYPES: dict[str, PreType] = {}
for _names, _pre in (
    (("default", "gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4"), None),
    (("trillion",), PreType((_GPT2,), clean_spaces=False)),
    (("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), PreType((r"\p{N}", _GPT2))),
    (("smollm", "command-r"), PreType((r"\p{N}", _GPT2), clean_spaces=False)),
    (("qwen2", "deepseek-r1-qwen", "hunyuan"), PreType((_QWEN2,), clean_spaces=False)),
    (("megrez", "stablelm2"), PreType((_QWEN2,))),
    (
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "lfm2"),
        PreType((_LLAMA3,), ignore_merges=True, add_bos=True),
    ),
    (("dbrx", "smaug-bpe"), PreType((_LLAMA3,))),
):  # fmt: skip
    for _name in _names:
        PRE_TYPES[_name] = _pre or PreType(_DEFAULT if _name == "default" else (_GPT2,))

# --- llama.cpp's by-name fix-ups of token attributes (llama_vocab::impl::load) ----------------
# The first token found with one of these names becomes that special id (if the file does not
# give it) and is forced to CONTROL.
AUTO_SPECIAL: dict[str, tuple[str, ...]] = {
    "eot": (
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
        "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
        "<end_of_utterance>",
    ),
    "eom": ("<|eom_id|>",),
    "fim_pre": (
        "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
        "<|code_prefix|>", "<|prefix|>",
    ),
    "fim_suf": (
        "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
        "<|code_suffix|>", "<|suffix|>",
    ),
    "fim_mid": (
        "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
        "<|code_middle|>", "<|middle|>",
    ),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}  # fmt: skip
AUTO_SPECIAL_KEYS = {
    "eot": ("eot_token_id",),
    "eom": ("eom_token_id",),
    "fim_pre": ("fim_pre_token_id", "prefix_token_id"),
    "fim_suf": ("fim_suf_token_id", "suffix_token_id"),
    "fim_mid": ("fim_mid_token_id", "middle_token_id"),
    "fim_pad": ("fim_pad_token_id",),
    "fim_rep": ("fim_rep_token_id",),
    "fim_sep": ("fim_sep_token_id",),
}
# Every token with one of these names ends generation and is forced to CONTROL.
EOG_NAMES = frozenset(
    (
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
        "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>",
        "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>",
        "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    )
)  # fmt: skip
# gpt-oss: always rendered, whatever the file says
FORCE_USER_DEFINED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's unicode char -> byte map (the inverse of bytes_to_unicode)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out = {chr(b): b for b in keep}
    n = 0
    for b in range(256):
        if b not in keep:
            out[chr(256 + n)] = b
            n += 1
    return out


BYTE_DECODER = _gpt2_byte_decoder()
BYTE_ENCODER = {b: ch for ch, b in BYTE_DECODER.items()}
