// FAULT (softmax=no_max_sub, post-mortem 003): no max-subtraction: exp(x) overflows to inf once
// x > 88, and inf / inf is NaN.
fn shift(row_max: f32) -> f32 { return 0.0; }

fn row_is_empty(row_max: f32) -> bool { return false; }
