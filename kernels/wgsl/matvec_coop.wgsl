// matvec_coop.wgsl — one token's matmul of Q4_0 weights on tensor cores (WGSL cooperative
// matrices, 16 x 16 x 16, f16 operands, f32 accumulators), with the bits of matmul_coop.wgsl:
// y[r] = sum_c W[r, c] * x[c]. Composed like matmul_coop.wgsl (the `enable` lines + packed.wgsl +
// packed_q4_0.wgsl + mm_io.wgsl + coop_q4_0.wgsl + this file; coop.rs `kernels`); the layer
// runner's one-token matmul of the matrices that take the tensor cores (plan.rs `Step::CoopVec`).
//   2 storage read  X: array<vec4<f32>>  [cols] f32 activations, chunk-major ("swizzled") as
//                                        matmul_coop.wgsl reads them (mm_x_f32.wgsl)
//
// Dispatch: (rows / 16, 1, 1) workgroups of SG subgroups of 32 invocations; workgroup w writes
// rows 16 w .. 16 w + 15 of token 0 (Y[P.y_off + r]). Rows must be a multiple of 16, cols of 32.
//
// matmul_coop.wgsl cuts K into ranges of KR values and adds the ranges' partial sums in order.
// Here the SG subgroups compute SG ranges' partials side by side: round j stages ranges
// j SG .. j SG + SG - 1 of the workgroup's 16 rows (dequantized to f16, coop_q4_0.wgsl) and of the
// token into workgroup memory, subgroup g runs range j SG + g's chain of KR / 16 products, and
// invocations 0 .. 15 add the partials' column 0 to their row's sum in range order. The next
// round's loads are in flight while a round's products run. (A chain's products wait for each
// other: one chain per subgroup, SG of them at once, instead of one chain over all of K.)
//
// Batch invariance: the sum starts as matmul_coop.wgsl's accumulator (0, or Y's value where
// P.accumulate) and adds the same partials in the same order; a partial is coopMultiplyAdd of
// the same f16 operands in the same K order, from zero: A the weights as coop_q4_0.wgsl rounds
// them, B's column 0 the token's values rounded to f16. B's other columns hold whatever follows
// in `sx`: an output of column 0 depends only on its row of A, column 0 of B and its
// accumulator. Past the last chunk (a last range shorter than KR, the rounds' spare ranges),
// weights are staged as Q4_0 zeros (-0 in f16) and the token as zeros: a shorter range's extra
// products are zeros, which leave its partial as it was (but for the sign of a partial that is
// exactly zero); spare ranges are never added. (Scalar f32 additions here, the cooperative
// matrices' elementwise `+` in the tile: both IEEE f32 adds, the same bits on the H200.)

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

// subgroups per workgroup, each one range per round (coop.rs `ONE_TOKEN_SUBGROUPS`, replaced
// there with this line); invocations. With KR, chosen on the H200 (1.1B Q4_0, tg128 with every
// matmul here, docs/perf.md): KR x SG 128 x 8 365-366 t/s; 256 x 4 301-304, 64 x 8 315-316 (the
// kernel before the ranges, one chain over all of K: 293-294).
const SG: u32 = 8u;
const NT: u32 = 32u * SG;
// values of K per range (coop.rs `K_RANGE`, replaced there with this line; a multiple of 32);
// chunks of 32 per range
const KR: u32 = 128u;
const CR: u32 = KR / 32u;
// row stride of a range's weights in `sa` in f16s (16-byte aligned rows); one range's 16 rows
const SA: u32 = KR + 8u;
const SAB: u32 = 16u * SA;
// weight chunks of a round per invocation; the token's vec4s of a round per invocation
const CI: u32 = 16u * CR * SG / NT;
const XI: u32 = (SG * KR / 4u + NT - 1u) / NT;
// (main holds at most 4 weight chunks and 2 of the token's vec4s per invocation, written out:
// arrays indexed in loops were measured to cost a third of the speed)
const_assert CI * NT == 16u * CR * SG && CI <= 4u && XI <= 2u;

// a round's weights: range g's rows at g * SAB (coop_q4_0.wgsl writes them)
var<workgroup> sa: array<f16, SG * SAB>;
// a round's values of the token, range g's at g * KR, then 256 that stay 0 (B of range g at kk
// reads sx[g KR + kk + 16 j + i] for its column j)
var<workgroup> sx: array<f16, SG * KR + 256u>;
// the subgroups' partials, column-major (column 0: the 16 rows' values)
var<workgroup> sc: array<f32, 256u * SG>;

// Weight task `t` of a round: (range, row, chunk of the range). The 32 lanes of a subgroup take
// 32 / CR rows x CR chunks of one range (8 x 4): their stores into `sa` fall on 8 of the 32
// banks, and each row's chunks are adjacent in W. (Rows of the 8 ranges in a subgroup, as first
// written, put them on 2 banks: tg128 365-370 against 421-428 here; 16 rows x 2 chunks, 408-416,
// reads less adjacent chunks; rows of 130 or 132 f16, which spread the stores further, slow the
// cooperative loads: 375-400. H200, 1.1B Q4_0, docs/perf.md.)
fn task(t: u32) -> vec3<u32> {
    return vec3<u32>(t / (16u * CR), (t / CR) % 16u, t % CR);
}

// Weight task `t` of round `j`: chunk j SG CR + range * CR + chunk of row r0 + row (past the
// row's chunks: zeros).
fn fetch_w(t: u32, r0: u32, j: u32, nc: u32) -> Raw {
    let k = task(t);
    let c = j * SG * CR + k.x * CR + k.z;
    if (c < nc) {
        return load_chunk((r0 + k.y) * p.row_bytes + c);
    }
    return Raw(vec4<u32>(0u), vec4<u32>(0u), 0u);
}

// The token's vec4 `i` of round `j`: vec4 i % 8 of chunk j SG CR + i / 8.
fn fetch_x(i: u32, j: u32, nc: u32) -> vec4<f32> {
    let c = j * SG * CR + i / 8u;
    if (i < SG * KR / 4u && c < nc) {
        return X[(i % 8u) * nc + c];
    }
    return vec4<f32>(0.0);
}

// Weight task `t` into `sa`: its 32 values at its range's region, row, column 32 * chunk.
fn stage_w(t: u32, r: Raw) {
    let k = task(t);
    let o = k.x * SAB + k.y * SA + 32u * k.z;
    let d = unpack2x16float(r.s).x;
    dequant_word(o, r.q.x, d);
    dequant_word(o + 4u, r.q.y, d);
    dequant_word(o + 8u, r.q.z, d);
    dequant_word(o + 12u, r.q.w, d);
}

// The token's vec4 `i` into `sx`, rounded to f16.
fn stage_x(i: u32, x: vec4<f32>) {
    if (i < SG * KR / 4u) {
        let v = vec4<f16>(x);
        let o = (i / 8u) * 32u + 4u * (i % 8u);
        sx[o] = v.x; sx[o + 1u] = v.y; sx[o + 2u] = v.z; sx[o + 3u] = v.w;
    }
}

@compute @workgroup_size(NT)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let g = li / 32u;
    let r0 = wg.x * 16u;
    let nc = p.cols / 32u;
    // ranges, rounds
    let nr = (nc + CR - 1u) / CR;
    let nj = (nr + SG - 1u) / SG;
    var sum = 0.0;
    if (li < 16u && p.accumulate != 0u) {
        sum = Y[p.y_off + r0 + li];
    }
    // the next round in registers (slots past CI and XI are constant-false branches)
    var w0 = fetch_w(li, r0, 0u, nc);
    var w1: Raw; var w2: Raw; var w3: Raw;
    if (CI > 1u) { w1 = fetch_w(li + NT, r0, 0u, nc); }
    if (CI > 2u) { w2 = fetch_w(li + 2u * NT, r0, 0u, nc); w3 = fetch_w(li + 3u * NT, r0, 0u, nc); }
    var x0 = fetch_x(li, 0u, nc);
    var x1: vec4<f32>;
    if (XI > 1u) { x1 = fetch_x(li + NT, 0u, nc); }
    for (var j = 0u; j < nj; j++) {
        stage_w(li, w0);
        if (CI > 1u) { stage_w(li + NT, w1); }
        if (CI > 2u) { stage_w(li + 2u * NT, w2); stage_w(li + 3u * NT, w3); }
        stage_x(li, x0);
        if (XI > 1u) { stage_x(li + NT, x1); }
        workgroupBarrier();
        if (j + 1u < nj) {
            let n = j + 1u;
            w0 = fetch_w(li, r0, n, nc);
            if (CI > 1u) { w1 = fetch_w(li + NT, r0, n, nc); }
            if (CI > 2u) {
                w2 = fetch_w(li + 2u * NT, r0, n, nc);
                w3 = fetch_w(li + 3u * NT, r0, n, nc);
            }
            x0 = fetch_x(li, n, nc);
            if (XI > 1u) { x1 = fetch_x(li + NT, n, nc); }
        }
        var part = coop_mat16x16<f32, C>();
        var a = coopLoadT<coop_mat16x16<f16, A>>(&sa[g * SAB], SA);
        var b = coopLoad<coop_mat16x16<f16, B>>(&sx[g * KR], 16u);
        for (var kk = 16u; kk < KR; kk += 16u) {
            let an = coopLoadT<coop_mat16x16<f16, A>>(&sa[g * SAB + kk], SA);
            let bn = coopLoad<coop_mat16x16<f16, B>>(&sx[g * KR + kk], 16u);
            part = coopMultiplyAdd(a, b, part);
            a = an;
            b = bn;
        }
        part = coopMultiplyAdd(a, b, part);
        coopStore(part, &sc[256u * g], 16u);
        workgroupBarrier();
        if (li < 16u) {
            for (var s = 0u; s < SG && j * SG + s < nr; s++) {
                sum += sc[256u * s + li];
            }
        }
    }
    if (li < 16u) {
        Y[p.y_off + r0 + li] = sum;
    }
}
