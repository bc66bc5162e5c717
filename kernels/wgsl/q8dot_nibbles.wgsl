// q8dot_nibbles.wgsl — what q8dot_q4_0.wgsl and q8dot_q4_1.wgsl share (prepended before either):
// the integer dot of a 4-bit chunk's 16 quant bytes (nibbles as unsigned values 0..15, low
// nibbles the first 16 elements, high nibbles the last 16) with a Q8 block (x0, x1: q8_act.wgsl),
// by dot4I8Packed. Exact.

fn nibble_dot(q: vec4<u32>, x0: vec4<u32>, x1: vec4<u32>) -> i32 {
    let m = vec4<u32>(0x0F0F0F0Fu);
    let lo = q & m;
    let hi = (q >> vec4<u32>(4u)) & m;
    var s = dot4I8Packed(lo.x, x0.x) + dot4I8Packed(lo.y, x0.y) + dot4I8Packed(lo.z, x0.z) + dot4I8Packed(lo.w, x0.w);
    s += dot4I8Packed(hi.x, x1.x) + dot4I8Packed(hi.y, x1.y) + dot4I8Packed(hi.z, x1.z) + dot4I8Packed(hi.w, x1.w);
    return s;
}
