// FAULT (moe_router=routed_scale_twice): the routed scaling factor applied in the router and again where
// the experts' outputs are summed: the routed experts' share scaled by its square.
fn routed_scale() -> f32 {
    return P.w_scale * P.w_scale;
}
