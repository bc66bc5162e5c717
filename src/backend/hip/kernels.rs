//! The kernels of kernels/hip, resolved once from the loaded module, and their launches: grid,
//! block, shared memory and argument order live here and nowhere else.

use std::collections::HashMap;
use std::sync::Arc;

use super::runtime::{launch, Arg, DevPtr, Func, Platform, Runtime};
use super::HipError;
use crate::gguf::GgmlType;

/// A matmul's tile per row group: R rows x T tokens (matmul.hip). Every tile gives the same bits;
/// the host picks by the number of tokens unless told (`HipOptions::tile`, tests iterate them).
/// `Mma` is the tensor-core tile of the q8-order types (Q4_0, Q4_1, Q8_0) on NVIDIA sm_80+;
/// for other types or GPUs it runs as `T8` (same bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tile {
    /// 1 row, 1 token: decode.
    T1,
    /// 2 rows, 4 tokens.
    T4,
    /// 4 rows, 8 tokens: prefill.
    T8,
    /// 4 rows, 16 tokens (slower than T8 on the H100; kept as a variant the tests run).
    T16,
    /// 64 rows x 32 tokens per CTA on int8 tensor cores (mma.sync m16n8k32): prefill up to 32 tokens.
    Mma,
    /// 64 rows x 64 tokens per CTA (16 warps) on int8 tensor cores: longer prefill.
    Mma64,
}

impl Tile {
    pub const ALL: [Tile; 6] = [Tile::T1, Tile::T4, Tile::T8, Tile::T16, Tile::Mma, Tile::Mma64];

    /// The tensor-core tiles (q8-order types on NVIDIA sm_80+ only).
    fn is_mma(self) -> bool {
        matches!(self, Tile::Mma | Tile::Mma64)
    }

    fn tag(self) -> &'static str {
        match self {
            Tile::T1 => "t1",
            Tile::T4 => "t4",
            Tile::T8 => "t8",
            Tile::T16 => "t16",
            Tile::Mma => "mma",
            Tile::Mma64 => "mma64",
        }
    }

    /// (rows, tokens) of the tile.
    fn rt(self) -> (u32, u32) {
        match self {
            Tile::T1 => (1, 1),
            Tile::T4 => (2, 4),
            Tile::T8 => (4, 8),
            Tile::T16 => (4, 16),
            Tile::Mma => (64, 32),
            Tile::Mma64 => (64, 64),
        }
    }

    /// The tile of a matrix of `rows` rows for a step of `n_tok` tokens: one function of the shape
    /// and the batch size (a forced tile, `HipOptions::tile` or a test's, is applied by the caller).
    /// `Mma64` only where it makes at least `MMA64_MIN_CTAS` CTAs (one per SM at a time):
    /// SmolLM2's 960-row q|k|v at 512 tokens is 120 of them, slower than `Mma`'s 240.
    pub fn choose(rows: usize, n_tok: usize) -> Tile {
        match n_tok {
            0 | 1 => Tile::T1,
            2..=4 => Tile::T4,
            // t16 measured slower than t8 on the H100 (1.1B pp512: 11.1k vs 13.1k tokens/s)
            5..=8 => Tile::T8,
            // T8 where there is no tensor-core kernel (Kernels::matmul)
            9..=32 => Tile::Mma,
            _ if rows.div_ceil(64) * n_tok.div_ceil(64) < MMA64_MIN_CTAS => Tile::Mma,
            _ => Tile::Mma64,
        }
    }
}

/// Whether a matmul adds into its output (the residual) or stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Epi {
    Store,
    Add,
}

/// How matmul.hip reads a weight type: its kernel-name tag, work items per block, and whether it
/// multiplies f32 activations (float types) or q8 blocks. The one place a new type is named on
/// the host side (besides its struct in quants.hip).
#[derive(Debug, Clone, Copy)]
pub struct TypeInfo {
    /// kernel-name tag of the type (`q4_0`, `f16`, ...)
    pub tag: &'static str,
    /// values per block as matmul.hip counts them (8 for the float types)
    pub block: usize,
    /// work items per block in matmul.hip
    pub items_per_block: usize,
    /// multiplies f32 activations (float types); false: Q8 activation blocks
    pub float_act: bool,
    /// summed in matmul.hip's q8 order (8 segments of whole blocks; 8 lanes per row, and a
    /// tensor-core kernel) rather than its lane order
    pub q8_order: bool,
}

/// The weight types kernels/hip has matmul and embedding kernels for (`quants.hip`).
pub const HIP_TYPES: [GgmlType; 8] =
    [GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4K, GgmlType::Q6K];

/// How the HIP kernels lay out `ty`; `None`: a type they have no kernel for (see [`HIP_TYPES`]).
pub fn type_info(ty: GgmlType) -> Option<TypeInfo> {
    let (tag, block, items_per_block, float_act) = match ty {
        GgmlType::F32 => ("f32", 8, 1, true),
        GgmlType::F16 => ("f16", 8, 1, true),
        GgmlType::BF16 => ("bf16", 8, 1, true),
        GgmlType::Q4_0 => ("q4_0", 32, 2, false),
        GgmlType::Q4_1 => ("q4_1", 32, 2, false),
        GgmlType::Q8_0 => ("q8_0", 32, 2, false),
        GgmlType::Q4K => ("q4_k", 256, 4, false),
        GgmlType::Q6K => ("q6_k", 256, 8, false),
        _ => return None,
    };
    let q8_order = matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0);
    Some(TypeInfo { tag, block, items_per_block, float_act, q8_order })
}

/// A weight matrix on the device: `rows` rows of `row_bytes` GGUF bytes.
#[derive(Debug, Clone, Copy)]
pub struct MatRef {
    /// device address of the first row
    pub ptr: DevPtr,
    /// weight type of the rows
    pub ty: GgmlType,
    /// number of rows (outputs)
    pub rows: usize,
    /// elements per row (inputs)
    pub cols: usize,
    /// bytes per row in GGUF blocks
    pub row_bytes: usize,
}

/// A matmul's input in both forms (each kernel reads the one its weight type uses).
#[derive(Debug, Clone, Copy)]
pub struct ActRef {
    /// [n_tok, cols] f32
    pub f32: DevPtr,
    /// [n_tok, cols / 32] BlockQ8 (40 bytes each)
    pub q8: DevPtr,
}

/// Bytes of one BlockQ8.
pub const Q8_BYTES: usize = 40;
/// Bytes of one TokInfo (common.h).
pub const TOK_BYTES: usize = 24;
/// The fewest 64 x 64 tiles for which `Tile::choose` picks `Tile::Mma64` (H100: 132 SMs, one
/// such CTA each; 1.1B's 2048-row matrices at 512 tokens make 256, faster than Mma's 512).
const MMA64_MIN_CTAS: usize = 192;

/// Dynamic shared memory of the 64 x 64 tensor-core tile (matmul.hip's FC_MMA64_SMEM).
const MMA64_SHARED: u32 = 8 * 64 * 68 * 4;

/// Keys per attention chunk (attention.hip's FC_ATT_CH; the CPU's ATT_TILE).
pub const ATT_CH: usize = 128;

/// Tokens per CTA of the grouped attention kernel (attention.hip's `attn_partial_g4`; 8 tokens
/// measured slower on the H100: 151 registers, 3 CTAs per SM).
const ATT_GROUP: usize = 4;

/// The fewest tokens of a launch for which attention runs grouped by default (prefill; same bits).
pub const ATT_GROUP_MIN: usize = 32;

/// Rows (token, query head) per CTA of the KV-head attention kernel (attention.hip's FC_ATT_KR).
const ATT_KV_ROWS: usize = 32;

/// The fewest CTAs (KV heads x token groups) for which attention runs fused by default: on the
/// H100 the 1.1B's 512 at 512 tokens are faster fused (ncu 104 us vs 97 + 26), SmolLM2's 156
/// slower (a CTA walks its chunks one after another: pp512 97-98k vs 115-117k t/s).
const ATT_FUSED_MIN_CTAS: usize = 256;

/// Dynamic shared memory of the fused KV-head attention kernel (attention.hip's
/// FC_ATT_FUSED_SHARED): K, V, P, the query rows and the l partials.
fn att_fused_shared(hd: usize) -> u32 {
    (ATT_CH * (hd / 2 + 2) * 4 + ATT_CH * hd * 2 + ATT_CH * 36 * 4 + ATT_KV_ROWS * hd * 4 + 4 * ATT_KV_ROWS * 4) as u32
}

/// How attention's chunk kernel spreads its work; every way gives each token the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttGroup {
    /// One CTA per (chunk, head, token): decode.
    PerToken,
    /// One CTA per (chunk, head, 4 tokens): `attn_partial_g4`.
    Tokens4,
    /// One CTA per (chunk, KV head, 32 / (n_head / n_kv) tokens): `attn_partial_kv{32,64}`, its
    /// chunk of keys and values read once for all query heads of the KV head; head_dim 32 or 64
    /// and at most 32 query heads per KV head (otherwise it runs as `Tokens4`).
    KvHead,
    /// `KvHead` and the merge in one kernel, `attn_fused_kv{32,64}`: one CTA per (KV head, 32 /
    /// (n_head / n_kv) tokens) walks its chunks in order, then merges its rows (NVIDIA sm_80+;
    /// elsewhere, or for other shapes, it runs as `KvHead`).
    KvFused,
}

impl AttGroup {
    pub const ALL: [AttGroup; 4] = [AttGroup::PerToken, AttGroup::Tokens4, AttGroup::KvHead, AttGroup::KvFused];

    /// The way for a launch of `n` tokens whose KV-head kernels would run `kv_ctas` CTAs (0: the
    /// heads do not fit them): per token below `ATT_GROUP_MIN`, else by KV head, fused from
    /// `ATT_FUSED_MIN_CTAS` CTAs.
    pub fn choose(n: usize, kv_ctas: usize) -> AttGroup {
        if n < ATT_GROUP_MIN {
            AttGroup::PerToken
        } else if kv_ctas >= ATT_FUSED_MIN_CTAS {
            AttGroup::KvFused
        } else {
            AttGroup::KvHead
        }
    }
}

/// Slices of 256 elements per CTA of `silu_mul_q8` from `NORM_ROW_MIN` tokens (elementwise.hip's
/// FC_SILU_SPC; fewer tokens: one slice per CTA, as many CTAs as slices).
const SILU_SLICES: usize = 4;

/// Tokens from which RMSNorm runs one CTA per row (`NormGrid::Row`) and SiLU·mul `SILU_SLICES`
/// slices per CTA (prefill); below it both keep decode's short threads.
pub const NORM_ROW_MIN: usize = 16;

/// How RMSNorm's CTAs cover a row of 256-element slices; every way gives the same bits (each
/// CTA computes the row's scale in one fixed order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormGrid {
    /// One CTA per slice, each summing the whole row: few tokens (decode), many CTAs.
    Slice,
    /// One CTA per row, the row read once: prefill.
    Row,
}

impl NormGrid {
    /// Every grid (tests iterate them).
    pub const ALL: [NormGrid; 2] = [NormGrid::Slice, NormGrid::Row];

    /// The grid for `n` rows: by row from `NORM_ROW_MIN` rows, else by slice.
    pub fn choose(n: usize) -> NormGrid {
        if n >= NORM_ROW_MIN {
            NormGrid::Row
        } else {
            NormGrid::Slice
        }
    }
}

pub struct Kernels {
    mm: HashMap<(GgmlType, Tile, Epi), Func>,
    /// the GPU runs matmul.hip's tensor-core kernels (NVIDIA, compute capability 8.0 or later)
    mma: bool,
    embed: HashMap<GgmlType, Func>,
    rmsnorm_q8: Func,
    quantize_q8: Func,
    rope: Func,
    rope_store: Func,
    attn_partial: Func,
    /// attn_partial for groups of ATT_GROUP tokens
    attn_partial_g: Func,
    /// attn_partial for the query heads of a KV head, head_dim 32 and 64
    attn_partial_kv32: Func,
    attn_partial_kv64: Func,
    attn_merge: Func,
    /// attn_partial_kv{32,64} and attn_merge in one kernel, head_dim 32 and 64 (None: not on this GPU)
    attn_fused_kv: Option<(Func, Func)>,
    silu_mul_q8: Func,
    silu_mul: Func,
    add: Func,
    kv_copy: Func,
}

fn grid1(n: usize, per: usize) -> u32 {
    n.div_ceil(per).max(1) as u32
}

impl Kernels {
    pub fn load(rt: &Arc<dyn Runtime>, module: usize) -> Result<Kernels, HipError> {
        let f = |name: &str| rt.function(module, name);
        let mut mm = HashMap::new();
        let mut embed = HashMap::new();
        for ty in HIP_TYPES {
            let tag = type_info(ty).map_or("", |i| i.tag);
            let q8 = type_info(ty).is_some_and(|i| i.q8_order);
            for tile in Tile::ALL {
                if tile.is_mma() && !q8 {
                    continue;
                }
                for (epi, e) in [(Epi::Store, "store"), (Epi::Add, "add")] {
                    mm.insert((ty, tile, epi), f(&format!("mm_{tag}_{}_{e}", tile.tag()))?);
                }
            }
            embed.insert(ty, f(&format!("embed_{tag}"))?);
        }
        let mma = rt.platform() == Platform::Nvidia && Kernels::sm_major(&rt.arch()).is_some_and(|m| m >= 8);
        if mma {
            for ((_, tile, _), func) in &mm {
                if *tile == Tile::Mma64 {
                    rt.set_shared_limit(*func, MMA64_SHARED)?;
                }
            }
        }
        // the fused attention kernel asks for more than 48 KiB of shared memory (NVIDIA's opt-in;
        // sm_80+, where its copies are cp.async); without it attention runs as `AttGroup::KvHead`
        let attn_fused_kv = if mma {
            let (f32_, f64_) = (f("attn_fused_kv32")?, f("attn_fused_kv64")?);
            let ok = rt.set_shared_limit(f32_, att_fused_shared(32)).is_ok() && rt.set_shared_limit(f64_, att_fused_shared(64)).is_ok();
            ok.then_some((f32_, f64_))
        } else {
            None
        };
        Ok(Kernels {
            mm,
            mma,
            embed,
            rmsnorm_q8: f("rmsnorm_q8")?,
            quantize_q8: f("quantize_q8")?,
            rope: f("rope")?,
            rope_store: f("rope_store")?,
            attn_partial: f("attn_partial")?,
            attn_partial_g: f("attn_partial_g4")?,
            attn_partial_kv32: f("attn_partial_kv32")?,
            attn_partial_kv64: f("attn_partial_kv64")?,
            attn_merge: f("attn_merge")?,
            attn_fused_kv,
            silu_mul_q8: f("silu_mul_q8")?,
            silu_mul: f("silu_mul")?,
            add: f("add")?,
            kv_copy: f("kv_copy")?,
        })
    }

    /// The major compute capability of an NVIDIA arch name (`sm_90` -> 9).
    fn sm_major(arch: &str) -> Option<u32> {
        let d = arch.strip_prefix("sm_")?;
        let d = d.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        d.get(..d.len().checked_sub(1)?)?.parse().ok()
    }

    /// Whether this GPU runs the tensor-core tiles (otherwise `Tile::Mma`/`Mma64` run as `Tile::T8`).
    pub fn has_mma(&self) -> bool {
        self.mma
    }

    /// Lanes per row of a matrix of `items` work items: 32, doubled while every lane keeps at
    /// least 4 items, at most 256. A function of the matrix's shape alone (batch invariance).
    pub fn lanes(items: usize) -> u32 {
        let mut l = 32u32;
        while l < 256 && items >= 4 * 2 * l as usize {
            l *= 2;
        }
        l
    }

    /// out[t, r] (=|+=) W x[t] for t < n_tok; out rows are `ldo` floats apart.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(&self, rt: &dyn Runtime, m: &MatRef, x: ActRef, n_tok: usize, out: DevPtr, ldo: usize, epi: Epi, tile: Option<Tile>) -> Result<(), HipError> {
        if n_tok == 0 || m.rows == 0 {
            return Ok(());
        }
        let info = type_info(m.ty).ok_or_else(|| HipError::Unsupported(format!("{} weights", m.ty.name())))?;
        let mut tile = tile.unwrap_or_else(|| Tile::choose(m.rows, n_tok));
        if tile.is_mma() && !(self.mma && info.q8_order) {
            tile = Tile::T8;
        }
        let nb = m.cols / info.block;
        let (r, t) = tile.rt();
        // (block, rows per CTA, shared bytes)
        let (block, rows_per_cta, shared) = if tile == Tile::Mma {
            ([256, 1, 1], r, 0)
        } else if tile == Tile::Mma64 {
            ([512, 1, 1], r, MMA64_SHARED)
        } else if info.q8_order && tile == Tile::T1 {
            // one row per warp (4 lanes per segment), 8 rows per CTA
            ([32, 8, 1], 8, 0)
        } else if info.q8_order {
            // matmul.hip's FC_QS lanes per row group, 8 groups (2 warps) per CTA
            ([8, 8, 1], 8 * r, 0)
        } else {
            let l = Kernels::lanes(nb * info.items_per_block);
            let g = match tile {
                Tile::T1 => (256 / l).max(1),
                _ => (128 / l).max(1),
            };
            ([l, g, 1], g * r, if l > 32 { g * r * t * (l / 32) * 4 } else { 0 })
        };
        let (xp, xs) = if info.float_act { (x.f32, m.cols) } else { (x.q8, m.cols / 32) };
        let f = self.mm[&(m.ty, tile, epi)];
        let grid = [grid1(m.rows, rows_per_cta as usize), grid1(n_tok, t as usize), 1];
        launch(
            rt,
            f,
            grid,
            block,
            shared,
            &[
                Arg::Ptr(m.ptr),
                Arg::U64(m.row_bytes as u64),
                Arg::I32(m.rows as i32),
                Arg::I32(nb as i32),
                Arg::Ptr(xp),
                Arg::I32(xs as i32),
                Arg::I32(n_tok as i32),
                Arg::Ptr(out),
                Arg::I32(ldo as i32),
            ],
        )
    }

    /// out[t] = row ids[t] of `m`, dequantized; ids: [n] u32 on the device.
    pub fn embed(&self, rt: &dyn Runtime, m: &MatRef, ids: DevPtr, n: usize, out: DevPtr) -> Result<(), HipError> {
        let f = self.embed[&m.ty];
        launch(rt, f, [n.max(1) as u32, 1, 1], [256, 1, 1], 0, &[Arg::Ptr(m.ptr), Arg::U64(m.row_bytes as u64), Arg::Ptr(ids), Arg::I32(m.cols as i32), Arg::Ptr(out)])
    }

    /// xn = rmsnorm(x) * w for n rows of e; with `xq`, their q8 blocks too (e % 32 == 0).
    /// `xn` None: only the q8 blocks (a matmul on q8 weights reads nothing else).
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm(&self, rt: &dyn Runtime, x: DevPtr, w: DevPtr, e: usize, eps: f32, xn: Option<DevPtr>, xq: Option<DevPtr>, n: usize) -> Result<(), HipError> {
        self.rmsnorm_rows(rt, x, None, w, e, eps, xn, xq, n, None)
    }

    /// `rmsnorm` of the rows `rows` ([n] u32 on the device; None: rows 0..n) of x, on `grid`
    /// (None: `NormGrid::choose(n)`); every grid gives the same bits.
    #[allow(clippy::too_many_arguments)]
    pub fn rmsnorm_rows(
        &self,
        rt: &dyn Runtime,
        x: DevPtr,
        rows: Option<DevPtr>,
        w: DevPtr,
        e: usize,
        eps: f32,
        xn: Option<DevPtr>,
        xq: Option<DevPtr>,
        n: usize,
        grid: Option<NormGrid>,
    ) -> Result<(), HipError> {
        let slices = grid1(e, 256) as usize;
        let spc = match grid.unwrap_or_else(|| NormGrid::choose(n)) {
            NormGrid::Slice => 1,
            NormGrid::Row => slices,
        };
        let args = [
            Arg::Ptr(x),
            Arg::Ptr(w),
            Arg::I32(e as i32),
            Arg::F32(eps),
            Arg::Ptr(xn.unwrap_or(0)),
            Arg::Ptr(xq.unwrap_or(0)),
            Arg::I32(xq.is_some() as i32),
            Arg::I32(spc as i32),
            Arg::Ptr(rows.unwrap_or(0)),
        ];
        launch(rt, self.rmsnorm_q8, [n as u32, grid1(slices, spc), 1], [256, 1, 1], 0, &args)
    }

    pub fn quantize(&self, rt: &dyn Runtime, x: DevPtr, cols: usize, xq: DevPtr, n: usize) -> Result<(), HipError> {
        launch(rt, self.quantize_q8, [n as u32, 1, 1], [256, 1, 1], 0, &[Arg::Ptr(x), Arg::I32(cols as i32), Arg::Ptr(xq)])
    }

    /// RoPE in place on n rows of n_head heads; pos: [n] u32.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(&self, rt: &dyn Runtime, x: DevPtr, n_head: usize, hd: usize, table: DevPtr, pos: DevPtr, n: usize) -> Result<(), HipError> {
        launch(rt, self.rope, [n as u32, 1, 1], [128, 1, 1], 0, &[Arg::Ptr(x), Arg::I32(n_head as i32), Arg::I32(hd as i32), Arg::Ptr(table), Arg::Ptr(pos)])
    }

    #[allow(clippy::too_many_arguments)]
    pub fn rope_store(&self, rt: &dyn Runtime, qkv: DevPtr, n_head: usize, n_kv: usize, hd: usize, table: DevPtr, tok: DevPtr, layer: usize, n: usize) -> Result<(), HipError> {
        let args = [Arg::Ptr(qkv), Arg::I32(n_head as i32), Arg::I32(n_kv as i32), Arg::I32(hd as i32), Arg::Ptr(table), Arg::Ptr(tok), Arg::I32(layer as i32)];
        // one thread per q pair, k pair and v pair
        let work = (n_head * hd) / 2 + n_kv * hd;
        launch(rt, self.rope_store, [n as u32, grid1(work, 128), 1], [128, 1, 1], 0, &args)
    }

    /// Attention of n tokens (rows of `q`, `q_stride` floats apart; their TokInfo at `tok`) over
    /// layer `layer` of their caches, into `att` [n, n_head*hd] (and `attq` when given).
    /// `part`: scratch of at least n * n_head * max_chunks * (hd + 2) floats. `grouped`: how CTAs
    /// share the work (None: `AttGroup::choose`); the same bits.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        rt: &dyn Runtime,
        q: DevPtr,
        q_stride: usize,
        heads: (usize, usize, usize),
        tok: DevPtr,
        layer: usize,
        part: DevPtr,
        max_chunks: usize,
        att: DevPtr,
        attq: Option<DevPtr>,
        n: usize,
        grouped: Option<AttGroup>,
    ) -> Result<(), HipError> {
        let (n_head, n_kv, hd) = heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let args = [
            Arg::Ptr(q),
            Arg::I32(q_stride as i32),
            Arg::I32(n_head as i32),
            Arg::I32(n_kv as i32),
            Arg::I32(hd as i32),
            Arg::F32(scale),
            Arg::Ptr(tok),
            Arg::I32(layer as i32),
            Arg::Ptr(part),
            Arg::I32(max_chunks as i32),
        ];
        let qpk = n_head / n_kv.max(1);
        let kv_func = match hd {
            32 => Some(self.attn_partial_kv32),
            64 => Some(self.attn_partial_kv64),
            _ => None,
        };
        let grouped_args = || [&args[..7], &[Arg::I32(n as i32)], &args[7..]].concat();
        // the KV-head kernels take up to ATT_KV_ROWS query heads per KV head
        let kv_fits = (1..=ATT_KV_ROWS).contains(&qpk);
        let kv_ctas = if kv_fits { n_kv * n.div_ceil(ATT_KV_ROWS / qpk) } else { 0 };
        let grouped = grouped.unwrap_or_else(|| AttGroup::choose(n, kv_ctas));
        let fused = match (grouped, self.attn_fused_kv, hd) {
            (AttGroup::KvFused, Some((f, _)), 32) | (AttGroup::KvFused, Some((_, f)), 64) if kv_fits => Some(f),
            _ => None,
        };
        if let Some(f) = fused {
            // 12 arguments: grouped_args without hd, then att and attq (0: no q8 blocks)
            let args = [&args[..4], &args[5..7], &[Arg::I32(n as i32)], &args[7..], &[Arg::Ptr(att), Arg::Ptr(attq.unwrap_or(0))]].concat();
            let grid = [n_kv as u32, grid1(n, ATT_KV_ROWS / qpk), 1];
            return launch(rt, f, grid, [128, 1, 1], att_fused_shared(hd), &args);
        }
        match (grouped, kv_func) {
            (AttGroup::PerToken, _) => launch(rt, self.attn_partial, [max_chunks as u32, n_head as u32, n as u32], [128, 1, 1], 0, &args)?,
            // KvFused where its kernel is missing (not NVIDIA sm_80+) runs as KvHead
            (AttGroup::KvHead | AttGroup::KvFused, Some(f)) if kv_fits => {
                let grid = [max_chunks as u32, n_kv as u32, grid1(n, ATT_KV_ROWS / qpk)];
                launch(rt, f, grid, [128, 1, 1], 0, &grouped_args())?
            }
            _ => launch(rt, self.attn_partial_g, [max_chunks as u32, n_head as u32, grid1(n, ATT_GROUP)], [128, 1, 1], 0, &grouped_args())?,
        }
        let args = [
            Arg::Ptr(part),
            Arg::I32(n_head as i32),
            Arg::I32(hd as i32),
            Arg::I32(max_chunks as i32),
            Arg::Ptr(tok),
            Arg::Ptr(att),
            Arg::Ptr(attq.unwrap_or(0)),
            Arg::I32(attq.is_some() as i32),
        ];
        if max_chunks * 8 > 48 << 10 {
            return Err(HipError::Unsupported(format!("attention over {max_chunks} chunks of {ATT_CH} keys (at most 6144)")));
        }
        launch(rt, self.attn_merge, [n as u32, n_head as u32, 1], [128, 1, 1], (max_chunks * 8) as u32, &args)
    }

    /// act = silu(gate) * up from gu [n, 2*ff] (`act` None: not written), and actq when given.
    pub fn silu_mul_q8(&self, rt: &dyn Runtime, gu: DevPtr, ff: usize, act: Option<DevPtr>, actq: Option<DevPtr>, n: usize) -> Result<(), HipError> {
        let spc = if n >= NORM_ROW_MIN { SILU_SLICES } else { 1 };
        let args = [Arg::Ptr(gu), Arg::I32(ff as i32), Arg::Ptr(act.unwrap_or(0)), Arg::Ptr(actq.unwrap_or(0)), Arg::I32(actq.is_some() as i32), Arg::I32(spc as i32)];
        launch(rt, self.silu_mul_q8, [n as u32, grid1(ff, 256 * spc), 1], [256, 1, 1], 0, &args)
    }

    pub fn silu_mul(&self, rt: &dyn Runtime, g: DevPtr, u: DevPtr, n: usize) -> Result<(), HipError> {
        launch(rt, self.silu_mul, [grid1(n, 256), 1, 1], [256, 1, 1], 0, &[Arg::Ptr(g), Arg::Ptr(u), Arg::I32(n as i32)])
    }

    pub fn add(&self, rt: &dyn Runtime, x: DevPtr, y: DevPtr, n: usize) -> Result<(), HipError> {
        launch(rt, self.add, [grid1(n, 256), 1, 1], [256, 1, 1], 0, &[Arg::Ptr(x), Arg::Ptr(y), Arg::I32(n as i32)])
    }

    /// Positions 0..n of `lh` (layer, head) runs of head_dim f16 values, between caches of
    /// capacities cap_dst and cap_src.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_copy(&self, rt: &dyn Runtime, dst: DevPtr, src: DevPtr, cap_dst: usize, cap_src: usize, n: usize, hd: usize, lh: usize) -> Result<(), HipError> {
        let args = [Arg::Ptr(dst), Arg::Ptr(src), Arg::I32(cap_dst as i32), Arg::I32(cap_src as i32), Arg::I32(n as i32), Arg::I32(hd as i32)];
        launch(rt, self.kv_copy, [grid1(n * hd, 256), lh as u32, 1], [256, 1, 1], 0, &args)
    }
}
