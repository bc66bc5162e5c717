//! Per-sequence KV cache: f16 keys and values, contiguous per (layer, KV head) so attention
//! scans positions in order with unit stride. Capacity is fixed at creation (prompt + budget);
//! nothing grows during decode.

use half::f16;

use super::config::LlamaConfig;

pub struct KvCache {
    /// [n_layer, n_head_kv, capacity, head_dim]
    pub k: Vec<f16>,
    /// [n_layer, n_head_kv, capacity, head_dim]
    pub v: Vec<f16>,
    pub capacity: usize,
    /// Positions 0..len hold valid keys and values.
    len: usize,
    n_head_kv: usize,
    head_dim: usize,
}

impl KvCache {
    pub fn new(c: &LlamaConfig, capacity: usize) -> KvCache {
        let n = c.n_layer * c.n_head_kv * capacity * c.head_dim;
        KvCache {
            k: vec![f16::ZERO; n],
            v: vec![f16::ZERO; n],
            capacity,
            len: 0,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets positions `len..` (e.g. a rejected draft); the next token is written at `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Makes this cache hold positions 0..n of `src` (another sequence's cache, any capacity):
    /// the primitive behind prefix reuse. Fails when either side lacks the positions.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> Result<(), String> {
        if n > src.len || n > self.capacity || src.n_head_kv != self.n_head_kv || src.head_dim != self.head_dim {
            return Err(format!("cannot copy {n} positions from a cache of {} into one of capacity {}", src.len, self.capacity));
        }
        let hd = self.head_dim;
        let heads = self.k.len() / (self.capacity * hd);
        for lh in 0..heads {
            let (s, d) = (lh * src.capacity * hd, lh * self.capacity * hd);
            self.k[d..d + n * hd].copy_from_slice(&src.k[s..s + n * hd]);
            self.v[d..d + n * hd].copy_from_slice(&src.v[s..s + n * hd]);
        }
        self.len = n;
        Ok(())
    }

    /// Rows (layer, KV head) of the cache: `n_layer * n_head_kv`.
    fn rows(&self) -> usize {
        self.k.len() / (self.capacity * self.head_dim).max(1)
    }

    /// Copies positions `start..start + n` of every (layer, KV head) row into `k` and `v`, laid
    /// out [rows, n, head_dim] (a KV block). Fails when the positions are not all valid.
    pub fn read_range(&self, start: usize, n: usize, k: &mut [f16], v: &mut [f16]) -> Result<(), String> {
        let hd = self.head_dim;
        let rows = self.rows();
        if start + n > self.len || k.len() != rows * n * hd || v.len() != k.len() {
            return Err(format!("cannot read positions {start}..{} of a cache holding {}", start + n, self.len));
        }
        for r in 0..rows {
            let s = (r * self.capacity + start) * hd;
            k[r * n * hd..(r + 1) * n * hd].copy_from_slice(&self.k[s..s + n * hd]);
            v[r * n * hd..(r + 1) * n * hd].copy_from_slice(&self.v[s..s + n * hd]);
        }
        Ok(())
    }

    /// Appends the first `n` positions of a block `k`, `v` laid out [rows, stride, head_dim]
    /// (what [`KvCache::read_range`] wrote with `n = stride`) at position `len`.
    pub fn append_block(&mut self, k: &[f16], v: &[f16], stride: usize, n: usize) -> Result<(), String> {
        let hd = self.head_dim;
        let rows = self.rows();
        if n > stride || self.len + n > self.capacity || k.len() != rows * stride * hd || v.len() != k.len() {
            return Err(format!("cannot append {n} positions to a cache holding {} of {}", self.len, self.capacity));
        }
        for r in 0..rows {
            let d = (r * self.capacity + self.len) * hd;
            let s = r * stride * hd;
            self.k[d..d + n * hd].copy_from_slice(&k[s..s + n * hd]);
            self.v[d..d + n * hd].copy_from_slice(&v[s..s + n * hd]);
        }
        self.len += n;
        Ok(())
    }

    pub(crate) fn advance(&mut self, n: usize) {
        debug_assert!(self.len + n <= self.capacity);
        self.len += n;
    }

    fn layer_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per_layer = self.n_head_kv * self.capacity * self.head_dim;
        layer * per_layer..(layer + 1) * per_layer
    }

    /// Keys and values of one layer: ([n_head_kv, capacity, head_dim], same).
    pub fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        let r = self.layer_range(layer);
        (&self.k[r.clone()], &self.v[r])
    }

    /// Stores rows `k`, `v` ([n_tok, n_head_kv * head_dim]) at positions `start..start+n_tok`.
    pub fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let (hd, cap) = (self.head_dim, self.capacity);
        let r = self.layer_range(layer);
        let row = self.n_head_kv * hd;
        for (src, dst) in [(k, &mut self.k), (v, &mut self.v)] {
            let dst = &mut dst[r.clone()];
            for (t, tok) in src.chunks_exact(row).enumerate() {
                for (h, head) in tok.chunks_exact(hd).enumerate() {
                    let at = (h * cap + start + t) * hd;
                    for (d, s) in dst[at..at + hd].iter_mut().zip(head) {
                        *d = f16::from_f32(*s);
                    }
                }
            }
        }
    }
}
