// The gated activation as a matvec epilogue (matvec_store_epilogue.wgsl), composed after
// glu_act.wgsl: y is the gate when the matmul is the gate projection (P.y_first = 1), else the up
// projection, and e is the other one, computed by the stage before.
fn epilogue(y: f32, e: f32) -> f32 {
    if (P.y_first == 1u) {
        return glu(y, e, P.act);
    }
    return glu(e, y, P.act);
}
