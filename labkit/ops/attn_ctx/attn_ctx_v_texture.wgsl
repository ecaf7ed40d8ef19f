// attn_ctx's V in a prefill: a texture, texel (w, s) = values 4w..4w+3 of V row s.
@group(0) @binding(1) var V: texture_2d<f32>;

fn v_texel(w: u32, s: u32) -> vec4<f32> {
    return textureLoad(V, vec2<u32>(w, s), 0);
}
