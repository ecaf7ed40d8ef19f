// attn_ctx's key range, the default: only the keys the mask lets one of the tile's queries see
// (query t sits at position n_past + t: keys up to it, and within the sliding window when there
// is one), as flash attention does; elsewhere every softmax gives probability 0. That halves
// the work of a causal prefill and, past Gemma's 512-token window, cuts a local layer's to one
// window a query.
fn first_key(t: u32) -> u32 {
    let pos = P.n_past + t;
    return select(0u, pos + 1u - P.window, P.window > 0u && pos + 1u > P.window);
}

fn last_key(t: u32) -> u32 {
    return min(P.n_past + t + 1u, P.n_keys);
}
