// moe_router's normalization step: divided by the k weights' sum where the model renormalizes
// (llama.cpp clamps the sum to f16's smallest normal first).
fn normalized(w: f32, total: f32) -> f32 {
    if (P.norm != 0u) { return w / max(total, 6.103515625e-5); }
    return w;
}
