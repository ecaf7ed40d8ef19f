// softmax's stable part: the row's max is subtracted before exp, so exp never overflows, and a row
// with nothing visible (max -inf) is empty: zeros, not 0/0.
fn shift(row_max: f32) -> f32 { return row_max; }

fn row_is_empty(row_max: f32) -> bool { return row_max == bitcast<f32>(0xff800000u); }
