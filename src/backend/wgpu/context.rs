//! The wgpu device: adapter choice, the compute pipelines (built once), and small helpers to
//! make buffers, record dispatches and read results back.
//!
//! Adapter order: an integrated GPU first (it shares the CPU's memory and usually idles), then a
//! discrete one, then virtual / other adapters; software rasterizers (llvmpipe / lavapipe, device
//! type `Cpu`) only when [`WgpuOptions::allow_software`] is set. Detection never fails:
//! [`WgpuContext::detect`] answers `None` when there is no usable adapter.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::kernel_src::{wide_grid, wide_source, with_lanes};
use super::pipeline::{kernel, Kernel, B};
pub use super::pipeline::WG;
use super::options::{DecodePlan, WgpuOptions};
use super::WgpuError;
use crate::gguf::GgmlType;

/// The weight types with a WGSL dequantizer (the CPU runs every `GgmlType`): the matmul and
/// embedding kernels decode all of them.
pub const WEIGHT_TYPES: [GgmlType; 10] =
    [GgmlType::F32, GgmlType::F16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::BF16];

/// Tokens per matmul workgroup (see matmul.wgsl, and matmul_tile.wgsl's TT).
pub const MM_TOKENS: u32 = 8;
/// Largest head_dim the attention kernel takes.
pub const MAX_HEAD_DIM: usize = 256;
/// Bytes of one parameter window (16 words) of the layer runner's parameter buffer; its slots are
/// `slot_stride` bytes apart (layers.rs).
pub(crate) const PARAM_WINDOW: u64 = 64;

/// A fresh id for a layer stack, an activation set or a KV cache (what a bind group or a step
/// recorded ahead was made for).
pub(crate) fn next_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// What was chosen, for logs and `forge-cache hardware`.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    /// Adapter name as wgpu reports it.
    pub name: String,
    /// wgpu's device type (`DiscreteGpu`, `IntegratedGpu`, `Cpu`, ...).
    pub device_type: String,
    /// wgpu backend (`Vulkan`, `Metal`, ...).
    pub backend: String,
    /// Driver name and driver info.
    pub driver: String,
    /// PCI vendor id (0 when unknown)
    pub vendor: u32,
}

/// What the decode matmul (matmul_vec.wgsl, steps of one token) reads as its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum XSrc {
    /// the activations as they are
    Plain,
    /// RMSNorm folded in (binding 4: the norm weight)
    Norm,
    /// SiLU(gate)·up folded in (the input is the fused gate|up row)
    Silu,
    /// Q8 rows (q8_act.wgsl), integer dot products: Q4_0, Q4_1 and Q8_0 weights (matvec_q8.wgsl)
    Q8,
    /// f32 input quantized to Q8 by every workgroup, RMSNorm optionally folded in
    /// (mvq_x_stage.wgsl, binding 4: the norm weight); integer dot products as `Q8`
    Q8Stage,
    /// the o projection's Q8 input folded by every workgroup from a split attention's chunk
    /// partials (mvq_x_merge.wgsl, bindings 2, 4, 5); integer dot products as `Q8`
    Q8Merge,
}

/// Every pipeline, compiled once per context.
pub(crate) struct Kernels {
    /// batch matmuls against f32 activations (matmul.wgsl), per weight type
    pub matmul: HashMap<GgmlType, Kernel>,
    /// decode matmuls (empty when the plan is `Off`)
    pub matvec: HashMap<(GgmlType, XSrc), Kernel>,
    /// decode matmuls of interleaved gate|up rows with the SiLU·mul epilogue (mv_y_silu.wgsl),
    /// x sources plain and norm; empty when the plan is `Off` or a workgroup holds an odd number of rows
    pub matvec_silu: HashMap<(GgmlType, XSrc), Kernel>,
    /// decode matmuls of the fused q|k|v matrix (staged Q8 input) with RoPE + KV store as the
    /// epilogue (mv_y_rope.wgsl); empty when the plan is `Off` or a workgroup holds an odd number of rows
    pub matvec_rope: HashMap<GgmlType, Kernel>,
    /// batch matmuls of the repacked types against Q8 activations (matmul.wgsl after mm_x_q8.wgsl)
    pub matmul_q8: HashMap<GgmlType, Kernel>,
    /// the same, tiled (matmul_tile.wgsl; the same bits): the layer runner's, empty where
    /// [`WgpuOptions::tile`] is off (the output head keeps matmul_q8: a few rows of tokens)
    pub matmul_tile: HashMap<GgmlType, Kernel>,
    /// the same, wide tiles (matmul_wide.wgsl, same bits): empty unless `tile_wide` applies
    pub matmul_wide: HashMap<GgmlType, Kernel>,
    /// tensor-core matmuls against f32 activations (matmul_coop.wgsl's 64 x 32 and 128 x 64
    /// tiles, matvec_coop.wgsl for one token; the same bits): empty unless
    /// [`WgpuOptions::coop`] applies on the adapter
    pub matmul_coop: HashMap<GgmlType, super::coop::CoopKernels>,
    /// embedding lookup (embed.wgsl), per weight type
    pub embed: HashMap<GgmlType, Kernel>,
    /// RMSNorm (rmsnorm.wgsl)
    pub rmsnorm: Kernel,
    /// RMSNorm written as Q8 rows (rmsnorm_q8.wgsl)
    pub rmsnorm_q8: Kernel,
    /// per-head RMSNorm of q and k in place in the fused q|k|v rows (rmsnorm_heads.wgsl)
    pub rmsnorm_heads: Kernel,
    /// f32 rows to Q8 rows (quantize_q8.wgsl)
    pub quantize_q8: Kernel,
    /// RoPE of every head in place (rope.wgsl)
    pub rope: Kernel,
    /// appends a batch's keys and values to one layer's KV cache (kv_store.wgsl)
    pub kv_store: Kernel,
    /// RoPE + KV store of one sequence (layer runner); parameters at a dynamic offset
    pub rope_store: Kernel,
    /// parameters at a dynamic offset (one slot per sequence of a step)
    pub attention: Kernel,
    /// attention of a sequence's one token with its RoPE and KV store (layer runner, decode)
    pub attention_one: Kernel,
    /// folds the chunk partials of a one-token attention split over chunks (attention_merge.wgsl)
    pub attention_merge: Kernel,
    /// `attention` with one workgroup per KV head and block of tokens (attention_kv.wgsl, same
    /// bits, `attention`'s bind groups); `None` where workgroup memory is too small
    pub attention_kv: Option<Kernel>,
    /// SiLU(gate)·up (silu_mul.wgsl)
    pub silu_mul: Kernel,
    /// SiLU(gate)·up written as Q8 rows (silu_mul_q8.wgsl: silu_mul's values, quantize_q8's rows)
    pub silu_mul_q8: Kernel,
    /// residual add in place (add.wgsl)
    pub add: Kernel,
}

pub struct WgpuContext {
    /// the adapter's logical device
    pub(crate) device: wgpu::Device,
    /// the device's command queue
    pub(crate) queue: wgpu::Queue,
    /// every pipeline, compiled once
    pub(crate) kernels: Kernels,
    summary: AdapterSummary,
    /// Byte alignment of uniform-buffer offsets.
    pub(crate) uniform_align: u64,
    /// Largest storage buffer binding, bytes.
    pub(crate) max_binding: u64,
    /// Threads per matmul row; 256 / lanes rows per workgroup.
    pub(crate) lanes: u32,
    /// Whether GPU timestamps can be written at compute pass boundaries.
    pub(crate) timestamps: bool,
    /// How steps of one token run.
    pub(crate) decode: DecodePlan,
    /// Whether the decode matmuls reduce by subgroup shuffles (subgroups of exactly `lanes`).
    pub(crate) subgroups: bool,
    /// [`WgpuOptions::q8`]
    pub(crate) q8: bool,
    /// [`WgpuOptions::tile`]
    pub(crate) tile: bool,
    /// [`WgpuOptions::tile_wide`] where it applies (tiled, 32 lanes), else 0 (never)
    pub(crate) tile_wide: usize,
    /// [`WgpuOptions::stage`]
    pub(crate) stage: bool,
    /// [`WgpuOptions::attention_one`]
    pub(crate) attention_one: bool,
    /// [`WgpuOptions::attention_split`]
    pub(crate) attention_split: bool,
    /// [`WgpuOptions::o_merge`]
    pub(crate) o_merge: bool,
    /// [`WgpuOptions::submit_layers`]
    pub(crate) submit_layers: usize,
    /// [`WgpuOptions::spin_us`]
    pub(crate) spin: std::time::Duration,
    /// [`WgpuOptions::qkv_rope`]
    pub(crate) qkv_rope: bool,
    /// [`WgpuOptions::coop_wide`] (0: never)
    pub(crate) coop_wide: usize,
    /// Whether the adapter offers what matmul_coop.wgsl needs (whether or not it is used).
    coop_offered: bool,
    /// The options the context was made with.
    options: WgpuOptions,
    /// The first error wgpu reported outside an error scope (validation, device loss).
    uncaptured: Arc<Mutex<Option<String>>>,
}

impl std::fmt::Debug for WgpuContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgpuContext").field("adapter", &self.summary).finish()
    }
}

fn rank(t: wgpu::DeviceType) -> Option<u8> {
    Some(match t {
        wgpu::DeviceType::IntegratedGpu => 0,
        wgpu::DeviceType::DiscreteGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => return None,
    })
}

/// The `dequant_chunk` source of `ty` (16-bit floats share one, with their own `pair16`).
fn weight_source(ty: GgmlType) -> String {
    let half = |pair: &str| format!("{pair}\n{}", include_str!("../../../kernels/wgsl/dequant_16bit.wgsl"));
    match ty {
        GgmlType::F32 => include_str!("../../../kernels/wgsl/dequant_f32.wgsl").into(),
        GgmlType::F16 => half(include_str!("../../../kernels/wgsl/pair_f16.wgsl")),
        GgmlType::BF16 => half(include_str!("../../../kernels/wgsl/pair_bf16.wgsl")),
        GgmlType::Q4_0 => include_str!("../../../kernels/wgsl/dequant_q4_0.wgsl").into(),
        GgmlType::Q4_1 => include_str!("../../../kernels/wgsl/dequant_q4_1.wgsl").into(),
        GgmlType::Q8_0 => include_str!("../../../kernels/wgsl/dequant_q8_0.wgsl").into(),
        GgmlType::Q5_0 => include_str!("../../../kernels/wgsl/dequant_q5_0.wgsl").into(),
        GgmlType::Q4K => format!("{K_SCALE_MIN}\n{}", include_str!("../../../kernels/wgsl/dequant_q4_k.wgsl")),
        GgmlType::Q5K => format!("{K_SCALE_MIN}\n{}", include_str!("../../../kernels/wgsl/dequant_q5_k.wgsl")),
        GgmlType::Q6K => include_str!("../../../kernels/wgsl/dequant_q6_k.wgsl").into(),
        // Only called for `WEIGHT_TYPES`; the others are refused as unsupported before.
        other => unreachable!("no WGSL dequantizer for {}", other.name()),
    }
}

const BYTES: &str = include_str!("../../../kernels/wgsl/bytes.wgsl");
/// Q4_K / Q5_K's 6-bit (scale, min) unpacking, shared by their dequantizers.
const K_SCALE_MIN: &str = include_str!("../../../kernels/wgsl/k_scale_min.wgsl");
const Q8_ACT: &str = include_str!("../../../kernels/wgsl/q8_act.wgsl");
const GATED: &str = include_str!("../../../kernels/wgsl/gated.wgsl");
const Q8_ROWS: &str = include_str!("../../../kernels/wgsl/q8_rows.wgsl");
const RMS_SCALE: &str = include_str!("../../../kernels/wgsl/rms_scale.wgsl");
const RMS_BIND: &str = include_str!("../../../kernels/wgsl/rms_bind.wgsl");
/// Widest input (columns) mvq_x_stage.wgsl and mvq_x_merge.wgsl build in workgroup memory (mvq_x_put.wgsl: XS_WORDS / 3 * 32).
pub(crate) const STAGE_MAX_COLS: usize = 576 / 3 * 32;

/// The `chunk_q8` source (integer dot of a weight chunk with a Q8 block) of a repacked type.
fn q8dot_source(ty: GgmlType) -> Option<String> {
    let nibbles = include_str!("../../../kernels/wgsl/q8dot_nibbles.wgsl");
    Some(match ty {
        GgmlType::Q4_0 => format!("{nibbles}\n{}", include_str!("../../../kernels/wgsl/q8dot_q4_0.wgsl")),
        GgmlType::Q4_1 => format!("{nibbles}\n{}", include_str!("../../../kernels/wgsl/q8dot_q4_1.wgsl")),
        GgmlType::Q8_0 => include_str!("../../../kernels/wgsl/q8dot_q8_0.wgsl").into(),
        _ => return None,
    })
}
const PACKED: &str = include_str!("../../../kernels/wgsl/packed.wgsl");
const ROPE_PAIR: &str = include_str!("../../../kernels/wgsl/rope_pair.wgsl");
/// The sequence parameters and attention_fold.wgsl (attention_part.wgsl, mvq_x_merge.wgsl).
const SEQ_FOLD: &str = concat!(include_str!("../../../kernels/wgsl/seq_params.wgsl"), "\n", include_str!("../../../kernels/wgsl/attention_fold.wgsl"));
const ATTENTION_PART: &str = concat!(include_str!("../../../kernels/wgsl/seq_params.wgsl"), "\n", include_str!("../../../kernels/wgsl/attention_fold.wgsl"), "\n", include_str!("../../../kernels/wgsl/attention_part.wgsl"));
const ATTENTION: &str = concat!(include_str!("../../../kernels/wgsl/seq_params.wgsl"), "\n", include_str!("../../../kernels/wgsl/attention_fold.wgsl"), "\n", include_str!("../../../kernels/wgsl/attention_part.wgsl"), "\n", include_str!("../../../kernels/wgsl/attention.wgsl"));
/// The sequence parameters and `kv_put` (rope_store.wgsl, mv_y_rope.wgsl).
const SEQ_KV_PUT: &str = concat!(include_str!("../../../kernels/wgsl/seq_params.wgsl"), "\n", include_str!("../../../kernels/wgsl/kv_put.wgsl"));

/// The `chunk_at` source of the decode matmul (matmul_vec.wgsl) for `ty`: lazy decoding from the
/// packed words for the packed types, else the whole chunk decoded first.
fn chunk_src(ty: GgmlType) -> &'static str {
    match super::pack::packed(ty) {
        true => include_str!("../../../kernels/wgsl/mv_w_lazy.wgsl"),
        false => include_str!("../../../kernels/wgsl/mv_w_eager.wgsl"),
    }
}

/// The `dequant_chunk` source of the matmul kernels for `ty`: packed_<type>.wgsl for the types
/// repacked at upload (pack.rs), else bytes.wgsl + the raw block decoder.
pub(super) fn matmul_weight_source(ty: GgmlType) -> String {
    let packed = match ty {
        GgmlType::Q4_0 => include_str!("../../../kernels/wgsl/packed_q4_0.wgsl"),
        GgmlType::Q4_1 => include_str!("../../../kernels/wgsl/packed_q4_1.wgsl"),
        GgmlType::Q8_0 => include_str!("../../../kernels/wgsl/packed_q8_0.wgsl"),
        _ => return format!("{BYTES}\n{}", weight_source(ty)),
    };
    format!("{PACKED}\n{packed}")
}

impl WgpuContext {
    /// The best adapter under `opts`, or `None` (never an error): the caller stays on the CPU.
    pub fn detect(opts: WgpuOptions) -> Option<Arc<WgpuContext>> {
        WgpuContext::new(opts).ok()
    }

    /// Like [`detect`](Self::detect), saying why there is no context.
    pub fn new(opts: WgpuOptions) -> Result<Arc<WgpuContext>, WgpuError> {
        let adapters = pollster::block_on(super::instance().enumerate_adapters(wgpu::Backends::all()));
        let mut seen = Vec::new();
        let mut best: Option<(u8, wgpu::Adapter)> = None;
        for a in adapters {
            let info = a.get_info();
            seen.push(format!("{} ({:?}, {:?})", info.name, info.device_type, info.backend));
            let r = match rank(info.device_type) {
                Some(r) => r,
                None if opts.allow_software => 4,
                None => continue,
            };
            if !a.get_downlevel_capabilities().flags.contains(wgpu::DownlevelFlags::COMPUTE_SHADERS) {
                continue;
            }
            if best.as_ref().is_none_or(|(b, _)| r < *b) {
                best = Some((r, a));
            }
        }
        let Some((_, adapter)) = best else {
            let seen = if seen.is_empty() { "none".to_string() } else { seen.join(", ") };
            let hint = if opts.allow_software { "" } else { " (software adapters not allowed)" };
            return Err(WgpuError::NoAdapter(format!("adapters seen: {seen}{hint}")));
        };
        Self::with_adapter(adapter, opts)
    }

    fn with_adapter(adapter: wgpu::Adapter, opts: WgpuOptions) -> Result<Arc<WgpuContext>, WgpuError> {
        let info = adapter.get_info();
        let lanes = opts.matmul_lanes.unwrap_or(if info.device_type == wgpu::DeviceType::Cpu { 1 } else { 32 });
        if !lanes.is_power_of_two() || lanes > WG {
            return Err(WgpuError::Unsupported(format!("{lanes} matmul lanes (a power of two up to {WG})")));
        }
        let limits = adapter.limits();
        let decode = match opts.decode_kernels {
            Some(plan) => plan,
            None if info.device_type != wgpu::DeviceType::Cpu => DecodePlan::Unfused,
            None => DecodePlan::Off,
        };
        // Shuffles replace the workgroup-memory tree only where a subgroup is exactly one row's
        // lanes (NVIDIA: always 32); elsewhere (lavapipe: 8) the tree stays. Same bits either way.
        let subgroups = decode != DecodePlan::Off
            && opts.subgroups
            && lanes == 32
            && adapter.features().contains(wgpu::Features::SUBGROUP)
            && info.subgroup_min_size == 32
            && info.subgroup_max_size == 32;
        let mut features = adapter.features() & wgpu::Features::TIMESTAMP_QUERY;
        if subgroups {
            features |= wgpu::Features::SUBGROUP;
        }
        let coop_offered = super::coop::capable(&adapter);
        let coop = opts.coop && coop_offered;
        if coop {
            features |= super::coop::FEATURES;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("forge-cache"),
            // Timestamps only serve WgpuLayers::forward_profiled; asked for when offered.
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: wgpu's experimental features are enabled only for the cooperative
            // matrices (tensor cores), where the adapter reports the 16 x 16 x 16 f16 / f32
            // configuration matmul_coop.wgsl uses; every result of that kernel is tested against
            // the CPU reference on such an adapter (`WgpuOptions::coop` turns it off).
            experimental_features: if coop { unsafe { wgpu::ExperimentalFeatures::enabled() } } else { wgpu::ExperimentalFeatures::default() },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| WgpuError::Device(e.to_string()))?;
        let timestamps = device.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let uncaptured = Arc::new(Mutex::new(None));
        let sink = uncaptured.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut s = sink.lock().unwrap_or_else(|p| p.into_inner());
            if s.is_none() {
                *s = Some(e.to_string());
            }
        }));
        let tile_wide = if opts.tile && lanes == 32 { opts.tile_wide } else { 0 };
        let mut kernels = build_kernels(&device, lanes, decode, subgroups, opts.tile.then_some(tile_wide > 0), opts.shader_checks)?;
        if coop {
            let built: Result<HashMap<_, _>, _> =
                super::coop::TYPES.into_iter().map(|ty| super::coop::kernels(&device, ty, &matmul_weight_source(ty), opts.shader_checks).map(|k| (ty, k))).collect();
            match built {
                Ok(k) => kernels.matmul_coop = k,
                // An experimental feature: a driver that reports it and then fails to compile the
                // kernel leaves the integer path in place, said once.
                Err(e) => tracing::warn!("cooperative-matrix matmuls unavailable on {}: {e}", info.name),
            }
        }
        let summary = AdapterSummary {
            name: info.name.clone(),
            device_type: format!("{:?}", info.device_type),
            backend: format!("{:?}", info.backend),
            driver: format!("{} {}", info.driver, info.driver_info).trim().to_string(),
            vendor: info.vendor,
        };
        Ok(Arc::new(WgpuContext {
            device,
            queue,
            kernels,
            summary,
            uniform_align: u64::from(limits.min_uniform_buffer_offset_alignment).max(16),
            max_binding: limits.max_storage_buffer_binding_size,
            lanes,
            timestamps,
            decode,
            subgroups,
            q8: opts.q8,
            tile: opts.tile,
            tile_wide,
            stage: opts.stage,
            attention_one: opts.attention_one,
            attention_split: opts.attention_split,
            o_merge: opts.o_merge,
            submit_layers: opts.submit_layers,
            qkv_rope: opts.qkv_rope,
            coop_wide: opts.coop_wide,
            coop_offered,
            spin: std::time::Duration::from_micros(opts.spin_us),
            options: opts,
            uncaptured,
        }))
    }

    pub fn adapter(&self) -> &AdapterSummary {
        &self.summary
    }

    /// The options this context was made with.
    pub fn options(&self) -> &WgpuOptions {
        &self.options
    }

    /// attention_kv.wgsl and its grid for a sequence of `n_tok` tokens of this shape, where the
    /// sequence takes it (the kernel was built; [`WgpuOptions::attention_kv`] and the kernel's
    /// limits: `attention_kv::grid`); `None`: attention.wgsl.
    pub(crate) fn attention_kv(&self, n_head: usize, n_kv_head: usize, head_dim: usize, n_tok: usize) -> Option<(&Kernel, (u32, u32))> {
        let kernel = self.kernels.attention_kv.as_ref()?;
        super::attention_kv::grid(self.options.attention_kv, n_head, n_kv_head, head_dim, n_tok).map(|g| (kernel, g))
    }

    /// Threads per matmul row (see [`WgpuOptions::matmul_lanes`]).
    pub fn matmul_lanes(&self) -> u32 {
        self.lanes
    }

    /// How one-token steps run: "batch kernels", "matvec, unfused" or "matvec + folded norm / silu",
    /// with "(subgroup shuffles)" where the decode matmuls reduce by subgroups.
    pub fn decode_kernels(&self) -> String {
        let plan = match self.decode {
            DecodePlan::Off => "batch kernels",
            DecodePlan::Unfused => "matvec, unfused",
            DecodePlan::Fused => "matvec + folded norm / silu",
        };
        format!("{plan}{}", if self.subgroups { " (subgroup shuffles)" } else { "" })
    }

    /// Whether Q4_0 matrices multiply on tensor cores ([`WgpuOptions::coop`], where the adapter
    /// has them and the kernel compiled).
    pub fn coop(&self) -> bool {
        !self.kernels.matmul_coop.is_empty()
    }

    /// Whether the adapter offers the cooperative matrices [`WgpuOptions::coop`] needs.
    pub fn coop_offered(&self) -> bool {
        self.coop_offered
    }

    /// Matmul workgroups for `rows` outputs of `n_tok` tokens.
    pub(crate) fn matmul_grid(&self, rows: usize, n_tok: usize) -> (u32, u32) {
        let per_group = (WG / self.lanes) as usize;
        (rows.div_ceil(per_group) as u32, n_tok.div_ceil(MM_TOKENS as usize) as u32)
    }

    /// Workgroups of the tiled Q8 matmul (matmul_tile.wgsl; matmul_wide.wgsl where `wide`) for `rows` outputs of `n_tok` tokens.
    pub(crate) fn tile_grid(&self, rows: usize, n_tok: usize, wide: bool) -> (u32, u32) {
        let per_group = (WG / self.lanes * TILE_ROWS) as usize;
        if wide { wide_grid(rows, n_tok) } else { (rows.div_ceil(per_group) as u32, n_tok.div_ceil(MM_TOKENS as usize) as u32) }
    }

    /// Whether the adapter is a software rasterizer (lavapipe / llvmpipe).
    pub fn is_software(&self) -> bool {
        self.summary.device_type == format!("{:?}", wgpu::DeviceType::Cpu)
    }

    /// Fails with the first error wgpu reported since the last check.
    pub(crate) fn check(&self) -> Result<(), WgpuError> {
        let mut s = self.uncaptured.lock().unwrap_or_else(|p| p.into_inner());
        match s.take() {
            Some(e) => Err(WgpuError::Gpu(e)),
            None => Ok(()),
        }
    }

    /// A storage buffer holding `bytes` (zero-padded to whole words), usable as a copy source too.
    pub(crate) fn storage_init(&self, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer, WgpuError> {
        self.storage_concat(label, &[bytes])
    }

    /// A storage buffer holding `parts` one after the other (zero-padded to whole words), written
    /// straight into the mapped buffer.
    pub(crate) fn storage_concat(&self, label: &str, parts: &[&[u8]]) -> Result<wgpu::Buffer, WgpuError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.fits(label, len as u64)?;
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: (len.div_ceil(4).max(1) * 4) as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: true,
        });
        {
            let mut view = buf.slice(..).get_mapped_range_mut().map_err(|e| WgpuError::Gpu(format!("{label}: {e:?}")))?;
            let mut at = 0;
            for p in parts {
                view.slice(at..at + p.len()).copy_from_slice(p);
                at += p.len();
            }
        }
        buf.unmap();
        Ok(buf)
    }

    /// A zeroed storage buffer of at least `size` bytes.
    pub(crate) fn storage(&self, label: &str, size: u64) -> Result<wgpu::Buffer, WgpuError> {
        self.fits(label, size)?;
        Ok(self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.div_ceil(16).max(1) * 16,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }))
    }

    fn fits(&self, label: &str, size: u64) -> Result<(), WgpuError> {
        if size > self.max_binding {
            return Err(WgpuError::TooLarge { what: label.to_string(), bytes: size, max: self.max_binding });
        }
        Ok(())
    }

    /// A bind group of `kernel` over `buffers` (binding i = buffers[i]); a `(buffer, offset)`
    /// with `Some(size)` binds that window (used for parameter slots).
    pub(crate) fn bind(&self, kernel: &Kernel, buffers: &[(&wgpu::Buffer, u64, Option<u64>)]) -> wgpu::BindGroup {
        let entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
            .iter()
            .enumerate()
            .map(|(i, (b, offset, size))| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b,
                    offset: *offset,
                    size: size.and_then(wgpu::BufferSize::new),
                }),
            })
            .collect();
        self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &kernel.layout, entries: &entries })
    }

    /// Copies `out.len()` f32 from `src` (at byte `offset`) to the host, waiting for all queued work.
    pub(crate) fn read_f32(&self, encoder: wgpu::CommandEncoder, src: &wgpu::Buffer, offset: u64, out: &mut [f32]) -> Result<(), WgpuError> {
        let staging = self.staging("readback", (out.len() * 4) as u64);
        self.submit_and_read(encoder, src, offset, &staging, out)
    }

    /// Records `src → staging`, submits `encoder`, waits and copies the result into `out`.
    pub(crate) fn submit_and_read(
        &self,
        encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        staging: &wgpu::Buffer,
        out: &mut [f32],
    ) -> Result<(), WgpuError> {
        self.map_read(encoder, src, offset, staging, (out.len() * 4) as u64, |b| out.copy_from_slice(bytemuck::cast_slice(b)))
    }

    /// Records a copy of `len` bytes `src → staging`, submits, waits, maps and hands the bytes to `f`.
    pub(crate) fn map_read(
        &self,
        mut encoder: wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        offset: u64,
        staging: &wgpu::Buffer,
        len: u64,
        f: impl FnOnce(&[u8]),
    ) -> Result<(), WgpuError> {
        if len > 0 {
            encoder.copy_buffer_to_buffer(src, offset, staging, 0, len);
        }
        self.queue.submit([encoder.finish()]);
        self.read_mapped(staging, len, f)
    }

    /// Waits for the submitted work, maps `len` bytes of `staging` (copied into by that work) and
    /// hands them to `f`.
    pub(crate) fn read_mapped(&self, staging: &wgpu::Buffer, len: u64, f: impl FnOnce(&[u8])) -> Result<(), WgpuError> {
        if len == 0 {
            self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| WgpuError::Gpu(e.to_string()))?;
            return self.check();
        }
        let slice = staging.slice(..len);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        // Polling in a loop first: a sleeping wait wakes up late, measured on the H100 (1.1B
        // decode: 761 against 638 tokens/s). A decode step ends within the spin; longer steps
        // then sleep.
        let mut early = None;
        if !self.spin.is_zero() {
            let until = std::time::Instant::now() + self.spin;
            while std::time::Instant::now() < until {
                self.device.poll(wgpu::PollType::Poll).map_err(|e| WgpuError::Gpu(e.to_string()))?;
                if let Ok(r) = rx.try_recv() {
                    early = Some(r);
                    break;
                }
            }
        }
        if early.is_none() {
            self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| WgpuError::Gpu(e.to_string()))?;
        }
        self.check()?;
        // Our poll returns once our submission is done, but when several threads share the
        // device, another thread's poll may have collected this mapping's callback and not run it
        // yet: wait for the callback itself (polling again meanwhile), never assume it has run.
        // (Assuming it had was the cause of the rare attention mismatches of issue 7: the op
        // failed with "map did not complete" and the trait method fell back to the CPU result.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mapped = loop {
            if let Some(r) = early.take() {
                break r;
            }
            match rx.recv_timeout(std::time::Duration::from_millis(1)) {
                Ok(r) => break r,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) if std::time::Instant::now() < deadline => {
                    self.device.poll(wgpu::PollType::Poll).map_err(|e| WgpuError::Gpu(e.to_string()))?;
                }
                Err(_) => return Err(WgpuError::Gpu("map did not complete".into())),
            }
        };
        mapped.map_err(|e| WgpuError::Gpu(format!("map failed: {e}")))?;
        {
            let view = slice.get_mapped_range().map_err(|e| WgpuError::Gpu(format!("mapped range: {e:?}")))?;
            f(&view[..]);
        }
        staging.unmap();
        Ok(())
    }


    /// A buffer the host can map for reading, of `size` bytes.
    pub(crate) fn staging(&self, label: &str, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size.div_ceil(4).max(1) * 4,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }
}

/// Workgroup counts (x, y) covering `n` threads of [`WG`] per group; x stays within the 65535 limit.
pub(crate) fn grid_1d(n: usize) -> (u32, u32) {
    let groups = n.div_ceil(WG as usize).max(1);
    let x = groups.min(65535);
    (x as u32, groups.div_ceil(x) as u32)
}

/// Rows per group of lanes in matmul_tile.wgsl (its `TR`).
const TILE_ROWS: u32 = 4;

pub(super) fn build_kernels(device: &wgpu::Device, lanes: u32, decode: DecodePlan, subgroups: bool, tile: Option<bool>, checks: bool) -> Result<Kernels, WgpuError> {
    let k = |name: &str, src: String, binds: &[B]| kernel(device, name, &src, binds, checks);
    let mm = [B::Uniform, B::Read, B::Read, B::Rw];
    // mm_io.wgsl: the parameters, weights and outputs both batch matmuls declare
    let mm_io = include_str!("../../../kernels/wgsl/mm_io.wgsl");
    let matmul_src = format!("{mm_io}\n{}", with_lanes("matmul", include_str!("../../../kernels/wgsl/matmul.wgsl"), lanes)?);
    let vec_src = with_lanes("matmul_vec", include_str!("../../../kernels/wgsl/matmul_vec.wgsl"), lanes)?;
    let vec_main = match subgroups {
        true => include_str!("../../../kernels/wgsl/mv_main_sg.wgsl"),
        false => include_str!("../../../kernels/wgsl/mv_main.wgsl"),
    };
    let mut srcs = vec![(XSrc::Plain, include_str!("../../../kernels/wgsl/mv_x_plain.wgsl").to_string())];
    if decode == DecodePlan::Fused {
        srcs.push((XSrc::Norm, format!("{RMS_SCALE}\n{}", include_str!("../../../kernels/wgsl/mv_x_norm.wgsl"))));
        srcs.push((XSrc::Silu, include_str!("../../../kernels/wgsl/mv_x_silu.wgsl").to_string()));
    }
    let mut matmul = HashMap::new();
    let mut matvec = HashMap::new();
    let mut matvec_silu = HashMap::new();
    let mut matvec_rope = HashMap::new();
    let (y_store, y_silu) = (include_str!("../../../kernels/wgsl/mv_y_store.wgsl"), include_str!("../../../kernels/wgsl/mv_y_silu.wgsl"));
    let mut embed = HashMap::new();
    let mut matmul_q8 = HashMap::new();
    let mut matmul_tile = HashMap::new();
    let mut matmul_wide = HashMap::new();
    let mm_x_f32 = include_str!("../../../kernels/wgsl/mm_x_f32.wgsl");
    let mm_x_q8 = include_str!("../../../kernels/wgsl/mm_x_q8.wgsl");
    let mv_q8 = include_str!("../../../kernels/wgsl/matvec_q8.wgsl");
    let tile_src = format!("{mm_io}\n{}", with_lanes("matmul_tile", include_str!("../../../kernels/wgsl/matmul_tile.wgsl"), lanes)?);
    // mt_main_sg.wgsl: one sum per lane after its reduce-scatter (TR * TT = LANES = 32)
    debug_assert!(!subgroups || (lanes == 32 && TILE_ROWS * MM_TOKENS == 32));
    let tile_main = match subgroups {
        true => include_str!("../../../kernels/wgsl/mt_main_sg.wgsl"),
        false => include_str!("../../../kernels/wgsl/mt_main.wgsl"),
    };
    debug_assert!(tile != Some(true) || lanes == 32, "matmul_wide.wgsl is written for 32 lanes");
    for ty in WEIGHT_TYPES {
        let Some(dot) = q8dot_source(ty) else { continue };
        let (w, name) = (matmul_weight_source(ty), ty.name());
        matmul_q8.insert(ty, k(&format!("matmul_q8_{name}"), format!("{w}\n{dot}\n{mm_x_q8}\n{matmul_src}"), &mm)?);
        if tile.is_some() {
            matmul_tile.insert(ty, k(&format!("matmul_tile_{name}"), format!("{w}\n{dot}\n{tile_src}\n{tile_main}"), &mm)?);
        }
        if tile == Some(true) {
            matmul_wide.insert(ty, k(&format!("matmul_wide_{name}"), format!("{w}\n{dot}\n{mm_io}\n{}", wide_source(ty)), &mm)?);
        }
        if decode != DecodePlan::Off {
            let (global, put) = (include_str!("../../../kernels/wgsl/mvq_x_global.wgsl"), include_str!("../../../kernels/wgsl/mvq_x_put.wgsl"));
            let stage = format!("{Q8_ACT}\n{put}\n{RMS_SCALE}\n{}", include_str!("../../../kernels/wgsl/mvq_x_stage.wgsl"));
            let staged = [B::Uniform, B::Read, B::Read, B::Rw, B::Read];
            // mvq_x_merge.wgsl: 2 the partials, 4 the positions, 5 the sequence's parameters
            let merge = format!("{Q8_ACT}\n{put}\n{SEQ_FOLD}\n{}", include_str!("../../../kernels/wgsl/mvq_x_merge.wgsl"));
            let merged = [B::Uniform, B::Read, B::Read, B::Rw, B::Read, B::UniformDyn];
            for (xs, x_src, binds) in [(XSrc::Q8, global.to_string(), &mm[..]), (XSrc::Q8Stage, stage, &staged[..]), (XSrc::Q8Merge, merge, &merged[..])] {
                let src = format!("{w}\n{dot}\n{x_src}\n{mv_q8}\n{vec_src}\n{vec_main}");
                matvec.insert((ty, xs), k(&format!("matvec_q8_{name}_{xs:?}"), format!("{src}\n{y_store}"), binds)?);
                if xs == XSrc::Q8 && (WG / lanes).is_multiple_of(2) {
                    matvec_silu.insert((ty, xs), k(&format!("matvec_q8_silu_{name}_{xs:?}"), format!("{src}\n{y_silu}"), binds)?);
                }
                if xs == XSrc::Q8Stage && (WG / lanes).is_multiple_of(2) {
                    let y_rope = include_str!("../../../kernels/wgsl/mv_y_rope.wgsl");
                    let rb = [B::Uniform, B::Read, B::Read, B::Rw, B::Read, B::Rw, B::Rw, B::Read, B::Read, B::UniformDyn];
                    matvec_rope.insert(ty, k(&format!("matvec_q8_rope_{name}"), format!("{src}\n{ROPE_PAIR}\n{SEQ_KV_PUT}\n{y_rope}"), &rb)?);
                }
            }
        }
    }
    for ty in WEIGHT_TYPES {
        let (deq, mdeq) = (weight_source(ty), matmul_weight_source(ty));
        debug_assert_eq!(super::pack::packed(ty), !mdeq.contains("fn ld_u32"));
        let name = ty.name();
        matmul.insert(ty, k(&format!("matmul_{name}"), format!("{mdeq}\n{mm_x_f32}\n{matmul_src}"), &mm)?);
        embed.insert(ty, k(&format!("embed_{name}"), format!("{BYTES}\n{deq}\n{}", include_str!("../../../kernels/wgsl/embed.wgsl")), &mm)?);
        for (xs, x_src) in srcs.iter().map(|(xs, src)| (*xs, src)).filter(|_| decode != DecodePlan::Off) {
            let binds: &[B] = if xs == XSrc::Norm { &[B::Uniform, B::Read, B::Read, B::Rw, B::Read] } else { &mm };
            let src = format!("{mdeq}\n{}\n{x_src}\n{}\n{vec_src}\n{vec_main}", chunk_src(ty), include_str!("../../../kernels/wgsl/mv_f32.wgsl"));
            matvec.insert((ty, xs), k(&format!("matmul_vec_{name}_{xs:?}"), format!("{src}\n{y_store}"), binds)?);
            if xs != XSrc::Silu && (WG / lanes).is_multiple_of(2) {
                matvec_silu.insert((ty, xs), k(&format!("matmul_vec_silu_{name}_{xs:?}"), format!("{src}\n{y_silu}"), binds)?);
            }
        }
    }
    let attention = k(
        "attention",
        format!("{Q8_ACT}\n{}\n{ATTENTION}", include_str!("../../../kernels/wgsl/attention_cached.wgsl")),
        &[B::UniformDyn, B::Read, B::Read, B::Read, B::Read, B::Rw, B::Rw, B::Rw],
    )?;
    let attention_kv = super::attention_kv::build(device, &attention, &format!("{Q8_ACT}\n{ATTENTION_PART}"), checks)?;
    Ok(Kernels {
        matmul,
        matvec,
        matvec_silu,
        matvec_rope,
        matmul_q8,
        matmul_tile,
        matmul_wide,
        matmul_coop: HashMap::new(),
        embed,
        rmsnorm: k("rmsnorm", format!("{RMS_BIND}\n{RMS_SCALE}\n{}", include_str!("../../../kernels/wgsl/rmsnorm.wgsl")), &[B::Uniform, B::Read, B::Read, B::Rw])?,
        rmsnorm_q8: k(
            "rmsnorm_q8",
            format!("{Q8_ACT}\n{RMS_BIND}\n{RMS_SCALE}\n{}", include_str!("../../../kernels/wgsl/rmsnorm_q8.wgsl")),
            &[B::Uniform, B::Read, B::Read, B::Rw],
        )?,
        rmsnorm_heads: k("rmsnorm_heads", format!("{RMS_SCALE}\n{}", include_str!("../../../kernels/wgsl/rmsnorm_heads.wgsl")), &[B::Uniform, B::Rw, B::Read])?,
        quantize_q8: k("quantize_q8", format!("{Q8_ACT}\n{}\n{Q8_ROWS}", include_str!("../../../kernels/wgsl/quantize_q8.wgsl")), &[B::Uniform, B::Read, B::Rw])?,
        rope: k("rope", format!("{ROPE_PAIR}\n{}", include_str!("../../../kernels/wgsl/rope.wgsl")), &[B::Uniform, B::Rw, B::Read, B::Read])?,
        kv_store: k(
            "kv_store",
            include_str!("../../../kernels/wgsl/kv_store.wgsl").into(),
            &[B::Uniform, B::Read, B::Read, B::Rw, B::Rw, B::Read],
        )?,
        attention,
        attention_kv,
        attention_one: k(
            "attention_one",
            format!("{Q8_ACT}\n{ROPE_PAIR}\n{}\n{ATTENTION}", include_str!("../../../kernels/wgsl/attention_one.wgsl")),
            &[B::UniformDyn, B::Read, B::Rw, B::Rw, B::Read, B::Rw, B::Read, B::Rw, B::Rw],
        )?,
        attention_merge: k(
            "attention_merge",
            format!("{Q8_ACT}\n{ATTENTION_PART}\n{}", include_str!("../../../kernels/wgsl/attention_merge.wgsl")),
            &[B::UniformDyn, B::Read, B::Read, B::Read, B::Read, B::Rw, B::Rw],
        )?,
        rope_store: k(
            "rope_store",
            format!("{ROPE_PAIR}\n{SEQ_KV_PUT}\n{}", include_str!("../../../kernels/wgsl/rope_store.wgsl")),
            &[B::UniformDyn, B::Rw, B::Read, B::Read, B::Rw, B::Rw],
        )?,
        silu_mul: k("silu_mul", format!("{GATED}\n{}", include_str!("../../../kernels/wgsl/silu_mul.wgsl")), &[B::Uniform, B::Read, B::Read, B::Rw])?,
        silu_mul_q8: k(
            "silu_mul_q8",
            format!("{Q8_ACT}\n{GATED}\n{}\n{Q8_ROWS}", include_str!("../../../kernels/wgsl/silu_mul_q8.wgsl")),
            &[B::Uniform, B::Read, B::Read, B::Rw],
        )?,
        add: k("add", include_str!("../../../kernels/wgsl/add.wgsl").into(), &[B::Uniform, B::Rw, B::Read])?,
    })
}
