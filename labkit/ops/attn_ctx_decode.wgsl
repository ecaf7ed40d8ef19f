// Attention context in a decode step (T = 1): C[h*head_dim + d] = Σ_s probs[h, s] · V[s, kv_head(h)*head_dim + d]
// Same interface as attn_ctx.wgsl (the prefill kernel), composed the same way: V from
// attn_ctx_v_buffer.wgsl, the key range from attn_ctx_keys_masked.wgsl or _every.wgsl.
// One thread per vec4 of a head's dims (TILE_D = 4), not per 4 tokens x 16 dims: one query has
// no tokens to share a V load between, and the prefill tiling left SmolLM2's 9 heads x 64 dims
// one workgroup, so one core, summing every key of the cache (one decode step after 512 tokens:
// SmolLM2's 30 layers of context 12.5 -> 6.5 ms, Gemma's 18 11.3 -> 7.1 ms).

const TILE_T: u32 = 1u;
const TILE_D: u32 = 4u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let hd4 = P.head_dim / 4u;
    if (idx >= P.n_heads * hd4) { return; }
    let d4 = idx % hd4;
    let h = idx / hd4;
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let a0 = h * P.n_keys;
    let v0 = kvh * hd4 + d4;
    var c = vec4<f32>();
    for (var s = first_key(0u); s < last_key(0u); s++) {
        c += A[a0 + s] * v_texel(v0, s);
    }
    C[idx] = c;
}
