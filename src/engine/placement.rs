//! Where a model's layers run: `--backend cpu|wgpu|split` and `--tensor-split cpu:N,igpu:M`.
//!
//! Layers are cut into contiguous runs in the order the split names them (`cpu:10,igpu:20`: layers
//! 0..10 on the CPU, 10..30 on the GPU). Embedding, the output norm, logits and sampling stay on
//! the CPU; a layer's KV lives on the tier that runs it. `dgpu:K` is parsed for the HIP tier that
//! is not built yet, and refused with an error that says so.
//!
//! Without `--tensor-split`, `--backend split` chooses: the wgpu adapter ([`WgpuContext::new`]:
//! integrated GPU first, then discrete; software adapters only when allowed) gets the last layers
//! that fit its memory budget, provided a short calibration (one decode token through one layer on
//! the CPU and through 1- and 3-layer stacks on the GPU) finds the whole model faster there. Layers
//! run one tier after the other, so the step time is `N_cpu · t_cpu + c_gpu + N_gpu · t_gpu`
//! (c_gpu: the GPU's fixed cost per step) and every layer belongs on the faster tier unless memory
//! says otherwise. No adapter means all layers on the CPU, never an error.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Instant;

use super::model::{Model, ModelError, SeqBatch};
use crate::backend::hardware;
use crate::backend::offload::{LayerOffload, OffloadError, SeqSpan};
use crate::backend::wgpu::{GpuLayers, KvPrecision, WgpuContext, WgpuError, WgpuOptions};

/// A processor kind of `--tensor-split`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// The wgpu adapter (an integrated GPU when there is one).
    Igpu,
    /// A discrete GPU through HIP: not built yet.
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
    #[error("--tensor-split dgpu:{0}: the HIP (discrete GPU) tier is not built yet; use cpu and igpu")]
    NoHipTier(usize),
    #[error("--tensor-split names igpu more than once; the GPU layers must be one contiguous run")]
    TwoGpuRuns,
    #[error("--tensor-split needs --backend split")]
    SplitWithoutSplitBackend,
    #[error("no usable GPU for the wgpu tier: {0}")]
    NoAdapter(String),
    #[error("the wgpu tier cannot run this model yet: {0}")]
    Unsupported(String),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("GPU: {0}")]
    Gpu(#[from] WgpuError),
    #[error("offloaded layers: {0}")]
    Offload(#[from] OffloadError),
}

/// `cpu:N,igpu:M[,dgpu:K]`, in layer order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSplit {
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
        if let Some(&(_, k)) = parts.iter().find(|(d, k)| *d == Device::Dgpu && *k > 0) {
            return Err(PlacementError::NoHipTier(k));
        }
        if parts.iter().filter(|(d, k)| *d == Device::Igpu && *k > 0).count() > 1 {
            return Err(PlacementError::TwoGpuRuns);
        }
        Ok(TensorSplit { parts })
    }
}

impl TensorSplit {
    /// The GPU's layer range for a model of `n_layer` layers.
    pub fn gpu_layers(&self, n_layer: usize) -> Result<Range<usize>, PlacementError> {
        let got: usize = self.parts.iter().map(|p| p.1).sum();
        if got != n_layer {
            return Err(PlacementError::LayerCount { got, n_layer });
        }
        let mut at = 0;
        for &(d, k) in &self.parts {
            if d == Device::Igpu && k > 0 {
                return Ok(at..at + k);
            }
            at += k;
        }
        Ok(0..0)
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
    /// Some layers on each: `--tensor-split`, or chosen from memory and a calibration run.
    Split,
}

#[derive(Debug, Clone, Default)]
pub struct PlacementOptions {
    pub backend: BackendChoice,
    pub split: Option<TensorSplit>,
    /// Accept a software adapter (lavapipe); tests set it.
    pub allow_software: bool,
}

/// Per-layer time of one decode token on each tier (ms), from [`calibrate`].
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    pub cpu_ms: f64,
    pub gpu_ms: f64,
    /// Fixed GPU cost per step (submit, read-back), whatever the number of layers.
    pub gpu_overhead_ms: f64,
}

/// What [`place`] did.
#[derive(Debug, Clone)]
pub struct Placement {
    pub n_layer: usize,
    pub gpu_layers: Range<usize>,
    /// How the split was chosen, for the start-up line.
    pub reason: String,
}

impl fmt::Display for Placement {
    /// `cpu:N,igpu:M` in layer order (zero parts left out), then the reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = &self.gpu_layers;
        let mut parts = Vec::new();
        for (d, k) in [(Device::Cpu, g.start), (Device::Igpu, g.len()), (Device::Cpu, self.n_layer - g.end)] {
            if k > 0 {
                parts.push(format!("{}:{k}", d.name()));
            }
        }
        write!(f, "{} ({})", parts.join(","), self.reason)
    }
}

/// Applies `opts` to `model` (see the module docs); call before making run states or KV caches.
pub fn place(model: &mut Model, opts: &PlacementOptions) -> Result<Placement, PlacementError> {
    let n_layer = model.config.n_layer;
    let cpu_only = |reason: String| Placement { n_layer, gpu_layers: 0..0, reason };
    if opts.split.is_some() && opts.backend != BackendChoice::Split {
        return Err(PlacementError::SplitWithoutSplitBackend);
    }
    if opts.backend == BackendChoice::Cpu {
        model.offload_none();
        return Ok(cpu_only("--backend cpu".into()));
    }
    let explicit = opts.split.as_ref().map(|s| s.gpu_layers(n_layer)).transpose()?;
    if explicit.as_ref().is_some_and(|r| r.is_empty()) {
        model.offload_none();
        return Ok(cpu_only("--tensor-split".into()));
    }
    if let Some(why) = layers_unsupported(model) {
        // Layers the wgpu runner cannot run: the automatic split keeps them on the CPU, an
        // explicit request is an error that says why.
        model.offload_none();
        if opts.backend == BackendChoice::Split && explicit.is_none() {
            return Ok(cpu_only(format!("auto: {why}")));
        }
        return Err(PlacementError::Unsupported(why));
    }
    // The wgpu knobs come from FORGE_WGPU_* (the command line's; defaults when unset).
    let wgpu_opts = WgpuOptions { allow_software: opts.allow_software, ..WgpuOptions::from_env()? };
    let ctx = match WgpuContext::new(wgpu_opts) {
        Ok(c) => c,
        Err(e) if opts.backend == BackendChoice::Split && explicit.is_none() => {
            model.offload_none();
            return Ok(cpu_only(format!("auto: {e}")));
        }
        Err(e) => return Err(PlacementError::NoAdapter(e.to_string())),
    };
    let (layers, reason) = match (opts.backend, explicit) {
        (BackendChoice::Wgpu, _) => (0..n_layer, "--backend wgpu".to_string()),
        (_, Some(r)) => (r, "--tensor-split".to_string()),
        _ => auto_split(model, &ctx)?,
    };
    let segment = wgpu_segment(model, ctx, layers.clone())?;
    model.offload(vec![segment])?;
    Ok(Placement { n_layer, gpu_layers: layers, reason })
}

/// Why the wgpu layer runner cannot run `model`'s layers (naming the architecture and the parts
/// it lacks), if it cannot.
pub fn layers_unsupported(model: &Model) -> Option<String> {
    let why = crate::backend::wgpu::layers_unsupported(model)?;
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

/// The last layers that fit the adapter's memory budget go to the GPU when it is faster per layer.
fn auto_split(model: &Model, ctx: &Arc<WgpuContext>) -> Result<(Range<usize>, String), PlacementError> {
    let c = &model.config;
    let n_layer = c.n_layer;
    let cal = calibrate(model, ctx)?;
    let name = &ctx.adapter().name;
    // All layers on one tier or the other: the GPU pays its step overhead once.
    let (cpu_all, gpu_all) = (n_layer as f64 * cal.cpu_ms, cal.gpu_overhead_ms + n_layer as f64 * cal.gpu_ms);
    let timing = format!(
        "{name} {:.3} ms/layer + {:.3} ms/step vs CPU {:.3} ms/layer per decode token",
        cal.gpu_ms, cal.gpu_overhead_ms, cal.cpu_ms
    );
    if gpu_all >= cpu_all {
        return Ok((0..0, format!("auto: {timing}, the CPU is faster")));
    }
    let per_layer = layer_bytes(model) + kv_bytes_per_layer(model, c.n_ctx_train.min(4096));
    let (fit, budget) = match memory_budget(ctx) {
        Some(b) => (((b / per_layer.max(1)) as usize).min(n_layer), format!("{:.1} GiB budget", b as f64 / (1u64 << 30) as f64)),
        None => (n_layer, "memory not reported, all layers assumed to fit".to_string()),
    };
    let why = format!("auto: {timing}; {budget}, {:.0} MiB per layer with KV", per_layer as f64 / (1 << 20) as f64);
    Ok((n_layer - fit..n_layer, why))
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

/// Bytes the adapter may hold: half the available system memory for integrated (and software)
/// adapters, which share it; 90% of the VRAM the PCI scan reports for a discrete one (none for
/// drivers that do not report it, e.g. NVIDIA's).
fn memory_budget(ctx: &WgpuContext) -> Option<u64> {
    let hw = hardware::detect();
    let a = ctx.adapter();
    if a.device_type == "IntegratedGpu" || ctx.is_software() {
        return hw.memory_available_bytes.map(|m| m / 2);
    }
    hw.gpus.iter().find(|g| g.vendor_id.map(u32::from) == Some(a.vendor)).and_then(|g| g.vram_total_bytes).map(|v| v / 10 * 9)
}

/// Times one decode token (best of 5 after a warm-up, at a context of 64 positions) through
/// layer 0 on the model's CPU backend, and on the GPU through stacks of 1 and 3 layers: a GPU
/// step has a fixed cost (submit, read-back) that a per-layer figure must not include, so the
/// GPU's per-layer time is (t3 - t1) / 2 and its step overhead t1 - per-layer.
pub fn calibrate(model: &Model, ctx: &Arc<WgpuContext>) -> Result<Calibration, PlacementError> {
    const DEPTH: usize = 64;
    const REPS: usize = 5;
    // CPU: layer 0 alone on a fresh cache filled to DEPTH.
    let mut state = model.new_state(DEPTH);
    let mut kv = super::KvCache::new(&model.config, DEPTH + REPS + 2);
    let toks: Vec<u32> = (0..DEPTH as u32).map(|i| (i * 31 + 7) % model.config.vocab_size as u32).collect();
    let mut cpu_ms = f64::MAX;
    {
        let mut seq = [SeqBatch { kv: &mut kv, tokens: &toks, logits: super::Logits::None }];
        model.layer_forward(0, &mut state, &mut seq)?;
    }
    for i in 0..=REPS {
        let t = Instant::now();
        let mut seq = [SeqBatch { kv: &mut kv, tokens: &toks[i..i + 1], logits: super::Logits::None }];
        model.layer_forward(0, &mut state, &mut seq)?;
        if i > 0 {
            cpu_ms = cpu_ms.min(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let n = model.config.n_layer.min(3);
    let t1 = gpu_step_ms(model, ctx, 1, DEPTH, REPS)?;
    let (gpu_ms, overhead_ms) = if n > 1 {
        let tn = gpu_step_ms(model, ctx, n, DEPTH, REPS)?;
        let per = ((tn - t1) / (n - 1) as f64).max(1e-3);
        (per, (t1 - per).max(0.0))
    } else {
        (t1, 0.0)
    };
    Ok(Calibration { cpu_ms, gpu_ms, gpu_overhead_ms: overhead_ms })
}

/// Best time of one decode token through a GPU stack of layers 0..n, through the offload
/// interface as `Model::forward` runs it.
fn gpu_step_ms(model: &Model, ctx: &Arc<WgpuContext>, n: usize, depth: usize, reps: usize) -> Result<f64, PlacementError> {
    let e = model.config.n_embd;
    let stack: Box<dyn LayerOffload> = Box::new(GpuLayers::new(ctx.clone(), model, 0..n, depth + reps + 2, KvPrecision::F16)?);
    let mut act = stack.new_acts(depth)?;
    let mut gkv = stack.new_kv(depth + reps + 2)?;
    let mut hidden = vec![0.01f32; depth * e];
    let pos: Vec<u32> = (0..(depth + reps + 1) as u32).collect();
    stack.forward(&mut act, &mut hidden, &pos[..depth], &mut [SeqSpan { kv: &mut gkv, start: 0, n_tok: depth }], None)?;
    let mut best = f64::MAX;
    for i in 0..=reps {
        let t = Instant::now();
        let mut one = vec![0.01f32; e];
        stack.forward(&mut act, &mut one, &pos[depth + i..depth + i + 1], &mut [SeqSpan { kv: &mut gkv, start: depth + i, n_tok: 1 }], None)?;
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
        for bad in ["", "cpu", "cpu:x", "tpu:3", "cpu:-1"] {
            assert!(matches!(bad.parse::<TensorSplit>(), Err(PlacementError::BadSplit(_))), "{bad}");
        }
        let e = "cpu:10,dgpu:20".parse::<TensorSplit>().expect_err("no HIP tier");
        assert!(matches!(e, PlacementError::NoHipTier(20)) && e.to_string().contains("not built yet"), "{e}");
        assert!(matches!("igpu:1,cpu:1,igpu:1".parse::<TensorSplit>(), Err(PlacementError::TwoGpuRuns)));
    }

    #[test]
    fn displays_in_layer_order() {
        let p = Placement { n_layer: 30, gpu_layers: 10..20, reason: "x".into() };
        assert_eq!(p.to_string(), "cpu:10,igpu:10,cpu:10 (x)");
        let p = Placement { n_layer: 30, gpu_layers: 0..0, reason: "y".into() };
        assert_eq!(p.to_string(), "cpu:30 (y)");
    }
}
