"""Matmul epilogues: in a decode step, a matmul and the elementwise stage after it run as one dispatch.

A dispatch costs lavapipe 50-100 us whatever its size, and a SmolLM2 decode step was 515 of
them, so the elementwise stages that follow a matmul (llama's residual adds after attn_out and
ffn_down, every model's gated activation after ffn_up) cost as much as a small matmul. The fused
kernel (matvec_store_epilogue.wgsl) stores each row of the matmul as usual and, in the same
thread, the next stage's value of that row: both named stages are written, so both can still be
captured or compared, and the fused stage's own plan has no dispatch. The results are the
unfused ones bit for bit (tests compare fused and unfused decode).

Fused only where nothing else changes: compiled decode steps (labkit.gpu.compiled_step; lab.run, the
stepper, debug and patched passes run every stage's own kernel), one token (or a batch's step of up to
4, the few-token driver's), a matmul on repacked weights (the matvec drivers) without bias or scale,
and a next stage whose selected kernel is the correct one; a faulty elementwise variant runs unfused,
so it still shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from labkit.ops.glu import ACT_CODES
from labkit.ops.matmul import EPILOGUES


@dataclass(frozen=True)
class Epilogue:
    """The elementwise stage fused into a matmul stage's kernel."""

    stage: Any  # the elementwise Stage (add or glu)
    other: str  # its input that is not the matmul's output (the residual stream, or the gate)
    y_first: bool  # the matmul's output is its first input (the gate of a glu)

    def values(self, e_offset: int, z_offset: int) -> dict[str, int]:
        """The epilogue's fields of the fused kernel's Params (labkit.ops.matmul.EPILOGUE_PARAMS)."""
        act = ACT_CODES[self.stage.params["act"]] if self.stage.op == "glu" else 0
        return {"e_offset": e_offset, "z_offset": z_offset, "act": act, "y_first": int(self.y_first)}


def epilogue_for(graph: list, i: int, kernels: dict, T: int) -> Epilogue | None:
    """The stage after graph[i] fused into its kernel, or None where the rules above say no."""
    st = graph[i]
    if i + 1 >= len(graph) or st.op != "matmul" or st.bias or st.params.get("weight_scale") or st.kv_write:
        return None
    k = kernels[st.name]
    if k.epilogue is None or (T != 1 and not (k.few_epilogue and 1 < T <= k.epilogue_tokens)):
        return None  # no fused form (the raw-bytes drivers), or none for this many tokens
    nxt = graph[i + 1]
    if nxt.op not in EPILOGUES or kernels[nxt.name].name != "default" or st.name not in nxt.inputs:
        return None
    if nxt.params.get("scale", 1.0) != 1.0:  # a scaled residual (Granite's muP): the epilogue adds as it is
        return None
    others = [n for n in nxt.inputs if n != st.name]
    if len(others) != 1:
        return None
    return Epilogue(nxt, others[0], nxt.inputs[0] == st.name)
