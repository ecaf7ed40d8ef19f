// moe_router's weight step: a selected expert's probability under the softmax over ALL experts,
// as it is (p; sel_sum: the k selected probabilities' sum).
fn gate_weight(p: f32, sel_sum: f32) -> f32 {
    return p;
}
