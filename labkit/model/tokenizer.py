"""A tokenizer built from a GGUF file's vocabulary that gives exactly llama.cpp's token ids.

Byte-level BPE merging runs in HuggingFace `tokenizers` (`models.BPE`), SentencePiece merging in
`labkit.model.spm`; everything around them follows llama.cpp's `llama-vocab.cpp` step by step:

* token attributes come from `tokenizer.ggml.token_type`, then llama.cpp's by-name fix-ups
  (e.g. `<end_of_turn>`, `</s>`, `<|im_end|>` become control tokens whatever the file says);
* `tokenizer_st_partition`: special tokens are cut out of the raw text first, longest text
  first. User-defined tokens (type 4, e.g. Gemma's runs of spaces/newlines/tabs and HTML tags)
  are always cut out; control tokens (type 3) only when ``special=True`` (llama.cpp's
  ``parse_special``);
* ``tokenizer.ggml.model == "llama"`` (SentencePiece, `llm_tokenizer_spm`): spaces become
  ``▁``, an optional space prefix per text fragment, then pairs merge by the score of the merged
  token, with ``<0xXX>`` byte fallback: llama.cpp's own loop, in `labkit.model.spm`;
* ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE, `llm_tokenizer_bpe`): the regex splits of
  llama.cpp for ``tokenizer.ggml.pre`` (e.g. ``smollm``: digits one by one, then the GPT-2
  pattern; ``qwen2``: the Qwen2 pattern), GPT-2 byte-to-unicode mapping, merges by rank.

`encode(text)` mirrors ``llama_tokenize(text, add_special=True, parse_special=False)``, which
is what llama-cpp-python's ``Llama.tokenize(text.encode(), add_bos=True, special=False)`` calls.
`piece` / `decode` mirror ``llama_token_to_piece`` / ``llama_detokenize``.
"""

from __future__ import annotations

import gc
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from labkit.errors import TokenIdError, TokenizerError, UnsupportedArchitectureError, VocabularyError
from labkit.model.spm import SpmMerger
from labkit.model.vocab_rules import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    AUTO_SPECIAL,
    AUTO_SPECIAL_KEYS,
    BYTE_DECODER,
    BYTE_ENCODER,
    EOG_NAMES,
    FORCE_USER_DEFINED,
    PRE_TYPES,
    TYPE_NORMAL,
    TYPE_TO_ATTR,
    PreType,
)


@dataclass(eq=False)
class GgufTokenizer:
    """llama.cpp-exact tokenizer of one GGUF vocabulary. Build it with `build_tokenizer`.

    `merger` merges raw text: `SpmMerger` (llama.cpp's SentencePiece loop) for "llama",
    `BpeMerger` (HuggingFace's byte-level BPE) for "gpt2". Neither handles special tokens: `encode`
    cuts them out first, like llama.cpp.
    """

    model: str  # tokenizer.ggml.model: "llama" (SentencePiece) or "gpt2" (byte-level BPE)
    pre: str  # tokenizer.ggml.pre ("" for SentencePiece)
    vocab_size: int
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    add_bos: bool  # llama_tokenize(add_special=True) prepends bos_id
    add_eos: bool  # ... and appends eos_id
    add_space_prefix: bool  # SentencePiece: a space before each raw text fragment
    clean_spaces: bool  # decode: llama_detokenize's clean-up of " ?", " 's", ...
    tokens: list[str] = field(repr=False)
    attrs: np.ndarray = field(repr=False)  # llama_token_attr bit flags per token
    # what merges a raw fragment into ids: llama.cpp's SentencePiece loop, or HF's byte-level BPE
    merger: SpmMerger | BpeMerger = field(repr=False)
    _vocab: dict[str, int] = field(repr=False, default_factory=dict)
    # (text, id) of the tokens cut out before BPE, longest (in UTF-8 bytes) first
    _user_specials: list[tuple[str, int]] = field(repr=False, default_factory=list)
    _all_specials: list[tuple[str, int]] = field(repr=False, default_factory=list)
    _pieces: dict[tuple[int, bool], bytes] = field(repr=False, default_factory=dict)
    # gpt2: bytes whose byte-level char is not a token (HF would drop them, llama.cpp aborts)
    _missing_bytes: frozenset[int] = field(repr=False, default_factory=frozenset)

    # --- encode ----------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None, *, special: bool = False) -> list[int]:
        """Token ids of `text`, exactly as llama.cpp's ``llama_tokenize``.

        add_bos: None = the file's default, i.e. ``add_special=True`` (bos_id first when
          tokenizer.ggml.add_bos_token, eos_id last when tokenizer.ggml.add_eos_token); True /
          False = force BOS on / off (and no EOS). What llama-cpp-python's
          ``Llama.tokenize(text.encode(), add_bos=True, special=False)`` returns is
          ``encode(text)``.
        special: also turn the text of control tokens (e.g. ``<start_of_turn>``,
          ``<|im_start|>``) into those tokens (llama.cpp's ``parse_special``). User-defined
          tokens are always matched.
        """
        ids: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise TokenizerError("this vocabulary has no BOS token")
            ids.append(self.bos_id)
        for frag in self._partition(text, special):
            if isinstance(frag, int):
                ids.append(frag)
            else:
                ids.extend(self._encode_raw(frag))
        if add_bos is None and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def _partition(self, text: str, special: bool) -> list[str | int]:
        """llama.cpp's tokenizer_st_partition: raw text fragments and special-token ids."""
        frags: list[str | int] = [text] if text else []
        for tok_text, tok_id in self._all_specials if special else self._user_specials:
            if tok_text not in text:  # every fragment is a substring of text
                continue
            out: list[str | int] = []
            for frag in frags:
                if isinstance(frag, str) and tok_text in frag:
                    for k, part in enumerate(frag.split(tok_text)):
                        if k:
                            out.append(tok_id)
                        if part:
                            out.append(part)
                else:
                    out.append(frag)
            frags = out
        return frags

    def _encode_raw(self, fragment: str) -> list[int]:
        if self.add_space_prefix:  # llama.cpp: every raw fragment follows BOS or a special
            fragment = " " + fragment
        if self._missing_bytes and not self._missing_bytes.isdisjoint(fragment.encode()):
            bad = sorted(self._missing_bytes.intersection(fragment.encode()))
            raise TokenizerError(
                f"this vocabulary has no token for the byte(s) {', '.join(f'0x{b:02X}' for b in bad)} "
                f"in {fragment!r} (llama.cpp cannot tokenize it either)"
            )
        return self.merger.encode(fragment)

    # --- decode ----------------------------------------------------------------------------

    def piece_bytes(self, id: int, special: bool = True) -> bytes:
        """llama.cpp's ``llama_token_to_piece(id, lstrip=0, special)``, as raw bytes."""
        key = (int(id), special)
        out = self._pieces.get(key)
        if out is None:
            out = self._pieces[key] = self._piece_bytes(int(id), special)
        return out

    def _piece_bytes(self, id: int, special: bool) -> bytes:
        if not 0 <= id < self.vocab_size:
            raise TokenIdError(f"token id {id} out of range for a vocabulary of {self.vocab_size}")
        attr = int(self.attrs[id])
        text = self.tokens[id]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN):
            return text.encode() if special else b""
        if attr & ATTR_USER_DEFINED:
            return text.encode()
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace("▁", " ").encode()
            return _byte_level_decode(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens render as nothing

    def piece(self, id: int) -> str:
        """The token's text as llama.cpp's token_to_piece shows it: "▁blue" / "Ġblue" ->
        " blue", "<0x0A>" -> "\\n", control tokens as their text ("<bos>"). A piece that is
        not valid UTF-8 on its own (a lone byte of a multi-byte character) shows as U+FFFD."""
        return self.piece_bytes(id, special=True).decode("utf-8", errors="replace")

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of `ids`, as llama.cpp's ``llama_detokenize(remove_special=False,
        unparse_special=special)``: control tokens (BOS, EOS, ...) render as nothing unless
        `special`. For Gemma 3 and SmolLM2 ``decode(encode(text)) == text``. Like llama.cpp,
        a vocabulary with add_space_prefix loses one leading space of the first token (none
        when that token is BOS), and most gpt2 pre-tokenizers (not smollm / qwen2) drop the
        space of " ?", " !", " .", " ," and " 's"-style contractions."""
        parts = [self.piece_bytes(i, special) for i in ids]
        if parts and self.add_space_prefix and parts[0].startswith(b" "):
            parts[0] = parts[0][1:]  # llama.cpp: lstrip=1 on the first token only
        data = b"".join(parts)
        if self.clean_spaces:
            data = _clean_spaces(data)
        return data.decode("utf-8", errors="replace")

    def token_id(self, text: str) -> int | None:
        """Id of the token whose text is exactly `text`, or None."""
        return self._vocab.get(text)


@dataclass(frozen=True)
class BpeMerger:
    """HuggingFace's byte-level BPE (its pre-tokenizer splits and merges by rank) as a merger: the
    ids of one raw fragment, with no special-token handling of its own."""

    hf: Tokenizer

    def encode(self, fragment: str) -> list[int]:
        return self.hf.encode(fragment, add_special_tokens=False).ids


def _byte_level_decode(text: str) -> bytes:
    """llama.cpp's llama_decode_text: GPT-2 byte-level chars back to bytes."""
    out = bytearray()
    for ch in text:
        b = BYTE_DECODER.get(ch)
        if b is not None:
            out.append(b)
        else:  # llama.cpp's marker for a char outside the byte map
            utf8 = ch.encode()
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode() + b"]"
    return bytes(out)


def _clean_spaces(data: bytes) -> bytes:
    """The three clean-up passes at the end of llama.cpp's llama_detokenize, verbatim."""
    text = bytearray(data)
    # first pass: " ?", " !", " .", " ," lose the space
    n, total = len(text), 1 if text else 0
    for i in range(1, n):
        x = text[i]
        if text[i - 1] == 0x20 and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    # second pass: a lone apostrophe between spaces loses both spaces
    n, total, i = total, 1 if total else 0, 1
    while i < n:
        x = text[i]
        if x == 0x27 and i + 1 < n and text[i - 1] == 0x20 and text[i + 1] == 0x20:
            total -= 1
            i += 1
            text[i] = 0
        text[total] = x
        total += 1
        i += 1
    # third pass: " 's", " 'm", " 're", " 've" lose the space
    n, total = total, 1 if total else 0
    for i in range(1, n):
        x = text[i]
        if text[i - 1] == 0x20 and x == 0x27 and i + 1 < n:
            x1 = text[i + 1]
            if x1 in b"sm" or (i + 2 < n and (x1, text[i + 2]) in ((0x72, 0x65), (0x76, 0x65))):
                total -= 1
        text[total] = x
        total += 1
    return bytes(text[:total])


# --- building ------------------------------------------------------------------------------


def build_tokenizer(metadata: Mapping[str, Any]) -> GgufTokenizer:
    """Tokenizer from a GGUF metadata dict (keys ``tokenizer.ggml.*``).

    Raises UnsupportedArchitectureError for a tokenizer model other than "llama" (SentencePiece)
    and "gpt2" (byte-level BPE), or a gpt2 pre-tokenizer labkit has no regexes for.
    """
    model = metadata.get("tokenizer.ggml.model")
    if model not in ("llama", "gpt2"):
        raise UnsupportedArchitectureError(
            f"tokenizer model {model!r} (tokenizer.ggml.model) is not supported: labkit "
            "tokenizes 'llama' (SentencePiece, e.g. Gemma 3) and 'gpt2' (byte-level BPE, "
            "e.g. SmolLM2, Qwen2)"
        )
    if "tokenizer.ggml.tokens" not in metadata:
        raise UnsupportedArchitectureError("the GGUF file has no tokenizer.ggml.tokens")

    was_enabled = gc.isenabled()
    gc.disable()  # building ~10^6 small objects: the cyclic GC only slows it down
    try:
        return _build(metadata, model)
    finally:
        if was_enabled:
            gc.enable()


def _token_table(metadata: Mapping[str, Any]) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """(tokens, attributes, vocab) as llama.cpp reads them: empty tokens renamed, types → attrs."""
    key = "tokenizer.ggml."
    tokens = list(metadata[key + "tokens"])
    if "" in tokens:  # llama.cpp renames empty tokens
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    types = metadata.get(key + "token_type")
    types = np.asarray(types, dtype=np.int64) if types is not None else np.full(n, TYPE_NORMAL, dtype=np.int64)
    attrs = np.zeros(n, dtype=np.int64)  # unknown type values stay ATTR_UNDEFINED
    for t, a in TYPE_TO_ATTR.items():
        attrs[types[:n] == t] = a
    return tokens, attrs, {t: i for i, t in enumerate(tokens)}


def _settings(metadata: Mapping[str, Any], model: str, n: int) -> dict[str, Any]:
    """Pre-tokenizer, special ids and add-flags: the model's defaults, then the file's overrides."""
    key = "tokenizer.ggml."
    if model == "llama":
        pre, pre_type, bos, eos, unk = "", None, 1, 2, 0
        add_bos, add_space_prefix, clean_spaces = True, True, False
    else:
        pre = str(metadata.get(key + "pre") or "default")
        pre_type = PRE_TYPES.get(pre)
        if pre_type is None:
            raise UnsupportedArchitectureError(
                f"gpt2 pre-tokenizer {pre!r} (tokenizer.ggml.pre) is not supported; known: "
                + ", ".join(sorted(PRE_TYPES))
            )
        bos, eos, unk = 11, 11, None
        add_bos, add_space_prefix, clean_spaces = pre_type.add_bos, False, pre_type.clean_spaces

    def special_id(name: str, default: int | None) -> int | None:
        value = metadata.get(key + name)
        if value is not None and 0 <= int(value) < n:
            return int(value)
        return default if default is not None and 0 <= default < n else None

    return {
        "pre": pre,
        "pre_type": pre_type,
        "bos_id": special_id("bos_token_id", bos),
        "eos_id": special_id("eos_token_id", eos),
        "unk_id": special_id("unknown_token_id", unk),
        "add_bos": bool(metadata.get(key + "add_bos_token", add_bos)),
        "add_eos": bool(metadata.get(key + "add_eos_token", False)),
        "add_space_prefix": bool(metadata.get(key + "add_space_prefix", add_space_prefix)),
        "clean_spaces": clean_spaces,
    }


def _build(metadata: Mapping[str, Any], model: str) -> GgufTokenizer:
    key = "tokenizer.ggml."
    tokens, attrs, vocab = _token_table(metadata)
    n = len(tokens)
    cfg = _settings(metadata, model, n)
    pre_type = cfg.pop("pre_type")
    _fix_attrs(metadata, tokens, vocab, attrs, cfg["eos_id"])
    if model == "llama":
        scores = metadata.get(key + "scores")
        scores = np.asarray(scores, dtype=np.float32)[:n] if scores is not None else np.zeros(n, dtype=np.float32)
        merger = SpmMerger(vocab, scores.tolist())
    else:
        merges = metadata.get(key + "merges")
        merger = _bpe_hf(tokens, vocab, [] if merges is None else merges, pre_type)
    specials = [i for i in np.flatnonzero(attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))]
    specials.sort(key=lambda i: -len(tokens[i].encode()))  # stable: ties keep id order
    missing = frozenset(b for b, ch in BYTE_ENCODER.items() if ch not in vocab) if model == "gpt2" else frozenset()
    return GgufTokenizer(
        model=model,
        vocab_size=n,
        tokens=tokens,
        attrs=attrs,
        merger=merger,
        _vocab=vocab,
        _user_specials=[(tokens[i], int(i)) for i in specials if not attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)],
        _all_specials=[(tokens[i], int(i)) for i in specials],
        _missing_bytes=missing,
        **cfg,
    )


def _fix_attrs(
    metadata: Mapping[str, Any],
    tokens: Sequence[str],
    vocab: Mapping[str, int],
    attrs: np.ndarray,
    eos: int | None,
) -> None:
    """llama.cpp's by-name attribute fix-ups (llama_vocab::impl::load), in its order."""
    n = len(tokens)
    given: dict[str, int | None] = {}
    for role, keys in AUTO_SPECIAL_KEYS.items():
        given[role] = None
        for k in keys:
            v = metadata.get("tokenizer.ggml." + k)
            if v is not None and 0 <= int(v) < n:
                given[role] = int(v)
    for role, names in AUTO_SPECIAL.items():
        if given[role] is not None:
            continue
        # llama.cpp takes the first match in hash-map order; the lowest id is our stand-in
        found = sorted(vocab[name] for name in names if name in vocab)
        if found:
            given[role] = found[0]
            attrs[found[0]] |= ATTR_CONTROL

    eog = {given[r] for r in ("fim_pad", "fim_rep", "fim_sep")} - {None}
    for name in EOG_NAMES:
        i = vocab.get(name)
        if i is not None:
            eog.add(i)
            attrs[i] |= ATTR_CONTROL
    for name in FORCE_USER_DEFINED:
        if name in vocab:
            attrs[vocab[name]] = ATTR_USER_DEFINED
    eog |= {eos, given["eot"], given["eom"]} - {None}

    texts = {tokens[i]: i for i in eog if i is not None}
    if "<|end|>" in texts and (
        ("<|return|>" in texts and "<|call|>" in texts)
        or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
    ):
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        attrs[texts["</s>"]] = ATTR_NORMAL


def _bpe_hf(tokens: list[str], vocab: dict[str, int], merges_raw: Iterable[str], pre_type: PreType) -> BpeMerger:
    merges = []
    for i, m in enumerate(merges_raw):
        m = str(m)
        p = m.find(" ", 1)
        if p < 0:
            raise VocabularyError(f"tokenizer.ggml.merges[{i}] is {m!r}, not two tokens separated by a space")
        a, b = m[:p], m[p + 1 :]
        missing = [t for t in (a, b) if t not in vocab]
        if missing:  # the file contradicts itself
            raise VocabularyError(
                f"tokenizer.ggml.merges[{i}] ({m!r}) names {missing[0]!r}, which is not in the vocabulary"
            )
        if a + b in vocab:  # llama.cpp keeps a rank for a pair whose result is no token; HF refuses it
            merges.append((a, b))
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre_type.ignore_merges)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre_type.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return BpeMerger(tok)
