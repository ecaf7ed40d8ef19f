"""`labkit reduce`: the shortest prompt that still diverges at the same stage kind, by delta
debugging (Zeller's ddmin) over the prompt's tokens, like Polygraphy's `debug reduce` shrinks a
failing model. The candidates of each round run as parallel Dask tasks.

The first token stays when it is the model's BOS (a prompt without it is another kind of input).
A candidate "still fails" when its first divergence is of the same stage kind as the whole
prompt's (blk.3.attn_probs and blk.7.attn_probs count as the same failure).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from labkit.errors import InvalidArgumentError
from labkit.ops.registry import check_selection
from labkit.sweeps.cluster import dask_client
from labkit.sweeps.task import AGAINST, run_task


@dataclass
class Reduction:
    """A reduced prompt: its tokens and text, the divergence it keeps, and what it took."""

    model: str
    tokens: list[int]
    text: str
    first_divergence: str
    kind: str
    original_tokens: list[int]
    rounds: int = 0
    tested: int = 0
    history: list[int] = field(default_factory=list)  # candidate length after each round (one per round)

    def summary(self) -> str:
        n = len(self.tokens)
        return (
            f"{self.model}: {len(self.original_tokens)} -> {n} token{'s' * (n != 1)} in {self.rounds} rounds "
            f"({self.tested} passes); still diverges first at {self.first_divergence} ({self.kind})\n"
            f"tokens: {self.tokens}\ntext: {self.text!r}"
        )


def chunks(seq: list[int], n: int) -> list[list[int]]:
    """`seq` in n contiguous parts, as even as can be."""
    k, r = divmod(len(seq), n)
    out, start = [], 0
    for i in range(n):
        end = start + k + (1 if i < r else 0)
        out.append(seq[start:end])
        start = end
    return [c for c in out if c]


def ddmin_round(body: list[int], n: int) -> list[list[int]]:
    """The candidates of one ddmin round at granularity n: each part, then each complement."""
    parts = chunks(body, n)
    complements = [[t for j, p in enumerate(parts) if j != i for t in p] for i in range(len(parts))]
    return parts + (complements if len(parts) > 2 else [])


def reduce_prompt(
    model: str,
    prompt,
    variants: dict[str, str] | None = None,
    against: str = "reference",
    client: Any = None,
    scheduler: str | None = None,
    n_workers: int | None = None,
) -> Reduction:
    """A shortest token sequence (1-minimal: no single part can go) that diverges at the same stage kind."""
    from labkit.lab import open as open_lab

    variants = check_selection(dict(variants or {}))
    if against not in AGAINST:
        raise InvalidArgumentError(f"against must be one of {', '.join(AGAINST)}, not {against!r}")
    lab = open_lab(model)
    ids = lab.prompt_ids(prompt)
    keep = ids[:1] if ids and ids[0] == lab.config.bos_id else []
    body = ids[len(keep) :]
    with dask_client(client, scheduler, n_workers) as c:

        def verdicts(cands: list[list[int]]) -> list[dict]:
            futs = c.map(run_task, [model] * len(cands), [keep + x for x in cands], [variants] * len(cands),
                         [against] * len(cands), pure=False)  # fmt: skip
            return c.gather(futs)

        first = verdicts([body])[0]
        if first.get("error"):
            raise InvalidArgumentError(f"the whole prompt does not run: {first['error']}")
        if not first["diverged"]:
            raise InvalidArgumentError(f"the whole prompt does not diverge against {against}: nothing to reduce")
        kind = first["first_divergence_kind"]
        red = Reduction(lab.name, ids, lab.detokenize(ids), first["first_divergence"], kind, ids, tested=1)
        n = 2
        while len(body) >= 2:
            cands = ddmin_round(body, n)
            rows = verdicts(cands)
            red.rounds, red.tested = red.rounds + 1, red.tested + len(cands)
            n_parts = len(chunks(body, n))
            hit = next((i for i, r in enumerate(rows) if r.get("first_divergence_kind") == kind), None)
            if hit is not None:  # a part still fails: keep it, split in two; a complement: one part fewer
                body = cands[hit]
                red.first_divergence = rows[hit]["first_divergence"]
                n = 2 if hit < n_parts else max(n - 1, 2)
            red.history.append(len(body))  # every round, the last (which found nothing smaller) included
            if hit is None and n < len(body):
                n = min(2 * n, len(body))
            elif hit is None:
                break
    red.tokens = keep + body
    red.text = lab.detokenize(red.tokens)
    return red
