// Attention context: C[t, h*head_dim + d] = Σ_s probs[h, t, s] · V[s, kv_head(h)*head_dim + d]
// Interface: @binding(0) A: array<f32> [n_heads, T, n_keys] (probabilities)
//            @binding(1) V: [>= n_keys, n_kv_heads*head_dim] (the layer's V cache), read as vec4
//            @binding(2) C: [T, n_heads*head_dim], written as vec4 (head_dim % 4 == 0)
//            @binding(3) P: Params.
// One thread per tile of TILE_T tokens x TILE_D dims of a head (the host reads the constants):
// each V vec4 it loads serves 4 tokens. Every key is summed, masked ones too (their
// probability is 0, or NaN under a faulty softmax, which must reach the context).
// The fused tiers' struct (one Params per family); n_past, window, scale and softcap are unused here.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> V: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> P: Params;

const TILE_T: u32 = 4u;
const TILE_D: u32 = 4u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let hd4 = P.head_dim / 4u;
    let nt = (P.T + TILE_T - 1u) / TILE_T;
    if (idx >= nt * P.n_heads * hd4) { return; }
    let d4 = idx % hd4;
    let h = (idx / hd4) % P.n_heads;
    let t0 = (idx / (hd4 * P.n_heads)) * TILE_T;
    let t_last = min(t0 + 3u, P.T - 1u);
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let a0 = (h * P.T + t0) * P.n_keys;
    let a1 = (h * P.T + min(t0 + 1u, t_last)) * P.n_keys;
    let a2 = (h * P.T + min(t0 + 2u, t_last)) * P.n_keys;
    let a3 = (h * P.T + t_last) * P.n_keys;
    let vs = P.n_kv_heads * hd4;
    let vb = kvh * hd4 + d4;
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    for (var s = 0u; s < P.n_keys; s++) {
        let v = V[s * vs + vb];
        c0 += A[a0 + s] * v;
        c1 += A[a1 + s] * v;
        c2 += A[a2 + s] * v;
        c3 += A[a3 + s] * v;
    }
    let row = P.n_heads * hd4;
    let cb = t0 * row + h * hd4 + d4;
    C[cb] = c0;
    if (t0 + 1u < P.T) { C[cb + row] = c1; }
    if (t0 + 2u < P.T) { C[cb + 2u * row] = c2; }
    if (t0 + 3u < P.T) { C[cb + 3u * row] = c3; }
}
