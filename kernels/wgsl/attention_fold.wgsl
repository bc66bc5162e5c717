// attention_fold.wgsl — the chunk size of the attention split over keys and the fold of a
// chunk's partial into a running one (attention_part.wgsl says what a partial is), shared by
// attention.wgsl, attention_merge.wgsl (through attention_part.wgsl) and mvq_x_merge.wgsl (the o
// projection's input stage that folds the partials itself): one function, so one float order.
// No bindings.

const C: u32 = 256u;      // keys per chunk
const NEG: f32 = -3.0e38; // stands for -infinity (WGSL may assume no infinities)

// One element of a partial: its chunk's max and sum, and element d of its values' sum.
struct Part {
    m: f32,
    l: f32,
    o: f32,
}

// `r` (the chunks before) then chunk partial `c`: both rescaled to the larger max.
fn fold(r: Part, c: Part) -> Part {
    let mn = max(r.m, c.m);
    let a = exp(r.m - mn);
    let b = exp(c.m - mn);
    return Part(mn, fma(c.l, b, r.l * a), fma(c.o, b, r.o * a));
}


// Four elements of one head's partials at once (the o projection's input stage,
// mvq_x_merge.wgsl): `fold`'s operations on each element, the max and sum shared.
struct Part4 {
    m: f32,
    l: f32,
    o: vec4<f32>,
}

fn fold4(r: Part4, c: Part4) -> Part4 {
    let mn = max(r.m, c.m);
    let a = exp(r.m - mn);
    let b = exp(c.m - mn);
    return Part4(mn, fma(c.l, b, r.l * a), fma(c.o, vec4<f32>(b), r.o * a));
}
