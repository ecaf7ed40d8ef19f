// moe_router's group step (DeepSeek-V3's group-limited routing): the groups the top k may come from.
// a group's score: the sum of its two best selection scores
fn group_score(t: u32, g: u32) -> f32 {
    let size = P.n_expert / P.groups;
    let neg_inf = bitcast<f32>(0xff800000u);
    var b1 = neg_inf;
    var b2 = neg_inf;
    for (var e = g * size; e < (g + 1u) * size; e++) {
        let s = selection_score(t, e);
        if (s > b1) { b2 = b1; b1 = s; } else if (s > b2) { b2 = s; }
    }
    return b1 + b2;
}

// the groups the top k may come from, as bits: all, or the P.groups_used best (a tie to the lower group)
fn allowed_groups(t: u32) -> u32 {
    if (P.groups <= 1u) { return 0xffffffffu; }
    var mask = 0u;
    for (var j = 0u; j < P.groups_used; j++) {
        var bs = bitcast<f32>(0xff800000u);
        var bg = P.groups;
        for (var g = 0u; g < P.groups; g++) {
            let s = group_score(t, g);
            if ((mask & (1u << g)) == 0u && (bg == P.groups || s > bs)) { bs = s; bg = g; }
        }
        mask |= 1u << bg;
    }
    return mask;
}
