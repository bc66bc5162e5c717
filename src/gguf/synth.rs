//! Synthetic models: valid GGUF files with random weights, for speed work on shapes larger than
//! the default model (`smollm2-135m`, `tinyllama-1.1b`) and for checking every architecture the
//! engine runs against llama.cpp on files it loads too (`qwen2`, `qwen3`, `llama3`, `phi3`,
//! `gemma3`: small shapes, each architecture's own tensors, metadata and tokenizer kind).
//!
//! Weights are N(0, std) (norm weights N(1, 0.02)); the architecture shapes use larger
//! deviations than the speed presets so that attention and every layer visibly change the
//! logits (a test on them can fail). Generation is deterministic for a seed and uses only
//! exact f32 arithmetic (no libm), so the same seed gives the same bytes on every machine: the
//! stored llama.cpp references name the sha256 of the file they were made from. Every row has
//! its own random stream, whatever the thread count.

pub mod vocab;

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use self::vocab::{control, Special, SpecialIds};
use super::writer::GgufWriter;
use super::{GgmlType, GgufFile, Value};
pub use crate::rng::Rng;

/// The architectures synthetic models come in (`general.architecture`, plus `llama3`: the
/// `llama` architecture in Llama 3's shape, rope frequency factors and tokenizer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthArch {
    Llama,
    Llama3,
    Qwen2,
    Qwen3,
    Phi3,
    Gemma3,
}

impl SynthArch {
    pub const ALL: [SynthArch; 6] = [SynthArch::Llama, SynthArch::Llama3, SynthArch::Qwen2, SynthArch::Qwen3, SynthArch::Phi3, SynthArch::Gemma3];

    pub fn name(self) -> &'static str {
        match self {
            SynthArch::Llama => "llama",
            SynthArch::Llama3 => "llama3",
            SynthArch::Qwen2 => "qwen2",
            SynthArch::Qwen3 => "qwen3",
            SynthArch::Phi3 => "phi3",
            SynthArch::Gemma3 => "gemma3",
        }
    }

    pub fn parse(s: &str) -> Result<SynthArch, SynthError> {
        SynthArch::ALL.into_iter().find(|a| a.name() == s).ok_or_else(|| SynthError::UnknownArch(s.to_string()))
    }

    /// `general.architecture` of the file.
    fn gguf_arch(self) -> &'static str {
        match self {
            SynthArch::Llama | SynthArch::Llama3 => "llama",
            other => other.name(),
        }
    }
}

/// Hyper-parameters of a synthetic model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthShape {
    /// The model's name (written into `general.name`).
    pub name: String,
    /// The architecture whose tensors and metadata are written.
    pub arch: SynthArch,
    /// Width of the hidden states.
    pub n_embd: usize,
    /// Transformer layers.
    pub n_layer: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Per-head width of Q, K and V; `None`: n_embd / n_head.
    pub head_dim: Option<usize>,
    /// Width of the feed-forward layer.
    pub n_ff: usize,
    /// Vocabulary size, tokens.
    pub vocab: usize,
    /// Context length, tokens (`context_length`).
    pub context: usize,
    /// RoPE frequency base.
    pub rope_base: f32,
    /// RMSNorm epsilon.
    pub rms_eps: f32,
    /// No `output.weight`: the output projection reuses the token embedding.
    pub tied_output: bool,
    /// Sliding attention window of the SWA layers (gemma3: every layer but each
    /// `swa_pattern`-th), or `None`.
    pub sliding_window: Option<usize>,
    /// Every `swa_pattern`-th layer is global (0 with no sliding window).
    pub swa_pattern: usize,
    /// Standard deviation of the layers' weight matrices (and biases).
    pub weight_std: f32,
    /// Standard deviation of the output matrix (and of a tied embedding).
    pub output_std: f32,
    /// Standard deviation of an untied token embedding (`None`: `output_std`).
    pub embed_std: Option<f32>,
}

/// Names accepted by [`SynthShape::preset`].
pub const PRESETS: [&str; 2] = ["smollm2-135m", "tinyllama-1.1b"];

impl SynthShape {
    /// A real model's shape, Llama architecture, small weights (speed work).
    pub fn preset(name: &str) -> Option<SynthShape> {
        let s = |n_embd, n_layer, n_head, n_head_kv, n_ff, vocab, context, rope_base, tied_output| SynthShape {
            name: name.to_string(),
            arch: SynthArch::Llama,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            head_dim: None,
            n_ff,
            vocab,
            context,
            rope_base,
            rms_eps: 1e-5,
            tied_output,
            sliding_window: None,
            swa_pattern: 0,
            weight_std: 0.02,
            output_std: 0.02,
            embed_std: None,
        };
        match name {
            "smollm2-135m" => Some(s(576, 30, 9, 3, 1536, 49152, 8192, 100000.0, true)),
            "tinyllama-1.1b" => Some(s(2048, 22, 32, 4, 5632, 32000, 2048, 10000.0, false)),
            _ => None,
        }
    }

    /// A small model of `arch` for correctness tests (a few MB): n_embd 256, 2 layers (3 for
    /// gemma3: two sliding-window layers, then a global one), GQA 4:2, n_ff 512, vocab 1024.
    pub fn small(arch: SynthArch) -> SynthShape {
        let mut s = SynthShape {
            name: format!("small-{}", arch.name()),
            arch,
            n_embd: 256,
            n_layer: 2,
            n_head: 4,
            n_head_kv: 2,
            head_dim: None,
            n_ff: 512,
            vocab: 1024,
            context: 4096,
            rope_base: 10000.0,
            rms_eps: 1e-5,
            tied_output: false,
            sliding_window: None,
            swa_pattern: 0,
            weight_std: 0.06,
            output_std: 0.1,
            embed_std: None,
        };
        match arch {
            SynthArch::Llama => {}
            SynthArch::Llama3 => s.rope_base = 500000.0,
            SynthArch::Qwen2 => {
                s.rope_base = 1_000_000.0;
                s.tied_output = true;
                s.rms_eps = 1e-6;
            }
            SynthArch::Qwen3 => {
                s.rope_base = 1_000_000.0;
                s.head_dim = Some(128);
                s.rms_eps = 1e-6;
            }
            SynthArch::Phi3 => {}
            SynthArch::Gemma3 => {
                s.n_layer = 3;
                s.head_dim = Some(128);
                s.rope_base = 1_000_000.0;
                s.rms_eps = 1e-6;
                // Untied (llama.cpp reads an `output.weight` if there is one): with random weights
                // a tied output over embeddings scaled by √n_embd picks the input token again and
                // again, whatever the layers compute. (The real Gemma 3 checks the tied path.)
                s.sliding_window = Some(8);
                s.swa_pattern = 3;
                s.embed_std = Some(0.05);
                s.output_std = 0.15;
            }
        }
        s
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.n_embd / self.n_head.max(1))
    }

    /// Parameters in the weight matrices (embedding and output included).
    pub fn n_params(&self) -> u64 {
        let (e, hd) = (self.n_embd as u64, self.head_dim() as u64);
        let (qd, kvd) = (hd * self.n_head as u64, hd * self.n_head_kv as u64);
        let layer = e * qd * 2 + e * kvd * 2 + e * self.n_ff as u64 * 3;
        let out = if self.tied_output { 0 } else { e * self.vocab as u64 };
        e * self.vocab as u64 + out + layer * self.n_layer as u64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape {0:?} (known: smollm2-135m, tinyllama-1.1b)")]
    UnknownShape(String),
    #[error("unknown architecture {0:?} (known: llama, llama3, qwen2, qwen3, phi3, gemma3)")]
    UnknownArch(String),
    #[error("unsupported quantization {0:?} (a GGML type such as q4_0, q5_0, q8_0, q2_k .. q6_k, iq4_nl, mxfp4, f16; or the mix q4_k_m)")]
    UnknownQuant(String),
    #[error("invalid shape: {0}")]
    BadShape(String),
    #[error("tokenizer source: {0}")]
    Tokenizer(String),
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// The weight types of a synthetic model: one type for every matrix, or a mix like llama.cpp's
/// Q4_K_M (Q6_K for `attn_v` and `ffn_down`, Q4_K elsewhere, Q5_0 where a row is not whole
/// 256-blocks, Q8_0 embeddings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SynthQuant {
    All(GgmlType),
    Q4KM,
}

impl SynthQuant {
    pub fn name(self) -> String {
        match self {
            SynthQuant::All(t) => t.name().to_string(),
            SynthQuant::Q4KM => "Q4_K_M".into(),
        }
    }

    /// The type of tensor `name` with rows of `cols` values.
    fn type_of(self, name: &str, cols: usize) -> GgmlType {
        let ty = match self {
            SynthQuant::All(t) => t,
            SynthQuant::Q4KM if name.starts_with("token_embd") || name.starts_with("output.") => GgmlType::Q8_0,
            SynthQuant::Q4KM if name.contains("attn_v") || name.contains("ffn_down") => GgmlType::Q6K,
            SynthQuant::Q4KM => GgmlType::Q4K,
        };
        if cols % ty.block_elems() == 0 {
            ty
        } else if cols % 32 == 0 {
            GgmlType::Q5_0
        } else {
            GgmlType::F16
        }
    }

    /// llama.cpp's `general.file_type`.
    fn file_type(self) -> u32 {
        match self {
            SynthQuant::Q4KM => 15,
            SynthQuant::All(t) => match t {
                GgmlType::F32 => 0,
                GgmlType::F16 => 1,
                GgmlType::Q4_0 => 2,
                GgmlType::Q4_1 => 3,
                GgmlType::Q8_0 => 7,
                GgmlType::Q5_0 => 8,
                GgmlType::Q5_1 => 9,
                GgmlType::Q2K => 10,
                GgmlType::Q3K => 12,
                GgmlType::Q4K => 14,
                GgmlType::Q5K => 16,
                GgmlType::Q6K => 18,
                GgmlType::IQ4NL => 25,
                GgmlType::BF16 => 32,
                GgmlType::MXFP4 => 38,
            },
        }
    }
}

/// Quantization of the weight matrices: a GGML type name, or `q4_k_m`.
pub fn parse_quant(s: &str) -> Result<SynthQuant, SynthError> {
    if s.eq_ignore_ascii_case("q4_k_m") {
        return Ok(SynthQuant::Q4KM);
    }
    GgmlType::from_name(s).map(SynthQuant::All).ok_or_else(|| SynthError::UnknownQuant(s.to_string()))
}

/// The random stream of one weight row (the sampler's splitmix64).
fn row_stream(seed: u64) -> Rng {
    Rng::new(seed ^ 0x5DEE_CE66_D1CE_4E5B)
}

/// Approximately standard normal: the sum of four uniforms, centred and scaled to unit
/// variance (Irwin-Hall). Plain f32 arithmetic, so the same on every machine.
pub fn normal(rng: &mut Rng) -> f32 {
    let s = rng.next_f32() + rng.next_f32() + rng.next_f32() + rng.next_f32();
    (s - 2.0) * 1.732_050_8
}

/// Quantizes `x` (whole blocks) to `ty` (see [`super::quantize`]), appending to `out`.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut Vec<u8>) -> Result<(), SynthError> {
    if x.len() % ty.block_elems() != 0 {
        return Err(SynthError::BadShape(format!("{} values are not whole {} blocks", x.len(), ty.name())));
    }
    super::quantize::quantize_row(ty, x, out);
    Ok(())
}

/// A random `rows × cols` matrix of N(mean, std) values quantized to `ty`; row r draws from
/// its own stream seeded by (seed, r).
pub fn random_matrix(ty: GgmlType, rows: usize, cols: usize, mean: f32, std: f32, seed: u64) -> Result<Vec<u8>, SynthError> {
    let rb = ty.row_bytes(cols).ok_or_else(|| SynthError::BadShape(format!("{cols} columns of {}", ty.name())))?;
    let mut data = vec![0u8; rows * rb];
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rows_per = rows.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        for (i, part) in data.chunks_mut((rows_per * rb).max(1)).enumerate() {
            s.spawn(move || {
                let mut q = Vec::with_capacity(rb);
                for (j, dst) in part.chunks_exact_mut(rb.max(1)).enumerate() {
                    let mut rng = row_stream(seed.wrapping_mul(0x1000_0000_01B3) ^ (i * rows_per + j) as u64);
                    let x: Vec<f32> = (0..cols).map(|_| mean + std * normal(&mut rng)).collect();
                    q.clear();
                    super::quantize::quantize_row(ty, &x, &mut q);
                    dst.copy_from_slice(&q);
                }
            });
        }
    });
    Ok(data)
}

/// The tokenizer metadata of a synthetic model of `arch` with `vocab` tokens.
fn synthetic_tokenizer(arch: SynthArch, vocab: usize) -> Vec<(String, Value)> {
    let ids = |bos, eos, eot, unk, pad| SpecialIds { bos, eos, eot, unk, pad };
    match arch {
        SynthArch::Llama => vocab::bpe(vocab, "gpt-2", &[control("<|endoftext|>")], &ids(Some(0), Some(0), None, None, None), false),
        SynthArch::Llama3 => {
            let sp = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"].map(control);
            vocab::bpe(vocab, "llama-bpe", &sp, &ids(Some(0), Some(1), Some(4), None, None), true)
        }
        SynthArch::Qwen2 | SynthArch::Qwen3 => {
            let sp = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(control);
            vocab::bpe(vocab, "qwen2", &sp, &ids(Some(0), Some(2), None, None, Some(0)), false)
        }
        SynthArch::Phi3 => {
            // llama.cpp requires `<|endoftext|>` in a vocabulary of a model named Phi-3.
            let sp: [Special; 7] = [
                Special { text: "<unk>", ty: 2 },
                control("<s>"),
                control("</s>"),
                control("<|endoftext|>"),
                control("<|user|>"),
                control("<|assistant|>"),
                control("<|end|>"),
            ];
            vocab::spm(vocab, &sp, &ids(Some(1), Some(2), Some(6), Some(0), None), true, true)
        }
        SynthArch::Gemma3 => {
            let sp: [Special; 6] = [
                control("<pad>"),
                control("<eos>"),
                control("<bos>"),
                Special { text: "<unk>", ty: 2 },
                control("<start_of_turn>"),
                control("<end_of_turn>"),
            ];
            vocab::spm(vocab, &sp, &ids(Some(2), Some(1), Some(5), Some(3), Some(0)), true, false)
        }
    }
}

/// Llama 3's rope frequency factors (`rope_freqs.weight`, one per rotated pair) for a scaling
/// factor of 8, low / high frequency factors 1 / 4 and an original context of 8192, exactly as
/// llama.cpp's converter computes them.
pub fn llama3_rope_factors(head_dim: usize, base: f32) -> Vec<f32> {
    let (factor, low, high, old_ctx) = (8.0f64, 1.0f64, 4.0f64, 8192.0f64);
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / (base as f64).powf(2.0 * i as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor as f32
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (1.0 / ((1.0 - smooth) / factor + smooth)) as f32
            }
        })
        .collect()
}

/// Progress of [`write_synth_model`]: `done` of `total` tensors generated.
#[derive(Debug, Clone)]
pub struct SynthProgress<'a> {
    /// Name of the tensor just generated.
    pub tensor: &'a str,
    /// Tensors generated so far.
    pub done: usize,
    /// Tensors in the file.
    pub total: usize,
    /// Tensor data generated so far, bytes.
    pub bytes: u64,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct SynthReport {
    /// The shape written.
    pub shape: SynthShape,
    /// The weight types used.
    pub quant: SynthQuant,
    /// Parameters of the shape ([`SynthShape::n_params`]).
    pub n_params: u64,
    /// Size of the written file, bytes.
    pub file_bytes: u64,
}

/// What a tensor of the plan holds.
enum Fill {
    /// A matrix of N(0, std) (GGML dims [cols, rows]).
    Matrix { cols: usize, rows: usize, std: f32 },
    /// An f32 vector of N(mean, std).
    Vector { n: usize, mean: f32, std: f32 },
    /// Fixed f32 values.
    Values(Vec<f32>),
}

/// Every tensor of a model of `s`, in file order.
fn tensor_plan(s: &SynthShape) -> Vec<(String, Fill)> {
    let (e, hd, ff, ws) = (s.n_embd, s.head_dim(), s.n_ff, s.weight_std);
    let (qd, kvd) = (hd * s.n_head, hd * s.n_head_kv);
    let m = |cols, rows| Fill::Matrix { cols, rows, std: ws };
    let norm = |n| Fill::Vector { n, mean: 1.0, std: 0.02 };
    let bias = |n| Fill::Vector { n, mean: 0.0, std: ws * 2.0 };
    let embed_std = if s.tied_output { s.output_std } else { s.embed_std.unwrap_or(s.output_std) };
    let mut plan: Vec<(String, Fill)> = vec![("token_embd.weight".into(), Fill::Matrix { cols: e, rows: s.vocab, std: embed_std })];
    if s.arch == SynthArch::Llama3 {
        plan.push(("rope_freqs.weight".into(), Fill::Values(llama3_rope_factors(hd, s.rope_base))));
    }
    for l in 0..s.n_layer {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        plan.push((n("attn_norm"), norm(e)));
        if s.arch == SynthArch::Phi3 {
            plan.push((n("attn_qkv"), m(e, qd + 2 * kvd)));
        } else {
            plan.extend([(n("attn_q"), m(e, qd)), (n("attn_k"), m(e, kvd)), (n("attn_v"), m(e, kvd))]);
        }
        if s.arch == SynthArch::Qwen2 {
            let b = |t: &str| format!("blk.{l}.{t}.bias");
            plan.extend([(b("attn_q"), bias(qd)), (b("attn_k"), bias(kvd)), (b("attn_v"), bias(kvd))]);
        }
        if matches!(s.arch, SynthArch::Qwen3 | SynthArch::Gemma3) {
            plan.extend([(n("attn_q_norm"), norm(hd)), (n("attn_k_norm"), norm(hd))]);
        }
        plan.push((n("attn_output"), m(qd, e)));
        if s.arch == SynthArch::Gemma3 {
            plan.push((n("post_attention_norm"), norm(e)));
        }
        plan.push((n("ffn_norm"), norm(e)));
        if s.arch == SynthArch::Phi3 {
            plan.push((n("ffn_up"), m(e, 2 * ff)));
        } else {
            plan.extend([(n("ffn_gate"), m(e, ff)), (n("ffn_up"), m(e, ff))]);
        }
        plan.push((n("ffn_down"), m(ff, e)));
        if s.arch == SynthArch::Gemma3 {
            plan.push((n("post_ffw_norm"), norm(e)));
        }
    }
    plan.push(("output_norm.weight".into(), norm(e)));
    if !s.tied_output {
        plan.push(("output.weight".into(), Fill::Matrix { cols: e, rows: s.vocab, std: s.output_std }));
    }
    plan
}

/// The architecture metadata of `s` (`{arch}.*` keys).
fn arch_metadata(s: &SynthShape) -> Vec<(String, Value)> {
    let arch = s.arch.gguf_arch();
    let k = |key: &str| format!("{arch}.{key}");
    let u = |v: usize| Value::U32(v as u32);
    let hd = s.head_dim();
    let mut m = vec![
        (k("context_length"), u(s.context)),
        (k("embedding_length"), u(s.n_embd)),
        (k("block_count"), u(s.n_layer)),
        (k("feed_forward_length"), u(s.n_ff)),
        (k("attention.head_count"), u(s.n_head)),
        (k("attention.head_count_kv"), u(s.n_head_kv)),
        (k("rope.freq_base"), Value::F32(s.rope_base)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps)),
    ];
    if s.head_dim.is_some() {
        m.extend([(k("attention.key_length"), u(hd)), (k("attention.value_length"), u(hd))]);
    }
    if matches!(s.arch, SynthArch::Llama | SynthArch::Llama3 | SynthArch::Phi3) {
        m.push((k("rope.dimension_count"), u(hd)));
    }
    if matches!(s.arch, SynthArch::Llama | SynthArch::Llama3) {
        m.push((k("vocab_size"), u(s.vocab)));
    }
    if let Some(w) = s.sliding_window {
        m.push((k("attention.sliding_window"), u(w)));
        if s.arch == SynthArch::Gemma3 {
            m.push((k("attention.sliding_window_pattern"), u(s.swa_pattern)));
        }
    }
    m
}

/// Writes a synthetic model of `shape` to `path`. `tokenizer_from` copies the `tokenizer.*`
/// metadata of a real model (its vocabulary size then replaces the shape's).
pub fn write_synth_model(
    shape: &SynthShape,
    quant: impl Into<SynthQuant>,
    seed: u64,
    tokenizer_from: Option<&GgufFile>,
    path: &Path,
    mut progress: impl FnMut(SynthProgress<'_>),
) -> Result<SynthReport, SynthError> {
    let quant = quant.into();
    let mut shape = shape.clone();
    let tok_meta: Vec<(String, Value)> = match tokenizer_from {
        Some(g) => {
            let meta: Vec<(String, Value)> = g.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")).map(|(k, v)| (k.clone(), v.clone())).collect();
            let n = g.array("tokenizer.ggml.tokens").map_err(|e| SynthError::Tokenizer(e.to_string()))?.len();
            shape.vocab = n;
            meta
        }
        None => synthetic_tokenizer(shape.arch, shape.vocab),
    };
    let s = &shape;
    let hd = s.head_dim();
    if s.n_head == 0 || s.n_head_kv == 0 || s.n_head % s.n_head_kv != 0 || hd % 2 != 0 || (s.head_dim.is_none() && s.n_embd % s.n_head != 0) {
        return Err(SynthError::BadShape(format!("n_embd {} with {} heads of {hd} / {} KV heads", s.n_embd, s.n_head, s.n_head_kv)));
    }
    if s.n_embd % 32 != 0 || s.n_ff % 32 != 0 || (hd * s.n_head) % 32 != 0 || s.vocab < 300 {
        return Err(SynthError::BadShape(format!("n_embd {}, n_ff {} and n_head * head_dim must be multiples of 32, vocab >= 300", s.n_embd, s.n_ff)));
    }

    let mut w = GgufWriter::new();
    w.meta("general.architecture", Value::String(s.arch.gguf_arch().into()))
        .meta("general.name", Value::String(format!("forge-cache synthetic {} {}", s.name, quant.name())))
        .meta("general.file_type", Value::U32(quant.file_type()))
        .meta("general.quantization_version", Value::U32(2));
    for (k, v) in arch_metadata(s) {
        w.meta(&k, v);
    }
    for (k, v) in tok_meta {
        w.meta(&k, v);
    }

    let plan = tensor_plan(s);
    let total = plan.len();
    let mut bytes = 0u64;
    for (i, (name, fill)) in plan.iter().enumerate() {
        let tseed = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9));
        let (dims, ty, data) = match fill {
            Fill::Matrix { cols, rows, std } => {
                let ty = quant.type_of(name, *cols);
                (vec![*cols as u64, *rows as u64], ty, random_matrix(ty, *rows, *cols, 0.0, *std, tseed)?)
            }
            Fill::Vector { n, mean, std } => (vec![*n as u64], GgmlType::F32, random_matrix(GgmlType::F32, 1, *n, *mean, *std, tseed)?),
            Fill::Values(v) => (vec![v.len() as u64], GgmlType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect()),
        };
        bytes += data.len() as u64;
        w.tensor(name, &dims, ty, data);
        progress(SynthProgress { tensor: name, done: i + 1, total, bytes });
    }
    let io = |source| SynthError::Io { path: path.display().to_string(), source };
    let mut f = BufWriter::with_capacity(1 << 20, File::create(path).map_err(io)?);
    w.write_to(&mut f).map_err(io)?;
    let f = f.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    let file_bytes = std::fs::metadata(path).map_err(io)?.len();
    Ok(SynthReport { n_params: shape.n_params(), shape, quant, file_bytes })
}

impl From<GgmlType> for SynthQuant {
    fn from(t: GgmlType) -> SynthQuant {
        SynthQuant::All(t)
    }
}

/// A shape small enough for unit tests (2 layers, n_embd 128, GQA 4:2, Llama).
#[cfg(test)]
pub(crate) fn tiny_shape() -> SynthShape {
    SynthShape {
        name: "tiny".into(),
        n_embd: 128,
        n_layer: 2,
        n_head: 4,
        n_head_kv: 2,
        n_ff: 256,
        vocab: 320,
        context: 256,
        rope_base: 10000.0,
        weight_std: 0.02,
        output_std: 0.02,
        ..SynthShape::small(SynthArch::Llama)
    }
}

#[cfg(test)]
mod tests;
