// X of a prefill matmul, copied into a texture for matmul_tiled.wgsl: texel (w, t) holds values
// 4w..4w+3 of token t. lavapipe reads a storage buffer lane by lane (about 1.1 GB/s here) and
// gathers a textureLoad for all lanes at once (7.7-8.4 GB/s), and the tiled driver reads each
// X value once per 8 weight rows, so one pass over X here pays for itself many times over.
@group(0) @binding(0) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(1) var XT: texture_storage_2d<rgba32float, write>;
struct Params { K: u32, T: u32, x_offset: u32, x_stride: u32 }
@group(0) @binding(2) var<uniform> P: Params;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let words = P.K / 4u;
    let i = (wid.x + wid.y * nwg.x) * 64u + li;
    if (i >= P.T * words) {
        return;
    }
    let t = i / words;
    let w = i % words;
    textureStore(XT, vec2<u32>(w, t), X[(P.x_offset + t * P.x_stride) / 4u + w]);
}
