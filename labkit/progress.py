"""Progress bars on long work: a notebook widget in Jupyter, a bar on stderr in a terminal.

One switch for the whole library: the CLI turns bars off for `--json` (its stdout and stderr
stay machine-readable), and `LABKIT_PROGRESS=0` turns them off anywhere. Short work (a total
below `min_total`) shows nothing, so a 1-token generate does not flash a bar.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

_enabled = os.environ.get("LABKIT_PROGRESS", "1") not in ("0", "false", "no")


def enabled() -> bool:
    """Whether bars are shown now."""
    return _enabled


def set_enabled(on: bool) -> None:
    """Show (True) or hide (False) every bar from now on."""
    global _enabled
    _enabled = bool(on)


@contextmanager
def quiet() -> Iterator[None]:
    """No bars inside the block (the CLI's --json, a test that reads stderr)."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def bar(total: int, desc: str, unit: str = "it", min_total: int = 2):
    """A tqdm bar (tqdm.auto: a widget in Jupyter, text on stderr elsewhere), or a silent stand-in
    with the same `update`/`set_postfix_str`/`close` when bars are off or the work is short."""
    if not _enabled or total < min_total:
        return _Silent()
    from tqdm.auto import tqdm
    from tqdm.notebook import tqdm_notebook

    # In Jupyter a bar is a widget, and it stays, ending full: a closed one is shown by JupyterLab as its
    # first text ("0%| | 0/236") after the work is done. A terminal's bar clears its line.
    leave = issubclass(tqdm, tqdm_notebook)
    return tqdm(total=total, desc=desc, unit=unit, leave=leave, dynamic_ncols=True)


def track(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it", min_total: int = 2) -> Iterator[T]:
    """`for x in track(items, "prompts"):` with a bar over them."""
    n = total if total is not None else (len(items) if hasattr(items, "__len__") else 0)  # type: ignore[arg-type]
    with _closing(bar(n, desc, unit, min_total)) as b:
        for x in items:
            yield x
            b.update(1)


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass


@contextmanager
def _closing(b):
    try:
        yield b
    finally:
        b.close()
