// FAULTY mask for attn_scores.wgsl, a micro-batch after the first: the sliding window is applied
// within the chunk only, so a query still sees every cached key, however far back (pytorch/executorch
// #21857: chunked prefill of a sliding-window layer let each query see more keys than the window
// allows, so a multi-chunk prefill did not match a single-chunk one). It shows only on a layer with a
// window, once some query of a later chunk is a window or more past the sequence's start.
fn masked(qpos: u32, s: u32) -> bool {
    return s > qpos || (P.window > 0u && s >= P.n_past && qpos - s >= P.window);
}
