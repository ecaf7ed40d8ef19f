// Attention context in a decode step (T = 1) for real GPUs: attn_ctx_decode.wgsl's units (a vec4 of
// dims for a group of 4 query heads sharing a KV head, from attn_ctx_decode_unit.wgsl), with a
// unit's keys split over KEY_SLICES threads. There 8 threads walk all the keys of a unit one after
// another: on an H200, 126 us a layer at 512 keys, 2 of a Llama-3.2-1B decode step's 6 ms. Here
// slice j takes keys j, j + 32, ..., and the slices' sums meet in workgroup memory (barriers are
// cheap on a GPU, coroutines on llvmpipe, which keeps the 8-thread driver). The sum runs in
// another order than the prefill kernel's, so a decode step's context can differ from a prefill's
// in the last bits.
const KEY_SLICES: u32 = 32u;
var<workgroup> partial: array<array<vec4<f32>, 4>, 256>;  // 8 dim lanes x KEY_SLICES

fn add_slices(li: u32, other: u32) {
    let o = partial[other];
    partial[li][0] += o[0];
    partial[li][1] += o[1];
    partial[li][2] += o[2];
    partial[li][3] += o[3];
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let lane = li % 8u;  // the unit's vec4 of dims
    let slice = li / 8u;
    let first = first_key(0u);
    let last = last_key(0u);
    let units = unit_count();
    for (var u = wid.x + wid.y * nwg.x; u < units; u += nwg.x * nwg.y) {  // uniform per workgroup
        let w = unit_at(u, lane);
        var c: array<vec4<f32>, 4>;
        for (var s = first + slice; s < last; s += KEY_SLICES) {
            add_key(&c, probs(w, s, last), w, s, last);
        }
        partial[li] = c;
        for (var half = KEY_SLICES / 2u; half > 0u; half = half / 2u) {
            workgroupBarrier();
            if (slice < half) { add_slices(li, li + 8u * half); }
        }
        workgroupBarrier();
        if (slice == 0u) { store_unit(w, partial[lane]); }
        workgroupBarrier();  // the next unit writes `partial` again
    }
}
