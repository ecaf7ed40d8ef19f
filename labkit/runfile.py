"""A Run on disk: one .safetensors file, so a run can be shared, reopened and compared later.

The captures are the file's tensors, byte for byte (a debug run's poison NaN payloads
included, so unwritten elements are still counted after a round trip). What produced them
(model, tokens, engine, precision, variants, timings, graph order, partial positions and
heads, unmapped names) is the file's string metadata, as JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from labkit.errors import RunFileError
from labkit.model.stage_kinds import is_attention_map

FORMAT = "labkit-run/1"
_JSON_FIELDS = ("tokens", "stages", "variants", "timings", "unwritten", "positions", "heads", "unmapped")


def save_run(run: Any, path: str | Path) -> None:
    """Write `run` (a labkit.captures.Run) to `path` (a new file; an existing one is replaced)."""
    from safetensors.numpy import save_file

    meta = {"format": FORMAT, "model": run.model, "engine": run.engine, "precision": run.precision}
    meta["n_past"], meta["path"] = str(run.n_past), run.path
    for name in _JSON_FIELDS:
        meta[name] = json.dumps(getattr(run, name))
    tensors = {name: np.ascontiguousarray(a) for name, a in run.captures.items()}
    save_file(tensors, str(path), metadata=meta)


def read_run(path: str | Path) -> dict[str, Any]:
    """The fields of the Run saved at `path`, every one checked (labkit.captures.load_run builds it)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise RunFileError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            if meta.get("format") != FORMAT:
                raise RunFileError(f"{path}: not a run saved by labkit (no {FORMAT!r} metadata)")
            captures = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (safe_open has no iter)
    except (SafetensorError, OSError, ValueError) as e:
        raise RunFileError(f"{path}: cannot read a saved run: {e}") from None
    fields = _checked_fields(path, meta, captures)
    return dict(model=meta["model"], engine=meta["engine"], captures=captures, precision=meta["precision"],
                n_past=int(meta["n_past"]), path=meta.get("path", "one-shot"), **fields)  # fmt: skip


# each JSON field's container and item type (older files lack some: "heads", "unmapped")
_FIELD_TYPES = {
    "tokens": (list, int),
    "stages": (list, str),
    "variants": (dict, str),
    "timings": (dict, object),  # seconds, a stage's ms, and words (recomputed_from)
    "unwritten": (dict, int),
    "positions": (dict, list),
    "heads": (dict, list),
    "unmapped": (dict, str),
}


def _checked_fields(path: Path, meta: dict[str, str], captures: dict[str, np.ndarray]) -> dict[str, Any]:
    """The metadata's fields, each of the type a Run holds, and the captures' shapes consistent with
    them (a stage's positions and heads say how many rows it has): a RunFileError names the first
    that is not."""
    missing = [k for k in ("model", "engine", "precision", "n_past") if k not in meta]
    if missing or not re.fullmatch(r"[0-9]+", meta["n_past"]):
        raise RunFileError(
            f"{path}: a saved run needs model, engine, precision and n_past (an integer): {missing or meta['n_past']!r}"
        )
    fields = {}
    for name, (container, item) in _FIELD_TYPES.items():
        try:
            value = json.loads(meta.get(name, "[]" if container is list else "{}"))
        except ValueError as e:
            raise RunFileError(f"{path}: the run's {name!r} is not JSON: {e}") from None
        items = value.values() if isinstance(value, dict) else value
        if not isinstance(value, container) or not all(_is(v, item) for v in items):
            raise RunFileError(f"{path}: the run's {name!r} is not a {container.__name__} of {item.__name__}")
        fields[name] = value
    for name in ("positions", "heads"):
        fields[name] = {k: tuple(v) for k, v in fields[name].items()}
    _check_rows(path, fields, captures)
    return fields


def _is(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not (kind is int and isinstance(value, bool))  # JSON's true is no count


def _check_rows(path: Path, fields: dict[str, Any], captures: dict[str, np.ndarray]) -> None:
    n = len(fields["tokens"])
    for what in ("positions", "heads"):
        for stage, rows in fields[what].items():
            a = captures.get(stage)
            if a is None:
                raise RunFileError(f"{path}: the run lists {what} for {stage!r}, which it did not capture")
            axis = 1 if what == "positions" and a.ndim == 3 and is_attention_map(stage) else 0  # [heads, q, k]
            if a.ndim <= axis or a.shape[axis] != len(rows):
                raise RunFileError(
                    f"{path}: {stage!r} has shape {list(a.shape)}, but the run lists {len(rows)} {what} for it"
                )
            if what == "positions" and not all(isinstance(p, int) and 0 <= p < n for p in rows):
                raise RunFileError(
                    f"{path}: {stage!r}'s positions {list(rows)[:8]} are not within the run's {n} tokens"
                )
    unknown = [k for k in captures if fields["stages"] and k not in fields["stages"]]
    if unknown:
        raise RunFileError(f"{path}: captures {unknown[:5]} are not among the run's stages")
