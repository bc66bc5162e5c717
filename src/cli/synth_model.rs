//! `forge-cache synth-model --shape tinyllama-1.1b --quant q4_0 -o FILE.gguf`: writes a Llama
//! GGUF with random weights in a real model's shape, for speed measurements on models larger
//! than the default without any download. `--arch qwen2|qwen3|llama3|phi3|gemma3` writes a
//! small model of that architecture instead (its own tensors, metadata and tokenizer kind), for
//! checking the engine against llama.cpp. Prints progress per layer and a summary.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::Args;

use forge_cache::gguf::synth::{parse_quant, write_synth_model, SynthArch, SynthShape, PRESETS};
use forge_cache::gguf::GgufFile;

#[derive(Debug, Args)]
pub struct SynthModelArgs {
    /// Model shape (Llama architecture): smollm2-135m or tinyllama-1.1b.
    #[arg(long, conflicts_with = "arch", required_unless_present = "arch")]
    pub shape: Option<String>,
    /// A small model of this architecture: llama, llama3, qwen2, qwen3, phi3 or gemma3.
    #[arg(long)]
    pub arch: Option<String>,
    /// Weight quantization: a GGML type (q4_0, q4_1, q5_0, q5_1, q8_0, q2_k, q3_k, q4_k, q5_k,
    /// q6_k, iq4_nl, mxfp4, f16, bf16, f32) or the mix q4_k_m.
    #[arg(long, default_value = "q4_0")]
    pub quant: String,
    /// Output GGUF file.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
    /// Random seed (same seed, same file).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Copy the tokenizer (tokenizer.* metadata) of this GGUF model instead of a synthetic
    /// byte-level vocabulary; its vocabulary size replaces the shape's.
    #[arg(long)]
    pub tokenizer_from: Option<PathBuf>,
}

pub fn run(args: &SynthModelArgs) -> anyhow::Result<()> {
    let shape = match (&args.shape, &args.arch) {
        (_, Some(arch)) => SynthShape::small(SynthArch::parse(arch)?),
        (Some(name), None) => SynthShape::preset(name).with_context(|| format!("unknown shape {name:?} (known: {})", PRESETS.join(", ")))?,
        (None, None) => anyhow::bail!("give --shape or --arch"),
    };
    let quant = parse_quant(&args.quant)?;
    let tok = match &args.tokenizer_from {
        Some(p) => Some(GgufFile::open(p).with_context(|| format!("reading the tokenizer of {}", p.display()))?),
        None => None,
    };
    eprintln!(
        "synth-model: {} ({}, {} layers, n_embd {}, {:.2}B parameters), {}, seed {} -> {}",
        shape.name,
        shape.arch.name(),
        shape.n_layer,
        shape.n_embd,
        shape.n_params() as f64 / 1e9,
        quant.name(),
        args.seed,
        args.output.display()
    );
    let t0 = Instant::now();
    let mut last_layer = String::new();
    let rep = write_synth_model(&shape, quant, args.seed, tok.as_ref(), &args.output, |p| {
        // One line per layer (and for the embedding / output tensors).
        let group = p.tensor.split('.').take(2).collect::<Vec<_>>().join(".");
        let group = if p.tensor.starts_with("blk.") { group } else { p.tensor.to_string() };
        if group != last_layer || p.done == p.total {
            eprintln!("  [{:>3}/{}] {:<20} {:>8.1} MB generated, {:.1} s", p.done, p.total, group, p.bytes as f64 / 1e6, t0.elapsed().as_secs_f64());
            last_layer = group;
        }
    })
    .with_context(|| format!("writing {}", args.output.display()))?;
    eprintln!(
        "wrote {} ({:.1} MB, vocab {}) in {:.1} s",
        args.output.display(),
        rep.file_bytes as f64 / 1e6,
        rep.shape.vocab,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
