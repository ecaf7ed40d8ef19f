// Rows of a storage buffer copied into a texture, for kernels that read an operand as a texture
// (labkit/gpu/texture.py): texel (w, t) holds floats 4w..4w+3 of row t. lavapipe reads a
// storage buffer lane by lane (about 1.1 GB/s here) and gathers a textureLoad for all lanes at
// once (7.7-8.4 GB/s); the kernels that read these textures read each value many times over
// (the tiled matmul once per 8 weight rows, attention once per 4 queries or keys).
@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(1) var XT: texture_storage_2d<rgba32float, write>;
struct Params { width: u32, rows: u32, offset: u32, stride: u32 }
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let texels = P.width / 4u;
    let i = (wid.x + wid.y * nwg.x) * 64u + li;
    if (i >= P.rows * texels) {
        return;
    }
    let t = i / texels;
    let w = i % texels;
    textureStore(XT, vec2<u32>(w, t), X[(P.offset + t * P.stride) / 4u + w]);
}
