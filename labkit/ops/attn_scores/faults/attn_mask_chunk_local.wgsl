// FAULTY mask for attn_scores.wgsl, a micro-batch after the first: the causal mask is built for the
// chunk alone, as if it started at position 0, so query t of the chunk sees keys 0..t of the whole
// sequence (the oldest cached ones) instead of every key up to its own position (lablup/mlxcel #885:
// a chunked-prefill continuation's chunk-local mask, built with offset 0). A one-shot prompt and a
// decode step (their own kernels) are untouched: only a chunked or continued prompt shows it.
fn masked(qpos: u32, s: u32) -> bool {
    let t = qpos - P.n_past;
    return s > t || (P.window > 0u && t - s >= P.window);
}
