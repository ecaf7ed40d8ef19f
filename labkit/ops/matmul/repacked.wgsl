// What the drivers on repacked weights share (matmul_tiled.wgsl, matmul_matvec.wgsl): the
// weight window, in the layout repack.wgsl writes, held in a texture, and reading one slot of
// it. A slot is one vec4<u32> texel: the same quant word of 4 rows of a quad; each row has its
// group's (scale, offset). Slot i is texel (i % SLOT_ROW, i / SLOT_ROW).
//
// Why a texture (measured on lavapipe, this kind of machine): llvmpipe reads a storage buffer
// one lane at a time, with a bounds check per lane, at about 1.1 GB/s; textureLoad gathers all
// lanes at once, at 7.7-8.4 GB/s. Weights are read many times and written once, so they live
// in textures; activations stay in storage buffers.
@group(0) @binding(0) var W: texture_2d<u32>;

const SLOT_ROW: u32 = 8192u;  // texels per texture row: WebGPU's guaranteed max-texture-dimension-2d

fn slot(i: u32) -> vec4<u32> {
    return textureLoad(W, vec2<u32>(i % SLOT_ROW, i / SLOT_ROW), 0);
}

// the 4 rows' values in one quant slot: column i is row i's 4 values
fn quad4(u: vec4<u32>, s: vec4<f32>, o: vec4<f32>) -> mat4x4<f32> {
    return mat4x4<f32>(s.x * vec4<f32>(unpack4xI8(u.x)) + o.x, s.y * vec4<f32>(unpack4xI8(u.y)) + o.y,
                       s.z * vec4<f32>(unpack4xI8(u.z)) + o.z, s.w * vec4<f32>(unpack4xI8(u.w)) + o.w);
}
