// FAULTY mask for attn_scores.wgsl: the sliding window keeps one key too many (> where >= was
// meant), so a query still sees the key w positions back. It diverges only where some query is w
// or more positions past a key: prompts longer than the window, on models that have one.
fn masked(qpos: u32, s: u32) -> bool {
    return s > qpos || (P.window > 0u && qpos - s > P.window);
}
