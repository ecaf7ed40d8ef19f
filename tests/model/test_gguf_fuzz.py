"""Fuzzing the model reader: mutants of valid files, where only labkit.errors may escape.

Every case is a file on disk that `labkit.open` reads the way a user's file is read. Most mutants
are structure-level (tests/model/gguf_fuzz_worker.py): a count, length, value type, tensor type,
dimension or offset set to a telling value, or a key or tensor dropped, doubled, retyped or
reshaped; the rest flip, overwrite or cut bytes. The sources are two tiny models, llama and bitnet
(a mutant that opens with another header runs a reference pass), and the headers of the two real
models (their data a sparse tail).
The worker runs in a process of its own under an address-space cap, so a bare MemoryError or a
runaway allocation shows as a failure, not as a machine out of memory. A fresh seed per run, in
every failure message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from labkit.model.registry import resolve_model

SEED = int(np.random.SeedSequence().entropy % 2**32)
CAP = 3 << 30  # the worker's address space: a count trusted before it is checked exceeds it
# (source kind, model, mutants): about 45 s on a 2-core host, most of it the real headers
SOURCES = [("tiny", "llama", 3600), ("tiny", "tiny-bitnet", 1900), ("header", "smollm2-135m", 260),
           ("header", "gemma3-270m", 140)]  # fmt: skip


def test_fuzz_model_reader(tiny_model):
    specs = []
    for kind, name, n in SOURCES:
        path = tiny_model("llama", "Q8_0") if name == "llama" else resolve_model(name)[1]
        specs.append(f"{kind}:{path}:{n}:600")
    worker = Path(__file__).with_name("gguf_fuzz_worker.py")
    done = subprocess.run([sys.executable, str(worker), str(SEED), str(CAP), *specs], capture_output=True,
                          text=True, timeout=900, cwd=worker.parent)  # fmt: skip
    assert done.returncode == 0, f"seed {SEED}: {done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    outcomes = report["outcomes"]
    escaped = [k for k in outcomes if k.startswith("escaped")]
    assert not escaped, f"seed {SEED}: " + "\n".join(escaped[:10])
    assert outcomes["structure-level"] >= 5000, outcomes
    assert outcomes.get("ran", 0) >= 20, f"too few mutants ran a pass: {outcomes}"
    typed = sum(v for k, v in outcomes.items() if k.endswith("Error"))
    assert typed >= 2500, outcomes  # most mutants are refused, by name
    grew = [k for k in outcomes if k.startswith("grew")]  # the cases that raised the peak most
    assert report["maxrss_kb"] < 2 << 20, f"seed {SEED}: peak RSS {report['maxrss_kb'] / 2**20:.2f} GB; {grew}"
