// FAULT (moe_router=no_routed_scale): the routed scaling factor never applied: every routed expert's
// output too small by the factor (2.5 on DeepSeek-V3), the shared expert's not.
fn routed_scale() -> f32 {
    return 1.0;
}
