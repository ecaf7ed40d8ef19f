// moe_router's id step: the id stored for selected expert e (itself).
fn expert_id(e: u32) -> u32 {
    return e;
}
