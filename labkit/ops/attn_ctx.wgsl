// Attention context: C[t, h*head_dim + d] = Σ_s probs[h, t, s] · V[s, kv_head(h)*head_dim + d]
// Interface (A, C and P declared in attn_ctx_io.wgsl, composed before this file):
//            @binding(0) A: array<f32> [n_heads, T, n_keys] (probabilities)
//            @binding(1) V: [n_keys, n_kv_heads*head_dim] (the layer's V cache), declared with
//                          v_texel() by a file composed after this one: attn_ctx_v_texture.wgsl
//                          (prefill) or attn_ctx_v_buffer.wgsl (decode)
//            @binding(2) C: [T, n_heads*head_dim], written as vec4 (head_dim % 4 == 0)
//            @binding(3) P: Params.
// One thread per tile of TILE_T tokens x TILE_D dims of a head (the host reads the constants):
// each V texel it loads serves 4 tokens, each probability 16 dims. In a prefill V is a texture
// (lavapipe gathers those for all lanes at once; labkit/gpu/texture.py); in a decode step it
// stays a buffer (one query reads each value once: copying the whole cache into a texture
// every step would cost more than it saves). A stays a buffer, read once per 16 dims.
// Keys first_key(t0) .. last_key(t_last) - 1 are summed, from a file composed after this one:
// attn_ctx_keys_masked.wgsl (the default: the keys the mask lets the tile's queries see) or
// attn_ctx_keys_every.wgsl (every key).

const TILE_T: u32 = 4u;
const TILE_D: u32 = 16u;

// c, this tile's context for one token: dims d4..d4+3 (vec4s) that exist
fn store(cb: u32, d4: u32, hd4: u32, c: mat4x4<f32>) {
    C[cb] = c[0];
    if (d4 + 1u < hd4) { C[cb + 1u] = c[1]; }
    if (d4 + 2u < hd4) { C[cb + 2u] = c[2]; }
    if (d4 + 3u < hd4) { C[cb + 3u] = c[3]; }
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let hd4 = P.head_dim / 4u;
    let nd = (hd4 + 3u) / 4u;  // tiles of TILE_D dims per head
    let nt = (P.T + TILE_T - 1u) / TILE_T;
    if (idx >= nt * P.n_heads * nd) { return; }
    let d4 = (idx % nd) * 4u;
    let h = (idx / nd) % P.n_heads;
    let t0 = (idx / (nd * P.n_heads)) * TILE_T;
    let t_last = min(t0 + 3u, P.T - 1u);
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let a0 = (h * P.T + t0) * P.n_keys;
    let a1 = (h * P.T + min(t0 + 1u, t_last)) * P.n_keys;
    let a2 = (h * P.T + min(t0 + 2u, t_last)) * P.n_keys;
    let a3 = (h * P.T + t_last) * P.n_keys;
    // this tile's 4 texel columns of V; past the head's end they repeat its last (never stored)
    let v0 = kvh * hd4 + d4;
    let v1 = kvh * hd4 + min(d4 + 1u, hd4 - 1u);
    let v2 = kvh * hd4 + min(d4 + 2u, hd4 - 1u);
    let v3 = kvh * hd4 + min(d4 + 3u, hd4 - 1u);
    var c0 = mat4x4<f32>();
    var c1 = mat4x4<f32>();
    var c2 = mat4x4<f32>();
    var c3 = mat4x4<f32>();
    for (var s = first_key(t0); s < last_key(t_last); s++) {
        let v = mat4x4<f32>(v_texel(v0, s), v_texel(v1, s), v_texel(v2, s), v_texel(v3, s));
        c0 += A[a0 + s] * v;
        c1 += A[a1 + s] * v;
        c2 += A[a2 + s] * v;
        c3 += A[a3 + s] * v;
    }
    let row = P.n_heads * hd4;
    let cb = t0 * row + h * hd4 + d4;
    store(cb, d4, hd4, c0);
    if (t0 + 1u < P.T) { store(cb + row, d4, hd4, c1); }
    if (t0 + 2u < P.T) { store(cb + 2u * row, d4, hd4, c2); }
    if (t0 + 3u < P.T) { store(cb + 3u * row, d4, hd4, c3); }
}
