"""Load, prefill and decode for both real models: GPU path, numpy float64 reference and (when the
`oracle` extra is installed) llama.cpp, measured in one run. Writes benchmarks/results/<model>.json.

    .venv/bin/python benchmarks/bench_models.py [--new-tokens 8]

Run nothing else meanwhile: on 2 cores a second job halves every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from labkit.bench import BenchResult

OUT = Path(__file__).resolve().parent / "results"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    ap.add_argument("--prompt", default="The color of the sky is")
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    for model in args.models:  # one process per model: peak RSS is per process
        cmd = [sys.executable, "-m", "labkit.cli", "bench", model, "--prompt", args.prompt, "--json"]
        out = subprocess.run(cmd + ["--new-tokens", str(args.new_tokens)], capture_output=True, text=True, check=True)
        res = BenchResult.from_dict(json.loads(out.stdout))
        print(res.table(), end="\n\n")
        (OUT / f"{model}.json").write_text(json.dumps(res.to_dict(), indent=1))


if __name__ == "__main__":
    main()
