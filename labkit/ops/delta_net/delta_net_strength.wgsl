// delta_net's write strength, the correct one: beta (sigmoid(b), from its stage) once.
fn strength(b: f32) -> f32 {
    return b;
}
