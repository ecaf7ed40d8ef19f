"""Sweep inputs and outputs on disk: prompt files, and results as Parquet with the sweep's
configuration in the file's metadata (so a results file says what produced it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labkit.errors import InputFileError

META_KEY = b"labkit.sweep"


def read_prompts(path: str | Path) -> list:
    """Prompts from a .txt (one per line, blank lines skipped) or a .jsonl file (each line a
    string, or {"prompt": text} or {"tokens": [ids]})."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise InputFileError(f"{path}: cannot read prompts ({e.strerror or e})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if path.suffix == ".jsonl":
        out = []
        for i, ln in enumerate(lines, 1):
            try:
                item = json.loads(ln)
            except json.JSONDecodeError as e:
                raise InputFileError(f"{path}:{i}: not JSON ({e.msg})") from None
            if isinstance(item, dict):
                item = item.get("prompt", item.get("tokens"))
            if not isinstance(item, str | list) or not item:
                raise InputFileError(f'{path}:{i}: want a string, {{"prompt": text}} or {{"tokens": [ids]}}')
            out.append(item)
        lines = out
    if not lines:
        raise InputFileError(f"{path}: no prompts")
    return lines


def save_results(df, path: str | Path, config: dict[str, Any]) -> None:
    """The results table as Parquet, `config` as JSON in the schema metadata."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[META_KEY] = json.dumps(config, default=str).encode()
    pq.write_table(table.replace_schema_metadata(meta), str(path))


def load_results(path: str | Path):
    """(DataFrame, config) of a saved sweep; the config is also in df.attrs["labkit.sweep"]."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(str(path))
    except (OSError, ValueError) as e:
        raise InputFileError(f"{path}: not a readable Parquet file ({e})") from None
    meta = table.schema.metadata or {}
    if META_KEY not in meta:
        raise InputFileError(f"{path}: not a labkit sweep (no {META_KEY.decode()} metadata)")
    config = json.loads(meta[META_KEY])
    df = table.to_pandas()
    df.attrs["labkit.sweep"] = config
    return df, config
