// Attention context: C[t, h*head_dim + d] = Σ_s probs[h, t, s] · V[s, kv_head(h)*head_dim + d]
// Interface: @binding(0) A: array<f32> [n_heads, T, n_keys] (probabilities)
//            @binding(1) V: array<f32> [>= n_keys, n_kv_heads*head_dim] (the layer's V cache)
//            @binding(2) C: array<f32> [T, n_heads*head_dim]
//            @binding(3) P: Params. One thread per output element.
// The fused tiers' struct (one Params per family); n_past, window, scale and softcap are unused here.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(1) var<storage, read> V: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<f32>;
@group(0) @binding(3) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = gid.x + gid.y * nwg.x * 64u;
    let row = P.n_heads * P.head_dim;
    if (idx >= P.T * row) { return; }
    let t = idx / row;
    let h = (idx % row) / P.head_dim;
    let d = idx % P.head_dim;
    let kvh = h / (P.n_heads / P.n_kv_heads);
    let ab = (h * P.T + t) * P.n_keys;
    let vstride = P.n_kv_heads * P.head_dim;
    var acc = 0.0;
    for (var s = 0u; s < P.n_keys; s++) { acc += A[ab + s] * V[s * vstride + kvh * P.head_dim + d]; }
    C[idx] = acc;
}
