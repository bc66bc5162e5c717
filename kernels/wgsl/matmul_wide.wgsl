// matmul_wide.wgsl — the batch (prefill) matmul of the repacked types (Q4_0, Q4_1, Q8_0) against
// Q8 activations, a wide tile: Y[t, r] = sum_c W[r, c] * X[t, c] for RW = 64 rows x TW = 32
// tokens per workgroup, each thread 4 rows x 2 tokens, the operands staged in workgroup memory a
// few chunks at a time. Composed as packed.wgsl + packed_<type>.wgsl + q8dot_<type>.wgsl +
// mm_io.wgsl + this file; bindings, parameters and outputs are matmul.wgsl's (mm_x_q8.wgsl's X).
// The layer runner's `matmul_wide` pipelines, chosen per step (layers.rs `GpuLayers::wide`) for
// matrices of plan::WIDE_MIN_ROWS rows and more and fewer than WgpuOptions::tile_wide_cols
// columns in steps of WgpuOptions::tile_wide tokens and more, where a row has 32 lanes (the
// GPUs' default); elsewhere matmul_tile.wgsl, with the same bits.
//
// Dispatch: (ceil(rows / RW), ceil(n_tok / TW), 1) workgroups of 256 threads; thread li holds
// rows r0 + 16 j + li % 16 (j = 0..3) of tokens t0 + 16 u + li / 16 (u = 0, 1).
//
// Batch invariance: the float order of matmul.wgsl / matmul_vec.wgsl for every (row, token),
// bitwise. There lane l (of LANES = 32) folds chunks l, l + 32, ... into a sum from zero by
// chunk_q8, and the lane sums are added by the tree of strides 16, 8, 4, 2, 1: a balanced binary
// tree whose leaves, left to right, are the lanes in bit-reversed order (0, 16, 8, 24, 4, ...).
// Here one thread computes all 32 lane sums of its outputs, in that leaf order, four lanes at a
// time (group g: leaves 4g .. 4g + 3, each lane's chunks in increasing order, one accumulator per
// lane), adds the four as the tree does ((a0 + a1) + (a2 + a3)), and folds the group's sum into
// a stack indexed by the bits of g (s2, s3, s4: the subtrees of 4, 8, 16 leaves), so every
// addition has the tree's operands in the tree's order. A lane without chunks (cols < 1024)
// adds 0.0, as the tree does. Nothing about a token's arithmetic depends on the batch or tile.

// P, W and Y: mm_io.wgsl (prepended).
@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;

const LANES: u32 = 32u;
const RW: u32 = 64u;
const TW: u32 = 32u;
// chunks staged at a time: one of each lane of a group
const SC: u32 = 4u;
// whether the type uses Raw.q1 (Q8_0); the context sets it false for the 4-bit types
const HAS_Q1: bool = true;

// [SC][RW] the staged chunks of the workgroup's rows (Raw's q, q1, s)
var<workgroup> WQ: array<vec4<u32>, 256>;
var<workgroup> WQ1: array<vec4<u32>, 256>;
var<workgroup> WS: array<u32, 256>;
// [SC][3][TW] the tokens' Q8 words of the staged chunks (x0, x1, xm)
var<workgroup> XS: array<vec4<u32>, 384>;

// sums of 4 rows (components) x 2 tokens (u0: token slot tg, u1: tg + 16)
struct Acc {
    u0: vec4<f32>,
    u1: vec4<f32>,
}

fn add(a: Acc, b: Acc) -> Acc {
    return Acc(a.u0 + b.u0, a.u1 + b.u1);
}

// the lane (of LANES) at leaf i of the tree
fn leaf_lane(i: u32) -> u32 {
    return reverseBits(i) >> 27u;
}

// Stage slot s (0 .. SC - 1) holds chunk leaf_lane(4 g + s) + LANES k.
fn stage(li: u32, r0: u32, t0: u32, g: u32, k: u32, nc: u32) {
    let s = li / RW;
    let c = leaf_lane(4u * g + s) + LANES * k;
    var raw = Raw(vec4<u32>(0u), vec4<u32>(0u), 0u);
    if (c < nc) {
        raw = load_chunk(min(r0 + li % RW, p.rows - 1u) * p.row_bytes + c);
    }
    WQ[li] = raw.q;
    if (HAS_Q1) {
        WQ1[li] = raw.q1;
    }
    WS[li] = raw.s;
    for (var e = li; e < SC * 3u * TW; e += 256u) {
        let es = e / (3u * TW);
        let part = (e / TW) % 3u;
        let t = t0 + e % TW;
        let ec = leaf_lane(4u * g + es) + LANES * k;
        var v = vec4<u32>(0u);
        if (ec < nc && t < p.n_tok) {
            let xb = t * 3u * nc;
            v = X[select(xb + 2u * ec + part, xb + 2u * nc + ec, part == 2u)];
        }
        XS[e] = v;
    }
}

fn wraw(i: u32) -> Raw {
    return Raw(WQ[i], WQ1[i], WS[i]);
}

// acc + staged chunk s of the thread's 4 rows x 2 tokens (tokens past the last: nothing, so a
// batch of few tokens costs few threads' work; their sums are never stored)
fn slot(acc: Acc, s: u32, rg: u32, tg: u32, live0: bool, live1: bool) -> Acc {
    var out = acc;
    if (!live0) {
        return out;
    }
    let w0 = wraw(s * RW + rg);
    let w1 = wraw(s * RW + 16u + rg);
    let w2 = wraw(s * RW + 32u + rg);
    let w3 = wraw(s * RW + 48u + rg);
    let xa = s * 3u * TW + tg;
    let x0 = XS[xa];
    let x1 = XS[xa + TW];
    let xm = XS[xa + 2u * TW];
    out.u0 = vec4<f32>(chunk_q8(acc.u0.x, w0, x0, x1, xm), chunk_q8(acc.u0.y, w1, x0, x1, xm), chunk_q8(acc.u0.z, w2, x0, x1, xm), chunk_q8(acc.u0.w, w3, x0, x1, xm));
    if (!live1) {
        return out;
    }
    let y0 = XS[xa + 16u];
    let y1 = XS[xa + TW + 16u];
    let ym = XS[xa + 2u * TW + 16u];
    out.u1 = vec4<f32>(chunk_q8(acc.u1.x, w0, y0, y1, ym), chunk_q8(acc.u1.y, w1, y0, y1, ym), chunk_q8(acc.u1.z, w2, y0, y1, ym), chunk_q8(acc.u1.w, w3, y0, y1, ym));
    return out;
}

// output (r, token t) = v: written, or added to (accumulate = 1)
fn put(r: u32, t: u32, v: f32) {
    if (r >= p.rows || t >= p.n_tok) {
        return;
    }
    let y = t * p.y_stride + p.y_off + r;
    if (p.accumulate != 0u) {
        Y[y] = Y[y] + v;
    } else {
        Y[y] = v;
    }
}

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let rg = li % 16u;
    let tg = li / 16u;
    let r0 = wg.x * RW;
    let t0 = wg.y * TW;
    let nc = p.cols / 32u;
    let ks = (nc + LANES - 1u) / LANES;
    let zero = Acc(vec4<f32>(0.0), vec4<f32>(0.0));
    var s2 = zero;
    var s3 = zero;
    var s4 = zero;
    var total = zero;
    let live0 = t0 + tg < p.n_tok;
    let live1 = t0 + tg + 16u < p.n_tok;
    for (var g = 0u; g < 8u; g++) {
        let l0 = leaf_lane(4u * g);
        let l1 = leaf_lane(4u * g + 1u);
        let l2 = leaf_lane(4u * g + 2u);
        let l3 = leaf_lane(4u * g + 3u);
        var a0 = zero;
        var a1 = zero;
        var a2 = zero;
        var a3 = zero;
        for (var k = 0u; k < ks; k++) {
            stage(li, r0, t0, g, k, nc);
            workgroupBarrier();
            let cb = LANES * k;
            if (l0 + cb < nc) {
                a0 = slot(a0, 0u, rg, tg, live0, live1);
            }
            if (l1 + cb < nc) {
                a1 = slot(a1, 1u, rg, tg, live0, live1);
            }
            if (l2 + cb < nc) {
                a2 = slot(a2, 2u, rg, tg, live0, live1);
            }
            if (l3 + cb < nc) {
                a3 = slot(a3, 3u, rg, tg, live0, live1);
            }
            workgroupBarrier();
        }
        // leaves 4g .. 4g + 3: strides 16 and 8 of the tree
        let v = add(add(a0, a1), add(a2, a3));
        // strides 4, 2, 1: the subtrees of 8, 16 and 32 leaves
        if ((g & 1u) == 0u) {
            s2 = v;
        } else {
            let v2 = add(s2, v);
            if ((g & 2u) == 0u) {
                s3 = v2;
            } else {
                let v3 = add(s3, v2);
                if ((g & 4u) == 0u) {
                    s4 = v3;
                } else {
                    total = add(s4, v3);
                }
            }
        }
    }
    let ta = t0 + tg;
    let tb = ta + 16u;
    for (var j = 0u; j < 4u; j++) {
        let r = r0 + 16u * j + rg;
        put(r, ta, total.u0[j]);
        put(r, tb, total.u1[j]);
    }
}
