// What the unfused context kernels share (attn_ctx.wgsl for a prefill, attn_ctx_decode.wgsl for a
// decode step), composed before them: the probabilities A, the context C and the Params, the fused
// tiers' struct (one Params per family; scale and softcap are unused here). V comes from
// attn_ctx_v_texture.wgsl or attn_ctx_v_buffer.wgsl.
struct Params { T: u32, n_keys: u32, n_past: u32, n_heads: u32, n_kv_heads: u32, head_dim: u32, window: u32, scale: f32, softcap: f32, sinks: u32 }
@group(0) @binding(0) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read_write> C: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> P: Params;
