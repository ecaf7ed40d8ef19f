"""What attribution found, per stage: its own error, what it inherited, and its noise band."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class StageAttribution:
    """One captured stage (or the segment that leads to it from captured stages).

    local: NMSE of the engine's output against the stage recomputed exactly from the engine's
    own inputs. inherited: NMSE of that recomputation against the reference; what the stage
    would show if it were exact. total: the engine's output against the reference (compare's).
    band: NMSE the engine's precision alone gives this stage on these inputs (emulated)."""

    stage: str
    segment: tuple[str, ...]
    local: float
    inherited: float
    total: float
    band: float
    limit: float  # k × max(band, floor): local above it is guilty
    guilty: bool
    reason: str = ""  # why guilty when it is not the NMSE (NaN, inf mismatch, unwritten)
    first_bad_position: int | None = None  # the first position whose own local NMSE is over the limit
    total_failed: bool = False  # the total error fails compare's fixed table

    @property
    def name(self) -> str:
        return self.stage if len(self.segment) == 1 else f"{self.segment[0]} … {self.stage}"

    @property
    def ratio(self) -> float:
        """local / limit: above 1 is guilty."""
        return self.local / self.limit if self.limit > 0 else float("inf") * (self.local > 0)


@dataclass
class Attribution:
    """Per captured stage in graph order. `guilty` are the stages whose own error leaves the band."""

    engine: str
    precision: str
    k: float
    floor: float
    rows: list[StageAttribution]
    model: str = ""
    n_past: int = 0
    variants: dict[str, str] = field(default_factory=dict)
    _repro: object = field(default=None, repr=False)  # (run, lab, context, segments) for repro()

    @property
    def guilty(self) -> list[str]:
        return [r.stage for r in self.rows if r.guilty]

    @property
    def first_guilty(self) -> str | None:
        return next((r.stage for r in self.rows if r.guilty), None)

    @property
    def first_divergence(self) -> str | None:
        """The first stage whose total error fails compare's table (where plain compare stops)."""
        return next((r.stage for r in self.rows if r.total_failed), None)

    def row(self, stage: str) -> StageAttribution:
        for r in self.rows:
            if r.stage == stage or r.name == stage:
                return r
        raise KeyError(f"no attributed stage {stage!r}")

    def headline(self) -> str:
        first, div = self.first_guilty, self.first_divergence
        if first is None:
            tail = f"; the total error first fails at {div}, all of it inherited or within bands" if div else ""
            return f"no guilty stage: every stage's own error is within {self.k:g}× its band{tail}"
        r = self.row(first)
        where = f" at position {r.first_bad_position}" if r.first_bad_position is not None else ""
        why = r.reason or f"local nmse {r.local:.2e} > {r.limit:.1e} ({self.k:g}× band {r.band:.1e})"
        more = f" ({len(self.guilty)} guilty stages)" if len(self.guilty) > 1 else ""
        inherited = ""
        if div is not None and div != first and self._index(div) < self._index(first):
            inherited = f"; the total error fails first at {div}, inherited there"
        return f"first guilty stage: {r.name}{where}: {why}{more}{inherited}"

    def _index(self, stage: str) -> int:
        return next(i for i, r in enumerate(self.rows) if r.stage == stage)

    def table(self, only_guilty: bool = False) -> str:
        head = f"{'stage':34} {'local':>9} {'band':>9} {'inherited':>9} {'total':>9}  verdict"
        lines = [self.headline(), f"{self.engine} ({self.precision}); guilty above {self.k:g}× band", head]
        for r in self.rows:
            if only_guilty and not r.guilty:
                continue
            verdict = ("GUILTY " + (r.reason or f"{r.ratio:.0f}× limit")) if r.guilty else "ok"
            lines.append(f"{r.name:34} {r.local:9.2e} {r.band:9.2e} {r.inherited:9.2e} {r.total:9.2e}  {verdict}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    def _repr_html_(self) -> str:
        cells = "".join(
            f"<tr style='color:{'#c00' if r.guilty else 'inherit'}'><td>{r.name}</td><td>{r.local:.2e}</td>"
            f"<td>{r.band:.2e}</td><td>{r.inherited:.2e}</td><td>{r.total:.2e}</td>"
            f"<td>{'GUILTY' if r.guilty else 'ok'}</td></tr>"
            for r in self.rows
        )
        return (
            f"<b>{self.engine}</b> ({self.precision}): {self.headline()}<table><tr><th>stage</th><th>local</th>"
            f"<th>band</th><th>inherited</th><th>total</th><th></th></tr>{cells}</table>"
        )

    def records(self) -> list[dict]:
        """One dict per stage: what `--json` writes, one per line."""
        return [
            {**asdict(r), "name": r.name, "segment": list(r.segment), "verdict": "guilty" if r.guilty else "ok",
             "position": r.first_bad_position}
            for r in self.rows
        ]  # fmt: skip

    def to_jsonl(self) -> str:
        return "\n".join(json.dumps(rec, allow_nan=True) for rec in self.records())

    def to_dict(self) -> dict:
        return {"engine": self.engine, "precision": self.precision, "k": self.k, "floor": self.floor,
                "first_guilty": self.first_guilty, "guilty": self.guilty, "first_divergence": self.first_divergence,
                "headline": self.headline(), "stages": self.records()}  # fmt: skip

    def repro(self, stage: str, out) -> object:
        """Write a standalone reproducer of one stage (labkit.attribution.repro)."""
        from labkit.attribution.repro import write_repro

        return write_repro(self, stage, out)
