"""One verdict from computed bands: `compare`, where each stage over the fixed table is asked its own error first.

`compare` judges a stage's total error against a table per precision. A clean run's total can outgrow the table
where a stage amplifies what its inputs carry: attention probabilities from scores of ±300 on an 8B shape, or a
quantized cache whose rounding flips one step where two engines' keys differ in the last bits. `attribute`
recomputes each stage from the run's own inputs and bounds its own error by what the run's precision gives there.
`verdict` asks it of every stage: one over the table whose own error is inside its band passes, its row saying
its error was inherited; one whose own error leaves its band fails, over the table or under it, so a fault too
small for the table is found at its stage rather than hidden in what it inflates later. A clean run has no such
stage (attribute's measured margins), so it passes on every host.
"""

from __future__ import annotations

from typing import Any

from labkit.attribution.attribute import attribute
from labkit.captures import Run
from labkit.compare import Comparison, compare
from labkit.errors import InvalidArgumentError


def verdict(run: Run, lab: Any, reference: Run | None = None, k: float | None = None) -> Comparison:
    """`compare(run, reference)` with computed bands: a run from any engine (the GPU, llama.cpp, dumps) of `lab`'s
    model; the float64 reference of the same tokens is computed when not given. It costs a float64 recomputation
    of every captured stage (about a reference pass)."""
    if run.n_past:
        raise InvalidArgumentError(f"verdict judges a whole pass: this {run.engine} run starts after {run.n_past} "
                                   "cached positions (attribute it with past=)")  # fmt: skip
    ref = reference if reference is not None else lab.reference(run.tokens)
    if lab.config.ssm is not None:  # attribute does not recompute recurrent layers yet: the table alone
        return compare(run, ref)
    att = attribute(run, lab, reference=ref, k=k)
    own = {r.stage: (r.local, r.limit) for r in att.rows if not r.reason}
    return compare(run, ref, own=own)
