// FAULT (moe_router=expert_index_off_by_one): the neighbouring expert's id, one too high.
fn expert_id(e: u32) -> u32 {
    return (e + 1u) % P.n_expert;
}
