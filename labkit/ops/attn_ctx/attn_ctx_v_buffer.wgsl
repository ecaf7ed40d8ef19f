// attn_ctx's V in a decode step: the layer's V cache buffer itself, rows of n_kv_heads*head_dim.
@group(0) @binding(1) var<storage, read> V: array<vec4<f32>>;

fn v_texel(w: u32, s: u32) -> vec4<f32> {
    return V[s * (P.n_kv_heads * P.head_dim / 4u) + w];
}
