// One step of a 16 x 8 register tile shared through subgroupBroadcast (tile16.wgsl's matmul tile,
// attn_scores_prefill.wgsl's scores): no bindings, so any kernel with such a tile composes it.
// Lane l of a group of 8 holds vector l in va and vector 8 + l in vb; every lane of the subgroup
// wants the same 16 (a workgroup shares its tokens or queries), so any subgroup of 8 or more lanes
// serves.
// acc[2t + h] += vector t's 4 values (lane t & 7 of va for t < 8, of vb after) times m: column j
// of m is row (or key) j's 4 values, so acc's component j sums their products
fn quad_step(acc: ptr<function, array<vec4<f32>, 32>>, h: u32, va: vec4<f32>, vb: vec4<f32>, m: mat4x4<f32>) {
    (*acc)[0u + h] += subgroupBroadcast(va, 0u) * m;
    (*acc)[2u + h] += subgroupBroadcast(va, 1u) * m;
    (*acc)[4u + h] += subgroupBroadcast(va, 2u) * m;
    (*acc)[6u + h] += subgroupBroadcast(va, 3u) * m;
    (*acc)[8u + h] += subgroupBroadcast(va, 4u) * m;
    (*acc)[10u + h] += subgroupBroadcast(va, 5u) * m;
    (*acc)[12u + h] += subgroupBroadcast(va, 6u) * m;
    (*acc)[14u + h] += subgroupBroadcast(va, 7u) * m;
    (*acc)[16u + h] += subgroupBroadcast(vb, 0u) * m;
    (*acc)[18u + h] += subgroupBroadcast(vb, 1u) * m;
    (*acc)[20u + h] += subgroupBroadcast(vb, 2u) * m;
    (*acc)[22u + h] += subgroupBroadcast(vb, 3u) * m;
    (*acc)[24u + h] += subgroupBroadcast(vb, 4u) * m;
    (*acc)[26u + h] += subgroupBroadcast(vb, 5u) * m;
    (*acc)[28u + h] += subgroupBroadcast(vb, 6u) * m;
    (*acc)[30u + h] += subgroupBroadcast(vb, 7u) * m;
}

