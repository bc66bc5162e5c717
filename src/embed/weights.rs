//! BERT weights inside a memory-mapped safetensors file.
//!
//! The header is parsed (and fully validated: offsets contiguous, sizes matching dtype × shape,
//! data ending exactly at the end of the file) by the `safetensors` crate. Every tensor the
//! encoder uses is then looked up by name, its dtype and shape checked against `config.json`,
//! and only its byte range is kept: matrices and embedding tables stay in the map and are read
//! through [`WeightView`]s; the small vectors (biases, LayerNorm parameters) are copied to f32.

use std::ops::Range;
use std::path::Path;

use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;

use super::config::BertConfig;
use super::EmbedError;
use crate::backend::WeightView;
use crate::gguf::GgmlType;

/// A float tensor's bytes inside the mapped file.
#[derive(Debug, Clone)]
pub struct Mapped {
    /// element type of the stored floats
    pub ty: GgmlType,
    /// byte range in the whole file (header included)
    pub range: Range<usize>,
}

/// Element size in bytes of the float types a safetensors file may hold for us.
fn elem_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 => 4,
        _ => 2,
    }
}

/// Decodes little-endian elements of `ty` (F32, F16 or BF16) into `out` (`out.len()` elements),
/// adding them to what is there.
fn add_decoded(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o += half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        _ => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o += half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

impl Mapped {
    /// `out += row r` of a `[_, cols]` table. `r` must be in range (checked by the caller).
    pub fn add_row(&self, map: &[u8], r: usize, cols: usize, out: &mut [f32]) {
        let rb = cols * elem_bytes(self.ty);
        let start = self.range.start + r * rb;
        add_decoded(self.ty, &map[start..start + rb], out);
    }

    fn to_f32(&self, map: &[u8], n: usize) -> Vec<f32> {
        let mut v = vec![0f32; n];
        add_decoded(self.ty, &map[self.range.clone()], &mut v);
        v
    }
}

/// A PyTorch `nn.Linear`: `y = W x + b`.
#[derive(Debug)]
pub struct Linear {
    /// [rows = out_features, cols = in_features], row-major (GGML's layout)
    pub w: Mapped,
    /// Byte range in [`Weights::half`] of [rows, cols] F16 little-endian: `w` rounded to half
    /// precision, read instead of `w` when present ([`Weights::hold_f16`])
    pub half: Option<Range<usize>>,
    /// out_features
    pub rows: usize,
    /// in_features
    pub cols: usize,
    /// [rows]
    pub b: Vec<f32>,
}

impl Linear {
    /// The matrix: in `half` ([`Weights::half_bytes`]) when rounded to F16, else in `map`.
    pub fn view<'a>(&self, map: &'a [u8], half: &'a [u8]) -> WeightView<'a> {
        match &self.half {
            Some(r) => WeightView { ty: GgmlType::F16, rows: self.rows, cols: self.cols, data: &half[r.clone()], prepared: None },
            None => WeightView { ty: self.w.ty, rows: self.rows, cols: self.cols, data: &map[self.w.range.clone()], prepared: None },
        }
    }

    /// Writes the F32 matrix rounded to F16 (to nearest even) into `out` (rows × cols × 2 bytes);
    /// false when some weight is beyond F16's range.
    fn write_f16(&self, map: &[u8], out: &mut [u8]) -> bool {
        map[self.w.range.clone()].chunks_exact(4).zip(out.chunks_exact_mut(2)).all(|(c, o)| {
            let v = half::f16::from_f32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            o.copy_from_slice(&v.to_le_bytes());
            v.is_finite()
        })
    }
}

/// Huge pages are 2 MiB on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// LayerNorm parameters.
#[derive(Debug)]
pub struct Norm {
    /// [hidden]
    pub w: Vec<f32>,
    /// [hidden]
    pub b: Vec<f32>,
}

/// One encoder layer (`encoder.layer.{i}`).
#[derive(Debug)]
pub struct Layer {
    /// [hidden, hidden]
    pub query: Linear,
    /// [hidden, hidden]
    pub key: Linear,
    /// [hidden, hidden]
    pub value: Linear,
    /// [hidden, hidden]
    pub attn_out: Linear,
    /// LayerNorm after the attention output and residual (`attention.output.LayerNorm`)
    pub attn_norm: Norm,
    /// [intermediate, hidden]
    pub ffn_up: Linear,
    /// [hidden, intermediate]
    pub ffn_down: Linear,
    /// LayerNorm after the feed-forward output and residual (`output.LayerNorm`)
    pub ffn_norm: Norm,
}

/// All tensors of the encoder.
#[derive(Debug)]
pub struct Weights {
    /// [vocab_size, hidden]
    pub word: Mapped,
    /// [max_position_embeddings, hidden]
    pub position: Mapped,
    /// [hidden]: row 0 of `token_type_embeddings` (every token type id is 0)
    pub token_type0: Vec<f32>,
    /// LayerNorm of the summed embeddings (`embeddings.LayerNorm`)
    pub emb_norm: Norm,
    /// [num_hidden_layers]
    pub layers: Vec<Layer>,
    /// The F16 copies of the matrices ([`Weights::hold_f16`]), one anonymous map; the bytes start
    /// `half_at` into it (the first 2 MiB boundary, for huge pages)
    pub half: Option<memmap2::MmapMut>,
    half_at: usize,
}

/// Looks tensors up in the parsed header and checks them.
struct Loader<'a> {
    map: &'a [u8],
    meta: Metadata,
    /// offset of the data section in the file
    data_start: usize,
    /// "" or "bert." (checkpoints saved from `BertFor*` heads)
    prefix: &'static str,
}

impl<'a> Loader<'a> {
    fn new(map: &'a [u8], path: &Path) -> Result<Loader<'a>, EmbedError> {
        let (n, meta) = SafeTensors::read_metadata(map)
            .map_err(|source| EmbedError::Safetensors { path: path.to_path_buf(), source })?;
        let data_start = n
            .checked_add(8)
            .ok_or_else(|| EmbedError::Corrupt(format!("{}: header length overflows", path.display())))?;
        let prefix = if meta.info("embeddings.word_embeddings.weight").is_none()
            && meta.info("bert.embeddings.word_embeddings.weight").is_some()
        {
            "bert."
        } else {
            ""
        };
        Ok(Loader { map, meta, data_start, prefix })
    }

    /// The tensor `name`, which must be a float tensor of exactly `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Mapped, EmbedError> {
        let full = format!("{}{name}", self.prefix);
        let info = self.meta.info(&full).ok_or_else(|| EmbedError::MissingTensor(full.clone()))?;
        let ty = match info.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            other => return Err(EmbedError::Dtype { name: full, dtype: format!("{other:?}") }),
        };
        if info.shape != shape {
            return Err(EmbedError::Shape { name: full, expected: shape.to_vec(), got: info.shape.clone() });
        }
        // `read_metadata` has checked these already; checked again so that a bug there cannot
        // turn into an out-of-bounds slice later.
        let (s, e) = info.data_offsets;
        let n: usize = shape.iter().product();
        let range = self.data_start.checked_add(s).zip(self.data_start.checked_add(e)).map(|(a, b)| a..b);
        match range {
            Some(r) if r.end <= self.map.len() && r.len() == n * elem_bytes(ty) => Ok(Mapped { ty, range: r }),
            _ => Err(EmbedError::Corrupt(format!("tensor `{full}` has data offsets outside the file"))),
        }
    }

    fn vector(&self, name: &str, n: usize) -> Result<Vec<f32>, EmbedError> {
        Ok(self.get(name, &[n])?.to_f32(self.map, n))
    }

    fn linear(&self, name: &str, rows: usize, cols: usize) -> Result<Linear, EmbedError> {
        let w = self.get(&format!("{name}.weight"), &[rows, cols])?;
        let b = self.vector(&format!("{name}.bias"), rows)?;
        Ok(Linear { w, half: None, rows, cols, b })
    }

    fn norm(&self, name: &str, n: usize) -> Result<Norm, EmbedError> {
        Ok(Norm { w: self.vector(&format!("{name}.weight"), n)?, b: self.vector(&format!("{name}.bias"), n)? })
    }
}

impl Weights {
    /// Parses the safetensors bytes `map` (read from `path`, named in errors) and checks every
    /// tensor against `cfg`.
    pub fn load(map: &[u8], cfg: &BertConfig, path: &Path) -> Result<Weights, EmbedError> {
        let l = Loader::new(map, path)?;
        let (h, i) = (cfg.hidden_size, cfg.intermediate_size);
        let word = l.get("embeddings.word_embeddings.weight", &[cfg.vocab_size, h])?;
        let position = l.get("embeddings.position_embeddings.weight", &[cfg.max_position_embeddings, h])?;
        let tt = l.get("embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, h])?;
        let mut token_type0 = vec![0f32; h];
        tt.add_row(map, 0, h, &mut token_type0);
        let emb_norm = l.norm("embeddings.LayerNorm", h)?;
        let layers = (0..cfg.num_hidden_layers)
            .map(|n| {
                let p = format!("encoder.layer.{n}");
                Ok(Layer {
                    query: l.linear(&format!("{p}.attention.self.query"), h, h)?,
                    key: l.linear(&format!("{p}.attention.self.key"), h, h)?,
                    value: l.linear(&format!("{p}.attention.self.value"), h, h)?,
                    attn_out: l.linear(&format!("{p}.attention.output.dense"), h, h)?,
                    attn_norm: l.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
                    ffn_up: l.linear(&format!("{p}.intermediate.dense"), i, h)?,
                    ffn_down: l.linear(&format!("{p}.output.dense"), h, i)?,
                    ffn_norm: l.norm(&format!("{p}.output.LayerNorm"), h)?,
                })
            })
            .collect::<Result<Vec<_>, EmbedError>>()?;
        Ok(Weights { word, position, token_type0, emb_norm, layers, half: None, half_at: 0 })
    }

    /// Every layer's matrices.
    fn linears(&mut self) -> impl Iterator<Item = &mut Linear> {
        self.layers.iter_mut().flat_map(|l| [&mut l.query, &mut l.key, &mut l.value, &mut l.attn_out, &mut l.ffn_up, &mut l.ffn_down])
    }

    /// Holds the F32 matrices rounded to F16 (half the bytes a matmul streams); embeddings,
    /// biases and norms stay as stored, as does a matrix with a weight beyond F16's range. The
    /// copies share one anonymous map advised to use huge pages: an embedding right after a model
    /// run finds its weights out of cache, and with 4 KiB pages every page of that stream starts
    /// with a TLB miss and a stalled hardware prefetcher.
    pub fn hold_f16(&mut self, map: &[u8]) -> std::io::Result<()> {
        let bytes: usize = self.linears().filter(|l| l.w.ty == GgmlType::F32).map(|l| l.rows * l.cols * 2).sum();
        if bytes == 0 {
            return Ok(());
        }
        let mut store = memmap2::MmapMut::map_anon(bytes + HUGE_PAGE)?;
        #[cfg(target_os = "linux")]
        // Advice only (before the first touch, so that the faults take huge pages); without it
        // the copies still work.
        let _ = store.advise(memmap2::Advice::HugePage);
        let start = store.as_ptr() as usize;
        let skip = start.next_multiple_of(HUGE_PAGE) - start;
        let mut at = 0;
        for l in self.linears().filter(|l| l.w.ty == GgmlType::F32) {
            let r = at..at + l.rows * l.cols * 2;
            // A matrix that does not fit F16 stays F32 (its slot stays unused).
            if l.write_f16(map, &mut store[skip + r.start..skip + r.end]) {
                l.half = Some(r.clone());
            }
            at = r.end;
        }
        (self.half, self.half_at) = (Some(store), skip);
        Ok(())
    }

    /// The bytes the F16 matrices' ranges index (empty without them).
    pub fn half_bytes(&self) -> &[u8] {
        self.half.as_deref().map_or(&[], |h| &h[self.half_at..])
    }

    /// The matrix types used by matmuls (for the backend capability check).
    pub fn matrix_types(&self) -> impl Iterator<Item = GgmlType> + '_ {
        self.layers
            .iter()
            .flat_map(|l| [&l.query, &l.key, &l.value, &l.attn_out, &l.ffn_up, &l.ffn_down])
            .map(|m| if m.half.is_some() { GgmlType::F16 } else { m.w.ty })
    }
}
