//! AVX-512 VNNI kernels of the K-quants Q4_K, Q5_K and Q6_K against Q8_K activations (x86-64):
//! the blocks unpack as in `avx2_k`, then per token `vpdpbusd` multiplies 64 u8 weights by 64
//! i8 activations into 16 i32 lanes of 4 values (half the instructions of AVX2's
//! `maddubs` + `madd` per value), times each group of 16's scale. The integer sums and the float
//! formula are the reference's, so results equal it bitwise (`cpu::tests`).

#![cfg(target_arch = "x86_64")]

use std::arch::x86_64::*;

use super::avx2_k::{dot_k_with, KBlock, KQuant, Q4K, Q5K, Q6K};
use super::quant::BlockQ8K;
use super::shared::{tile_rows_with, SharedOut};
use crate::backend::WeightView;
use crate::gguf::{GgmlType, QK_K};

/// Rows `rows` of a Q4_K / Q5_K / Q6_K matrix against `n_tok` Q8_K activation rows (`acts`:
/// [n_tok, cols / 256]), in token tiles of 4 (then single tokens).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub fn matmul_rows_q8k(w: WeightView<'_>, rows: std::ops::Range<usize>, acts: &[BlockQ8K], n_tok: usize, out: &SharedOut) {
    let nb = w.cols / QK_K;
    match w.ty {
        GgmlType::Q4K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot::<Q4K, 4>, dot::<Q4K, 1>),
        GgmlType::Q5K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot::<Q5K, 4>, dot::<Q5K, 1>),
        GgmlType::Q6K => tile_rows_with(w, rows, acts, nb, n_tok, out, dot::<Q6K, 4>, dot::<Q6K, 1>),
        other => unreachable!("avx512_k::matmul_rows_q8k called for {other:?}"),
    }
}

// Everything below is `inline(always)` and only ever inlined into `matmul_rows_q8k`, whose
// features the backend checked at run time before choosing this level.

/// Per block: the weights as 4 vectors of 64 (groups of 32 in pairs, matching 64 contiguous
/// activations), and per vector the scales of its 16 lanes (lanes 4k..4k+4: group of 16 k).
struct Wide {
    q: [__m512i; 4],
    sc: [__m512i; 4],
}

#[inline(always)]
fn widen(b: &KBlock) -> Wide {
    // SAFETY: AVX-512F is enabled in the only caller.
    unsafe {
        let q = std::array::from_fn(|k| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(b.q[2 * k]), b.q[2 * k + 1]));
        let sc = std::array::from_fn(|k| {
            let s = |i: usize| b.sc16[4 * k + i];
            _mm512_setr_epi32(s(0), s(0), s(0), s(0), s(1), s(1), s(1), s(1), s(2), s(2), s(2), s(2), s(3), s(3), s(3), s(3))
        });
        Wide { q, sc }
    }
}

/// Σ sc16 · Σ q·x over the block's groups of 16 (exact integers).
#[inline(always)]
fn sum_qx(_b: &KBlock, w: &Wide, x: &[i8]) -> i32 {
    assert!(x.len() >= 256);
    // SAFETY: AVX-512F/BW/VNNI are enabled in the only caller; each load reads 64 of the 256
    // activation bytes (asserted).
    unsafe {
        let mut s = _mm512_setzero_si512();
        for k in 0..4 {
            let xv = _mm512_loadu_si512(x.as_ptr().add(64 * k) as *const __m512i);
            let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), w.q[k], xv);
            s = _mm512_add_epi32(s, _mm512_mullo_epi32(p, w.sc[k]));
        }
        _mm512_reduce_add_epi32(s)
    }
}

#[inline(always)]
fn dot<K: KQuant, const NT: usize>(w: &[u8], x: [&[BlockQ8K]; NT], out: &mut [f32; NT]) {
    dot_k_with::<K, Wide, NT>(w, x, out, widen, sum_qx)
}
