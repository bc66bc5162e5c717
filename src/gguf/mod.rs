//! GGUF model files: header, metadata and tensor infos parsed up front; tensor data handed out
//! as zero-copy views into a read-only memory map (nothing is read until a kernel touches it).
//!
//! Every count, length, rank, offset and size read from the file is bounds-checked, so a
//! truncated or corrupt file is a [`GgufError`] naming the problem, never a panic.
//!
//! `writer` writes GGUF v3 files; `quantize` turns f32 values into any block type; `synth` builds
//! synthetic models with them (random weights in a real model's shape for speed work, small
//! models of every architecture for checks against llama.cpp).

mod parse;
pub mod quantize;
pub mod synth;
pub mod types;
pub mod writer;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

pub use types::{dequantize_row, GgmlType, QK, QK_K};

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("not a GGUF file (magic {0:?}, expected \"GGUF\")")]
    BadMagic([u8; 4]),
    #[error("unsupported GGUF version {0} (supported: 2, 3)")]
    UnsupportedVersion(u32),
    #[error("file truncated: needed {needed} bytes at offset {offset} while reading {what}, file has {len}")]
    Truncated { what: String, offset: u64, needed: u64, len: u64 },
    #[error("corrupt GGUF: {0}")]
    Corrupt(String),
    #[error("tensor {name}: unsupported type {type_name} (id {id})")]
    UnsupportedType { name: String, id: u32, type_name: &'static str },
    #[error("missing metadata key {0}")]
    MissingKey(String),
    #[error("metadata key {key} has type {found}, expected {expected}")]
    WrongType { key: String, found: &'static str, expected: &'static str },
    #[error("missing tensor {0}")]
    MissingTensor(String),
    #[error("tensor {name}: shape {found:?}, expected {expected:?}")]
    BadShape { name: String, found: Vec<u64>, expected: Vec<u64> },
    #[error("architecture {arch:?} is not supported (supported: {supported})")]
    UnsupportedArch { arch: String, supported: String },
    #[error("tensor {name} is not part of a {arch} model as this engine runs it (unknown tensor)")]
    UnexpectedTensor { name: String, arch: String },
    #[error("not supported: {0}")]
    Unsupported(String),
}

/// One metadata value (GGUF value types 0..=12).
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }

    /// Any integer value that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v as u64),
            Value::U16(v) => Some(v as u64),
            Value::U32(v) => Some(v as u64),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
}

/// Where a tensor lives and what it is. `dims` are GGML order: `dims[0]` is the row length
/// (contiguous), `dims[1]` the number of rows.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    /// The tensor's name (e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, GGML order (see above).
    pub dims: Vec<u64>,
    /// Element (block) type.
    pub ty: GgmlType,
    /// Absolute byte offset of the tensor data in the file.
    pub offset: u64,
    /// Size of the tensor data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed, memory-mapped GGUF file.
pub struct GgufFile {
    /// The file's path.
    pub path: PathBuf,
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// The header's key/value metadata.
    pub metadata: BTreeMap<String, Value>,
    /// Tensor descriptors, in header order.
    pub tensors: Vec<TensorInfo>,
    index: BTreeMap<String, usize>,
    mmap: Mmap,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and validates a GGUF file. Only the header is read; tensor data stays in the map.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io { path: path.clone(), source };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Model files are not
        // expected to change while loaded; every access below is bounds-checked against the
        // map's length, so a file that shrinks would fault rather than read another buffer.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = parse::parse_header(&mmap)?;
        let index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect::<BTreeMap<_, _>>();
        if index.len() != header.tensors.len() {
            return Err(GgufError::Corrupt("duplicate tensor names".into()));
        }
        Ok(GgufFile {
            path,
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            index,
            mmap,
        })
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))?;
        v.as_u64().ok_or_else(|| GgufError::WrongType {
            key: key.into(),
            found: v.type_name(),
            expected: "unsigned integer",
        })
    }

    pub fn f32(&self, key: &str) -> Result<f32, GgufError> {
        let v = self.get(key).ok_or_else(|| GgufError::MissingKey(key.into()))?;
        v.as_f64().map(|x| x as f32).ok_or_else(|| GgufError::WrongType {
            key: key.into(),
            found: v.type_name(),
            expected: "number",
        })
    }

    pub fn str(&self, key: &str) -> Result<&str, GgufError> {
        match self.get(key) {
            Some(Value::String(s)) => Ok(s),
            Some(v) => Err(GgufError::WrongType { key: key.into(), found: v.type_name(), expected: "string" }),
            None => Err(GgufError::MissingKey(key.into())),
        }
    }

    pub fn array(&self, key: &str) -> Result<&[Value], GgufError> {
        match self.get(key) {
            Some(Value::Array(a)) => Ok(a),
            Some(v) => Err(GgufError::WrongType { key: key.into(), found: v.type_name(), expected: "array" }),
            None => Err(GgufError::MissingKey(key.into())),
        }
    }

    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::MissingTensor(name.into()))
    }

    /// Zero-copy view of a tensor's bytes (bounds were checked at open).
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>, GgufError> {
        let info = self.tensor_info(name)?;
        let start = info.offset as usize;
        let bytes = &self.mmap[start..start + info.n_bytes as usize];
        Ok(TensorView { info, bytes })
    }

    /// Bytes of the data of `info` (a tensor of this file; bounds were checked at open).
    pub fn data(&self, info: &TensorInfo) -> &[u8] {
        &self.mmap[info.offset as usize..(info.offset + info.n_bytes) as usize]
    }

    /// The tensor, checked to have exactly `dims` (GGML order).
    pub fn tensor_with_shape(&self, name: &str, dims: &[u64]) -> Result<TensorView<'_>, GgufError> {
        let t = self.tensor(name)?;
        if t.info.dims != dims {
            return Err(GgufError::BadShape { name: name.into(), found: t.info.dims.clone(), expected: dims.to_vec() });
        }
        Ok(t)
    }
}

/// Borrowed bytes of one tensor inside the memory map.
#[derive(Debug, Clone, Copy)]
pub struct TensorView<'a> {
    /// The tensor's descriptor.
    pub info: &'a TensorInfo,
    /// Its data, `info.n_bytes` long.
    pub bytes: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Elements per row (`dims[0]`).
    pub fn row_len(&self) -> usize {
        self.info.dims.first().copied().unwrap_or(1) as usize
    }

    pub fn n_rows(&self) -> usize {
        (self.info.n_elements() as usize) / self.row_len().max(1)
    }

    /// The whole tensor dequantized to f32 (for small tensors: norms, tests).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.info.n_elements() as usize];
        let rb = self.info.ty.row_bytes(self.row_len()).unwrap_or(0);
        for (dst, src) in out.chunks_exact_mut(self.row_len()).zip(self.bytes.chunks_exact(rb)) {
            dequantize_row(self.info.ty, src, dst);
        }
        out
    }
}
