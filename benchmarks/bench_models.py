"""Prefill per prompt length, decode and re-run for both real models: GPU path, numpy float64
reference and (with the `oracle` extra) llama.cpp, measured in one process per model by
`labkit bench`. Writes benchmarks/results/<model>.json and <model>-prefill.png (time against
prompt length, one line per engine and capture).

    .venv/bin/python benchmarks/bench_models.py [--lengths 8,128,512,2048] [--models gemma3-270m]

Run nothing else meanwhile: on 2 cores a second job halves every figure.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from labkit.bench import BenchReport

OUT = Path(__file__).resolve().parent / "results"


def plot(report: BenchReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, eng in report.engines.items():
        for attr, style, label in (("logits_all_s", "-o", "logits at every position"),
                                   ("all_stages_s", "--s", "every stage captured"),
                                   ("last_only_s", ":^", "output_norm only")):  # fmt: skip
            pts = [(f.length, getattr(f, attr)) for f in eng.lengths if getattr(f, attr)]
            if pts:
                ax.plot(*zip(*pts), style, label=f"{name}: {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("seconds (median)")
    ax.set_title(f"{report.model} prefill on {report.adapter}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    ap.add_argument("--lengths", default="8,128,512")
    ap.add_argument("--repeats", default="3")
    args = ap.parse_args()
    OUT.mkdir(exist_ok=True)
    for model in args.models:  # one process per model: peak RSS is per process
        cmd = [sys.executable, "-m", "labkit.cli", "bench", model, "--lengths", args.lengths, "--repeats", args.repeats]
        out = subprocess.run(cmd + ["--json"], capture_output=True, text=True)
        if out.returncode:
            sys.exit(f"{model}: labkit bench failed ({out.returncode}):\n{out.stderr[-3000:]}")
        report = BenchReport.from_dict(json.loads(out.stdout))
        print(report.table(), end="\n\n")
        (OUT / f"{model}.json").write_text(json.dumps(report.to_dict(), indent=1))
        plot(report, OUT / f"{model}-prefill.png")


if __name__ == "__main__":
    main()
