// matmul_coop.wgsl — the batch and one-token matmul of Q4_0 weights (repacked, pack.rs) against f32
// activations on tensor cores (WGSL cooperative matrices, 16 x 16 x 16, f16 operands, f32
// accumulators): Y[t, r] = sum_c W[r, c] * X[t, c]. Composed as the `enable` lines + packed.wgsl +
// packed_q4_0.wgsl (load_chunk) + mm_io.wgsl (P, W, Y) + coop_q4_0.wgsl (dequant_word) + this
// file, with the `WGM` and `WGN` lines replaced by the tile's (coop.rs `kernels`); the layer
// runner's `matmul_coop` pipelines (WgpuOptions::coop) for steps of two tokens and more
// (matvec_coop.wgsl, one token, gives the same bits).
//   2 storage read  X: array<vec4<f32>>  [n_tok, cols] f32 activations in the chunk-major
//                                        ("swizzled") layout of mm_x_f32.wgsl
//
// Dispatch: (rows / (32 * WGM), ceil(n_tok / (32 * WGN)), 1) workgroups of WGM x WGN subgroups
// of 32 invocations; subgroup s holds a 32 x 32 block (2 x 2 accumulators) of rows
// wg.x * 32 * WGM + (s % WGM) * 32 and tokens wg.y * 32 * WGN + (s / WGM) * 32. Rows must be a
// multiple of 32 * WGM (the runner takes this kernel only then); Y must hold the token rows up to
// the last tile's end (the runner's activation buffers are rounded up), which receive values
// nobody reads; tokens from n_tok on are staged as zeros.
//
// Each stage (one chunk of 32 values of K) is staged through workgroup memory: a weight half
// chunk dequantized to f16 as d * (q - 8) (rounded once, to f16), a token's 32 values rounded to
// f16; then two 16-deep products per accumulator, while the next stage's loads are in flight.
//
// Batch invariance: K is cut into ranges of KR values (0 .. KR, KR .. 2 KR, ..., the last one
// shorter where KR does not divide P.cols). An output (row, token) is the accumulator's start (0,
// or Y's value where P.accumulate), plus the first range's partial, plus the second's, and so on,
// each partial the products of its range's K steps in order (coopMultiplyAdd of the same f16
// operands) from zero. Nothing depends on the tile, its place in it or the other tokens of the
// step, so a token has the same bits alone, in any batch and with either tile; matvec_coop.wgsl
// computes the ranges' partials side by side and adds them in the same order. (Other bits than
// the integer path: f16 operands and the tensor core's own summation.) The ranges cost the tile
// 2-4% (the partials' registers; H200, docs/perf.md) and buy the one-token kernel its parallel
// chains.

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

const WGM: u32 = 4u;
const WGN: u32 = 2u;
// values of K per range (coop.rs `K_RANGE`, replaced there with this line; a multiple of 32)
const KR: u32 = 128u;
const TM: u32 = 32u * WGM;
const TN: u32 = 32u * WGN;
const NT: u32 = 32u * WGM * WGN;
// workgroup row stride in f16s: 32 values and 8 of padding (16-byte aligned rows)
const SS: u32 = 40u;
// (main holds at most 2 A and 4 B tasks per invocation)
const_assert 2u * TM <= 2u * NT && 8u * TN <= 4u * NT;

var<workgroup> sa: array<f16, TM * SS>;
var<workgroup> sb: array<f16, TN * SS>;

// A half chunk as loaded for the next stage: its quant words and scale.
struct Half {
    q: vec2<u32>,
    d: f32,
}

// Task `task` of A (half task % 2 of row task / 2's chunk c); past the tile's: nothing.
fn fetch_a(task: u32, r0: u32, c: u32) -> Half {
    if (task < 2u * TM) {
        let r = load_chunk((r0 + task / 2u) * p.row_bytes + c);
        return Half(select(r.q.xy, r.q.zw, task % 2u == 1u), unpack2x16float(r.s).x);
    }
    return Half(vec2<u32>(0u), 0.0);
}

// Task `task` of B (vec4 task % 8 of token t0 + task / 8's chunk c): zeros from n_tok on.
fn fetch_b(task: u32, t0: u32, c: u32, nc: u32) -> vec4<f32> {
    let t = t0 + task / 8u;
    if (task < 8u * TN && t < p.n_tok) {
        return X[t * (p.cols / 4u) + (task % 8u) * nc + c];
    }
    return vec4<f32>(0.0);
}

// A's task into workgroup memory: elements 8h .. 8h + 7 and 16 + 8h .. 16 + 8h + 7 of a row.
fn stage_a(task: u32, h: Half) {
    if (task < 2u * TM) {
        let at = (task / 2u) * SS + 8u * (task % 2u);
        dequant_word(at, h.q.x, h.d);
        dequant_word(at + 4u, h.q.y, h.d);
    }
}

// B's task into workgroup memory: a token's values 4k .. 4k + 3, rounded to f16.
fn stage_b(task: u32, x: vec4<f32>) {
    if (task < 8u * TN) {
        let v = vec4<f16>(x);
        let o = (task / 8u) * SS + 4u * (task % 8u);
        sb[o] = v.x; sb[o + 1u] = v.y; sb[o + 2u] = v.z; sb[o + 3u] = v.w;
    }
}

// The accumulator of rows r.., tokens t..: zero, or Y's values. (The stride `ys` is P.y_stride
// passed in as an argument, here and in `put`: naga 30's SPIR-V writer panics, "expression not
// cached", on a stride computed in the calling function.)
fn start(r: u32, t: u32, ys: u32) -> coop_mat16x16<f32, C> {
    if (p.accumulate != 0u) {
        return coopLoad<coop_mat16x16<f32, C>>(&Y[t * ys + p.y_off + r], ys);
    }
    return coop_mat16x16<f32, C>();
}

fn put(m: coop_mat16x16<f32, C>, at: u32, ys: u32) {
    coopStore(m, &Y[at], ys);
}

@compute @workgroup_size(NT)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let sg = li / 32u;
    let rs = (sg % WGM) * 32u;
    let ts = (sg / WGM) * 32u;
    let r0 = wg.x * TM;
    let t0 = wg.y * TN;
    let nc = p.cols / 32u;
    let ys = p.y_stride;
    var c00 = start(r0 + rs, t0 + ts, ys);
    var c01 = start(r0 + rs, t0 + ts + 16u, ys);
    var c10 = start(r0 + rs + 16u, t0 + ts, ys);
    var c11 = start(r0 + rs + 16u, t0 + ts + 16u, ys);
    // the current range's partials
    var p00 = coop_mat16x16<f32, C>();
    var p01 = coop_mat16x16<f32, C>();
    var p10 = coop_mat16x16<f32, C>();
    var p11 = coop_mat16x16<f32, C>();
    // The next stage in registers (loaded while this stage's products run), written out for
    // the tiles' task counts: A 2 * TM half chunks (at most 2 per invocation), B 8 * TN vec4s
    // (at most 4); tasks past a tile's count do nothing.
    var a0 = fetch_a(li, r0, 0u);
    var a1 = fetch_a(li + NT, r0, 0u);
    var x0 = fetch_b(li, t0, 0u, nc);
    var x1 = fetch_b(li + NT, t0, 0u, nc);
    var x2 = fetch_b(li + 2u * NT, t0, 0u, nc);
    var x3 = fetch_b(li + 3u * NT, t0, 0u, nc);
    for (var c = 0u; c < nc; c++) {
        workgroupBarrier();
        stage_a(li, a0);
        stage_a(li + NT, a1);
        stage_b(li, x0);
        stage_b(li + NT, x1);
        stage_b(li + 2u * NT, x2);
        stage_b(li + 3u * NT, x3);
        workgroupBarrier();
        if (c + 1u < nc) {
            a0 = fetch_a(li, r0, c + 1u);
            a1 = fetch_a(li + NT, r0, c + 1u);
            x0 = fetch_b(li, t0, c + 1u, nc);
            x1 = fetch_b(li + NT, t0, c + 1u, nc);
            x2 = fetch_b(li + 2u * NT, t0, c + 1u, nc);
            x3 = fetch_b(li + 3u * NT, t0, c + 1u, nc);
        }
        for (var kk = 0u; kk < 32u; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&sa[rs * SS + kk], SS);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&sa[(rs + 16u) * SS + kk], SS);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&sb[ts * SS + kk], SS);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&sb[(ts + 16u) * SS + kk], SS);
            p00 = coopMultiplyAdd(a0, b0, p00);
            p01 = coopMultiplyAdd(a0, b1, p01);
            p10 = coopMultiplyAdd(a1, b0, p10);
            p11 = coopMultiplyAdd(a1, b1, p11);
        }
        // a range ends: its partials join the sums, in range order
        if ((c + 1u) % (KR / 32u) == 0u || c + 1u == nc) {
            c00 = c00 + p00;
            c01 = c01 + p01;
            c10 = c10 + p10;
            c11 = c11 + p11;
            p00 = coop_mat16x16<f32, C>();
            p01 = coop_mat16x16<f32, C>();
            p10 = coop_mat16x16<f32, C>();
            p11 = coop_mat16x16<f32, C>();
        }
    }
    let y = (t0 + ts) * ys + p.y_off + r0 + rs;
    put(c00, y, ys);
    put(c01, y + 16u * ys, ys);
    put(c10, y + 16u, ys);
    put(c11, y + 16u + 16u * ys, ys);
}
