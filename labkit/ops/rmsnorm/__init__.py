"""rmsnorm: each group of values divided by its root mean square, times a learned weight.

Groups are rows of d_model for the block norms, and each head's head_dim for Gemma's and
Qwen 3's q/k norms. The file's weight is used as stored (Gemma's 1 + w is folded in by the
converter), which is what the `offset_twice` fault gets wrong."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, Params, ceil_div, compose, wgsl_const

PARAMS = Params(n_groups="u32", group="u32", eps="f32")


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, group: int) -> np.ndarray:
    g = x.reshape(-1, group)
    return (g / np.sqrt(np.mean(g * g, axis=-1, keepdims=True) + eps) * w).reshape(x.shape)


def reference(stage, ref) -> np.ndarray:
    return rmsnorm(ref.x[0], ref.weight(stage.weight), stage.params["eps"], stage.params["group"])


def workgroups(n_groups: int, source: str | None = None) -> int:
    """GROUPS_PER_WG groups a workgroup, as the kernel's source declares (rmsnorm.wgsl: 8 threads a
    group, 64 a workgroup; rmsnorm_wide.wgsl: one group); a user's kernel without it gets one a group."""
    return ceil_div(n_groups, wgsl_const(source or _with_part("rmsnorm_exact")(None), "GROUPS_PER_WG", 1))


BY_BATCH_SIZE = 32  # by_batch_size's switch from the wide driver to lanes8


def _with_part(part: str, driver: str = "rmsnorm"):
    """The kernel: a driver (8 threads a group, or a workgroup a group) with its scale-and-weight
    part (the correct one, or a fault's)."""
    if driver == "rmsnorm_wide":
        return lambda shape: compose(driver, part)
    return lambda shape: compose("lanes8", driver, part)


def plan(stage, gpu):
    x = gpu.input(0)
    out = gpu.output(x.shape)
    n_groups = x.size // stage.params["group"]
    values = {"n_groups": n_groups, "group": stage.params["group"], "eps": stage.params["eps"]}
    wgs = workgroups(n_groups, gpu.kernel.source(gpu.shape))
    gpu.dispatch([x.buffer, gpu.vector(stage.weight), out.buffer], values, wgs)
    return out


def shapes(stage) -> tuple[list[str], str]:
    width = stage.params["width"]
    return [f"[T, {width}]", f"{stage.weight} [{stage.params['group']}]"], f"[T, {width}]"


OP = Op(
    output=lambda st, s: (s.T, st.params["width"]),
    name="rmsnorm",
    what="divides each group of values by its root mean square, then multiplies by a learned weight",
    formula="y = x / sqrt(mean(x²) + eps) · w",
    params=PARAMS,
    reference=reference,
    plan=plan,
    shapes=shapes,
    weight="vector",
    kernels=(
        Kernel(
            "rmsnorm",
            "lanes8",
            "the correct kernel, 8 threads a group reducing through subgroup shuffles (the default on a CPU)",
            _with_part("rmsnorm_exact"),
            prefer="cpu",
        ),
        Kernel(
            "rmsnorm",
            "wide",
            "the correct kernel, a workgroup of 256 threads a group (the default on a real GPU: 8 threads "
            "took a decode step's 4096-wide row as 512 loads in a row, 0.23 ms a norm on an H200)",
            _with_part("rmsnorm_exact", "rmsnorm_wide"),
            prefer="gpu",
        ),
        Kernel(
            "rmsnorm",
            "by_batch_size",
            "correct, but its driver chosen by the pass's token count, as engines pick kernels by batch size: a "
            f"workgroup a row below {BY_BATCH_SIZE} tokens, 8 threads a row from there. A row's sum runs in "
            "another order in a large batch than alone: not wrong, not batch invariant (vllm-project/vllm#27433)",
            lambda shape: (
                _with_part("rmsnorm_exact", "rmsnorm_wide") if shape.T < BY_BATCH_SIZE else _with_part("rmsnorm_exact")
            )(shape),  # fmt: skip
        ),
        Kernel(
            "rmsnorm",
            "scale_clamp",
            "norm weight read at a wrong block scale (1.688e-4, an I2_S-style clamp): tiny normalized outputs (003)",
            _with_part("rmsnorm_scale_clamp"),
            faulty=True,
        ),
        Kernel(
            "rmsnorm",
            "eps_outside",
            "eps added outside the square root (003, hypothesis C)",
            _with_part("rmsnorm_eps_outside"),
            faulty=True,
        ),
        Kernel(
            "rmsnorm",
            "offset_twice",
            "gemma's (1 + w) applied again to weights that already hold it",
            _with_part("rmsnorm_offset_twice"),
            faulty=True,
        ),
    ),
)
