// ssm_scan's chunked form, the state a chunk starts from, the correct one: what the chunk before left.
fn carried(s: f32, chunk: u32) -> f32 {
    return s;
}
