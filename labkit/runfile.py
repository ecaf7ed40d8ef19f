"""A Run on disk: one .safetensors file, so a run can be shared, reopened and compared later.

The captures are the file's tensors, byte for byte (a debug run's poison NaN payloads
included, so unwritten elements are still counted after a round trip). What produced them
(model, tokens, engine, precision, variants, timings, graph order, partial positions and
heads, unmapped names) is the file's string metadata, as JSON.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from labkit.captures import Run
from labkit.errors import LabkitError, RunFileError

FORMAT = "labkit-run/1"
_JSON_FIELDS = ("tokens", "stages", "variants", "timings", "unwritten", "positions", "heads", "unmapped")


def save_run(run: Run, path: str | Path) -> None:
    """Write `run` to `path` (a new file; an existing one is replaced)."""
    from safetensors.numpy import save_file

    meta = {"format": FORMAT, "model": run.model, "engine": run.engine, "precision": run.precision}
    meta["n_past"] = str(run.n_past)
    for name in _JSON_FIELDS:
        meta[name] = json.dumps(getattr(run, name))
    tensors = {name: np.ascontiguousarray(a) for name, a in run.captures.items()}
    save_file(tensors, str(path), metadata=meta)


def load_run(path: str | Path, model: Any = None) -> Run:
    """The Run saved at `path`. `model` (an open Lab or a model name) gives token pieces for the
    widgets; without it the saved model is opened by name the first time a piece is needed."""
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
    fields = {name: json.loads(meta.get(name, "{}")) for name in _JSON_FIELDS}  # older files have no "heads"
    fields["positions"] = {k: tuple(v) for k, v in fields["positions"].items()}
    fields["heads"] = {k: tuple(v) for k, v in fields["heads"].items()}
    return Run(
        model=meta["model"],
        engine=meta["engine"],
        captures=captures,
        precision=meta["precision"],
        n_past=int(meta["n_past"]),
        piece=_piece(model if model is not None else meta["model"]),
        **fields,
    )


def _piece(model: Any):
    """A token-id → text function that opens the model's tokenizer on first use (or shows the id
    when the model cannot be opened here)."""
    cache: dict[str, Any] = {}

    def piece(token_id: int) -> str:
        if "fn" not in cache:
            try:
                from labkit.lab import Lab, open

                lab = model if isinstance(model, Lab) else open(model)
                cache["fn"] = lab.piece
            except LabkitError:  # a run from a model this machine lacks still opens
                cache["fn"] = lambda i: f"<{i}>"
        return cache["fn"](token_id)

    return piece
