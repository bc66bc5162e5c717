//! Where a model's layers run: `--backend cpu|wgpu|hip|split` and
//! `--tensor-split cpu:N,igpu:M,dgpu:K`.
//!
//! Three tiers: the CPU, the wgpu adapter (`igpu`: an integrated GPU when there is one) and the
//! HIP device (`dgpu`: an AMD GPU through HIP, or an NVIDIA GPU through the same kernels on the
//! CUDA driver). Layers are cut into contiguous runs in the order the split names them
//! (`cpu:10,igpu:8,dgpu:12`: layers 0..10 on the CPU, 10..18 on wgpu, 18..30 on HIP); each GPU
//! tier takes at most one run. Embedding and sampling stay on the CPU; the output norm and logits
//! run on the tier of the last layer when it is a GPU; a layer's KV lives on the tier that runs it.
//!
//! Without `--tensor-split`, `--backend split` chooses: every tier present is calibrated (one
//! decode token through one layer on the CPU, and through 1- and 3-layer stacks on each GPU, so a
//! GPU's fixed cost per step is not counted per layer). Layers run one tier after the other, so
//! the step time is `N_cpu · t_cpu + Σ_gpu (c_gpu + N_gpu · t_gpu)`: every layer goes to the
//! fastest tier that is faster than the CPU for the whole model, as many as fit its memory
//! budget, the rest to the next such tier, then the CPU. No GPU means all layers on the CPU,
//! never an error.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use super::model::{Model, ModelError, SeqBatch};
use crate::backend::hardware;
use crate::backend::hip::{HipContext, HipError, HipLayers};
use crate::backend::offload::{LayerOffload, OffloadError, SeqSpan};
use crate::backend::wgpu::{GpuLayers, KvPrecision, WgpuContext, WgpuError, WgpuOptions};

/// A processor kind of `--tensor-split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// The wgpu adapter (an integrated GPU when there is one).
    Igpu,
    /// The HIP device: a discrete AMD GPU, or an NVIDIA GPU through the CUDA driver.
    Dgpu,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Igpu => "igpu",
            Device::Dgpu => "dgpu",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PlacementError {
    #[error("--tensor-split {0:?}: expected comma-separated DEVICE:LAYERS with DEVICE cpu, igpu or dgpu (e.g. cpu:10,igpu:20)")]
    BadSplit(String),
    #[error("--tensor-split names {got} layers, the model has {n_layer}")]
    LayerCount { got: usize, n_layer: usize },
    #[error("--tensor-split names {0} more than once; each GPU's layers must be one contiguous run")]
    TwoGpuRuns(&'static str),
    #[error("--tensor-split needs --backend split")]
    SplitWithoutSplitBackend,
    #[error("no usable GPU for the wgpu tier: {0}")]
    NoAdapter(String),
    #[error("no usable device for the HIP tier: {0}")]
    NoHip(String),
    #[error("the GPU tiers cannot run this model yet: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("GPU: {0}")]
    Gpu(#[from] WgpuError),
    #[error("HIP: {0}")]
    Hip(#[from] HipError),
    #[error("offloaded layers: {0}")]
    Offload(#[from] OffloadError),
}

/// `cpu:N,igpu:M,dgpu:K`, in layer order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSplit {
    /// (device, number of layers) in layer order.
    pub parts: Vec<(Device, usize)>,
}

impl FromStr for TensorSplit {
    type Err = PlacementError;

    fn from_str(s: &str) -> Result<TensorSplit, PlacementError> {
        let bad = || PlacementError::BadSplit(s.to_string());
        let mut parts = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (dev, n) = part.split_once(':').ok_or_else(bad)?;
            let dev = match dev.trim().to_ascii_lowercase().as_str() {
                "cpu" => Device::Cpu,
                "igpu" | "wgpu" | "gpu" => Device::Igpu,
                "dgpu" | "hip" => Device::Dgpu,
                _ => return Err(bad()),
            };
            parts.push((dev, n.trim().parse::<usize>().map_err(|_| bad())?));
        }
        if parts.is_empty() {
            return Err(bad());
        }
        for d in [Device::Igpu, Device::Dgpu] {
            if parts.iter().filter(|(x, k)| *x == d && *k > 0).count() > 1 {
                return Err(PlacementError::TwoGpuRuns(d.name()));
            }
        }
        Ok(TensorSplit { parts })
    }
}

impl TensorSplit {
    /// The runs of a model of `n_layer` layers in layer order (empty parts left out).
    pub fn runs(&self, n_layer: usize) -> Result<Vec<(Device, Range<usize>)>, PlacementError> {
        let got: usize = self.parts.iter().map(|p| p.1).sum();
        if got != n_layer {
            return Err(PlacementError::LayerCount { got, n_layer });
        }
        let mut at = 0;
        let mut runs = Vec::new();
        for &(d, k) in self.parts.iter().filter(|p| p.1 > 0) {
            runs.push((d, at..at + k));
            at += k;
        }
        Ok(runs)
    }

    /// The wgpu tier's layer range (empty when it has none).
    pub fn gpu_layers(&self, n_layer: usize) -> Result<Range<usize>, PlacementError> {
        Ok(self.runs(n_layer)?.into_iter().find(|r| r.0 == Device::Igpu).map(|r| r.1).unwrap_or(0..0))
    }
}

/// `--backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Every layer on the CPU.
    #[default]
    Cpu,
    /// Every layer on the wgpu adapter (an error when there is none).
    Wgpu,
    /// Every layer on the HIP device (an error when there is none).
    Hip,
    /// Some layers on each tier: `--tensor-split`, or chosen from memory and a calibration run.
    Split,
}

#[derive(Debug, Clone, Default)]
pub struct PlacementOptions {
    /// `--backend`: where layers may run.
    pub backend: BackendChoice,
    /// `--tensor-split`, if given.
    pub split: Option<TensorSplit>,
    /// Accept a software adapter (lavapipe); tests set it.
    pub allow_software: bool,
}

/// One tier's time per decode token (ms), from a calibration run.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    /// Time per layer per decode token, ms.
    pub per_layer_ms: f64,
    /// Fixed cost per step (submit, copies, read-back), whatever the number of layers; 0 on the CPU.
    pub overhead_ms: f64,
}

/// What [`place`] did.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Number of layers in the model.
    pub n_layer: usize,
    /// Runs of layers in layer order.
    pub runs: Vec<(Device, Range<usize>)>,
    /// How the split was chosen, for the start-up line.
    pub reason: String,
}

impl fmt::Display for Placement {
    /// `cpu:N,igpu:M,dgpu:K` in layer order, then the reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.runs.iter().filter(|r| !r.1.is_empty()).map(|(d, r)| format!("{}:{}", d.name(), r.len())).collect();
        write!(f, "{} ({})", parts.join(","), self.reason)
    }
}

/// The GPU tiers a placement may use, opened on demand.
struct Tiers {
    wgpu: Option<Result<Arc<WgpuContext>, String>>,
    hip: Option<Result<Arc<HipContext>, String>>,
    allow_software: bool,
}

impl Tiers {
    fn wgpu(&mut self) -> Result<Arc<WgpuContext>, String> {
        let allow = self.allow_software;
        self.wgpu
            .get_or_insert_with(|| {
                // The wgpu knobs come from FORGE_WGPU_* (the command line's; defaults when unset).
                let opts = WgpuOptions::from_env().map_err(|e| e.to_string())?;
                WgpuContext::new(WgpuOptions { allow_software: allow, ..opts }).map_err(|e| e.to_string())
            })
            .clone()
    }

    fn hip(&mut self) -> Result<Arc<HipContext>, String> {
        self.hip.get_or_insert_with(|| HipContext::get().map_err(|e| e.to_string())).clone()
    }
}

/// Applies `opts` to `model` (see the module docs); call before making run states or KV caches.
pub fn place(model: &mut Model, opts: &PlacementOptions) -> Result<Placement, PlacementError> {
    let n_layer = model.config.n_layer;
    if opts.split.is_some() && opts.backend != BackendChoice::Split {
        return Err(PlacementError::SplitWithoutSplitBackend);
    }
    let mut tiers = Tiers { wgpu: None, hip: None, allow_software: opts.allow_software };
    // The GPU layer runners each name the layer parts they lack (wgpu: Llama's layer plus NeoX RoPE
    // and GeGLU; HIP: Llama's): the automatic split keeps a model that either tier refuses on the
    // CPU, an explicit request for a tier that refuses it is an error that says why.
    let unsupported = if opts.backend == BackendChoice::Cpu { None } else { layers_unsupported(model) };
    if let (Some(why), BackendChoice::Split, None) = (&unsupported, opts.backend, &opts.split) {
        model.offload(Vec::new())?;
        return Ok(Placement { n_layer, runs: vec![(Device::Cpu, 0..n_layer)], reason: format!("auto: {why}") });
    }
    let (runs, reason) = match (opts.backend, &opts.split) {
        (BackendChoice::Cpu, _) => (vec![(Device::Cpu, 0..n_layer)], "--backend cpu".to_string()),
        (BackendChoice::Wgpu, _) => (vec![(Device::Igpu, 0..n_layer)], "--backend wgpu".to_string()),
        (BackendChoice::Hip, _) => (vec![(Device::Dgpu, 0..n_layer)], "--backend hip".to_string()),
        (BackendChoice::Split, Some(s)) => (s.runs(n_layer)?, "--tensor-split".to_string()),
        (BackendChoice::Split, None) => auto_split(model, &mut tiers)?,
    };
    for (d, _) in &runs {
        if let Some(why) = tier_unsupported(model, *d) {
            return Err(PlacementError::Unsupported(why));
        }
    }
    let mut segments = Vec::new();
    for (d, r) in &runs {
        match d {
            Device::Cpu => {}
            Device::Igpu => segments.push(wgpu_segment(model, tiers.wgpu().map_err(PlacementError::NoAdapter)?, r.clone())?),
            Device::Dgpu => segments.push(hip_segment(model, tiers.hip().map_err(PlacementError::NoHip)?, r.clone())?),
        }
    }
    model.offload(segments)?;
    Ok(Placement { n_layer, runs, reason })
}

/// Why a GPU layer runner (wgpu or HIP) cannot run `model`'s layers (naming the architecture and
/// the parts it lacks; wgpu's reason first), if either cannot.
pub fn layers_unsupported(model: &Model) -> Option<String> {
    tier_unsupported(model, Device::Igpu).or_else(|| tier_unsupported(model, Device::Dgpu))
}

/// Why tier `d`'s layer runner cannot run `model`'s layers, if it cannot (the CPU runs every model).
pub fn tier_unsupported(model: &Model, d: Device) -> Option<String> {
    let why = match d {
        Device::Cpu => return None,
        Device::Igpu => crate::backend::wgpu::layers_unsupported(model)?,
        Device::Dgpu => crate::backend::hip::layers_unsupported(model)?,
    };
    Some(format!("this {} model needs {why}", model.config.arch))
}

/// Layers `layers` of `model` on the wgpu adapter of `ctx` (weights uploaded now, f16 KV, a
/// RoPE table for the trained context); with the model's last layer, the output norm and logits
/// too.
pub fn wgpu_segment(model: &Model, ctx: Arc<WgpuContext>, layers: Range<usize>) -> Result<Box<dyn LayerOffload>, WgpuError> {
    let last = layers.end == model.config.n_layer;
    let g = GpuLayers::new(ctx, model, layers, model.config.n_ctx_train, KvPrecision::F16)?;
    Ok(Box::new(if last { g.with_head(model)? } else { g }))
}

/// Layers `layers` of `model` on the HIP device of `ctx` (weights uploaded now, f16 KV, the
/// CPU's RoPE table for the trained context); with the model's last layer, the output norm and
/// logits too.
pub fn hip_segment(model: &Model, ctx: Arc<HipContext>, layers: Range<usize>) -> Result<Box<dyn LayerOffload>, HipError> {
    let last = layers.end == model.config.n_layer;
    Ok(Box::new(HipLayers::new(ctx, model, layers, model.config.n_ctx_train, last)?))
}

/// A GPU tier found by the automatic split, with its calibration and memory budget.
struct GpuTier {
    device: Device,
    name: String,
    cal: Calibration,
    /// bytes it may hold; None: not reported (all layers assumed to fit)
    budget: Option<u64>,
}

/// Calibrates every tier present and gives each GPU faster than the CPU the layers that fit, the
/// fastest last (see the module docs).
fn auto_split(model: &Model, tiers: &mut Tiers) -> Result<(Vec<(Device, Range<usize>)>, String), PlacementError> {
    let n_layer = model.config.n_layer;
    let cpu = calibrate_cpu(model)?;
    let mut notes = vec![format!("CPU {:.3} ms/layer", cpu.per_layer_ms)];
    let mut gpus = Vec::new();
    match tiers.wgpu() {
        Ok(ctx) => {
            let cal = calibrate_segment(model, |r| wgpu_segment_n(model, &ctx, r))?;
            let name = format!("wgpu {}", ctx.adapter().name);
            gpus.push(GpuTier { device: Device::Igpu, name, cal, budget: memory_budget(&ctx) });
        }
        Err(e) => notes.push(format!("no wgpu tier ({e})")),
    }
    match tiers.hip() {
        Ok(ctx) => {
            let cal = calibrate_segment(model, |r| Ok(Box::new(HipLayers::new(ctx.clone(), model, r, 128, false)?) as Box<dyn LayerOffload>))?;
            let budget = Some(ctx.runtime().total_memory() / 10 * 9);
            gpus.push(GpuTier { device: Device::Dgpu, name: format!("hip {}", ctx.describe()), cal, budget });
        }
        Err(e) => notes.push(format!("no HIP tier ({e})")),
    }
    let whole_cpu = n_layer as f64 * cpu.per_layer_ms;
    for g in &gpus {
        notes.push(format!("{} {:.3} ms/layer + {:.3} ms/step", g.name, g.cal.per_layer_ms, g.cal.overhead_ms));
    }
    // GPUs faster than the CPU for the whole model, fastest first
    gpus.retain(|g| g.cal.overhead_ms + n_layer as f64 * g.cal.per_layer_ms < whole_cpu);
    gpus.sort_by(|a, b| a.cal.per_layer_ms.total_cmp(&b.cal.per_layer_ms));
    let per_layer = layer_bytes(model) + kv_bytes_per_layer(model, model.config.n_ctx_train.min(4096));
    let mut end = n_layer;
    let mut runs = Vec::new();
    for g in &gpus {
        let fit = g.budget.map_or(n_layer, |b| (b / per_layer.max(1)) as usize);
        let k = fit.min(end);
        if k > 0 {
            runs.push((g.device, end - k..end));
            end -= k;
        }
    }
    if end > 0 {
        runs.push((Device::Cpu, 0..end));
    }
    runs.reverse();
    let verdict = if gpus.is_empty() { ", the CPU is fastest" } else { "" };
    Ok((runs, format!("auto: {}{verdict}; {:.0} MiB per layer with KV", notes.join(", "), per_layer as f64 / (1 << 20) as f64)))
}

fn wgpu_segment_n(model: &Model, ctx: &Arc<WgpuContext>, layers: Range<usize>) -> Result<Box<dyn LayerOffload>, PlacementError> {
    Ok(Box::new(GpuLayers::new(ctx.clone(), model, layers, 128, KvPrecision::F16)?))
}

/// Weight bytes of one layer (the largest, so the estimate is safe).
fn layer_bytes(model: &Model) -> u64 {
    let g = &model.gguf;
    model
        .weights
        .layers
        .iter()
        .map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down].iter().map(|m| m.view(g).data.len() as u64).sum::<u64>())
        .max()
        .unwrap_or(0)
}

/// f16 K and V of one layer for one sequence of `ctx` positions.
fn kv_bytes_per_layer(model: &Model, ctx: usize) -> u64 {
    (2 * model.config.kv_dim() * ctx * 2) as u64
}

/// Bytes the wgpu adapter may hold: half the available system memory for integrated (and
/// software) adapters, which share it; 90% of the VRAM the PCI scan reports for a discrete one
/// (none for drivers that do not report it, e.g. NVIDIA's).
fn memory_budget(ctx: &WgpuContext) -> Option<u64> {
    let hw = hardware::detect();
    let a = ctx.adapter();
    if a.device_type == "IntegratedGpu" || ctx.is_software() {
        return hw.memory_available_bytes.map(|m| m / 2);
    }
    hw.gpus.iter().find(|g| g.vendor_id.map(u32::from) == Some(a.vendor)).and_then(|g| g.vram_total_bytes).map(|v| v / 10 * 9)
}

const DEPTH: usize = 64;
const REPS: usize = 5;

/// Best time of one decode token (of 5, after a warm-up, at a context of 64 positions) through
/// layer 0 on the model's CPU backend.
pub fn calibrate_cpu(model: &Model) -> Result<Calibration, PlacementError> {
    let mut state = model.new_state(DEPTH);
    let mut kv = super::KvCache::new(&model.config, DEPTH + REPS + 2);
    let toks: Vec<u32> = (0..DEPTH as u32).map(|i| (i * 31 + 7) % model.config.vocab_size as u32).collect();
    let mut best = f64::MAX;
    {
        let mut seq = [SeqBatch { kv: &mut kv, tokens: &toks, logits: super::Logits::None }];
        model.layer_forward(0, &mut state, &mut seq)?;
    }
    for i in 0..=REPS {
        let t = Instant::now();
        let mut seq = [SeqBatch { kv: &mut kv, tokens: &toks[i..i + 1], logits: super::Logits::None }];
        model.layer_forward(0, &mut state, &mut seq)?;
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(Calibration { per_layer_ms: best, overhead_ms: 0.0 })
}

/// A GPU tier's calibration: one decode token through stacks of layers 0..1 and 0..3 made by
/// `make`; the per-layer time is (t3 - t1) / 2, the step overhead t1 minus that.
pub fn calibrate_segment(
    model: &Model,
    make: impl Fn(Range<usize>) -> Result<Box<dyn LayerOffload>, PlacementError>,
) -> Result<Calibration, PlacementError> {
    let n = model.config.n_layer.min(3);
    let t1 = segment_step_ms(model, &*make(0..1)?)?;
    if n == 1 {
        return Ok(Calibration { per_layer_ms: t1, overhead_ms: 0.0 });
    }
    let tn = segment_step_ms(model, &*make(0..n)?)?;
    let per = ((tn - t1) / (n - 1) as f64).max(1e-3);
    Ok(Calibration { per_layer_ms: per, overhead_ms: (t1 - per).max(0.0) })
}

/// Best time of one decode token through `stack`, through the offload interface as
/// `Model::forward` runs it.
fn segment_step_ms(model: &Model, stack: &dyn LayerOffload) -> Result<f64, PlacementError> {
    let e = model.config.n_embd;
    let mut act = stack.new_acts(DEPTH)?;
    let mut gkv = stack.new_kv(DEPTH + REPS + 2)?;
    let mut hidden = vec![0.01f32; DEPTH * e];
    let pos: Vec<u32> = (0..(DEPTH + REPS + 1) as u32).collect();
    stack.forward(&mut act, &mut hidden, &pos[..DEPTH], &mut [SeqSpan { kv: &mut gkv, start: 0, n_tok: DEPTH }], None)?;
    let mut best = f64::MAX;
    let mut one = vec![0.01f32; e];
    for i in 0..=REPS {
        one.fill(0.01);
        let t = Instant::now();
        stack.forward(&mut act, &mut one, &pos[DEPTH + i..DEPTH + i + 1], &mut [SeqSpan { kv: &mut gkv, start: DEPTH + i, n_tok: 1 }], None)?;
        if i > 0 {
            best = best.min(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_splits() {
        let s: TensorSplit = "cpu:10, igpu:20".parse().expect("parses");
        assert_eq!(s.parts, vec![(Device::Cpu, 10), (Device::Igpu, 20)]);
        assert_eq!(s.gpu_layers(30).expect("fits"), 10..30);
        assert!(matches!(s.gpu_layers(31), Err(PlacementError::LayerCount { got: 30, n_layer: 31 })));
        let s: TensorSplit = "igpu:4,cpu:26".parse().expect("parses");
        assert_eq!(s.gpu_layers(30).expect("fits"), 0..4);
        let s: TensorSplit = "cpu:30,igpu:0,dgpu:0".parse().expect("parses");
        assert_eq!(s.gpu_layers(30).expect("fits"), 0..0);
        assert_eq!(s.runs(30).expect("fits"), vec![(Device::Cpu, 0..30)]);
        for bad in ["", "cpu", "cpu:x", "tpu:3", "cpu:-1"] {
            assert!(matches!(bad.parse::<TensorSplit>(), Err(PlacementError::BadSplit(_))), "{bad}");
        }
        let s: TensorSplit = "cpu:10,igpu:8,dgpu:12".parse().expect("three tiers");
        assert_eq!(s.runs(30).expect("fits"), vec![(Device::Cpu, 0..10), (Device::Igpu, 10..18), (Device::Dgpu, 18..30)]);
        let s: TensorSplit = "hip:5,cpu:5".parse().expect("hip is dgpu");
        assert_eq!(s.runs(10).expect("fits"), vec![(Device::Dgpu, 0..5), (Device::Cpu, 5..10)]);
        assert!(matches!("igpu:1,cpu:1,igpu:1".parse::<TensorSplit>(), Err(PlacementError::TwoGpuRuns("igpu"))));
        assert!(matches!("dgpu:1,cpu:1,dgpu:1".parse::<TensorSplit>(), Err(PlacementError::TwoGpuRuns("dgpu"))));
    }

    #[test]
    fn displays_in_layer_order() {
        let p = Placement { n_layer: 30, runs: vec![(Device::Cpu, 0..10), (Device::Igpu, 10..20), (Device::Dgpu, 20..30)], reason: "x".into() };
        assert_eq!(p.to_string(), "cpu:10,igpu:10,dgpu:10 (x)");
        let p = Placement { n_layer: 30, runs: vec![(Device::Cpu, 0..30)], reason: "y".into() };
        assert_eq!(p.to_string(), "cpu:30 (y)");
    }
}
