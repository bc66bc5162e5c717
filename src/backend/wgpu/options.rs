//! [`WgpuOptions`]: every knob of the wgpu backend in one struct (adapter choice, kernel variants,
//! submission and read-back), with the measured defaults, the `FORGE_WGPU_*` environment variables
//! parsed in one function for the command line, and the variants tests iterate over.

use super::WgpuError;

/// Layers per submission of a layer step recorded as it goes (a step recorded ahead, layers/step.rs,
/// is one command buffer): the GPU runs the first parts while the CPU records the rest. H100, 1.1B model, tg128 in tokens/s, with the Q8 matmuls (two rounds, one call):
/// 1: 549 / 568, 2: 612 / 587, 3: 633 / 630, 4: 617 / 612, 5: 581 / 572, 6: 605 / 588 (with the
/// slower kernels of issue 7 part 3, in docs/perf.md's history, 6 was best: the faster the GPU, the more the CPU's
/// recording of the dispatches shows).
pub const SUBMIT_LAYERS: usize = 3;
/// Tokens from which a step's Q8 matmuls of few columns take the wide tile (defaults of
/// [`WgpuOptions::tile_wide`] and [`tile_wide_cols`](WgpuOptions::tile_wide_cols)). H100, pp
/// t/s, narrow / wide on every matrix of 768+ rows, two interleaved rounds after a warm-up, one
/// call: SmolLM2-shaped Q4_1 (q|k|v and gate|up of 576 columns) pp64 15884-16398 / 12845-13775,
/// pp128 25420-25809 / 22704-23371, pp256 30292-32018 / 33083-33865, pp512 36597-38070 /
/// 37833-41087; 1.1B Q4_0 (2048 and 5632 columns) narrow ahead at every size, pp16 3481-4145 /
/// 2138-2186, pp128 10884-10978 / 8462-9662, pp512 12310-12359 / 11781-12103. Below 1024
/// columns (32 chunks) some of a row's 32 lanes have no chunk in the narrow tile (576: 14 of 32
/// idle), while the wide tile's threads all work; from 1024 on the narrow tile is never slower.
pub const WIDE_FROM_TOKENS: usize = 256;
/// Columns from which the wide tile is not used by default (see [`WIDE_FROM_TOKENS`]).
pub const WIDE_MAX_COLS: usize = 1024;
/// Tokens from which a sequence's prefill attention runs one workgroup per KV head and block of
/// tokens (default of [`WgpuOptions::attention_kv`]). H200, SmolLM2-shaped, new kernel against
/// the per-head one (t/s, two interleaved rounds, docs/perf.md): pp512 44136 / 47677 against
/// 45533 / 44218, pp128 25141 / 27602 against 28599 / 30170; the 1.1B gains from pp128 on.
pub const ATTN_KV_FROM_TOKENS: usize = 256;
/// Tokens from which the cooperative matmuls take the large tile (default of
/// [`WgpuOptions::coop_wide`]).
pub const COOP_WIDE_FROM_TOKENS: usize = 64;
/// Microseconds a read-back polls before it sleeps (default of [`WgpuOptions::spin_us`]).
pub const SPIN_US: u64 = 2000;

/// How steps of one token run (see [`WgpuOptions::decode_kernels`]). Every setting gives the same
/// bits: the decode kernels keep the batch kernels' reduction order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePlan {
    /// the batch kernels (rmsnorm, matmul, silu_mul) for one token too
    Off,
    /// matmul_vec.wgsl for the matmuls, rmsnorm and silu_mul dispatched apart
    Unfused,
    /// matmul_vec.wgsl with RMSNorm folded into q|k|v and gate|up, SiLU·mul into the down projection
    Fused,
}

/// Every knob of the wgpu backend, in one place. [`Default`] is what the service runs (the
/// settings measured fastest on the H100, docs/perf.md "wgpu tier"); tests build the variants they
/// compare (see [`bit_neutral_variants`](Self::bit_neutral_variants)); the command line reads the
/// `FORGE_WGPU_*` environment variables through [`from_env`](Self::from_env), the one place they
/// are read. Options marked "same bits" change speed only: a token's outputs are bitwise the same
/// under either setting (tested).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WgpuOptions {
    /// Accept a software adapter (llvmpipe / lavapipe) when no hardware one exists. Tests set it.
    pub allow_software: bool,
    /// Threads per matmul row (1, 2, 4, ..., 256); `None`: 32 on GPUs, 1 on software adapters.
    /// It fixes the reduction order, so results are bitwise stable for one setting only.
    /// `$FORGE_WGPU_MATMUL_LANES`.
    pub matmul_lanes: Option<u32>,
    /// Kernels of one-token steps; `None`: [`DecodePlan::Unfused`] on GPUs (measured fastest on
    /// the H100), [`DecodePlan::Off`] on software adapters. Same bits. `$FORGE_WGPU_DECODE`:
    /// `off`, `unfused`, `fused`, or `shared` (fused, and `subgroups` off).
    pub decode_kernels: Option<DecodePlan>,
    /// A sequence of one token in a step runs attention_one.wgsl (RoPE and KV store inside its
    /// attention: one dispatch instead of two). Off by default: slower on the H100 (tg128 504-537
    /// vs 576-593 t/s, 1.1B model, in docs/perf.md's history). Same bits. `$FORGE_WGPU_ATTN_ONE=1`.
    pub attention_one: bool,
    /// A sequence of one token splits its attention over chunks of 256 keys, one workgroup per
    /// (query head, chunk), then folds the chunks' partials in a second dispatch
    /// (attention_merge.wgsl); off: one workgroup per head walks the chunks (as prefill does).
    /// H100, tg128@d1024: SmolLM2-shaped 729-740 vs 579-598 t/s, 1.1B 741-790 vs 632-663 (main's
    /// single walk, docs/perf.md). Same bits. `$FORGE_WGPU_ATTN_SPLIT=0`.
    pub attention_split: bool,
    /// Where a one-token step's attention is split, its o projection (Q8 input, no post-norm)
    /// folds the chunk partials in its input stage (mvq_x_merge.wgsl: every workgroup merges
    /// and quantizes the row in workgroup memory) and no attention_merge dispatch runs. Same
    /// bits. `$FORGE_WGPU_O_MERGE=0`.
    pub o_merge: bool,
    /// Sequences of at least this many tokens run their attention as attention_kv.wgsl: one
    /// workgroup per (KV head, block of tokens), every key and value it loads serving all the
    /// block's query rows, instead of one workgroup per (query head, token); 0: never. Where
    /// the device's workgroup memory is under 24 KiB, head_dim is over 128 or a KV head has
    /// more than 16 query heads, never. Same bits. Default [`ATTN_KV_FROM_TOKENS`].
    /// `$FORGE_WGPU_ATTN_KV` (tokens).
    pub attention_kv: usize,
    /// The layer runner multiplies Q4_0 / Q4_1 / Q8_0 weights by activations quantized to 8 bits
    /// with integer dot products, as the CPU does (plan.rs); `false`: f32 activations and the
    /// dequantizing kernels, for comparisons (other bits). `$FORGE_WGPU_Q8=0`.
    pub q8: bool,
    /// The batch Q8 matmuls run the tiled kernel (matmul_tile.wgsl: rows x tokens per workgroup,
    /// partial sums in registers) instead of matmul.wgsl after mm_x_q8.wgsl. Same bits.
    /// `$FORGE_WGPU_TILE=0`.
    pub tile: bool,
    /// Steps of at least this many tokens run their tiled batch Q8 matmuls of
    /// `plan::WIDE_MIN_ROWS` rows and more and fewer than [`tile_wide_cols`](Self::tile_wide_cols)
    /// columns as matmul_wide.wgsl (64 rows x 32 tokens per workgroup, operands staged in
    /// workgroup memory, each thread all 32 lane sums of its outputs in the tree's leaf order)
    /// where a row has 32 lanes; smaller steps and other matrices, and every step with 0, run
    /// matmul_tile.wgsl (32 rows x 8 tokens, lanes across threads); 1: every step. Same bits
    /// either way (both tiles give the decode kernels' bits, tested), so the choice by batch size
    /// cannot make a token's bits depend on its batch. Default [`WIDE_FROM_TOKENS`].
    /// `$FORGE_WGPU_TILE_WIDE` (tokens).
    pub tile_wide: usize,
    /// The wide tile only for matrices of fewer columns than this (default [`WIDE_MAX_COLS`];
    /// `usize::MAX`: every size). Same bits. `$FORGE_WGPU_TILE_WIDE_COLS`.
    pub tile_wide_cols: usize,
    /// One-token Q8 matmuls quantize (and normalize) their own input in workgroup memory
    /// (mvq_x_stage.wgsl) where they can, instead of after a rmsnorm_q8 / quantize_q8 dispatch.
    /// Same bits. `$FORGE_WGPU_STAGE=0`.
    pub stage: bool,
    /// A one-token step's q|k|v matmul does RoPE + KV store in its epilogue (mv_y_rope.wgsl; no
    /// rope_store dispatch) where it can. Same bits. `$FORGE_WGPU_QKV_ROPE=0`.
    pub qkv_rope: bool,
    /// The decode matmuls reduce by subgroup shuffles where a subgroup is exactly one row's
    /// lanes (NVIDIA: 32); elsewhere (lavapipe: 8) the workgroup-memory tree stays. Same bits.
    /// `$FORGE_WGPU_DECODE=shared` turns it off.
    pub subgroups: bool,
    /// A layer step recorded as it goes is submitted in parts of this many layers (0: whole; a
    /// step recorded ahead is always one command buffer). Same bits. `$FORGE_WGPU_SUBMIT_LAYERS`.
    pub submit_layers: usize,
    /// Microseconds a read-back polls the device before it sleeps until the GPU is done (0: sleep
    /// at once). Same bits. `$FORGE_WGPU_SPIN_US`.
    pub spin_us: u64,
    /// Keep naga's bounds checks in the kernels (off: the platform's robust buffer access stays,
    /// see `kernel`). Same bits on valid inputs. `$FORGE_WGPU_SHADER_CHECKS=1`.
    pub shader_checks: bool,
    /// Where the adapter has cooperative matrices (tensor cores) with f16, Q4_0 matrices whose
    /// rows are a multiple of 128 multiply on them (matmul_coop.wgsl: f16 operands, f32 sums),
    /// in steps of every size (one token: matvec_coop.wgsl, the same bits), so a token's bits
    /// stay the same at any batch size; other bits than the integer path (so not "same bits").
    /// Off by default: one-token steps through it are slow (H200, 1.1B Q4_0, 2026-11-29: pp512
    /// 22.8-23.3k against 15.1-15.3k t/s, tg128 419-436 against 864-902; docs/perf.md).
    /// `$FORGE_WGPU_COOP=1`.
    pub coop: bool,
    /// Steps of at least this many tokens run the cooperative matmuls as 128 x 64 tiles, smaller
    /// ones as 64 x 32 (0: never the large one). Same bits (the tile does not enter a token's
    /// arithmetic). Default [`COOP_WIDE_FROM_TOKENS`]. `$FORGE_WGPU_COOP_WIDE` (tokens).
    pub coop_wide: usize,
}

impl Default for WgpuOptions {
    fn default() -> WgpuOptions {
        WgpuOptions {
            allow_software: false,
            matmul_lanes: None,
            decode_kernels: None,
            attention_one: false,
            attention_split: true,
            o_merge: true,
            attention_kv: ATTN_KV_FROM_TOKENS,
            q8: true,
            tile: true,
            tile_wide: WIDE_FROM_TOKENS,
            tile_wide_cols: WIDE_MAX_COLS,
            stage: true,
            qkv_rope: true,
            subgroups: true,
            submit_layers: SUBMIT_LAYERS,
            spin_us: SPIN_US,
            shader_checks: false,
            coop: false,
            coop_wide: COOP_WIDE_FROM_TOKENS,
        }
    }
}

impl WgpuOptions {
    /// The defaults with every `FORGE_WGPU_*` variable that is set applied (for the command
    /// line; the library reads the environment nowhere else). A value that does not parse is an
    /// error naming the variable.
    pub fn from_env() -> Result<WgpuOptions, WgpuError> {
        WgpuOptions::from_vars(|k| std::env::var(k).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<WgpuOptions, WgpuError> {
        let bad = |name: &str, v: &str, what: &str| WgpuError::Unsupported(format!("{name}={v:?}: expected {what}"));
        let num = |name: &str, what: &str| -> Result<Option<u64>, WgpuError> {
            var(name).map(|v| v.trim().parse().map_err(|_| bad(name, &v, what))).transpose()
        };
        let flag = |name: &str| -> Result<Option<bool>, WgpuError> {
            var(name)
                .map(|v| match v.trim() {
                    "1" => Ok(true),
                    "0" => Ok(false),
                    _ => Err(bad(name, &v, "0 or 1")),
                })
                .transpose()
        };
        let mut o = WgpuOptions::default();
        if let Some(n) = num("FORGE_WGPU_MATMUL_LANES", "a power of two up to 256")? {
            o.matmul_lanes = Some(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if let Some(v) = var("FORGE_WGPU_DECODE") {
            o.decode_kernels = Some(match v.trim() {
                "off" => DecodePlan::Off,
                "unfused" => DecodePlan::Unfused,
                "fused" => DecodePlan::Fused,
                "shared" => {
                    o.subgroups = false;
                    DecodePlan::Fused
                }
                _ => return Err(bad("FORGE_WGPU_DECODE", &v, "off, unfused, fused or shared")),
            });
        }
        o.attention_one = flag("FORGE_WGPU_ATTN_ONE")?.unwrap_or(o.attention_one);
        o.attention_split = flag("FORGE_WGPU_ATTN_SPLIT")?.unwrap_or(o.attention_split);
        o.o_merge = flag("FORGE_WGPU_O_MERGE")?.unwrap_or(o.o_merge);
        if let Some(n) = num("FORGE_WGPU_ATTN_KV", "a number of tokens (0: never)")? {
            o.attention_kv = usize::try_from(n).unwrap_or(usize::MAX);
        }
        o.q8 = flag("FORGE_WGPU_Q8")?.unwrap_or(o.q8);
        o.tile = flag("FORGE_WGPU_TILE")?.unwrap_or(o.tile);
        if let Some(n) = num("FORGE_WGPU_TILE_WIDE", "a number of tokens (0: never)")? {
            o.tile_wide = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(n) = num("FORGE_WGPU_TILE_WIDE_COLS", "a number of columns")? {
            o.tile_wide_cols = usize::try_from(n).unwrap_or(usize::MAX);
        }
        o.stage = flag("FORGE_WGPU_STAGE")?.unwrap_or(o.stage);
        o.qkv_rope = flag("FORGE_WGPU_QKV_ROPE")?.unwrap_or(o.qkv_rope);
        o.shader_checks = flag("FORGE_WGPU_SHADER_CHECKS")?.unwrap_or(o.shader_checks);
        if let Some(n) = num("FORGE_WGPU_SUBMIT_LAYERS", "a number of layers")? {
            o.submit_layers = n as usize;
        }
        o.spin_us = num("FORGE_WGPU_SPIN_US", "microseconds")?.unwrap_or(o.spin_us);
        o.coop = flag("FORGE_WGPU_COOP")?.unwrap_or(o.coop);
        if let Some(n) = num("FORGE_WGPU_COOP_WIDE", "a number of tokens (0: never)")? {
            o.coop_wide = usize::try_from(n).unwrap_or(usize::MAX);
        }
        Ok(o)
    }

    /// `self` with one "same bits" option changed at a time, each named: a token's outputs must
    /// be bitwise the same under every one of them (tests run the layer runner on each). The
    /// one-token kernels are on in every variant but `decode off`, so that the options that only
    /// touch them are exercised.
    pub fn bit_neutral_variants(&self) -> Vec<(&'static str, WgpuOptions)> {
        let base = WgpuOptions { decode_kernels: Some(self.decode_kernels.unwrap_or(DecodePlan::Unfused)), ..*self };
        let with = |f: fn(&mut WgpuOptions)| {
            let mut o = base;
            f(&mut o);
            o
        };
        vec![
            ("decode off", with(|o| o.decode_kernels = Some(DecodePlan::Off))),
            ("decode unfused", with(|o| o.decode_kernels = Some(DecodePlan::Unfused))),
            ("decode fused", with(|o| o.decode_kernels = Some(DecodePlan::Fused))),
            ("attention_one", with(|o| o.attention_one = !o.attention_one)),
            ("tile", with(|o| o.tile = !o.tile)),
            ("tile wide always", with(|o| (o.tile_wide, o.tile_wide_cols) = (1, usize::MAX))),
            ("tile wide never", with(|o| o.tile_wide = 0)),
            ("attention split", with(|o| o.attention_split = !o.attention_split)),
            ("o merge", with(|o| o.o_merge = !o.o_merge)),
            ("attention kv always", with(|o| o.attention_kv = 1)),
            ("attention kv never", with(|o| o.attention_kv = 0)),
            ("stage", with(|o| o.stage = !o.stage)),
            ("qkv_rope", with(|o| o.qkv_rope = !o.qkv_rope)),
            ("subgroups", with(|o| o.subgroups = !o.subgroups)),
            ("submit every layer", with(|o| o.submit_layers = 1)),
            ("submit whole", with(|o| o.submit_layers = 0)),
            ("spin 0", with(|o| o.spin_us = 0)),
            ("shader checks", with(|o| o.shader_checks = !o.shader_checks)),
            ("coop wide always", with(|o| o.coop_wide = 1)),
            ("coop wide never", with(|o| o.coop_wide = 0)),
        ]
    }
}
