"""Operand textures recycled between stages of one pass.

A kernel that reads an operand as a texture (labkit/gpu/texture.py) gets it filled by a dispatch
just before its own, and nothing else reads it: once the stage is recorded, the texture can
serve the next stage that asks for the same size. A 512-token Gemma pass fills about 150 such
textures (a matmul's X, attention's q, K and V), 0.5 GB of fresh memory without a pool, a few
textures with one. While a pool is active (`with pool.stage():` around one stage's planning),
`labkit.gpu.dispatch.texture_view` asks it first; a plan cache, when one is active, keeps its
own textures instead (a decode step reuses its last step's).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

_ACTIVE: ContextVar[TexturePool | None] = ContextVar("labkit_texture_pool", default=None)


def active_pool() -> TexturePool | None:
    """The texture pool of the stage being planned, if any."""
    return _ACTIVE.get()


class TexturePool:
    def __init__(self, device: Any):
        self.device = device
        self.free: dict[tuple, list[Any]] = {}
        self.taken: list[tuple[tuple, Any]] = []
        self.created = 0

    def stage(self) -> _Stage:
        """Plan one stage with this pool (`with pool.stage():`); on exit its textures are free for
        the next stages."""
        return _Stage(self)

    def release(self) -> None:
        """The stage planned: the textures it took serve the next stages."""
        for key, view in self.taken:
            self.free.setdefault(key, []).append(view)
        self.taken = []

    def view(self, size: tuple[int, int], fmt: str, usage: int, label: str = "") -> Any:
        """A view of a texture a finished stage left, or of a new one."""
        key = (*size, fmt, int(usage))
        pool = self.free.get(key)
        if pool:
            view = pool.pop()
        else:
            tex = self.device.create_texture(size=(*size, 1), format=fmt, usage=usage, label=label)
            view = tex.create_view()
            self.created += 1
        self.taken.append((key, view))
        return view


class _Stage:
    """TexturePool.stage's context: a class, not a generator (entered per planned stage)."""

    __slots__ = ("pool", "token")

    def __init__(self, pool: TexturePool):
        self.pool = pool

    def __enter__(self) -> TexturePool:
        self.token = _ACTIVE.set(self.pool)
        return self.pool

    def __exit__(self, *exc) -> None:
        _ACTIVE.reset(self.token)
        self.pool.release()
