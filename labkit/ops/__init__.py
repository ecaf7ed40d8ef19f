"""One module per op. `OPS` maps an op name (a stage's `op`) to its `Op`; nothing registers
itself on import: this module lists the op modules, and the registries read from them."""

from __future__ import annotations

from labkit.ops import (
    add,
    add_id,
    argmax,
    attn_ctx,
    attn_gate,
    attn_scores,
    columns,
    concat,
    delta_decay,
    delta_net,
    embed,
    gated_add,
    gated_norm,
    glu,
    hadamard,
    head_matmul,
    kv_cache,
    l2norm,
    matmul,
    moe_matmul,
    moe_router,
    moe_sum,
    mul,
    relu_sqr,
    rmsnorm,
    rope,
    scale,
    sigmoid,
    softcap,
    softmax,
    ssm_conv,
    ssm_scan,
    ssm_skip,
    state,
)
from labkit.ops.base import Explanation, Kernel, Op, Params, PassShape, Policy

OPS: dict[str, Op] = {
    m.OP.name: m.OP
    for m in (
        embed,
        rmsnorm,
        matmul,
        rope,
        attn_scores,
        softmax,
        attn_ctx,
        add,
        glu,
        softcap,
        scale,
        moe_router,
        moe_matmul,
        moe_sum,
        mul,
        add_id,
        ssm_conv,
        ssm_scan,
        ssm_skip,
        gated_norm,
        state,
        columns,
        attn_gate,
        sigmoid,
        delta_decay,
        l2norm,
        delta_net,
        gated_add,
        relu_sqr,
        concat,
        head_matmul,
        kv_cache,
        hadamard,
        argmax,
    )
}

__all__ = ["OPS", "Explanation", "Kernel", "Op", "Params", "PassShape", "Policy"]
