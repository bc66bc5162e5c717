//! [`GpuLayers`] as the engine's offloaded segment (`backend::offload::LayerOffload`), and
//! [`WgpuLayers`]: one stack with its activations and one sequence's cache, for tests and speed
//! measurements.

use std::ops::Range;
use std::sync::Arc;

use super::context::WgpuContext;
use super::kv::KvPrecision;
use super::layers::{GpuActivations, GpuLayers, Prof};
use super::WgpuError;
use crate::backend::offload::{LayerOffload, LogitRows, ModelTensors, OffloadActs, OffloadError, OffloadKv, SeqSpan};

impl LayerOffload for GpuLayers {
    fn device(&self) -> String {
        let a = self.context().adapter();
        format!("wgpu {} ({}, {})", a.name, a.device_type, a.backend)
    }

    fn layers(&self) -> Range<usize> {
        self.range()
    }

    fn has_head(&self) -> bool {
        self.head_rows().is_some()
    }

    fn max_positions(&self) -> usize {
        self.n_pos()
    }

    fn weight_bytes(&self) -> u64 {
        self.weights_on_gpu()
    }

    fn new_acts(&self, max_tokens: usize) -> Result<OffloadActs, OffloadError> {
        Ok(OffloadActs::new(self.activations(max_tokens)?))
    }

    fn new_kv(&self, capacity: usize) -> Result<OffloadKv, OffloadError> {
        Ok(OffloadKv::new(self.new_gpu_kv(capacity)?))
    }

    fn forward(
        &self,
        acts: &mut OffloadActs,
        hidden: &mut [f32],
        positions: &[u32],
        seqs: &mut [SeqSpan<'_>],
        logits: Option<LogitRows<'_>>,
    ) -> Result<(), OffloadError> {
        let act = acts.get_mut::<GpuActivations>().ok_or_else(|| WgpuError::Unsupported("activations of another backend".into()))?;
        let head = match logits {
            None => None,
            Some(LogitRows { rows, out }) => {
                let Some(vocab) = self.head_rows() else { return Err(WgpuError::Unsupported("logits without an output head".into()).into()) };
                if out.len() != rows.len() * vocab || rows.iter().any(|&r| r as usize >= positions.len()) {
                    return Err(WgpuError::BadShape { got: out.len(), expected: rows.len() * vocab }.into());
                }
                Some((rows, out))
            }
        };
        self.step(act, hidden, positions, seqs, Prof::Off, head)?;
        Ok(())
    }
}

/// Layers `[a, b)` of a model on the GPU for one sequence: [`GpuLayers`], its activations and
/// one KV cache, with the cached length tracked here.
pub struct WgpuLayers {
    stack: GpuLayers,
    act: GpuActivations,
    kv: OffloadKv,
    /// Positions 0..len of the KV cache are valid.
    len: usize,
}

impl WgpuLayers {
    /// Uploads layers `layers` of `model` with an f16 KV cache of `kv_capacity` positions
    /// (clamped to the trained context), for steps of up to `max_tokens` tokens.
    pub fn new(ctx: Arc<WgpuContext>, model: &dyn ModelTensors, layers: Range<usize>, max_tokens: usize, kv_capacity: usize) -> Result<WgpuLayers, WgpuError> {
        WgpuLayers::with_kv(ctx, model, layers, max_tokens, kv_capacity, KvPrecision::F16)
    }

    pub fn with_kv(
        ctx: Arc<WgpuContext>,
        model: &dyn ModelTensors,
        layers: Range<usize>,
        max_tokens: usize,
        kv_capacity: usize,
        kv: KvPrecision,
    ) -> Result<WgpuLayers, WgpuError> {
        let capacity = kv_capacity.clamp(1, model.shape().n_ctx_train);
        let stack = GpuLayers::new(ctx, model, layers, capacity, kv)?;
        let act = stack.activations(max_tokens)?;
        let kv = OffloadKv::new(stack.new_gpu_kv(capacity)?);
        Ok(WgpuLayers { stack, act, kv, len: 0 })
    }

    pub fn layers(&self) -> Range<usize> {
        self.stack.range()
    }

    /// Valid KV positions.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.kv.capacity()
    }

    pub fn max_tokens(&self) -> usize {
        self.act.max_tokens()
    }

    /// Forgets positions `len..` (a rejected draft, a new prompt); the next token goes at `len`.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Bytes of weights and KV cache held on the GPU.
    pub fn gpu_bytes(&self) -> u64 {
        self.stack.weights_on_gpu() + self.kv.bytes()
    }

    /// Runs this range's layers over `hidden` ([n_tok, n_embd], replaced by the layers' output)
    /// for tokens at `positions`, which must continue the sequence: `len(), len()+1, ...`.
    /// Their keys and values are appended to the GPU KV cache.
    pub fn forward(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<(), WgpuError> {
        self.step(hidden, positions, Prof::Off).map(|_| ())
    }

    /// [`forward`](Self::forward) with GPU timestamps per kind of dispatch (see
    /// `GpuLayers::measured`).
    pub fn forward_profiled(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        self.step(hidden, positions, Prof::Dispatches)
    }

    /// [`forward`](Self::forward) timed as a whole (see `GpuLayers::measured`).
    pub fn forward_timed(&mut self, hidden: &mut [f32], positions: &[u32]) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        self.step(hidden, positions, Prof::Span)
    }

    fn step(&mut self, hidden: &mut [f32], positions: &[u32], prof: Prof) -> Result<Option<Vec<(&'static str, f64)>>, WgpuError> {
        let mut seqs = [SeqSpan { kv: &mut self.kv, start: self.len, n_tok: positions.len() }];
        let r = match prof {
            Prof::Off => {
                self.stack.step(&mut self.act, hidden, positions, &mut seqs, Prof::Off, None)?;
                None
            }
            _ => self.stack.measured(&mut self.act, hidden, positions, &mut seqs, prof)?,
        };
        self.len += positions.len();
        Ok(r)
    }
}
