//! Prefill attention at the AVX-512 level with the queries in the lanes: up to 48 query heads
//! (the `g` heads of up to 16 prefill rows) side by side in 16-lane registers, one key broadcast
//! at a time.
//!
//! Every (query head, key) gets exactly the arithmetic of `attn512::attend_range` (and so of the
//! AVX2 kernel): its score is the 8 chains of `avx2::dot8` (dimension 8c + i in chain i, chunks in
//! order) added as `avx2::hsum` adds them, times the scale; the tile's max, the `exp16` of each
//! score less it, the sum of exponentials key by key, and one FMA per output element and key. Only
//! where those operations happen changes: with the queries transposed (dimension-major) a score
//! register holds 16 query heads' scores of one key, so the 8 chains of a score are 8 registers
//! combined by 7 vertical additions per 16 scores, instead of `attn512::reduce16`'s shuffles; the
//! tile max, the exponentials and the running sums are lane-wise, with no reduction at all; and a
//! converted K/V sub-tile serves 16 rows instead of 8. A row's result is therefore bitwise what
//! `attn512::attend_range` gives it alone (decode), whatever rows share its call
//! (`attend_lanes_equals_single_row_calls_bitwise`).

use std::arch::x86_64::*;

use half::f16;

use super::attn512::{self, accumulate_many, exp16, f16_rows, Row};
use super::ops::ATT_TILE;

/// Most query rows (tokens) [`attend_lanes`] takes at once ([`max_rows`] for a head shape).
pub const MAX_ROWS: usize = 16;

/// Most lanes (query heads of all rows) a call keeps: three registers.
const MAX_LANES: usize = 48;

/// Keys converted from f16 at a time into the f32 tile.
const SUB: usize = 32;

/// Most lanes a call takes for heads of `hd` dimensions: the transposed queries stay within
/// 16 KiB (48 lanes up to `hd` 64, 32 up to 128, 16 for wider heads).
fn lane_cap(hd: usize) -> usize {
    if hd <= 64 {
        MAX_LANES
    } else if hd <= 128 {
        32
    } else {
        16
    }
}

/// Rows [`attend_lanes`] takes for heads of `hd` dimensions in groups of `g`
/// (`attn512::supports(hd, g)`): as many as fill its lanes, at most [`MAX_ROWS`]. A function of
/// the model's shape only.
pub fn max_rows(hd: usize, g: usize) -> usize {
    (lane_cap(hd) / g).clamp(1, MAX_ROWS)
}

/// Whether `n_rows` rows of `g` heads fill at least one register of lanes (below that
/// `attn512::attend_rows` wastes fewer lanes).
pub fn worth(n_rows: usize, g: usize) -> bool {
    n_rows * g >= 16
}

/// A 64-byte aligned array of floats.
#[repr(C, align(64))]
struct A64<const N: usize>([f32; N]);

/// Attention of up to [`max_rows`]`(hd, g)` query rows against one KV head, each over its keys
/// `start..row.end` (`start` a multiple of `ops::ATT_TILE`; `keys`, `vals`: [>= every end, hd]
/// f16 rows), with `attn512::attend_rows`'s contract: every row's result is bitwise what
/// `attn512::attend_range` gives it alone.
///
/// # Safety
/// The CPU must have avx512f (the `Avx512Vnni` level checks it) and `attn512::supports(hd, g)`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn attend_lanes(rows: &mut [Row<'_>], keys: &[f16], vals: &[f16], start: usize, hd: usize, scale: f32) {
    let nr = rows.len();
    let g = rows[0].q.len() / hd;
    assert!(attn512::supports(hd, g) && (1..=max_rows(hd, g)).contains(&nr) && nr * g <= lane_cap(hd) && start % ATT_TILE == 0);
    let n_keys = rows.iter().map(|r| r.end).max().unwrap_or(0);
    assert!(keys.len() >= n_keys * hd && vals.len() >= n_keys * hd && n_keys < i32::MAX as usize);
    for r in rows.iter() {
        assert!(r.q.len() == g * hd && r.out.len() == g * hd && r.ml.as_ref().is_none_or(|m| m.len() >= 2 * g));
    }
    // SAFETY: the features are enabled here, and the shapes were checked above.
    unsafe {
        match (nr * g).div_ceil(16) {
            1 => lanes::<1, 8>(rows, keys, vals, start, hd, scale),
            2 => lanes::<2, 4>(rows, keys, vals, start, hd, scale),
            _ => lanes::<3, 4>(rows, keys, vals, start, hd, scale),
        }
    }
}

/// [`attend_lanes`] with the lanes in `NZ` registers, scores computed `KB` keys at a time.
#[inline(always)]
unsafe fn lanes<const NZ: usize, const KB: usize>(rows: &mut [Row<'_>], keys: &[f16], vals: &[f16], start: usize, hd: usize, scale: f32) {
    const T: usize = ATT_TILE;
    let nr = rows.len();
    let g = rows[0].q.len() / hd;
    let nl = nr * g;
    let w = 16 * NZ;
    let n_keys = rows.iter().map(|r| r.end).max().unwrap_or(0);
    // SAFETY (whole body): AVX-512F/FMA/F16C are enabled in the only caller; every pointer
    // offset is inside the buffer it indexes, as noted at each.
    unsafe {
        // Queries transposed: lane r * g + h of dimension d at qt[d * w + r * g + h]; lanes past
        // nl are zero (their scores are masked).
        let mut qt = A64([0f32; 4096]);
        assert!(hd * w <= qt.0.len());
        for (r, row) in rows.iter().enumerate() {
            for h in 0..g {
                for (d, &x) in row.q[h * hd..(h + 1) * hd].iter().enumerate() {
                    qt.0[d * w + r * g + h] = x;
                }
            }
        }
        // Each lane's end (0 for the padding lanes: every key masked).
        let mut lane_end = [0i32; MAX_LANES];
        for (lane, e) in lane_end.iter_mut().enumerate().take(nl) {
            *e = rows[lane / g].end as i32;
        }
        let ends: [__m512i; NZ] = std::array::from_fn(|z| _mm512_loadu_si512(lane_end.as_ptr().add(16 * z) as *const _));
        for r in rows.iter_mut() {
            r.out.fill(0.0);
        }
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let zero = _mm512_setzero_ps();
        let scale_v = _mm512_set1_ps(scale);
        // Running max and sum per lane.
        let mut m = [f32::NEG_INFINITY; MAX_LANES];
        let mut l = [zero; NZ];
        // A tile's scores (key j's lanes at sc[j]) and a sub-tile's exponentials.
        let mut sc = [[zero; NZ]; T];
        let mut ex = [[zero; NZ]; SUB];
        // f32 keys or values of one sub-tile, rows of hd; zeroed once, so the rows past a short
        // last sub-tile (read by the last KB block of scores, masked) are finite.
        let mut tile = A64([0f32; SUB * 256]);
        let mut start = start;
        while start < n_keys {
            let end = (start + T).min(n_keys);
            let mut tmax = [ninf; NZ];
            for s0 in (start..end).step_by(SUB) {
                let n = (end - s0).min(SUB);
                f16_rows(&keys[s0 * hd..(s0 + n) * hd], &mut tile.0[..n * hd]);
                // n is a multiple of KB except in the context's last sub-tile; the rows past it
                // are keys >= n_keys >= every lane's end, so masked.
                for j0 in (0..n).step_by(KB) {
                    // tile rows j0..j0 + KB <= SUB (KB divides SUB).
                    let s = scores::<NZ, KB>(qt.0.as_ptr(), w, tile.0.as_ptr().add(j0 * hd), hd);
                    for (k, sk) in s.iter().enumerate() {
                        let key = _mm512_set1_epi32((s0 + j0 + k) as i32);
                        for z in 0..NZ {
                            let valid = _mm512_cmpgt_epi32_mask(ends[z], key);
                            let v = _mm512_mask_blend_ps(valid, ninf, _mm512_mul_ps(sk[z], scale_v));
                            // s0 - start + j0 + k < T: j0 + k < SUB and s0 - start <= T - SUB.
                            sc[s0 - start + j0 + k][z] = v;
                            tmax[z] = _mm512_max_ps(tmax[z], v);
                        }
                    }
                }
            }
            // Per lane with keys in this tile, as the single-row kernel: the new max, the
            // correction of the sum and the output (libm's exp, scalar).
            let mut tm = [0f32; MAX_LANES];
            let mut lv = [0f32; MAX_LANES];
            for z in 0..NZ {
                _mm512_storeu_ps(tm.as_mut_ptr().add(16 * z), tmax[z]);
                _mm512_storeu_ps(lv.as_mut_ptr().add(16 * z), l[z]);
            }
            for lane in 0..nl {
                let (r, h) = (lane / g, lane % g);
                if rows[r].end <= start {
                    continue;
                }
                let m_new = m[lane].max(tm[lane]);
                let corr = (m[lane] - m_new).exp();
                lv[lane] *= corr;
                for o in rows[r].out[h * hd..(h + 1) * hd].iter_mut() {
                    *o *= corr;
                }
                m[lane] = m_new;
            }
            let mut mv = [zero; NZ];
            for z in 0..NZ {
                l[z] = _mm512_loadu_ps(lv.as_ptr().add(16 * z));
                mv[z] = _mm512_loadu_ps(m.as_ptr().add(16 * z));
            }
            for s0 in (start..end).step_by(SUB) {
                let n = (end - s0).min(SUB);
                f16_rows(&vals[s0 * hd..(s0 + n) * hd], &mut tile.0[..n * hd]);
                // Exponentials (0 exactly past a lane's end: exp16 clamps, so mask instead), and
                // the sums key by key.
                for j in 0..n {
                    let key = _mm512_set1_epi32((s0 + j) as i32);
                    for z in 0..NZ {
                        let valid = _mm512_cmpgt_epi32_mask(ends[z], key);
                        let ev = _mm512_maskz_mov_ps(valid, exp16(_mm512_sub_ps(sc[s0 - start + j][z], mv[z])));
                        ex[j][z] = ev;
                        l[z] = _mm512_add_ps(l[z], ev);
                    }
                }
                // Values: every lane over the keys all active rows share, then each row's rest
                // (a lane never runs an FMA past its own last key).
                let mut nk = [0usize; MAX_ROWS];
                let mut n_common = SUB;
                for (k, row) in nk.iter_mut().zip(rows.iter()) {
                    *k = row.end.min(end).saturating_sub(s0).min(SUB);
                    if *k > 0 {
                        n_common = n_common.min(*k);
                    }
                }
                let mut outs = [std::ptr::null_mut::<f32>(); MAX_LANES];
                let mut es = [std::ptr::null::<f32>(); MAX_LANES];
                let mut cnt = 0;
                let e0 = ex.as_ptr() as *const f32;
                for (r, row) in rows.iter_mut().enumerate() {
                    if nk[r] == 0 {
                        continue;
                    }
                    for h in 0..g {
                        outs[cnt] = row.out[h * hd..].as_mut_ptr();
                        // Lane r * g + h of key j at ex[j], float j * w + r * g + h.
                        es[cnt] = e0.add(r * g + h);
                        cnt += 1;
                    }
                }
                // SAFETY: every pointer addresses hd floats of a distinct output head (rows own
                // disjoint `out`s) and its lane of keys < n_common <= n (stride w); the tile holds
                // n >= nk keys.
                accumulate_many(&outs[..cnt], &es[..cnt], w, tile.0.as_ptr(), hd, 0..n_common);
                let mut i = 0;
                for &k in nk.iter().take(nr) {
                    if k == 0 {
                        continue;
                    }
                    if k > n_common {
                        // SAFETY: as above, for this row's g heads.
                        accumulate_many(&outs[i..i + g], &es[i..i + g], w, tile.0.as_ptr(), hd, n_common..k);
                    }
                    i += g;
                }
            }
            start = end;
        }
        let mut lv = [0f32; MAX_LANES];
        for z in 0..NZ {
            _mm512_storeu_ps(lv.as_mut_ptr().add(16 * z), l[z]);
        }
        for (r, row) in rows.iter_mut().enumerate() {
            if let Some(ml) = row.ml.as_deref_mut() {
                for h in 0..g {
                    ml[2 * h] = m[r * g + h];
                    ml[2 * h + 1] = lv[r * g + h];
                }
                continue;
            }
            for h in 0..g {
                let lh = lv[r * g + h];
                let inv = if lh > 0.0 { 1.0 / lh } else { 0.0 };
                for o in row.out[h * hd..(h + 1) * hd].iter_mut() {
                    *o *= inv;
                }
            }
        }
    }
}

/// Scores of all lanes (`qt`: the transposed queries, `w` floats per dimension) against the `KB`
/// keys `k` (f32 rows of hd): per lane and key the 8 FMA chains of `avx2::dot8` (chain i over
/// dimensions 8c + i, c in order), then `avx2::hsum`'s additions ((0 + 4) + (2 + 6)) + ((1 + 5)
/// + (3 + 7)). Chains i and i + 4 run together, sharing the loop; each query register serves KB
/// keys, each broadcast key element NZ registers.
///
/// # Safety
/// AVX-512F/FMA; `qt` holds hd * w floats (w >= 16 * NZ), `k` KB * hd.
#[inline(always)]
unsafe fn scores<const NZ: usize, const KB: usize>(qt: *const f32, w: usize, k: *const f32, hd: usize) -> [[__m512; NZ]; KB] {
    // SAFETY: the caller's contract; every offset is d * w + 16z + 16 <= hd * w or kk * hd + d < KB * hd.
    unsafe {
        let zero = _mm512_setzero_ps();
        let mut y = [[[zero; NZ]; KB]; 4];
        for (i, yi) in y.iter_mut().enumerate() {
            let mut a = [[zero; NZ]; KB];
            let mut b = [[zero; NZ]; KB];
            for c in 0..hd / 8 {
                let d = 8 * c + i;
                let mut q0 = [zero; NZ];
                let mut q1 = [zero; NZ];
                for z in 0..NZ {
                    q0[z] = _mm512_load_ps(qt.add(d * w + 16 * z));
                    q1[z] = _mm512_load_ps(qt.add((d + 4) * w + 16 * z));
                }
                for kk in 0..KB {
                    let k0 = _mm512_set1_ps(*k.add(kk * hd + d));
                    let k1 = _mm512_set1_ps(*k.add(kk * hd + d + 4));
                    for z in 0..NZ {
                        a[kk][z] = _mm512_fmadd_ps(q0[z], k0, a[kk][z]);
                        b[kk][z] = _mm512_fmadd_ps(q1[z], k1, b[kk][z]);
                    }
                }
            }
            for kk in 0..KB {
                for z in 0..NZ {
                    yi[kk][z] = _mm512_add_ps(a[kk][z], b[kk][z]);
                }
            }
        }
        let mut s = [[zero; NZ]; KB];
        for kk in 0..KB {
            for z in 0..NZ {
                s[kk][z] = _mm512_add_ps(_mm512_add_ps(y[0][kk][z], y[2][kk][z]), _mm512_add_ps(y[1][kk][z], y[3][kk][z]));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests;
