// FAULTY: the gate on the other side of the norm from where the family puts it (a norm ported from
// one family to the other: Mamba-2 gates before its norm, Qwen3-Next after).
fn gate_before(gate_first: u32) -> bool {
    return gate_first == 0u;
}
