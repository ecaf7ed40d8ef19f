// gated_norm's order, the correct one: the gate on the side the family's mixer puts it (Params.gate_first).
fn gate_before(gate_first: u32) -> bool {
    return gate_first != 0u;
}
