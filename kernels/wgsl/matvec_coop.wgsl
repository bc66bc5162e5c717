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
// A token's step is a chain: every product of an output's K steps 0, 16, 32, ... waits for the
// one before. Each product takes 16 x 16 weights, which the workgroup dequantizes into
// workgroup memory: for one subgroup alone that is 8 weights per invocation per product, more
// instructions than the product's latency hides (measured: ~220 ns per product, against 36 for
// the bare chain). So SG subgroups share the dequantization of the workgroup's 16 rows, and
// since cooperative-matrix operations need workgroup-uniform control flow, every one of them
// runs the same chain (subgroup 0's result is stored). Stages of KS values of K go through two
// buffers of workgroup memory: while the products of stage s run on one, stage s + 1 (loaded
// into registers during stage s - 1) is dequantized into the other and stage s + 2's loads are
// issued; the operands of each product are loaded while the product before runs.
//
// Batch invariance: the accumulator starts as matmul_coop.wgsl's (0, or Y's value where
// P.accumulate), and each product is coopMultiplyAdd of the same f16 operands in the same K
// order: A the weights as coop_q4_0.wgsl rounds them, B's column 0 the token's values rounded to
// f16. B's other columns hold whatever follows in `sx` (the next chunks, or zeros): an output of
// column 0 depends only on its row of A, column 0 of B and its accumulator, so the row's output
// in column 0 has the bits it has as any token of matmul_coop.wgsl's tiles.

@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;

// subgroups per workgroup (each runs the 16 rows' chain), invocations, values of K per stage,
// chunks of 32 of a stage's row. Chosen on the H200 (1.1B Q4_0, tg128 with every matmul here,
// docs/perf.md): SG x KS 4 x 256 297 t/s; 2 x 256 277, 1 x 256 230, 4 x 128 245, 2 x 128 253,
// 4 x 512 255, 8 x 512 232.
const SG: u32 = 4u;
const NT: u32 = 32u * SG;
const KS: u32 = 256u;
const CS: u32 = KS / 32u;
// row stride of `sa` in f16s: the stage and 8 of padding (16-byte aligned rows); one buffer
const SA: u32 = KS + 8u;
const SAB: u32 = 16u * SA;
// (main holds one weight chunk of a stage per invocation, and at most one vec4 of the token)
const_assert 16u * CS == NT && KS / 4u <= NT;

// two stages' weights, row-major (coop_q4_0.wgsl writes them)
var<workgroup> sa: array<f16, 2u * SAB>;
// two stages' values of the token, then 256 values that stay 0 (B of chunk kk reads
// sx[kk + 16 j + i] for its column j)
var<workgroup> sx: array<f16, 2u * KS + 256u>;
// the accumulator, column-major: column 0 in (Y's values or 0) and out (each subgroup's copy),
// columns 1 .. 15 as they come
var<workgroup> sc: array<f32, 256u * SG>;

// The weights and token values of a stage in registers.
struct Regs {
    w: Raw,
    x: vec4<f32>,
}

// Weight task `task` of stage `s`: chunk s * CS + task % CS of row r0 + task / CS (past the
// row's chunks: zeros, never multiplied).
fn fetch_w(task: u32, r0: u32, s: u32, nc: u32) -> Raw {
    let c = s * CS + task % CS;
    if (c < nc) {
        return load_chunk((r0 + task / CS) * p.row_bytes + c);
    }
    return Raw(vec4<u32>(0u), vec4<u32>(0u), 0u);
}

// The token's vec4 `i` of stage `s`: vec4 i % 8 of chunk s * CS + i / 8.
fn fetch_x(i: u32, s: u32, nc: u32) -> vec4<f32> {
    let c = s * CS + i / 8u;
    if (i < KS / 4u && c < nc) {
        return X[(i % 8u) * nc + c];
    }
    return vec4<f32>(0.0);
}

fn fetch(li: u32, r0: u32, s: u32, nc: u32) -> Regs {
    return Regs(fetch_w(li, r0, s, nc), fetch_x(li, s, nc));
}

// A weight task into buffer `ab` of `sa`: its 32 values at row task / CS, column 32 * (task % CS).
fn stage_w(ab: u32, task: u32, r: Raw) {
    let o = ab + (task / CS) * SA + 32u * (task % CS);
    let d = unpack2x16float(r.s).x;
    dequant_word(o, r.q.x, d);
    dequant_word(o + 4u, r.q.y, d);
    dequant_word(o + 8u, r.q.z, d);
    dequant_word(o + 12u, r.q.w, d);
}

// The token's vec4 `i` into buffer `xb` of `sx`, rounded to f16.
fn stage_x(xb: u32, i: u32, x: vec4<f32>) {
    if (i < KS / 4u) {
        let v = vec4<f16>(x);
        let o = xb + (i / 8u) * 32u + 4u * (i % 8u);
        sx[o] = v.x; sx[o + 1u] = v.y; sx[o + 2u] = v.z; sx[o + 3u] = v.w;
    }
}

// A stage from registers into buffer `b` (0 or 1).
fn stage(b: u32, li: u32, r: Regs) {
    stage_w(b * SAB, li, r.w);
    stage_x(b * KS, li, r.x);
}

// The accumulator's start (the stride as an argument: see matmul_coop.wgsl `start`).
fn start(at: u32, ss: u32) -> coop_mat16x16<f32, C> {
    return coopLoad<coop_mat16x16<f32, C>>(&sc[at], ss);
}

@compute @workgroup_size(NT)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let g = li / 32u;
    let r0 = wg.x * 16u;
    let nc = p.cols / 32u;
    let ns = (nc + CS - 1u) / CS;
    if (li < 16u && p.accumulate != 0u) {
        sc[li] = Y[p.y_off + r0 + li];
    }
    var r = fetch(li, r0, 0u, nc);
    stage(0u, li, r);
    if (ns > 1u) {
        r = fetch(li, r0, 1u, nc);
    }
    workgroupBarrier();
    var acc = start(0u, 16u);
    for (var s = 0u; s < ns; s++) {
        if (s + 1u < ns) {
            stage((s + 1u) % 2u, li, r);
            if (s + 2u < ns) {
                r = fetch(li, r0, s + 2u, nc);
            }
        }
        let ab = (s % 2u) * SAB;
        let xb = (s % 2u) * KS;
        let kn = min(KS, p.cols - s * KS);
        var a = coopLoadT<coop_mat16x16<f16, A>>(&sa[ab], SA);
        var b = coopLoad<coop_mat16x16<f16, B>>(&sx[xb], 16u);
        for (var kk = 16u; kk < kn; kk += 16u) {
            let an = coopLoadT<coop_mat16x16<f16, A>>(&sa[ab + kk], SA);
            let bn = coopLoad<coop_mat16x16<f16, B>>(&sx[xb + kk], 16u);
            acc = coopMultiplyAdd(a, b, acc);
            a = an;
            b = bn;
        }
        acc = coopMultiplyAdd(a, b, acc);
        workgroupBarrier();
    }
    // (each subgroup its own copy: the same values)
    coopStore(acc, &sc[256u * g], 16u);
    workgroupBarrier();
    if (li < 16u) {
        Y[p.y_off + r0 + li] = sc[li];
    }
}
