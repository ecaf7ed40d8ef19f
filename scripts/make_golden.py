"""Write llama.cpp golden files: labkit/data/golden/<model>.json (package data).

Needs the `oracle` extra (llama-cpp-python). For each prompt: llama.cpp's token
ids, the top-10 next-token ids and logits at the last position, and a greedy
8-token continuation. Tests read these files; they never need llama.cpp.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from labkit.progress import track

PROMPTS = [
    "The color of the sky is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "In 1969, 3 astronauts flew 384,400 km to the",
    "Paris is the capital of France, and Berlin is the capital of",
    "Q: What is 12 + 30?\nA:",
    "Once upon a time, in a small village,",
]
N_TOP, N_GREEDY = 10, 8


def golden_for(model: str, path: Path, prompts: list[str]) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=512, n_threads=2, n_batch=512, logits_all=True, verbose=False)
    out = {
        "model": model,
        "llama_cpp_python": llama_cpp.__version__,
        "file": path.name,
        "prompts": [],
    }
    for text in track(prompts, f"{model}: prompts", unit="prompt"):
        ids = llm.tokenize(text.encode(), add_bos=True, special=False)
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        prefill = time.perf_counter() - t0
        logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
        top = np.argsort(-logits, kind="stable")[:N_TOP]
        greedy = []
        nxt = int(top[0])
        t1 = time.perf_counter()
        for _ in range(N_GREEDY):
            greedy.append(nxt)
            if nxt == llm.token_eos() or len(greedy) == N_GREEDY:
                break
            llm.eval([nxt])
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        decode = time.perf_counter() - t1
        out["prompts"].append(
            {
                "text": text,
                "tokens": [int(i) for i in ids],
                "top": [
                    {
                        "id": int(i),
                        "logit": float(logits[i]),
                        "piece": llm.detokenize([int(i)]).decode("utf-8", "replace"),
                    }
                    for i in top
                ],
                "greedy": greedy,
                "greedy_text": llm.detokenize(greedy).decode("utf-8", "replace"),
                "prefill_s": prefill,
                "decode_tok_s": (len(greedy) - 1) / decode if decode > 0 else None,
            }
        )
    return out


def main() -> None:
    from labkit.model.registry import MODELS

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("models", nargs="*", default=list(MODELS))
    ap.add_argument("--out", default="labkit/data/golden")
    args = ap.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    for name in args.models:
        data = golden_for(name, MODELS[name].locate(), PROMPTS)
        dest = Path(args.out) / f"{name}.json"
        dest.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"wrote {dest}: {[p['top'][0]['piece'] for p in data['prompts']]}")


if __name__ == "__main__":
    main()
