//! Bounds-checked parsing of the GGUF header (v2 and v3, little-endian).
//!
//! Layout: magic "GGUF", u32 version, u64 tensor count, u64 metadata count, metadata
//! (key string, u32 value type, value), tensor infos (name, u32 rank, u64 dims[rank], u32 type,
//! u64 offset relative to the data section), padding to `general.alignment` (default 32), data.

use std::collections::BTreeMap;

use super::{GgmlType, GgufError, TensorInfo, Value};

pub(super) struct Header {
    /// GGUF format version (2 or 3).
    pub version: u32,
    /// The header's key/value metadata.
    pub metadata: BTreeMap<String, Value>,
    /// Tensor descriptors, offsets absolute in the file.
    pub tensors: Vec<TensorInfo>,
}

const MAX_RANK: u32 = 4;
const MAX_STRING: u64 = 1 << 30;
const MAX_ARRAY_DEPTH: usize = 4;

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], GgufError> {
        let remaining = (self.buf.len() - self.pos) as u64;
        if n > remaining {
            return Err(GgufError::Truncated {
                what: what.to_string(),
                offset: self.pos as u64,
                needed: n,
                len: self.buf.len() as u64,
            });
        }
        let s = &self.buf[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        if len > MAX_STRING {
            return Err(GgufError::Corrupt(format!("{what}: string length {len} is absurd")));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::Corrupt(format!("{what}: string is not valid UTF-8")))
    }

    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(what)?[0]),
            1 => Value::I8(self.arr::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => match self.arr::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(GgufError::Corrupt(format!("{what}: bool byte {b} is neither 0 nor 1"))),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Corrupt(format!("{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let elem_ty = self.u32(what)?;
                let n = self.u64(what)?;
                // Every element takes at least one byte: a count beyond the bytes left is corrupt
                // (and would otherwise make us allocate without bound).
                if n > self.remaining() {
                    return Err(GgufError::Corrupt(format!(
                        "{what}: array of {n} elements but only {} bytes remain",
                        self.remaining()
                    )));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_ty, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            t => return Err(GgufError::Corrupt(format!("{what}: unknown metadata value type {t}"))),
        })
    }
}

pub(super) fn parse_header(buf: &[u8]) -> Result<Header, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    let magic: [u8; 4] = c.arr("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic(magic));
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;
    // Each metadata pair needs >= 13 bytes, each tensor info >= 24: reject absurd counts early.
    if n_kv.saturating_mul(13) > c.remaining() {
        return Err(GgufError::Corrupt(format!("metadata count {n_kv} exceeds the file size")));
    }
    if n_tensors.saturating_mul(24) > c.remaining() {
        return Err(GgufError::Corrupt(format!("tensor count {n_tensors} exceeds the file size")));
    }

    let mut metadata = BTreeMap::new();
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key #{i}"))?;
        let ty = c.u32(&format!("type of {key}"))?;
        let v = c.value(ty, &key, 0)?;
        if metadata.insert(key.clone(), v).is_some() {
            return Err(GgufError::Corrupt(format!("duplicate metadata key {key}")));
        }
    }

    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => a,
            _ => return Err(GgufError::Corrupt(format!("general.alignment {v:?} is not a power of two"))),
        },
    };

    let mut raw = Vec::with_capacity(n_tensors as usize);
    for i in 0..n_tensors {
        let name = c.string(&format!("tensor #{i} name"))?;
        let rank = c.u32(&format!("rank of {name}"))?;
        if rank == 0 || rank > MAX_RANK {
            return Err(GgufError::Corrupt(format!("tensor {name}: rank {rank} (expected 1..={MAX_RANK})")));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            let d = c.u64(&format!("dims of {name}"))?;
            if d == 0 {
                return Err(GgufError::Corrupt(format!("tensor {name}: zero dimension")));
            }
            dims.push(d);
        }
        let type_id = c.u32(&format!("type of {name}"))?;
        let offset = c.u64(&format!("offset of {name}"))?;
        raw.push((name, dims, type_id, offset));
    }

    let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    let mut tensors = Vec::with_capacity(raw.len());
    for (name, dims, type_id, rel) in raw {
        let ty = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnsupportedType {
            name: name.clone(),
            id: type_id,
            type_name: GgmlType::name_of_id(type_id),
        })?;
        let n_elem = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| GgufError::Corrupt(format!("tensor {name}: element count overflows")))?;
        let row = dims[0];
        if row % ty.block_elems() as u64 != 0 {
            return Err(GgufError::Corrupt(format!(
                "tensor {name}: row length {row} is not a multiple of the {} block size {}",
                ty.name(),
                ty.block_elems()
            )));
        }
        let n_bytes = (n_elem / ty.block_elems() as u64)
            .checked_mul(ty.block_bytes() as u64)
            .ok_or_else(|| GgufError::Corrupt(format!("tensor {name}: byte size overflows")))?;
        if rel % alignment != 0 {
            return Err(GgufError::Corrupt(format!("tensor {name}: offset {rel} is not {alignment}-aligned")));
        }
        let offset = data_start
            .checked_add(rel)
            .ok_or_else(|| GgufError::Corrupt(format!("tensor {name}: offset overflows")))?;
        let end = offset
            .checked_add(n_bytes)
            .ok_or_else(|| GgufError::Corrupt(format!("tensor {name}: end overflows")))?;
        if end > file_len {
            return Err(GgufError::Truncated {
                what: format!("data of tensor {name}"),
                offset,
                needed: n_bytes,
                len: file_len,
            });
        }
        tensors.push(TensorInfo { name, dims, ty, offset, n_bytes });
    }
    Ok(Header { version, metadata, tensors })
}
