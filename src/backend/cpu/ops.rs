//! Scalar reference kernels for everything but matmul: norms, RoPE, activations, attention.
//! Each works on one token / one head so the parallel driver can split work without changing
//! the per-token arithmetic (batch invariance).

use half::f16;

/// out = x / sqrt(mean(x^2) + eps) * w, for one token.
pub fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ss: f32 = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let scale = 1.0 / (ss + eps).sqrt();
    for ((o, v), g) in out.iter_mut().zip(x).zip(w) {
        *o = v * scale * g;
    }
}

/// [`rmsnorm`] of every row of `x` ([n, w.len()]) into `out`, 8 rows at a time: each row's sum
/// of squares is the same sequential sum in the same order (8 independent chains instead of one
/// after another: the adds' latency no longer bounds it), so every row gets [`rmsnorm`]'s bits.
pub fn rmsnorm_rows(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    const R: usize = 8;
    let d = w.len();
    let (mut xs, mut os) = (x.chunks_exact(R * d), out.chunks_exact_mut(R * d));
    for (xr, or) in (&mut xs).zip(&mut os) {
        let mut ss = [0f32; R];
        for i in 0..d {
            for (r, s) in ss.iter_mut().enumerate() {
                let v = xr[r * d + i];
                *s += v * v;
            }
        }
        for (r, s) in ss.iter().enumerate() {
            let scale = 1.0 / (s / d as f32 + eps).sqrt();
            for ((o, v), g) in or[r * d..(r + 1) * d].iter_mut().zip(&xr[r * d..(r + 1) * d]).zip(w) {
                *o = v * scale * g;
            }
        }
    }
    for (o, xs) in os.into_remainder().chunks_exact_mut(d).zip(xs.remainder().chunks_exact(d)) {
        rmsnorm(xs, w, eps, o);
    }
}

/// out = (x - mean) / sqrt(var + eps) * w + b, for one token.
pub fn layernorm(x: &[f32], w: &[f32], b: &[f32], eps: f32, out: &mut [f32]) {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for (((o, v), g), bb) in out.iter_mut().zip(x).zip(w).zip(b) {
        *o = (v - mean) * inv * g + bb;
    }
}

/// Rotates adjacent pairs (x[2i], x[2i+1]) of one head by the angles in `cs` = [(cos, sin); hd/2].
pub fn rope_head(x: &mut [f32], cs: &[f32]) {
    for (p, c) in x.chunks_exact_mut(2).zip(cs.chunks_exact(2)) {
        let (x0, x1) = (p[0], p[1]);
        p[0] = x0 * c[0] - x1 * c[1];
        p[1] = x0 * c[1] + x1 * c[0];
    }
}

/// Rotates the pairs (x[i], x[i + rope_dims/2]) of one head (GGML's NeoX mode) by the angles
/// in `cs` = [(cos, sin); head_dim/2] (pair i uses cs[2i], cs[2i + 1]); dimensions from
/// `rope_dims` on are left as they are.
pub fn rope_head_neox(x: &mut [f32], cs: &[f32], rope_dims: usize) {
    let half = rope_dims / 2;
    for i in 0..half {
        let (x0, x1) = (x[i], x[i + half]);
        let (c, s) = (cs[2 * i], cs[2 * i + 1]);
        x[i] = x0 * c - x1 * s;
        x[i + half] = x0 * s + x1 * c;
    }
}

/// (cos, sin) of every pair of a head at position `pos` into `out` ([head_dim/2, 2]): angles
/// θ_i = pos · base^(-2i/rope_dims), by repeated multiplication in f32 as GGML does, divided by
/// `factors[i]` (Llama 3's frequency factors) and multiplied by `freq_scale` (linear scaling);
/// pairs from rope_dims/2 on get (1, 0), no rotation.
pub fn rope_row(pos: u32, rope_dims: usize, base: f32, freq_scale: f32, factors: Option<&[f32]>, out: &mut [f32]) {
    let theta_scale = base.powf(-2.0 / rope_dims as f32);
    let mut theta = pos as f32;
    for (i, cs) in out.chunks_exact_mut(2).enumerate() {
        if 2 * i < rope_dims {
            let ff = factors.and_then(|f| f.get(i)).copied().unwrap_or(1.0);
            let angle = freq_scale * (theta / ff);
            cs[0] = angle.cos();
            cs[1] = angle.sin();
            theta *= theta_scale;
        } else {
            cs[0] = 1.0;
            cs[1] = 0.0;
        }
    }
}

/// (cos, sin) table for positions 0..n_pos: `[n_pos, head_dim/2, 2]` rows of [`rope_row`]
/// (no scaling, no factors).
pub fn rope_table(n_pos: usize, head_dim: usize, rope_dims: usize, base: f32) -> Vec<f32> {
    let mut t = vec![0f32; n_pos * head_dim];
    for (pos, row) in t.chunks_exact_mut(head_dim.max(1)).enumerate() {
        rope_row(pos as u32, rope_dims, base, 1.0, None, row);
    }
    t
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// erf with |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit), computed in f64.
pub fn erf(x: f32) -> f32 {
    let x = x as f64;
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.26551223
            + t * (1.00002368
                + t * (0.37409196
                    + t * (0.09678418
                        + t * (-0.18628806
                            + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277)))))))))
            .exp();
    (if x >= 0.0 { 1.0 - r } else { r - 1.0 }) as f32
}

#[inline]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// √(2/π), the tanh-form GELU's constant (GGML's `SQRT_2_OVER_PI`).
pub const SQRT_2_OVER_PI: f32 = 0.797_884_6;
/// The tanh-form GELU's cubic coefficient (GGML's `GELU_COEF_A`).
pub const GELU_COEF_A: f32 = 0.044_715;

/// GELU, tanh form (Gemma's `gelu_pytorch_tanh`): 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))).
#[inline]
pub fn gelu_tanh(x: f32) -> f32 {
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + GELU_COEF_A * x * x)).tanh())
}

/// Keys per tile of the attention scan. Tiles start at absolute key positions 0, T, 2T, ...,
/// so a query's arithmetic never depends on what else is in the batch.
pub const ATT_TILE: usize = 128;

/// Keys per segment when the x86 SIMD levels split a long context (more than one segment) into
/// work items of their own, merged afterwards (`CpuBackend::attention`): a decode step then has
/// more items than KV heads to spread over the threads. The split depends only on the query's
/// position, so a token's result is the same in every batch; contexts of one segment keep the
/// unsegmented arithmetic.
pub const ATT_SEG: usize = 4 * ATT_TILE;

/// One query head against keys 0..n_keys of one KV head (rows of `head_dim` f16 values):
/// softmax(q·k * scale)-weighted sum of values, written to `out`. Tiled online softmax at absolute
/// tile positions: no allocation, fixed key order. The reference for every attention kernel.
pub fn attend_head(q: &[f32], keys: &[f16], values: &[f16], n_keys: usize, scale: f32, out: &mut [f32]) {
    let dot = |q: &[f32], k: &[f16]| q.iter().zip(k).map(|(a, b)| a * b.to_f32()).fold(0.0, |s: f32, p| s + p);
    let hd = q.len();
    let mut scores = [0f32; ATT_TILE];
    let mut m = f32::NEG_INFINITY;
    let mut l = 0f32;
    out.fill(0.0);
    let mut start = 0;
    while start < n_keys {
        let end = (start + ATT_TILE).min(n_keys);
        let mut tile_max = f32::NEG_INFINITY;
        for (j, s) in (start..end).zip(scores.iter_mut()) {
            *s = dot(q, &keys[j * hd..(j + 1) * hd]) * scale;
            tile_max = tile_max.max(*s);
        }
        let m_new = m.max(tile_max);
        let corr = (m - m_new).exp();
        l *= corr;
        for o in out.iter_mut() {
            *o *= corr;
        }
        for (j, s) in (start..end).zip(scores.iter()) {
            let e = (s - m_new).exp();
            l += e;
            for (o, v) in out.iter_mut().zip(&values[j * hd..(j + 1) * hd]) {
                *o += e * v.to_f32();
            }
        }
        m = m_new;
        start = end;
    }
    let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
    for o in out.iter_mut() {
        *o *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_known_values() {
        for (x, e) in [(0.0f32, 0.0f32), (0.5, 0.520_499_9), (1.0, 0.842_700_8), (-2.0, -0.995_322_3), (3.0, 0.999_977_9)] {
            assert!((erf(x) - e).abs() < 2e-7, "erf({x}) = {} want {e}", erf(x));
        }
    }

    #[test]
    fn attention_matches_naive_softmax() {
        let hd = 8;
        let n = 300; // spans three tiles
        let q: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.3).sin()).collect();
        let keys: Vec<f16> = (0..n * hd).map(|i| f16::from_f32((i as f32 * 0.17).cos())).collect();
        let vals: Vec<f16> = (0..n * hd).map(|i| f16::from_f32((i as f32 * 0.07).sin())).collect();
        let mut out = vec![0f32; hd];
        attend_head(&q, &keys, &vals, n, 0.5, &mut out);
        let s: Vec<f64> = (0..n)
            .map(|j| (0..hd).map(|d| q[d] as f64 * keys[j * hd + d].to_f64()).sum::<f64>() * 0.5)
            .collect();
        let mx = s.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = s.iter().map(|v| (v - mx).exp()).sum();
        for d in 0..hd {
            let want: f64 = (0..n).map(|j| (s[j] - mx).exp() / z * vals[j * hd + d].to_f64()).sum();
            assert!((out[d] as f64 - want).abs() < 1e-5, "dim {d}: {} vs {want}", out[d]);
        }
    }

    #[test]
    fn rope_rotates_pairs() {
        let t = rope_table(4, 4, 4, 10000.0);
        let mut x = [1.0f32, 0.0, 1.0, 0.0];
        rope_head(&mut x, &t[3 * 4..4 * 4]);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[1] - 3f32.sin()).abs() < 1e-6);
        let th = 3.0 * 10000f32.powf(-0.5);
        assert!((x[2] - th.cos()).abs() < 1e-6 && (x[3] - th.sin()).abs() < 1e-6);
    }

    #[test]
    fn rope_neox_rotates_halves_and_scales_angles() {
        // head_dim 8, rope_dims 4: pairs (0, 2) and (1, 3); 4..8 untouched.
        let mut cs = [0f32; 8];
        rope_row(3, 4, 10000.0, 1.0, None, &mut cs);
        assert_eq!(&cs[4..], &[1.0, 0.0, 1.0, 0.0]);
        let mut x = [1.0f32, 1.0, 0.0, 0.0, 5.0, 6.0, 7.0, 8.0];
        rope_head_neox(&mut x, &cs, 4);
        let th1 = 3.0 * 10000f32.powf(-0.5);
        assert!((x[0] - 3f32.cos()).abs() < 1e-6 && (x[2] - 3f32.sin()).abs() < 1e-6);
        assert!((x[1] - th1.cos()).abs() < 1e-6 && (x[3] - th1.sin()).abs() < 1e-6);
        assert_eq!(&x[4..], &[5.0, 6.0, 7.0, 8.0]);
        // Frequency factors divide the angle, the linear scale multiplies it.
        let mut scaled = [0f32; 8];
        rope_row(3, 4, 10000.0, 0.5, Some(&[2.0, 1.0]), &mut scaled);
        assert!((scaled[0] - (3.0f32 / 2.0 * 0.5).cos()).abs() < 1e-6);
        assert!((scaled[2] - (th1 * 0.5).cos()).abs() < 1e-6);
    }

    #[test]
    fn gelu_tanh_known_values() {
        // torch.nn.functional.gelu(x, approximate="tanh")
        for (x, e) in [(0.0f32, 0.0f32), (1.0, 0.841_192), (-1.0, -0.158_808), (2.5, 2.484_916), (-3.0, -0.003_637_4)] {
            assert!((gelu_tanh(x) - e).abs() < 2e-6, "gelu_tanh({x}) = {} want {e}", gelu_tanh(x));
        }
    }

    #[test]
    fn norms() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut o = [0f32; 4];
        rmsnorm(&x, &[1.0; 4], 0.0, &mut o);
        let r = (30.0f32 / 4.0).sqrt();
        assert!((o[3] - 4.0 / r).abs() < 1e-6);
        layernorm(&x, &[2.0; 4], &[1.0; 4], 0.0, &mut o);
        let sd = 1.25f32.sqrt();
        assert!((o[0] - (-1.5 / sd * 2.0 + 1.0)).abs() < 1e-5);
    }
}
