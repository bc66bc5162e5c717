//! Per-sequence KV cache: f16 keys and values, contiguous per (layer, KV head) so attention
//! scans positions in order with unit stride. Capacity is fixed at creation (prompt + budget);
//! nothing grows during decode.
//!
//! KV for a layer lives on the tier that runs it: the host arrays hold only the layers the CPU
//! runs; a model with offloaded segments keeps their layers' KV in one opaque [`OffloadKv`] per
//! segment (made by the segment on the sequence's first forward call). One length covers every
//! part, so `truncate` is exact for all, and `copy_prefix_from` copies all (each segment's part
//! on its device).

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::config::LlamaConfig;
use crate::backend::offload::OffloadKv;

pub struct KvCache {
    /// [n_cpu_layers, n_head_kv, capacity, head_dim]
    pub k: Vec<f16>,
    /// [n_cpu_layers, n_head_kv, capacity, head_dim]
    pub v: Vec<f16>,
    /// Positions the cache holds per layer and KV head.
    pub capacity: usize,
    /// Positions 0..len hold valid keys and values.
    len: usize,
    n_head_kv: usize,
    head_dim: usize,
    /// Per model layer: its index in `k` / `v`, or `None` when another tier runs it.
    slot: Vec<Option<usize>>,
    /// Per offloaded segment of the model (same order): its layers' keys and values, made on
    /// the first forward call that runs the segment (see `Model::forward`).
    pub(crate) offload: Vec<Option<OffloadKv>>,
}

impl KvCache {
    /// A cache with every layer on the host.
    pub fn new(c: &LlamaConfig, capacity: usize) -> KvCache {
        KvCache::with_cpu_layers(c, capacity, |_| true)
    }

    /// A cache whose host part holds the layers for which `on_cpu(layer)` is true.
    pub fn with_cpu_layers(c: &LlamaConfig, capacity: usize, on_cpu: impl Fn(usize) -> bool) -> KvCache {
        let mut next = 0;
        let slot: Vec<Option<usize>> = (0..c.n_layer)
            .map(|l| {
                on_cpu(l).then(|| {
                    next += 1;
                    next - 1
                })
            })
            .collect();
        let n = next * c.n_head_kv * capacity * c.head_dim;
        KvCache {
            k: vec![f16::ZERO; n],
            v: vec![f16::ZERO; n],
            capacity,
            len: 0,
            n_head_kv: c.n_head_kv,
            head_dim: c.head_dim,
            slot,
            offload: Vec::new(),
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
    /// the primitive behind prefix reuse. Fails when either side lacks the positions or the two
    /// place their layers on different tiers. Offloaded layers are copied on their device.
    pub fn copy_prefix_from(&mut self, src: &KvCache, n: usize) -> Result<(), String> {
        if n > src.len || n > self.capacity || src.n_head_kv != self.n_head_kv || src.head_dim != self.head_dim || src.slot != self.slot {
            return Err(format!("cannot copy {n} positions from a cache of {} into one of capacity {}", src.len, self.capacity));
        }
        if self.offload.len() < src.offload.len() {
            self.offload.resize_with(src.offload.len(), || None);
        }
        // A source that never ran a forward call has no part for a segment, and n = 0.
        for (s, d) in src.offload.iter().zip(self.offload.iter_mut()).filter_map(|(s, d)| Some((s.as_ref()?, d))) {
            match d {
                Some(d) => d.copy_prefix_from(s, n).map_err(|e| e.to_string())?,
                None => {
                    let mut new = s.empty_like(self.capacity).map_err(|e| e.to_string())?;
                    new.copy_prefix_from(s, n).map_err(|e| e.to_string())?;
                    *d = Some(new);
                }
            }
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

    /// The host range of `layer`; empty for a layer another tier runs.
    fn layer_range(&self, layer: usize) -> std::ops::Range<usize> {
        let per_layer = self.n_head_kv * self.capacity * self.head_dim;
        match self.slot.get(layer).copied().flatten() {
            Some(s) => s * per_layer..(s + 1) * per_layer,
            None => 0..0,
        }
    }

    /// Whether the host part holds `layer` (false for offloaded layers).
    pub fn on_host(&self, layer: usize) -> bool {
        matches!(self.slot.get(layer), Some(Some(_)))
    }

    /// Keys and values of one host layer: ([n_head_kv, capacity, head_dim], same); empty for
    /// a layer another tier runs.
    pub fn layer(&self, layer: usize) -> (&[f16], &[f16]) {
        let r = self.layer_range(layer);
        (&self.k[r.clone()], &self.v[r])
    }

    /// Keys and values of one host layer, to write in place (BLEND's re-rotation): as
    /// [`KvCache::layer`].
    pub fn layer_mut(&mut self, layer: usize) -> (&mut [f16], &mut [f16]) {
        let r = self.layer_range(layer);
        (&mut self.k[r.clone()], &mut self.v[r])
    }

    /// Stores rows `k`, `v` ([n_tok, n_head_kv * head_dim]) at positions `start..start+n_tok`.
    pub fn store(&mut self, layer: usize, start: usize, k: &[f32], v: &[f32]) {
        let row = self.n_head_kv * self.head_dim;
        self.store_rows(layer, k, v, |t| start + t, row);
    }

    /// Stores rows `k`, `v` ([n_tok, n_head_kv * head_dim]) at `positions` (one per row, any
    /// order: a forward call over scattered tokens, BLEND's selective recompute).
    pub fn store_at(&mut self, layer: usize, positions: &[u32], k: &[f32], v: &[f32]) {
        let row = self.n_head_kv * self.head_dim;
        debug_assert_eq!(positions.len() * row, k.len());
        self.store_rows(layer, k, v, |t| positions[t] as usize, row);
    }

    fn store_rows(&mut self, layer: usize, k: &[f32], v: &[f32], pos: impl Fn(usize) -> usize, row: usize) {
        let (hd, cap) = (self.head_dim, self.capacity);
        let r = self.layer_range(layer);
        for (src, dst) in [(k, &mut self.k), (v, &mut self.v)] {
            let dst = &mut dst[r.clone()];
            for (t, tok) in src.chunks_exact(row).enumerate() {
                let p = pos(t);
                for (h, head) in tok.chunks_exact(hd).enumerate() {
                    let at = (h * cap + p) * hd;
                    // `f16::from_f32` of each value, 8 at a time (the same F16C rounding)
                    dst[at..at + hd].convert_from_f32_slice(head);
                }
            }
        }
    }

    /// (KV heads, head dimension).
    pub fn head_shape(&self) -> (usize, usize) {
        (self.n_head_kv, self.head_dim)
    }
}
