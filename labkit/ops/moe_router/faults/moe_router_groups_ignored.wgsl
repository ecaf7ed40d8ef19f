// FAULT (moe_router=groups_ignored): group-limited routing skipped: the top k taken over every expert,
// as if the model had no expert groups. A token then reaches experts outside its best groups.
fn allowed_groups(t: u32) -> u32 {
    return 0xffffffffu;  // the bug: every group allowed
}
