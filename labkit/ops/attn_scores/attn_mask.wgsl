// The attention mask of attn_scores.wgsl: key s is hidden from the query at position qpos when it
// is in the future, or, with a sliding window w > 0 (P.window), w or more positions back
// (llama.cpp's rule: a window of w keeps the query and the w - 1 keys before it).
fn masked(qpos: u32, s: u32) -> bool {
    return s > qpos || (P.window > 0u && qpos - s >= P.window);
}
