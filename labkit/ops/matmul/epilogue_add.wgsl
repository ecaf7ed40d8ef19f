// The residual add as a matvec epilogue (matvec_store_epilogue.wgsl): e, the residual stream,
// plus y, the matmul's row (add.wgsl's A + B; IEEE addition is commutative, so bit for bit).
fn epilogue(y: f32, e: f32) -> f32 {
    return e + y;
}
