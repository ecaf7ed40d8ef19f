// FAULTY: dt used as it comes, without its softplus (a kernel that assumes its caller applied it).
fn step(dt: f32) -> f32 {
    return dt;
}
