"""Where sweep tasks run: a Dask client given by the caller, a scheduler address, or a
LocalCluster sized to this machine. labkit ships no scheduler of its own.

Workers are processes with one thread each: a WebGPU device belongs to its process, and two
threads driving one lavapipe device would only queue behind each other.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

from labkit.errors import InvalidArgumentError


def local_workers() -> int:
    """Worker processes for this machine: one per core, at most 4 (each holds its own labs)."""
    return max(1, min(4, os.cpu_count() or 1))


@contextmanager
def dask_client(client: Any = None, scheduler: str | None = None, n_workers: int | None = None):
    """Yield a distributed.Client: the one given, one connected to `scheduler`, or a fresh
    LocalCluster's (closed on exit)."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InvalidArgumentError("sweeps need Dask: pip install 'dask[distributed]'") from None
    if client is not None:
        yield client
        return
    if scheduler is not None:
        try:
            c = Client(scheduler, timeout="20s")
        except OSError as e:
            raise InvalidArgumentError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None
        try:
            yield c
        finally:
            c.close()
        return
    n = n_workers or local_workers()
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0")
    c = Client(cluster)
    try:
        yield c
    finally:
        c.close()
        cluster.close()
