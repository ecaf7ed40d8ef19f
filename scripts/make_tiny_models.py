"""Write the tiny synthetic models (every architecture × matmul format) into a folder."""

import argparse
from pathlib import Path

from labkit.model.tiny import TinySpec, write_tiny_model

ARCHS = ("gemma3", "llama", "qwen2")
FORMATS = ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q6_K")

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out", nargs="?", default="data/tiny")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for arch in ARCHS:
        for fmt in FORMATS:
            p = write_tiny_model(out / f"tiny-{arch}-{fmt.lower()}.gguf", TinySpec(arch=arch, weight_type=fmt))
            print(p)
