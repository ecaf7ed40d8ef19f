"""state: a layer's recurrent state as the pass leaves it, captured as a stage (`blk.L.conv_state`,
`blk.L.scan_state`), so a state bug is seen at the pass where it starts.

Nothing is computed: the stage that advances the state (ssm_conv, ssm_scan) wrote it in place, and
this stage's region on the GPU is the state's own buffer. Its one row is the whole state, the same
size at every length of the sequence (a KV cache grows by a row per token)."""

from __future__ import annotations

import numpy as np

from labkit.ops.base import Kernel, Op, from_file


def reference(stage, ref) -> np.ndarray:
    return ref.state(stage.state, (stage.params["size"],)).reshape(1, -1).copy()


def plan(stage, gpu):
    return gpu.state_region(stage.state, stage.params["size"])


def shapes(stage) -> tuple[list[str], str]:
    return [f"the layer's {stage.state} state after the pass"], f"[1, {stage.params['size']}]"


OP = Op(
    output=lambda st, s: (1, st.params["size"]),
    name="state",
    what="the layer's recurrent state as this pass leaves it (the next pass starts from it)",
    formula="S after the last token",
    params=None,
    reference=reference,
    plan=plan,
    shapes=shapes,
    layout="state",
    kernels=(Kernel("state", "default", "the state's own buffer: nothing is computed", from_file("state")),),
)
