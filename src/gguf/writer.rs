//! Writes GGUF v3 files: used by tests (valid, truncated and corrupt files) and by tools that
//! produce synthetic models. Tensor bytes must already be in the tensor's block format.

use std::io::Write;

use super::{GgmlType, Value};

pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
    alignment: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter { metadata: Vec::new(), tensors: Vec::new(), alignment: 32 }
    }
}

fn value_type(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend(x.to_le_bytes()),
        Value::I16(x) => out.extend(x.to_le_bytes()),
        Value::U32(x) => out.extend(x.to_le_bytes()),
        Value::I32(x) => out.extend(x.to_le_bytes()),
        Value::F32(x) => out.extend(x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(items) => {
            let elem_ty = items.first().map(value_type).unwrap_or(4);
            out.extend(elem_ty.to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for it in items {
                put_value(out, it);
            }
        }
        Value::U64(x) => out.extend(x.to_le_bytes()),
        Value::I64(x) => out.extend(x.to_le_bytes()),
        Value::F64(x) => out.extend(x.to_le_bytes()),
    }
}

impl GgufWriter {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn meta(&mut self, key: &str, v: Value) -> &mut Self {
        self.metadata.push((key.to_string(), v));
        self
    }

    /// Adds a tensor; `dims` in GGML order (row length first).
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: GgmlType, bytes: Vec<u8>) -> &mut Self {
        self.tensors.push((name.to_string(), dims.to_vec(), ty, bytes));
        self
    }

    /// Header, metadata and tensor infos, padded to the start of the data section.
    fn header(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(&mut out, k);
            out.extend(value_type(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut rel = 0u64;
        for (name, dims, ty, bytes) in &self.tensors {
            put_str(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.id().to_le_bytes());
            out.extend(rel.to_le_bytes());
            rel = self.align(rel + bytes.len() as u64);
        }
        out.resize(self.align(out.len() as u64) as usize, 0);
        out
    }

    fn align(&self, x: u64) -> u64 {
        x.div_ceil(self.alignment) * self.alignment
    }

    /// Serializes the whole file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing into a Vec cannot fail.
        let _ = self.write_to(&mut out);
        out
    }

    /// Streams the file to `w` (tensor data is not copied into one buffer first).
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let header = self.header();
        w.write_all(&header)?;
        let mut at = 0u64;
        for (i, (_, _, _, bytes)) in self.tensors.iter().enumerate() {
            if i > 0 {
                let pad = self.align(at) - at;
                w.write_all(&vec![0u8; pad as usize])?;
                at += pad;
            }
            w.write_all(bytes)?;
            at += bytes.len() as u64;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufError, GgufFile};

    fn sample() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.meta("general.architecture", Value::String("llama".into()))
            .meta("a.u8", Value::U8(7))
            .meta("a.i8", Value::I8(-7))
            .meta("a.u16", Value::U16(700))
            .meta("a.i16", Value::I16(-700))
            .meta("a.u32", Value::U32(70000))
            .meta("a.i32", Value::I32(-70000))
            .meta("a.f32", Value::F32(1.5))
            .meta("a.bool", Value::Bool(true))
            .meta("a.u64", Value::U64(1 << 40))
            .meta("a.i64", Value::I64(-(1 << 40)))
            .meta("a.f64", Value::F64(-2.25))
            .meta("a.arr", Value::Array(vec![Value::String("x".into()), Value::String("yz".into())]))
            .meta("a.nested", Value::Array(vec![Value::Array(vec![Value::I32(1), Value::I32(2)])]));
        let f32s: Vec<u8> = (0..64).flat_map(|i| (i as f32).to_le_bytes()).collect();
        w.tensor("t.f32", &[32, 2], GgmlType::F32, f32s);
        w.tensor("t.q8", &[32], GgmlType::Q8_0, vec![0; 34]);
        w
    }

    fn write_tmp(bytes: &[u8]) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("tmp");
        f.write_all(bytes).expect("write");
        f
    }

    #[test]
    fn round_trip_every_value_type() {
        let w = sample();
        let f = write_tmp(&w.to_bytes());
        let g = GgufFile::open(f.path()).expect("open");
        assert_eq!(g.version, 3);
        for (k, v) in &w.metadata {
            assert_eq!(g.get(k), Some(v), "{k}");
        }
        let t = g.tensor_with_shape("t.f32", &[32, 2]).expect("tensor");
        assert_eq!(t.to_f32()[63], 63.0);
        assert_eq!(g.tensor("t.q8").expect("q8").bytes.len(), 34);
        assert!(matches!(g.tensor("nope"), Err(GgufError::MissingTensor(_))));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let bytes = sample().to_bytes();
        // Cutting anywhere must yield an error, never a panic (the data section ends the file).
        for cut in 0..bytes.len() {
            let f = write_tmp(&bytes[..cut]);
            assert!(GgufFile::open(f.path()).is_err(), "cut at {cut} parsed");
        }
    }

    #[test]
    fn corrupt_fields_are_named() {
        let good = sample().to_bytes();
        let open = |b: &[u8]| GgufFile::open(write_tmp(b).path()).map(|_| ());

        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(open(&b), Err(GgufError::BadMagic(_))));

        let mut b = good.clone();
        b[4] = 9;
        assert!(matches!(open(&b), Err(GgufError::UnsupportedVersion(9))));

        let mut b = good.clone();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // tensor count
        let e = open(&b).unwrap_err().to_string();
        assert!(e.contains("tensor count"), "{e}");

        let mut b = good.clone();
        b[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes()); // metadata count
        assert!(open(&b).unwrap_err().to_string().contains("metadata count"));

        // First key's string length made absurd.
        let mut b = good.clone();
        b[24..32].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
        assert!(open(&b).is_err());

        // Unknown tensor type id in the last tensor info: find "t.q8" then patch its type.
        let pos = good.windows(4).position(|w| w == b"t.q8").expect("name");
        let ty_at = pos + 4 + 4 + 8; // name, rank u32, one dim u64
        let mut b = good.clone();
        b[ty_at..ty_at + 4].copy_from_slice(&99u32.to_le_bytes());
        assert!(matches!(open(&b), Err(GgufError::UnsupportedType { id: 99, .. })));

        // Rank 0 and rank 9.
        for rank in [0u32, 9] {
            let mut b = good.clone();
            b[pos + 4..pos + 8].copy_from_slice(&rank.to_le_bytes());
            assert!(open(&b).unwrap_err().to_string().contains("rank"));
        }

        // Offset pointing past the end of the file.
        let mut b = good.clone();
        b[ty_at + 4..ty_at + 12].copy_from_slice(&(1u64 << 40).to_le_bytes());
        assert!(matches!(open(&b), Err(GgufError::Truncated { .. })));

        // Dimension that is not a whole number of Q8_0 blocks.
        let mut b = good.clone();
        b[pos + 8..pos + 16].copy_from_slice(&33u64.to_le_bytes());
        assert!(open(&b).unwrap_err().to_string().contains("block size"));
    }
}
