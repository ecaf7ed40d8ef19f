// Attention context in a decode step (T = 1): C[h*head_dim + d] = Σ_s probs[h, s] · V[s, kv_head(h)*head_dim + d]
// Same interface as attn_ctx.wgsl (the prefill kernel), composed the same way: V from
// attn_ctx_v_buffer.wgsl, the key range from attn_ctx_keys_masked.wgsl or _every.wgsl; the unit of
// work and its helpers from attn_ctx_decode_unit.wgsl, composed before this file.
// One thread per vec4 of dims and per group of HEADS_PER_THREAD query heads that share a KV head
// (GQA): each V vec4 it loads serves every head of the group. The probabilities come through the
// subgroup: for 8 keys at a time lane l loads key l's (one vec4, the group's 4 heads), and
// subgroupBroadcast hands them out, so a workgroup's lanes, all on one group of heads, load each
// probability once between them. Per 8 keys a thread loads 8 vec4 of V and 4 probabilities for
// 4 heads, where one thread per (head, vec4 of dims) loaded 64 values.
// One decode step after 512 tokens (lavapipe, AMD EPYC family 25, 2 cores): Gemma 3's 18 layers of
// context 53-61 -> 20 ms, SmolLM2's 30 layers 50-59 -> 24-31 ms.
// A workgroup covers DIMS_PER_WG dims of one group of heads (the host reads both constants),
// and loops over the units a short dispatch left it.

fn context(w: Unit, lane: u32) -> array<vec4<f32>, 4> {
    var c: array<vec4<f32>, 4>;
    let first = first_key(0u);
    let last = last_key(0u);
    for (var s = first; s < last; s += 8u) {
        let p = broadcast8(probs(w, s + lane, last));
        add_key(&c, p.a, w, s, last);  // the 8 keys written out: a constant lane for each broadcast
        add_key(&c, p.b, w, s + 1u, last);
        add_key(&c, p.c, w, s + 2u, last);
        add_key(&c, p.d, w, s + 3u, last);
        add_key(&c, p.e, w, s + 4u, last);
        add_key(&c, p.f, w, s + 5u, last);
        add_key(&c, p.g, w, s + 6u, last);
        add_key(&c, p.h, w, s + 7u, last);
    }
    return c;
}

@compute @workgroup_size(8)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let units = unit_count();
    for (var u = wid.x + wid.y * nwg.x; u < units; u += nwg.x * nwg.y) {  // uniform per workgroup
        let w = unit_at(u, li);
        store_unit(w, context(w, lane & 7u));
    }
}
