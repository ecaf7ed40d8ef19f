// Eight lanes working as one, through subgroup operations: no workgroup memory and no barriers,
// which llvmpipe runs as coroutines. Any subgroup of 8 or more consecutive invocations holds whole
// groups of 8 (a lane's place in its group is lane & 7).
// Vec8: 8 vec4<f32>, 32 values: a run of X, 32 of a head's dims, or 8 keys' probabilities for 4 heads.
struct Vec8 { a: vec4<f32>, b: vec4<f32>, c: vec4<f32>, d: vec4<f32>, e: vec4<f32>, f: vec4<f32>, g: vec4<f32>, h: vec4<f32> }

// Lanes 0..7's v as fields a..h, for every lane of the subgroup. The callers load the vec4 of
// lane & 7, so one load a lane in 8 serves the whole subgroup.
fn broadcast8(v: vec4<f32>) -> Vec8 {
    return Vec8(subgroupBroadcast(v, 0u), subgroupBroadcast(v, 1u), subgroupBroadcast(v, 2u), subgroupBroadcast(v, 3u),
                subgroupBroadcast(v, 4u), subgroupBroadcast(v, 5u), subgroupBroadcast(v, 6u), subgroupBroadcast(v, 7u));
}

// The sum of v over a lane's group of 8 (shuffles xor 4, 2, 1), in every lane of the group
fn sum8(v: f32) -> f32 {
    let a = v + subgroupShuffleXor(v, 4u);
    let b = a + subgroupShuffleXor(a, 2u);
    return b + subgroupShuffleXor(b, 1u);
}

// The max of v over a lane's group of 8, in every lane of the group
fn max8(v: f32) -> f32 {
    let a = max(v, subgroupShuffleXor(v, 4u));
    let b = max(a, subgroupShuffleXor(a, 2u));
    return max(b, subgroupShuffleXor(b, 1u));
}
