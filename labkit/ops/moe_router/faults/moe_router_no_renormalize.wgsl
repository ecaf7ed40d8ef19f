// FAULT (moe_router=no_renormalize): the weights as they are, even where the model renormalizes.
fn normalized(w: f32, total: f32) -> f32 {
    return w;
}
