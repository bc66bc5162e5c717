//! Synthetic Llama models for performance work: valid GGUF files with random weights, in the
//! shapes of real models (`smollm2-135m`, `tinyllama-1.1b`), quantized to Q4_0 / Q4_1 / Q8_0
//! with GGML's reference quantizers, and the tokenizer metadata llama.cpp needs (a small valid
//! byte-level BPE vocabulary, or the arrays of a real model's tokenizer).
//!
//! Weights are N(0, 0.02) (norm weights N(1, 0.02)), so activations stay finite through any
//! number of layers. Generation is deterministic for a seed: every row has its own random
//! stream, whatever the thread count (rows are split over `std::thread::scope` threads).

use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use half::f16;

use super::writer::GgufWriter;
use super::{GgmlType, GgufFile, Value, QK};
pub use crate::engine::sampler::Rng;

/// Hyper-parameters of a synthetic Llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct SynthShape {
    pub name: String,
    pub n_embd: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub vocab: usize,
    pub context: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// No `output.weight`: the output projection reuses the token embedding.
    pub tied_output: bool,
}

/// Names accepted by [`SynthShape::preset`].
pub const PRESETS: [&str; 2] = ["smollm2-135m", "tinyllama-1.1b"];

impl SynthShape {
    pub fn preset(name: &str) -> Option<SynthShape> {
        let s = |n_embd, n_layer, n_head, n_head_kv, n_ff, vocab, context, rope_base, rms_eps, tied_output| SynthShape {
            name: name.to_string(),
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            vocab,
            context,
            rope_base,
            rms_eps,
            tied_output,
        };
        match name {
            "smollm2-135m" => Some(s(576, 30, 9, 3, 1536, 49152, 8192, 100000.0, 1e-5, true)),
            "tinyllama-1.1b" => Some(s(2048, 22, 32, 4, 5632, 32000, 2048, 10000.0, 1e-5, false)),
            _ => None,
        }
    }

    /// Parameters in the weight matrices (embedding and output included).
    pub fn n_params(&self) -> u64 {
        let (e, kvd) = (self.n_embd as u64, (self.n_embd / self.n_head * self.n_head_kv) as u64);
        let layer = e * e * 2 + e * kvd * 2 + e * self.n_ff as u64 * 3;
        let out = if self.tied_output { 0 } else { e * self.vocab as u64 };
        e * self.vocab as u64 + out + layer * self.n_layer as u64
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown shape {0:?} (known: smollm2-135m, tinyllama-1.1b)")]
    UnknownShape(String),
    #[error("unsupported quantization {0:?} (supported: q4_0, q4_1, q8_0)")]
    UnknownQuant(String),
    #[error("invalid shape: {0}")]
    BadShape(String),
    #[error("tokenizer source: {0}")]
    Tokenizer(String),
    #[error("cannot write {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

/// Quantization of the weight matrices.
pub fn parse_quant(s: &str) -> Result<GgmlType, SynthError> {
    match s.to_ascii_lowercase().as_str() {
        "q4_0" => Ok(GgmlType::Q4_0),
        "q4_1" => Ok(GgmlType::Q4_1),
        "q8_0" => Ok(GgmlType::Q8_0),
        _ => Err(SynthError::UnknownQuant(s.to_string())),
    }
}

/// llama.cpp's `general.file_type` for a whole-model quantization.
fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q4K => 15,
        GgmlType::Q6K => 18,
        GgmlType::BF16 => 32,
    }
}

/// The random stream of one weight row (the sampler's splitmix64).
fn row_stream(seed: u64) -> Rng {
    Rng::new(seed ^ 0x5DEE_CE66_D1CE_4E5B)
}

/// Standard normal (Box-Muller).
pub fn normal(rng: &mut Rng) -> f32 {
    let u1 = 1.0 - rng.next_f32(); // (0, 1]
    let u2 = rng.next_f32();
    (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
}

/// The element formats [`quantize_row`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quantizer {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl Quantizer {
    fn of(ty: GgmlType) -> Result<Quantizer, SynthError> {
        Ok(match ty {
            GgmlType::F32 => Quantizer::F32,
            GgmlType::F16 => Quantizer::F16,
            GgmlType::BF16 => Quantizer::BF16,
            GgmlType::Q4_0 => Quantizer::Q4_0,
            GgmlType::Q4_1 => Quantizer::Q4_1,
            GgmlType::Q8_0 => Quantizer::Q8_0,
            GgmlType::Q4K | GgmlType::Q6K => return Err(SynthError::UnknownQuant(ty.name().to_string())),
        })
    }

    fn write(self, x: &[f32], out: &mut Vec<u8>) {
        let h = |v: f32| f16::from_f32(v).to_le_bytes();
        match self {
            Quantizer::F32 => x.iter().for_each(|v| out.extend(v.to_le_bytes())),
            Quantizer::F16 => x.iter().for_each(|v| out.extend(h(*v))),
            Quantizer::BF16 => x.iter().for_each(|v| out.extend(half::bf16::from_f32(*v).to_le_bytes())),
            Quantizer::Q4_0 => {
                for b in x.chunks_exact(QK) {
                    // The value of largest magnitude maps to -8.
                    let max = b.iter().fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
                    let d = max / -8.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(h(d));
                    let q = |v: f32| ((v * id + 8.5) as i32).clamp(0, 15) as u8;
                    out.extend((0..QK / 2).map(|j| q(b[j]) | (q(b[j + QK / 2]) << 4)));
                }
            }
            Quantizer::Q4_1 => {
                for b in x.chunks_exact(QK) {
                    let (min, max) = b.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                    let d = (max - min) / 15.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(h(d));
                    out.extend(h(min));
                    let q = |v: f32| (((v - min) * id + 0.5) as i32).clamp(0, 15) as u8;
                    out.extend((0..QK / 2).map(|j| q(b[j]) | (q(b[j + QK / 2]) << 4)));
                }
            }
            Quantizer::Q8_0 => {
                for b in x.chunks_exact(QK) {
                    let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                    out.extend(h(d));
                    out.extend(b.iter().map(|v| (v * id).round() as i8 as u8));
                }
            }
        }
    }
}

/// Quantizes `x` (whole blocks) to `ty` with GGML's reference quantizers, appending to `out`.
/// F32, F16, BF16, Q4_0, Q4_1 and Q8_0; K-quants are an error.
pub fn quantize_row(ty: GgmlType, x: &[f32], out: &mut Vec<u8>) -> Result<(), SynthError> {
    Quantizer::of(ty)?.write(x, out);
    Ok(())
}

/// A random `rows × cols` matrix of N(mean, std) values quantized to `ty`; row r draws from
/// its own stream seeded by (seed, r).
pub fn random_matrix(ty: GgmlType, rows: usize, cols: usize, mean: f32, std: f32, seed: u64) -> Result<Vec<u8>, SynthError> {
    let qz = Quantizer::of(ty)?;
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
                    qz.write(&x, &mut q);
                    dst.copy_from_slice(&q);
                }
            });
        }
    });
    Ok(data)
}

/// The GPT-2 byte-level alphabet: byte b as the character that stands for it in token texts.
fn byte_char(b: u8) -> char {
    let printable = |c: u8| matches!(c, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(b) {
        return char::from(b);
    }
    let rank = (0..b).filter(|&c| !printable(c)).count() as u32;
    char::from_u32(256 + rank).unwrap_or('?')
}

/// A valid byte-level BPE tokenizer of exactly `vocab` tokens: `<|endoftext|>` (id 0, bos and
/// eos), the 256 byte tokens, then merges of byte pairs (most common English letters first).
fn synthetic_tokenizer(vocab: usize) -> Vec<(String, Value)> {
    let order: Vec<u8> = b" etaoinshrdlucmfwypvbgkjqxz".iter().copied().chain((0..=255u8).filter(|b| !b" etaoinshrdlucmfwypvbgkjqxz".contains(b))).collect();
    let mut tokens = vec!["<|endoftext|>".to_string()];
    let mut types = vec![Value::I32(3)];
    tokens.extend((0..=255u8).map(|b| byte_char(b).to_string()));
    types.extend((0..256).map(|_| Value::I32(1)));
    let mut merges = Vec::new();
    'outer: for &a in &order {
        for &b in &order {
            if tokens.len() >= vocab {
                break 'outer;
            }
            let (ca, cb) = (byte_char(a), byte_char(b));
            merges.push(Value::String(format!("{ca} {cb}")));
            tokens.push(format!("{ca}{cb}"));
            types.push(Value::I32(1));
        }
    }
    tokens.truncate(vocab);
    types.truncate(vocab);
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("gpt-2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens.into_iter().map(Value::String).collect())),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.add_bos_token".into(), Value::Bool(false)),
    ]
}

/// Progress of [`write_synth_model`]: `done` of `total` weight matrices generated.
#[derive(Debug, Clone)]
pub struct SynthProgress<'a> {
    pub tensor: &'a str,
    pub done: usize,
    pub total: usize,
    pub bytes: u64,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct SynthReport {
    pub shape: SynthShape,
    pub quant: GgmlType,
    pub n_params: u64,
    pub file_bytes: u64,
}

/// Writes a synthetic model of `shape` to `path`. `tokenizer_from` copies the `tokenizer.*`
/// metadata of a real model (its vocabulary size then replaces the shape's).
pub fn write_synth_model(
    shape: &SynthShape,
    quant: GgmlType,
    seed: u64,
    tokenizer_from: Option<&GgufFile>,
    path: &Path,
    mut progress: impl FnMut(SynthProgress<'_>),
) -> Result<SynthReport, SynthError> {
    let mut shape = shape.clone();
    let tok_meta: Vec<(String, Value)> = match tokenizer_from {
        Some(g) => {
            let meta: Vec<(String, Value)> = g.metadata.iter().filter(|(k, _)| k.starts_with("tokenizer.")).map(|(k, v)| (k.clone(), v.clone())).collect();
            let n = g.array("tokenizer.ggml.tokens").map_err(|e| SynthError::Tokenizer(e.to_string()))?.len();
            shape.vocab = n;
            meta
        }
        None => synthetic_tokenizer(shape.vocab),
    };
    let s = &shape;
    if s.n_head == 0 || s.n_head_kv == 0 || s.n_embd % s.n_head != 0 || s.n_head % s.n_head_kv != 0 || (s.n_embd / s.n_head) % 2 != 0 {
        return Err(SynthError::BadShape(format!("n_embd {} with {} heads / {} KV heads", s.n_embd, s.n_head, s.n_head_kv)));
    }
    if s.n_embd % QK != 0 || s.n_ff % QK != 0 || s.vocab < 257 {
        return Err(SynthError::BadShape(format!("n_embd {} and n_ff {} must be multiples of 32, vocab >= 257", s.n_embd, s.n_ff)));
    }
    let (e, hd) = (s.n_embd, s.n_embd / s.n_head);
    let kvd = hd * s.n_head_kv;

    let mut w = GgufWriter::new();
    let key = |k: &str| format!("llama.{k}");
    w.meta("general.architecture", Value::String("llama".into()))
        .meta("general.name", Value::String(format!("forge-cache synthetic {} {}", s.name, quant.name())))
        .meta("general.file_type", Value::U32(file_type(quant)))
        .meta("general.quantization_version", Value::U32(2))
        .meta(&key("context_length"), Value::U32(s.context as u32))
        .meta(&key("embedding_length"), Value::U32(e as u32))
        .meta(&key("block_count"), Value::U32(s.n_layer as u32))
        .meta(&key("feed_forward_length"), Value::U32(s.n_ff as u32))
        .meta(&key("attention.head_count"), Value::U32(s.n_head as u32))
        .meta(&key("attention.head_count_kv"), Value::U32(s.n_head_kv as u32))
        .meta(&key("rope.dimension_count"), Value::U32(hd as u32))
        .meta(&key("rope.freq_base"), Value::F32(s.rope_base))
        .meta(&key("attention.layer_norm_rms_epsilon"), Value::F32(s.rms_eps))
        .meta(&key("vocab_size"), Value::U32(s.vocab as u32));
    for (k, v) in tok_meta {
        w.meta(&k, v);
    }

    // (name, cols, rows); rows == 0 marks a norm vector of `cols` f32.
    let mut plan: Vec<(String, usize, usize)> = vec![("token_embd.weight".into(), e, s.vocab)];
    for l in 0..s.n_layer {
        let n = |t: &str| format!("blk.{l}.{t}.weight");
        plan.extend([
            (n("attn_norm"), e, 0),
            (n("attn_q"), e, e),
            (n("attn_k"), e, kvd),
            (n("attn_v"), e, kvd),
            (n("attn_output"), e, e),
            (n("ffn_norm"), e, 0),
            (n("ffn_gate"), e, s.n_ff),
            (n("ffn_up"), e, s.n_ff),
            (n("ffn_down"), s.n_ff, e),
        ]);
    }
    plan.push(("output_norm.weight".into(), e, 0));
    if !s.tied_output {
        plan.push(("output.weight".into(), e, s.vocab));
    }
    let total = plan.len();
    let mut bytes = 0u64;
    for (i, (name, cols, rows)) in plan.iter().enumerate() {
        let tseed = seed.wrapping_add((i as u64 + 1).wrapping_mul(0x9E37_79B9));
        let (dims, ty, data) = if *rows == 0 {
            (vec![*cols as u64], GgmlType::F32, random_matrix(GgmlType::F32, 1, *cols, 1.0, 0.02, tseed)?)
        } else {
            (vec![*cols as u64, *rows as u64], quant, random_matrix(quant, *rows, *cols, 0.0, 0.02, tseed)?)
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

/// A shape small enough for unit tests (2 layers, n_embd 128, GQA 4:2).
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
        rms_eps: 1e-5,
        tied_output: false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::backend::cpu::CpuBackend;
    use crate::engine::tokenizer::Tokenizer;
    use crate::engine::{Logits, Model, SeqBatch};
    use crate::gguf::dequantize_row;

    #[test]
    fn quantizers_round_trip_within_half_a_step() {
        let mut rng = Rng::new(3);
        let x: Vec<f32> = (0..256).map(|_| normal(&mut rng)).collect();
        // Q4_0 maps the largest magnitude to -8, so the other sign reaches only 7/8 of it:
        // values there may be off by a whole step (amax / 8), not half of one.
        for (ty, steps) in [(GgmlType::Q4_0, 8.0), (GgmlType::Q4_1, 15.0), (GgmlType::Q8_0, 254.0)] {
            let mut q = Vec::new();
            quantize_row(ty, &x, &mut q).expect("quantize");
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y);
            for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
                let span = xs.iter().fold(0f32, |m, v| m.max(v.abs())) * 2.0;
                for (a, c) in xs.iter().zip(ys) {
                    // Half a quantization step, plus the f16 rounding of the scale.
                    assert!((a - c).abs() <= span / steps * 0.5 * 1.01 + 1e-3 * a.abs(), "{ty:?} block {b}: {a} vs {c}");
                }
            }
        }
    }

    #[test]
    fn synthetic_tokenizer_loads_and_round_trips() {
        let meta: std::collections::BTreeMap<String, Value> = synthetic_tokenizer(1000).into_iter().collect();
        let tok = Tokenizer::from_metadata(&meta).expect("tokenizer");
        let ids = tok.encode("hello synthetic world", false).expect("encode");
        assert!(!ids.is_empty() && ids.iter().all(|&i| (i as usize) < 1000));
        assert_eq!(tok.decode(&ids, false).expect("decode"), "hello synthetic world");
    }

    #[test]
    fn engine_loads_a_synthetic_model_and_runs_it() {
        for quant in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
            let f = tempfile::NamedTempFile::new().expect("tmp");
            let mut calls = 0;
            let rep = write_synth_model(&tiny_shape(), quant, 7, None, f.path(), |p| {
                calls += 1;
                assert!(p.done <= p.total);
            })
            .expect("write");
            assert_eq!(calls, 2 + 9 * 2 + 1);
            assert_eq!(rep.file_bytes, std::fs::metadata(f.path()).expect("meta").len());
            let model = Model::load(f.path(), Arc::new(CpuBackend::new(1).expect("pool"))).expect("load");
            assert_eq!((model.config.n_layer, model.config.n_embd, model.config.vocab_size), (2, 128, 320));
            assert!(!model.config.tied_output);
            let tok = Tokenizer::from_gguf(&model.gguf).expect("tokenizer");
            let ids = tok.encode("the cat sat", false).expect("encode");
            let mut state = model.new_state(16);
            let mut kv = model.new_kv(32);
            model.forward(&mut state, &mut [SeqBatch { kv: &mut kv, tokens: &ids, logits: Logits::All }]).expect("forward");
            for i in 0..ids.len() {
                let l = model.logits(&state, i);
                assert!(l.iter().all(|v| v.is_finite()) && l.iter().any(|&v| v != 0.0), "{quant:?}: logits of token {i}");
            }
        }
    }

    #[test]
    fn presets_and_errors() {
        let t = SynthShape::preset("tinyllama-1.1b").expect("preset");
        assert_eq!((t.n_embd, t.n_layer, t.n_head, t.n_head_kv, t.n_ff, t.vocab, t.context), (2048, 22, 32, 4, 5632, 32000, 2048));
        assert!((1_000_000_000..1_200_000_000).contains(&t.n_params()), "{}", t.n_params());
        assert!(SynthShape::preset("smollm2-135m").is_some() && SynthShape::preset("gpt-5").is_none());
        assert!(parse_quant("Q4_0").is_ok() && parse_quant("q5_k").is_err());
        let mut bad = tiny_shape();
        bad.n_head = 3;
        let f = tempfile::NamedTempFile::new().expect("tmp");
        assert!(matches!(write_synth_model(&bad, GgmlType::Q4_0, 1, None, f.path(), |_| {}), Err(SynthError::BadShape(_))));
    }
}
