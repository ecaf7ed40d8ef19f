// attn_ctx's key range, `every_key`: every key is summed, masked ones too. Their probability is
// 0 under a correct softmax, but 0 · inf = NaN when a value is infinite (ggml's unfused mul_mat
// does the same), and a probability a faulty softmax left outside the mask reaches the context.
fn first_key(t: u32) -> u32 {
    return 0u;
}

fn last_key(t: u32) -> u32 {
    return P.n_keys;
}
