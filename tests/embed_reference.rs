//! End-to-end check of the all-MiniLM-L6-v2 embedder against `shared/reference/minilm_embeddings.jsonl`
//! (sentence-transformers-equivalent float64 math): identical token ids, cosine >= 0.9999 for
//! every text, the published similarity pairs, batch = single, and the time per sentence.
//!
//! The model files are required: a missing model fails the test (run `scripts/fetch-models.sh`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use forge_cache::backend::cpu::CpuBackend;
use forge_cache::embed::{default_dir, Embedder, MatrixFormat};

struct Ref {
    text: String,
    token_ids: Vec<u32>,
    embedding: Vec<f32>,
}

fn reference() -> Vec<Ref> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/reference/minilm_embeddings.jsonl");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("reference line is JSON");
            Ref {
                text: v["text"].as_str().expect("text").to_string(),
                token_ids: v["token_ids"]
                    .as_array()
                    .expect("token_ids")
                    .iter()
                    .map(|x| x.as_u64().expect("id") as u32)
                    .collect(),
                embedding: v["embedding"]
                    .as_array()
                    .expect("embedding")
                    .iter()
                    .map(|x| x.as_f64().expect("f") as f32)
                    .collect(),
            }
        })
        .collect()
}

fn model_dir() -> PathBuf {
    let dir = default_dir();
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(
            dir.join(f).is_file(),
            "model file {} is missing: run scripts/fetch-models.sh (or set FORGE_MODELS_DIR)",
            dir.join(f).display()
        );
    }
    dir
}

fn load() -> Embedder {
    let backend = Arc::new(CpuBackend::new(0).expect("thread pool"));
    Embedder::load(&model_dir(), backend).unwrap_or_else(|e| panic!("loading the embedder: {e}"))
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

#[test]
fn matches_reference_embeddings() {
    let emb = load();
    let refs = reference();
    assert!(refs.len() >= 40, "reference file has {} lines", refs.len());
    assert_eq!(emb.dim(), 384);
    let mut min_cos = f64::MAX;
    for r in &refs {
        let e = emb.embed(&r.text).unwrap_or_else(|err| panic!("embedding {:?}: {err}", r.text));
        assert_eq!(e.token_ids, r.token_ids, "token ids of {:?}", r.text);
        assert_eq!(e.vector.len(), r.embedding.len());
        let norm: f64 = e.vector.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "norm {norm} for {:?}", r.text);
        let c = cosine(&e.vector, &r.embedding);
        assert!(c >= 0.9999, "cosine {c} < 0.9999 for {:?}", r.text);
        min_cos = min_cos.min(c);
    }
    eprintln!(
        "minilm: {} texts, minimum cosine vs reference = {min_cos:.9} (1 - cos = {:.2e})",
        refs.len(),
        1.0 - min_cos
    );

    // Batching (texts of 2..256 tokens together) changes nothing.
    let texts: Vec<&str> = refs.iter().map(|r| r.text.as_str()).collect();
    let batch = emb.embed_batch(&texts).expect("batch");
    for (b, t) in batch.iter().zip(&texts) {
        assert_eq!(*b, emb.embed(t).expect("single"), "batch differs from single for {t:?}");
    }
}

/// The service holds the matrices in F16 by default (half the bytes per question): the vectors
/// stay within the same 0.9999 of the reference (measured: 1 - cos ~ 4e-7), the published
/// similarities within 0.001, and batching and the thread count still change nothing.
#[test]
fn f16_matrices_stay_close_to_the_reference() {
    let backend = Arc::new(CpuBackend::new(0).expect("thread pool"));
    let emb = Embedder::load_with(&model_dir(), backend, MatrixFormat::F16).expect("load f16");
    let f32emb = load();
    let refs = reference();
    let mut min_cos = f64::MAX;
    let mut moved = 0;
    for r in &refs {
        let e = emb.embed(&r.text).expect("embed");
        assert_eq!(e.token_ids, r.token_ids);
        let c = cosine(&e.vector, &r.embedding);
        assert!(c >= 0.9999, "cosine {c} < 0.9999 for {:?}", r.text);
        min_cos = min_cos.min(c);
        moved += usize::from(e.vector != f32emb.embed(&r.text).expect("f32").vector);
    }
    // The F16 path is really taken (the vectors differ from the F32 ones, slightly).
    assert!(moved > refs.len() / 2, "only {moved} of {} vectors changed", refs.len());
    eprintln!("minilm f16 matrices: minimum cosine vs reference = {min_cos:.9} (1 - cos = {:.2e})", 1.0 - min_cos);
    let base = emb.embed("That is a happy person").expect("embed").vector;
    for (other, want) in [("That is a happy dog", 0.6946), ("That is a very happy person", 0.9429), ("Today is a sunny day", 0.2569)] {
        let c = cosine(&base, &emb.embed(other).expect("embed").vector);
        assert!((c - want).abs() < 0.001, "{other:?}: {c} vs {want}");
    }
    let texts: Vec<&str> = refs.iter().map(|r| r.text.as_str()).collect();
    let one = CpuBackend::new(1).expect("pool");
    for (b, t) in emb.embed_batch(&texts).expect("batch").iter().zip(&texts) {
        assert_eq!(*b, emb.embed(t).expect("single"), "batch differs from single for {t:?}");
        assert_eq!(b, &emb.embed_batch_on(&one, &[t]).expect("one thread")[0], "thread count changed {t:?}");
    }
}

/// The service embeds a question on its one-thread embedder or, while the engine is idle, on the
/// engine's thread team: the vectors must not depend on which (nor on the thread count).
#[test]
fn thread_count_does_not_change_embeddings() {
    let emb = load();
    let refs = reference();
    let texts: Vec<&str> = refs.iter().map(|r| r.text.as_str()).collect();
    let (one, three) = (CpuBackend::new(1).expect("pool"), CpuBackend::new(3).expect("pool"));
    for t in &texts {
        let a = emb.embed_batch_on(&one, &[t]).expect("one thread");
        let b = emb.embed_batch_on(&three, &[t]).expect("three threads");
        assert_eq!(a, b, "{t:?}: one thread vs three");
        assert_eq!(a[0], emb.embed(t).expect("own backend"), "{t:?}");
    }
}

#[test]
fn published_similarities() {
    let emb = load();
    let v = |t: &str| emb.embed(t).expect("embed").vector;
    let base = v("That is a happy person");
    for (other, want) in
        [("That is a happy dog", 0.6946), ("That is a very happy person", 0.9429), ("Today is a sunny day", 0.2569)]
    {
        let c = cosine(&base, &v(other));
        eprintln!("cos(\"That is a happy person\", {other:?}) = {c:.4} (published {want})");
        assert!((c - want).abs() < 0.001, "{other:?}: {c} vs {want}");
    }
}

#[test]
fn time_per_sentence() {
    let emb = load();
    let refs = reference();
    let short = "That is a happy person";
    for _ in 0..5 {
        emb.embed(short).expect("warm-up");
    }
    let n = 50;
    let t0 = Instant::now();
    for _ in 0..n {
        emb.embed(short).expect("embed");
    }
    let per_short = t0.elapsed().as_secs_f64() * 1e3 / n as f64;

    let texts: Vec<&str> = refs.iter().map(|r| r.text.as_str()).collect();
    let tokens: usize = refs.iter().map(|r| r.token_ids.len()).sum();
    let t0 = Instant::now();
    for t in &texts {
        emb.embed(t).expect("embed");
    }
    let per_single = t0.elapsed().as_secs_f64() * 1e3 / texts.len() as f64;
    let t0 = Instant::now();
    emb.embed_batch(&texts).expect("batch");
    let per_batched = t0.elapsed().as_secs_f64() * 1e3 / texts.len() as f64;
    let long = refs.iter().max_by_key(|r| r.token_ids.len()).expect("non-empty");
    let t0 = Instant::now();
    emb.embed(&long.text).expect("embed");
    let t_long = t0.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "minilm timing ({}, {}): short sentence (7 tokens) {per_short:.2} ms; reference set ({} texts, {tokens} tokens) \
         {per_single:.2} ms/text one by one, {per_batched:.2} ms/text batched; {}-token text {t_long:.1} ms",
        if cfg!(debug_assertions) { "debug build" } else { "release" },
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        texts.len(),
        long.token_ids.len()
    );
}
