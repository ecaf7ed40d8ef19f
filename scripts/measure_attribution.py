"""How far clean runs' local errors stay under their bands: the evidence for GUILT_FACTOR.

For both models and every golden prompt, clean runs of each precision are attributed: labkit's
GPU pass (float32), llama.cpp's own tensors (int8-activations) and transformers' dumps in f32,
f16 and bf16 (the `hf` extra). For each precision it prints the largest local / max(band, floor)
over every stage, and the stage where it is reached; GUILT_FACTOR (k) should stay about 3x above it.

    .venv/bin/python scripts/measure_attribution.py [--models smollm2-135m gemma3-270m] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

import labkit
from labkit.attribution.attribute import BAND_FLOOR, GUILT_FACTOR


def golden_prompts(model: str) -> list[list[int]]:
    data = json.loads(resources.files("labkit.data.golden").joinpath(f"{model}.json").read_text())
    return [p["tokens"] for p in data["prompts"]]


def hf_run(lab, ids: list[int], dtype: str, tmp: Path):
    out = tmp / f"{lab.name}-{dtype}-{len(ids)}-{ids[0]}.pt"
    cmd = [sys.executable, "-m", "labkit.dumps.hf_hooks", lab.path, "--tokens", ",".join(map(str, ids))]
    subprocess.run(cmd + ["--out", str(out), "--dtype", dtype], check=True, capture_output=True, timeout=900)
    return labkit.load_dumps(out, lab, names="hf", tokens=ids)


def worst(att) -> tuple[float, str]:
    """The largest local / max(band, floor), and its stage."""
    p = att.precision
    ratios = [(r.local / max(r.band, BAND_FLOOR[p]), r.name) for r in att.rows]
    return max(ratios)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in a.models:
            lab = labkit.open(model)
            for ids in golden_prompts(model):
                ref = lab.reference(ids)
                runs = {"gpu": lab.run(ids), "llamacpp": lab.oracle(ids)}
                runs |= {f"hf-{d}": hf_run(lab, ids, d, Path(tmp)) for d in ("float32", "float16", "bfloat16")}
                for engine, run in runs.items():
                    att = labkit.attribute(run, lab, reference=ref)
                    ratio, stage = worst(att)
                    rows.append(dict(model=model, tokens=len(ids), engine=engine, precision=run.precision,
                                     worst_local_over_band=ratio, at=stage, k=GUILT_FACTOR[run.precision],
                                     guilty=att.guilty))  # fmt: skip
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        head = f"{r['model']:14} {r['tokens']:3} tokens {r['engine']:11} {r['precision']:16}"
        print(f"{head} worst local/band {r['worst_local_over_band']:8.2f} (k {r['k']:g}) at {r['at']}  {r['guilty']}")


if __name__ == "__main__":
    main()
