//! Attention at the AVX-512 level: the query heads sharing one KV head against a range of keys,
//! 16 f32 lanes per instruction, with a vector `exp` instead of libm's.
//!
//! Same arithmetic as `avx2::attend_range` (and the shape of `ops::attend_head`, the reference):
//! tiles of `ops::ATT_TILE` keys at absolute positions, online softmax per tile, keys in
//! position order, every query head on its own. Each score is bitwise the AVX2 kernel's (one
//! 8-lane FMA chain per key, two keys per 16-lane register, then `avx2::hsum`'s additions done
//! for 16 keys at once), the softmax sum is added key by key as there, and the values are
//! accumulated with the same FMA per element and key. Only the exponential differs ([`exp16`],
//! within 2 ulp of libm's on the range softmax uses), so results match the scalar reference
//! within the tolerance `cpu::tests` states, and never depend on the batch: a query's
//! arithmetic is a function of its own position, keys and values only.
//!
//! Per key and KV head (head_dim 64, 3 query heads): 4 conversions of K and of V, 12 FMAs for
//! the scores, 12 for the values, ~3 instructions of reduction per score and ~1 of exp: about a
//! quarter of the AVX2 kernel's instructions. [`attend_rows`] takes up to [`MAX_ROWS`] query rows
//! (prefill tokens) at once: they share the conversions and loads of each K/V tile, and the value
//! FMAs of all their heads are interleaved, while each row keeps exactly its own call's arithmetic.

use std::arch::x86_64::*;

use half::f16;

use super::ops::ATT_TILE;

/// Most query heads sharing one KV head that [`attend_range`] takes (as `avx2::MAX_GROUP`).
pub const MAX_GROUP: usize = 8;

/// Whether [`attend_range`] takes heads of `hd` dimensions in groups of `g`.
pub fn supports(hd: usize, g: usize) -> bool {
    hd % 16 == 0 && hd <= 256 && (1..=MAX_GROUP).contains(&g)
}

/// Keys converted from f16 at a time into the f32 tile.
const SUB: usize = 32;

/// Most query rows (tokens) [`attend_rows`] takes at once ([`max_rows`] for a head shape).
pub const MAX_ROWS: usize = 8;

/// Query heads of all rows together: the most running outputs a call keeps.
const MAX_HEADS: usize = MAX_ROWS * MAX_GROUP;

/// 8-float chunks of the queries a call keeps, duplicated into both halves of a register (64 KiB).
const QQ_CAP: usize = 4 * MAX_GROUP * 32;

/// Floats between two (row, head)s' scores of a tile, and between their exponentials of a
/// sub-tile: padded, so no two of a call's (row, head)s sit a multiple of 4 KiB apart (L1 sets).
const SC: usize = ATT_TILE + 16;
const ES: usize = SUB + 16;

/// Most query rows [`attend_rows`] takes for heads of `hd` dimensions in groups of `g`
/// ([`supports`]`(hd, g)`): [`MAX_ROWS`], fewer (at least 4) where their queries would not fit
/// the call's copy of them. A function of the model's shape only.
pub fn max_rows(hd: usize, g: usize) -> usize {
    (QQ_CAP / (g * hd / 8)).min(MAX_ROWS)
}

/// One query row of [`attend_rows`]: `g` query heads sharing the KV head (`q`: [g, hd]), its keys
/// `start..end` of the call. Without `ml` the normalized output goes to `out` ([g, hd]); with `ml`
/// ([g, 2]) `out` is left unnormalized and each head's running max and sum go to `ml[2h]`,
/// `ml[2h + 1]` for the segment merge in `CpuBackend::attention`.
pub struct Row<'a> {
    /// [g, hd]
    pub q: &'a [f32],
    /// One past the row's last key (absolute, in the slices the call gets).
    pub end: usize,
    /// [g, hd]
    pub out: &'a mut [f32],
    /// [g, 2], or `None` for a normalized output.
    pub ml: Option<&'a mut [f32]>,
}

/// Attention of `g` query heads (`q`: [g, hd]) sharing one KV head over the keys `range` (its
/// start a multiple of `ops::ATT_TILE`; `keys`, `vals`: [>= range.end, hd] f16 rows): one
/// [`Row`] of [`attend_rows`].
///
/// # Safety
/// The CPU must have avx512f (the `Avx512Vnni` level checks it) and [`supports`]`(hd, g)`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn attend_range(q: &[f32], keys: &[f16], vals: &[f16], range: std::ops::Range<usize>, hd: usize, scale: f32, out: &mut [f32], ml: Option<&mut [f32]>) {
    let mut rows = [Row { q, end: range.end, out, ml }];
    // SAFETY: the caller's contract is this one's.
    unsafe { attend_rows(&mut rows, keys, vals, range.start, hd, scale) }
}

/// Attention of up to [`max_rows`]`(hd, g)` query rows against one KV head, each over its keys
/// `start..row.end` (`start` a multiple of `ops::ATT_TILE`; `keys`, `vals`: [>= every end, hd] f16
/// rows). The rows share each conversion of K and V to f32 and each load of it; every row's
/// arithmetic is exactly what a call with that row alone does (tiles at the same absolute
/// positions, the same FMA chains per score and per output element, the same sums key by key),
/// so a token's result never depends on the rows beside it.
///
/// # Safety
/// The CPU must have avx512f (the `Avx512Vnni` level checks it) and [`supports`]`(hd, g)`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub unsafe fn attend_rows(rows: &mut [Row<'_>], keys: &[f16], vals: &[f16], start: usize, hd: usize, scale: f32) {
    const T: usize = ATT_TILE;
    let nr = rows.len();
    let g = rows[0].q.len() / hd;
    assert!(supports(hd, g) && (1..=max_rows(hd, g)).contains(&nr) && start % T == 0);
    let n_keys = rows.iter().map(|r| r.end).max().unwrap_or(0);
    assert!(keys.len() >= n_keys * hd && vals.len() >= n_keys * hd);
    for r in rows.iter() {
        assert!(r.q.len() == g * hd && r.out.len() == g * hd && r.ml.as_ref().is_none_or(|m| m.len() >= 2 * g));
    }
    let c8 = hd / 8;
    // Row r's head h: its tile's scores at scores[(r * g + h) * SC..][..T], its exponentials of
    // a sub-tile at e[(r * g + h) * ES..][..SUB].
    let mut scores = [0f32; MAX_HEADS * SC];
    let mut m = [[f32::NEG_INFINITY; MAX_GROUP]; MAX_ROWS];
    let mut l = [[0f32; MAX_GROUP]; MAX_ROWS];
    let mut e = [0f32; MAX_HEADS * ES];
    // f32 keys (pair layout) or values of one sub-tile. Its first SUB * hd floats are zeroed once:
    // lanes past the last key of a short sub-tile read finite values, never NaN (masked anyway).
    let mut tile_buf = [std::mem::MaybeUninit::<f32>::uninit(); SUB * 256];
    for x in &mut tile_buf[..SUB * hd] {
        x.write(0.0);
    }
    // SAFETY: the first SUB * hd floats were just written.
    let tile = unsafe { std::slice::from_raw_parts_mut(tile_buf.as_mut_ptr() as *mut f32, SUB * hd) };
    // Each (row, head)'s 8-float chunks of q, duplicated into both halves of a register.
    // Row r's head h: its c8 chunks from (r * g + h) * c8 (nr * g * c8 <= QQ_CAP by max_rows).
    let mut qq_buf = [std::mem::MaybeUninit::<__m512>::uninit(); QQ_CAP];
    for (r, row) in rows.iter().enumerate() {
        for (c, x) in row.q.chunks_exact(8).enumerate() {
            qq_buf[r * g * c8 + c].write(dup8(_mm256_loadu_ps(x.as_ptr())));
        }
    }
    let qq = |r: usize, h: usize| -> *const __m512 { qq_buf[(r * g + h) * c8..].as_ptr() as *const __m512 };
    for r in rows.iter_mut() {
        r.out.fill(0.0);
    }
    let scale_v = _mm512_set1_ps(scale);
    let mut start = start;
    while start < n_keys {
        let end = (start + T).min(n_keys);
        // Row r's end in this tile (<= start: the row is done, as its own call would have stopped).
        let mut row_end = [0usize; MAX_ROWS];
        for (re, row) in row_end.iter_mut().zip(rows.iter()) {
            *re = row.end.min(end);
        }
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut tile_max = [[ninf; MAX_GROUP]; MAX_ROWS];
        for s0 in (start..end).step_by(SUB) {
            let n = (end - s0).min(SUB);
            f16_pairs(&keys[s0 * hd..(s0 + n) * hd], hd, tile);
            for r in 0..nr {
                if row_end[r] <= s0 {
                    continue;
                }
                let nk = (row_end[r] - s0).min(SUB);
                for j in (0..nk).step_by(16) {
                    let valid = (nk - j).min(16);
                    let mask: __mmask16 = if valid == 16 { 0xffff } else { (1u16 << valid) - 1 };
                    let k16 = &tile[j * hd..(j + 16) * hd];
                    let mut h = 0;
                    while h < g {
                        let mut s = [_mm512_setzero_ps(); 3];
                        let w = (g - h).min(3);
                        // SAFETY: qq(r, h..h + w) hold c8 chunks each (written above).
                        unsafe {
                            match w {
                                3 => s = dots_n::<3>([qq(r, h), qq(r, h + 1), qq(r, h + 2)], c8, k16),
                                2 => s[..2].copy_from_slice(&dots_n::<2>([qq(r, h), qq(r, h + 1)], c8, k16)),
                                _ => s[0] = dots_n::<1>([qq(r, h)], c8, k16)[0],
                            }
                        }
                        for (i, &si) in s.iter().enumerate().take(w) {
                            let si = _mm512_mask_blend_ps(mask, _mm512_set1_ps(f32::NEG_INFINITY), _mm512_mul_ps(si, scale_v));
                            // SAFETY: (r, h + i)'s scores hold T >= s0 - start + j + 16 floats.
                            unsafe { _mm512_storeu_ps(scores[(r * g + h + i) * SC..].as_mut_ptr().add(s0 - start + j), si) };
                            tile_max[r][h + i] = _mm512_max_ps(tile_max[r][h + i], si);
                        }
                        h += w;
                    }
                }
            }
        }
        let mut m_tile = [[0f32; MAX_GROUP]; MAX_ROWS];
        for r in 0..nr {
            if row_end[r] <= start {
                continue;
            }
            for h in 0..g {
                let m_new = m[r][h].max(_mm512_reduce_max_ps(tile_max[r][h]));
                let corr = (m[r][h] - m_new).exp();
                l[r][h] *= corr;
                for o in rows[r].out[h * hd..(h + 1) * hd].iter_mut() {
                    *o *= corr;
                }
                m[r][h] = m_new;
                m_tile[r][h] = m_new;
            }
        }
        for s0 in (start..end).step_by(SUB) {
            let n = (end - s0).min(SUB);
            f16_rows(&vals[s0 * hd..(s0 + n) * hd], &mut tile[..n * hd]);
            // Valid keys of this sub-tile per row (0: none), and the fewest any active row has.
            let mut nk = [0usize; MAX_ROWS];
            for (k, re) in nk.iter_mut().zip(row_end) {
                *k = re.saturating_sub(s0).min(SUB);
            }
            let mut n_common = SUB;
            for r in 0..nr {
                if nk[r] == 0 {
                    continue;
                }
                n_common = n_common.min(nk[r]);
                for h in 0..g {
                    let mv = _mm512_set1_ps(m_tile[r][h]);
                    for j in (0..nk[r]).step_by(16) {
                        let valid = (nk[r] - j).min(16);
                        let mask: __mmask16 = if valid == 16 { 0xffff } else { (1u16 << valid) - 1 };
                        // SAFETY: (r, h)'s scores hold T >= s0 - start + j + 16 floats, its e SUB >= j + 16.
                        unsafe {
                            let s = _mm512_loadu_ps(scores[(r * g + h) * SC..].as_ptr().add(s0 - start + j));
                            // Lanes past the last key: e = 0 exactly (exp16 clamps, so mask instead).
                            let ev = _mm512_maskz_mov_ps(mask, exp16(_mm512_sub_ps(s, mv)));
                            _mm512_storeu_ps(e[(r * g + h) * ES..].as_mut_ptr().add(j), ev);
                        }
                    }
                }
            }
            // Key by key, as the AVX2 kernel and the reference add them (rows and heads interleaved).
            for r in 0..nr {
                for j in 0..nk[r] {
                    for h in 0..g {
                        l[r][h] += e[(r * g + h) * ES + j];
                    }
                }
            }
            // Values: every (row, head) over the keys all active rows share, then each row's rest.
            let mut outs = [std::ptr::null_mut::<f32>(); MAX_HEADS];
            let mut es = [std::ptr::null::<f32>(); MAX_HEADS];
            let mut cnt = 0;
            for r in 0..nr {
                if nk[r] == 0 {
                    continue;
                }
                for h in 0..g {
                    outs[cnt] = rows[r].out[h * hd..].as_mut_ptr();
                    es[cnt] = e[(r * g + h) * ES..].as_ptr();
                    cnt += 1;
                }
            }
            // SAFETY: every pointer addresses hd floats of a distinct output head (rows own
            // disjoint `out`s) and n_common <= SUB floats of its e; the tile holds n >= nk keys.
            unsafe { accumulate_many(&outs[..cnt], &es[..cnt], 1, tile.as_ptr(), hd, 0..n_common) };
            let mut i = 0;
            for r in 0..nr {
                if nk[r] == 0 {
                    continue;
                }
                if nk[r] > n_common {
                    // SAFETY: as above, for this row's g heads.
                    unsafe { accumulate_many(&outs[i..i + g], &es[i..i + g], 1, tile.as_ptr(), hd, n_common..nk[r]) };
                }
                i += g;
            }
        }
        start = end;
    }
    for (r, row) in rows.iter_mut().enumerate() {
        if let Some(ml) = row.ml.as_deref_mut() {
            for h in 0..g {
                ml[2 * h] = m[r][h];
                ml[2 * h + 1] = l[r][h];
            }
            continue;
        }
        for h in 0..g {
            let inv = if l[r][h] > 0.0 { 1.0 / l[r][h] } else { 0.0 };
            for o in row.out[h * hd..(h + 1) * hd].iter_mut() {
                *o *= inv;
            }
        }
    }
}

/// f16 rows to f32 (length a multiple of 16).
#[inline(always)]
pub(super) fn f16_rows(src: &[f16], dst: &mut [f32]) {
    assert!(src.len() == dst.len() && src.len() % 16 == 0);
    for (d, s) in dst.chunks_exact_mut(16).zip(src.chunks_exact(16)) {
        // SAFETY: AVX-512F enabled in every caller; `s` is 16 f16 = 32 bytes, `d` 16 floats.
        unsafe { _mm512_storeu_ps(d.as_mut_ptr(), _mm512_cvtph_ps(_mm256_loadu_si256(s.as_ptr() as *const __m256i))) }
    }
}

/// [v, v]: an 8-float register in both halves of a 16-float one.
#[inline(always)]
fn dup8(v: __m256) -> __m512 {
    // SAFETY: AVX-512F enabled in every caller.
    unsafe { _mm512_castpd_ps(_mm512_insertf64x4::<1>(_mm512_castps_pd(_mm512_castps256_ps512(v)), _mm256_castps_pd(v))) }
}

/// f16 key rows ([n, hd], n <= SUB) to f32 in pairs: keys 2p and 2p + 1 share 16-float
/// registers, chunk c (dims 8c..8c + 8) of pair p at floats `(p * hd / 8 + c) * 16`: key 2p in
/// the low 8, key 2p + 1 in the high 8 (zeros past an odd last key).
#[inline(always)]
fn f16_pairs(src: &[f16], hd: usize, dst: &mut [f32]) {
    let n = src.len() / hd;
    assert!(src.len() == n * hd && hd % 8 == 0 && dst.len() >= n.div_ceil(2) * 2 * hd);
    for p in 0..n.div_ceil(2) {
        let a = &src[2 * p * hd..(2 * p + 1) * hd];
        let b = if 2 * p + 1 < n { Some(&src[(2 * p + 1) * hd..(2 * p + 2) * hd]) } else { None };
        for c in 0..hd / 8 {
            // SAFETY: F16C/AVX-512F enabled in every caller; each load reads 8 f16 of a row of hd
            // (8c + 8 <= hd), the store 16 floats at (p * hd / 8 + c) * 16 + 16 <= dst.len().
            unsafe {
                let lo = _mm_loadu_si128(a.as_ptr().add(8 * c) as *const __m128i);
                let hi = match b {
                    Some(b) => _mm_loadu_si128(b.as_ptr().add(8 * c) as *const __m128i),
                    None => _mm_setzero_si128(),
                };
                let v = _mm512_cvtph_ps(_mm256_set_m128i(hi, lo));
                _mm512_storeu_ps(dst.as_mut_ptr().add((p * hd / 8 + c) * 16), v);
            }
        }
    }
}

/// Scores of `N` queries (`qs[i]`: its `c8` 8-float chunks, each duplicated in both register
/// halves) against 16 keys in the pair layout of [`f16_pairs`] (`k16`: [16 * 8 * c8] floats),
/// sharing each load of the keys. Per query and key the FMA chain of `avx2::dot8` (8 lanes,
/// chunks in order), then `avx2::hsum`'s additions (lane i + lane i + 4, then 0 + 2 and 1 + 3,
/// then those two) for all 16 keys at once: every lane of the result is bitwise the AVX2
/// kernel's score. Lane j holds key j's.
///
/// # Safety
/// AVX-512F; each `qs[i]` points at `c8` initialized registers.
#[inline(always)]
unsafe fn dots_n<const N: usize>(qs: [*const __m512; N], c8: usize, k16: &[f32]) -> [__m512; N] {
    assert!(k16.len() == 16 * 8 * c8);
    // SAFETY: pair p's chunk c is 16 floats at (p * c8 + c) * 16 < k16.len() (asserted); qs[i].add(c)
    // for c < c8 is initialized (the caller's contract).
    unsafe {
        let mut a = [[_mm512_setzero_ps(); 8]; N];
        for c in 0..c8 {
            let mut qv = [_mm512_setzero_ps(); N];
            for i in 0..N {
                qv[i] = *qs[i].add(c);
            }
            for p in 0..8 {
                let k = _mm512_loadu_ps(k16.as_ptr().add((p * c8 + c) * 16));
                for i in 0..N {
                    a[i][p] = _mm512_fmadd_ps(qv[i], k, a[i][p]);
                }
            }
        }
        let mut s = [_mm512_setzero_ps(); N];
        for i in 0..N {
            s[i] = reduce16(&a[i]);
        }
        s
    }
}

/// The 8 pair accumulators of [`dots_n`] to 16 scores in key order.
#[inline(always)]
fn reduce16(a: &[__m512; 8]) -> __m512 {
    // SAFETY: AVX-512F enabled in every caller.
    unsafe {
        // w_m quarter j = key 4m + j, lanes i + (i + 4) of its chain (a[2m] holds keys 4m, 4m + 1).
        let mut w = [_mm512_setzero_ps(); 4];
        for (m, wm) in w.iter_mut().enumerate() {
            let (x, y) = (a[2 * m], a[2 * m + 1]);
            *wm = _mm512_add_ps(_mm512_shuffle_f32x4::<0x88>(x, y), _mm512_shuffle_f32x4::<0xDD>(x, y));
        }
        // z_n quarter j = [key 8n + j: 0 + 2, 1 + 3 | key 8n + 4 + j: 0 + 2, 1 + 3].
        let mut z = [_mm512_setzero_ps(); 2];
        for (n, zn) in z.iter_mut().enumerate() {
            let (x, y) = (w[2 * n], w[2 * n + 1]);
            *zn = _mm512_add_ps(_mm512_shuffle_ps::<0x44>(x, y), _mm512_shuffle_ps::<0xEE>(x, y));
        }
        // Lane 4j + i = key 4i + j: (0 + 2) + (1 + 3).
        let r = _mm512_add_ps(_mm512_shuffle_ps::<0x88>(z[0], z[1]), _mm512_shuffle_ps::<0xDD>(z[0], z[1]));
        // Back to key order: key k sits in lane 4(k % 4) + k / 4.
        _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r)
    }
}

/// One query's scores against 16 keys ([`dots_n`] with one query).
#[cfg(test)]
#[inline(always)]
fn dots16(qq: &[__m512], k16: &[f32]) -> __m512 {
    // SAFETY: AVX-512F enabled in every caller; qq holds its c8 chunks.
    unsafe { dots_n::<1>([qq.as_ptr()], qq.len(), k16)[0] }
}

/// outs[i] += Σ_j es[i][j · stride] · v[j] for j in `js` (v: rows of hd floats), keys in order:
/// one FMA per element and key, as when each output is accumulated alone; up to 6 outputs share
/// each load of a value row, their running sums in registers 64 floats at a time.
///
/// # Safety
/// AVX-512F; each `outs[i]` addresses hd floats no other entry does, each `es[i]` >
/// (js.end - 1) * stride floats, `v` >= js.end * hd floats; hd a multiple of 16.
#[inline(always)]
pub(super) unsafe fn accumulate_many(outs: &[*mut f32], es: &[*const f32], stride: usize, v: *const f32, hd: usize, js: std::ops::Range<usize>) {
    debug_assert!(outs.len() == es.len() && hd % 16 == 0);
    let mut i = 0;
    while i < outs.len() {
        let n = (outs.len() - i).min(6);
        for c0 in (0..hd).step_by(64) {
            let w = (hd - c0).min(64) / 16;
            // SAFETY: the caller's contract, for outs[i..i + n] and columns c0..c0 + 16w <= hd.
            unsafe {
                match (n, w) {
                    (6, 4) => acc_block::<6, 4>(&outs[i..], &es[i..], stride, v, hd, c0, js.clone()),
                    (3, 4) => acc_block::<3, 4>(&outs[i..], &es[i..], stride, v, hd, c0, js.clone()),
                    (4, 4) => acc_block::<4, 4>(&outs[i..], &es[i..], stride, v, hd, c0, js.clone()),
                    (2, 4) => acc_block::<2, 4>(&outs[i..], &es[i..], stride, v, hd, c0, js.clone()),
                    (n, 4) => {
                        for k in i..i + n {
                            acc_block::<1, 4>(&outs[k..], &es[k..], stride, v, hd, c0, js.clone());
                        }
                    }
                    (n, _) => {
                        for k in i..i + n {
                            acc_block::<1, 1>(&outs[k..], &es[k..], stride, v, hd, c0, js.clone());
                        }
                    }
                }
            }
        }
        i += n;
    }
}

/// [`accumulate_many`] for N outputs and 16·W columns from c0 (W = 1 walks them 16 at a time).
#[inline(always)]
unsafe fn acc_block<const N: usize, const W: usize>(outs: &[*mut f32], es: &[*const f32], stride: usize, v: *const f32, hd: usize, c0: usize, js: std::ops::Range<usize>) {
    let cols = if W == 1 { (hd - c0).min(64) / 16 } else { 1 };
    for cc in 0..cols {
        let c = c0 + 16 * cc;
        // SAFETY: the caller's contract (`accumulate_many`): columns c..c + 16W are inside hd.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); W]; N];
            for k in 0..N {
                for x in 0..W {
                    acc[k][x] = _mm512_loadu_ps(outs[k].add(c + 16 * x));
                }
            }
            for j in js.clone() {
                let row = v.add(j * hd + c);
                let mut vv = [_mm512_setzero_ps(); W];
                for x in 0..W {
                    vv[x] = _mm512_loadu_ps(row.add(16 * x));
                }
                for k in 0..N {
                    let ev = _mm512_set1_ps(*es[k].add(j * stride));
                    for x in 0..W {
                        acc[k][x] = _mm512_fmadd_ps(ev, vv[x], acc[k][x]);
                    }
                }
            }
            for k in 0..N {
                for x in 0..W {
                    _mm512_storeu_ps(outs[k].add(c + 16 * x), acc[k][x]);
                }
            }
        }
    }
}

/// e^x for 16 f32, x clamped to [-88, 88]: x = k·ln2 + r (ln2 split in two for an exact
/// product), e^r by a degree-7 Taylor polynomial (|r| <= ln2/2, truncation < 1e-8 relative),
/// times 2^k through the exponent bits.
#[inline(always)]
pub(super) fn exp16(x: __m512) -> __m512 {
    // SAFETY: AVX-512F is enabled in every caller.
    unsafe {
        let x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-88.0)), _mm512_set1_ps(88.0));
        let k = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)));
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(k, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 5040.0);
        for c in [1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let bits = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_cvtps_epi32(k), _mm512_set1_epi32(127)));
        _mm512_mul_ps(p, _mm512_castsi512_ps(bits))
    }
}

/// Test helper (also for attn512q's tests): row r of `got` (outputs [n, g, hd]) and `got_ml`
/// ((max, sum) pairs [n, 2g], compared when `with_ml`) must be bitwise what [`attend_range`]
/// gives query row r of `q` alone over keys `start..ends[r]`. Callers check avx512f first.
#[cfg(test)]
#[allow(clippy::too_many_arguments)]
pub(super) fn assert_rows_equal_single_row_calls(got: &[f32], got_ml: &[f32], q: &[f32], ends: &[usize], keys: &[f16], vals: &[f16], start: usize, hd: usize, g: usize, with_ml: bool) {
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    for (r, &end) in ends.iter().enumerate() {
        let mut want = vec![0f32; g * hd];
        let mut want_ml = vec![0f32; 2 * g];
        let ml = if with_ml { Some(&mut want_ml[..]) } else { None };
        // SAFETY: the callers checked avx512f; the slices have the lengths attend_range needs.
        unsafe { attend_range(&q[r * g * hd..(r + 1) * g * hd], keys, vals, start..end, hd, 0.125, &mut want, ml) };
        assert!(same(&got[r * g * hd..(r + 1) * g * hd], &want), "hd {hd} g {g}, row {r}, start {start}, ends {ends:?}, ml {with_ml}");
        if with_ml {
            assert!(same(&got_ml[r * 2 * g..(r + 1) * 2 * g], &want_ml), "hd {hd} g {g}, row {r}: (max, sum)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::simd::SimdLevel;

    #[test]
    fn exp16_is_within_2ulp_of_libm_on_softmax_range() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x <= 0.0 {
            let xs: [f32; 16] = std::array::from_fn(|i| x - i as f32 * 1e-3);
            let mut got = [0f32; 16];
            // SAFETY: avx512f checked above.
            unsafe { _mm512_storeu_ps(got.as_mut_ptr(), exp16(_mm512_loadu_ps(xs.as_ptr()))) };
            for (g, v) in got.iter().zip(xs) {
                let want = v.exp();
                worst = worst.max((g - want).abs() / want);
            }
            x += 0.0137;
        }
        assert!(worst < 2.5e-7, "worst relative error {worst}");
    }

    #[test]
    fn dots16_equals_the_avx2_dot_of_each_key_bitwise() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        let hd = 48;
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let k: Vec<f16> = (0..16 * hd).map(|i| f16::from_f32(((i * 7 % 23) as f32 - 11.0) * 0.1)).collect();
        let mut tile = vec![0f32; 16 * hd];
        let mut got = [0f32; 16];
        // SAFETY: avx512f (and so avx2, fma, f16c on every CPU with it) checked above.
        unsafe {
            let qq: Vec<__m512> = q.chunks_exact(8).map(|x| dup8(_mm256_loadu_ps(x.as_ptr()))).collect();
            f16_pairs(&k, hd, &mut tile);
            _mm512_storeu_ps(got.as_mut_ptr(), dots16(&qq, &tile));
        }
        for (j, g) in got.iter().enumerate() {
            // `avx2::dot8` in scalar form: 8 lane chains of exact FMAs over the chunks in order,
            // then hsum's additions.
            let mut v = [0f32; 8];
            for c in 0..hd / 8 {
                for (i, vi) in v.iter_mut().enumerate() {
                    *vi = q[8 * c + i].mul_add(k[j * hd + 8 * c + i].to_f32(), *vi);
                }
            }
            let y: [f32; 4] = std::array::from_fn(|i| v[i] + v[i + 4]);
            let want = (y[0] + y[2]) + (y[1] + y[3]);
            assert_eq!(g.to_bits(), want.to_bits(), "key {j}: {g} vs {want}");
        }
    }

    /// Rows of different lengths in one call (ending inside a sub-tile, at a tile edge, past the
    /// others, one with no keys in the last tile), normalized or with (max, sum): each row's
    /// output bitwise what a call with that row alone gives, at head sizes 64 and 256.
    #[test]
    fn attend_rows_equals_single_row_calls_bitwise() {
        if !SimdLevel::Avx512Vnni.supported() {
            return;
        }
        use crate::backend::cpu::testutil::rand_f32;
        for (hd, g) in [(64, 3), (256, 4), (48, 2), (256, 8)] {
            let n_keys = 300;
            let keys: Vec<f16> = rand_f32(1, n_keys * hd).into_iter().map(f16::from_f32).collect();
            let vals: Vec<f16> = rand_f32(2, n_keys * hd).into_iter().map(f16::from_f32).collect();
            let q = rand_f32(3, MAX_ROWS * g * hd);
            let cases = [(0, [130, 131, 256, 129, 140, 255, 257, 1]), (128, [300, 150, 129, 160, 299, 200, 256, 257]), (0, [1, 17, 32, 33, 2, 16, 31, 64])];
            // The most rows the shape takes, and fewer.
            for (start, ends) in cases.iter().flat_map(|(s, e)| [(*s, &e[..max_rows(hd, g)]), (*s, &e[..3])]) {
                for with_ml in [false, true] {
                    let mut got = vec![0f32; MAX_ROWS * g * hd];
                    let mut got_ml = vec![0f32; MAX_ROWS * 2 * g];
                    {
                        let mut rows: Vec<Row<'_>> = Vec::new();
                        let (mut outs, mut mls) = (got.chunks_exact_mut(g * hd), got_ml.chunks_exact_mut(2 * g));
                        for (r, &end) in ends.iter().enumerate() {
                            let (out, ml) = (outs.next().unwrap(), mls.next().unwrap());
                            rows.push(Row { q: &q[r * g * hd..(r + 1) * g * hd], end, out, ml: with_ml.then_some(ml) });
                        }
                        // SAFETY: avx512f checked above; supports(hd, g) holds for these shapes.
                        unsafe { attend_rows(&mut rows, &keys, &vals, start, hd, 0.125) };
                    }
                    assert_rows_equal_single_row_calls(&got, &got_ml, &q, ends, &keys, &vals, start, hd, g, with_ml);
                }
            }
        }
    }
}
