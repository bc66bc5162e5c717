//! How a block is written to disk, and the checksum that guards it.
//!
//! * `f16` (the default): the engine's own f16 values, byte for byte. Lossless, so a block read
//!   back after a restart gives exactly the logits (and greedy tokens) of computing it again.
//! * `q8_0`: each head row (one position of one KV head, `head_dim` values) in groups of 32: an
//!   f16 scale and 32 signed bytes (34 bytes per 32 values, 1.88x smaller). Lossy.
//! * `q4_0`: the same with 4-bit values (18 bytes per 32 values, 3.56x smaller). Lossy.
//!
//! The lossy codecs trade token-for-token identity after a restart for disk space; their effect
//! is measured in `docs/perf.md` ("KV reuse"). The checksum is SHA-256 of the encoded bytes
//! (first 8 bytes), kept in the block's `kv_lineage` row: a block whose bytes do not match is
//! never served.

use half::f16;
use sha2::{Digest, Sha256};

use super::index::{Block, Geometry};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Codec {
    #[default]
    F16,
    Q8_0,
    Q4_0,
}

const GROUP: usize = 32;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CodecError {
    #[error("unknown KV codec {0:?} (f16, q8_0, q4_0)")]
    Unknown(String),
    #[error("a {codec} block must be {want} bytes, found {got}")]
    Size { codec: &'static str, want: usize, got: usize },
}

impl Codec {
    pub const ALL: [Codec; 3] = [Codec::F16, Codec::Q8_0, Codec::Q4_0];

    pub fn as_str(self) -> &'static str {
        match self {
            Codec::F16 => "f16",
            Codec::Q8_0 => "q8_0",
            Codec::Q4_0 => "q4_0",
        }
    }

    pub fn parse(s: &str) -> Result<Codec, CodecError> {
        Codec::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| CodecError::Unknown(s.to_string()))
    }

    /// Bytes of one encoded head row of `head_dim` values.
    fn row_bytes(self, head_dim: usize) -> usize {
        let groups = head_dim.div_ceil(GROUP);
        match self {
            Codec::F16 => head_dim * 2,
            Codec::Q8_0 => groups * (2 + GROUP),
            Codec::Q4_0 => groups * (2 + GROUP / 2),
        }
    }

    /// Bytes of one encoded block (keys and values).
    pub fn block_bytes(self, g: &Geometry) -> usize {
        2 * g.rows * g.block_tokens * self.row_bytes(g.head_dim)
    }

    pub fn encode(self, g: &Geometry, b: &Block) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.block_bytes(g));
        for half in [&b.k, &b.v] {
            for row in half.chunks_exact(g.head_dim) {
                match self {
                    Codec::F16 => row.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
                    Codec::Q8_0 | Codec::Q4_0 => quantize_row(self, row, &mut out),
                }
            }
        }
        out
    }

    pub fn decode(self, g: &Geometry, bytes: &[u8]) -> Result<Block, CodecError> {
        let want = self.block_bytes(g);
        if bytes.len() != want {
            return Err(CodecError::Size { codec: self.as_str(), want, got: bytes.len() });
        }
        let n = g.values();
        let mut vals = vec![f16::ZERO; 2 * n];
        let rb = self.row_bytes(g.head_dim);
        for (row, src) in vals.chunks_exact_mut(g.head_dim).zip(bytes.chunks_exact(rb)) {
            match self {
                Codec::F16 => row.iter_mut().zip(src.chunks_exact(2)).for_each(|(d, s)| *d = f16::from_le_bytes([s[0], s[1]])),
                Codec::Q8_0 | Codec::Q4_0 => dequantize_row(self, src, row),
            }
        }
        let v = vals.split_off(n);
        Ok(Block { k: vals, v })
    }
}

impl std::fmt::Display for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Largest quantized magnitude of the lossy codecs.
fn qmax(c: Codec) -> f32 {
    if c == Codec::Q8_0 {
        127.0
    } else {
        7.0
    }
}

fn quantize_row(c: Codec, row: &[f16], out: &mut Vec<u8>) {
    for group in row.chunks(GROUP) {
        let amax = group.iter().map(|x| x.to_f32().abs()).fold(0.0f32, f32::max);
        let d = f16::from_f32(amax / qmax(c));
        let inv = if d.to_f32() > 0.0 { 1.0 / d.to_f32() } else { 0.0 };
        out.extend_from_slice(&d.to_le_bytes());
        let q = |i: usize| group.get(i).map_or(0.0, |x| (x.to_f32() * inv).round().clamp(-qmax(c), qmax(c)));
        if c == Codec::Q8_0 {
            out.extend((0..GROUP).map(|i| q(i) as i8 as u8));
        } else {
            out.extend((0..GROUP / 2).map(|i| ((q(2 * i) + 8.0) as u8) | (((q(2 * i + 1) + 8.0) as u8) << 4)));
        }
    }
}

fn dequantize_row(c: Codec, src: &[u8], row: &mut [f16]) {
    let gb = if c == Codec::Q8_0 { 2 + GROUP } else { 2 + GROUP / 2 };
    for (group, s) in row.chunks_mut(GROUP).zip(src.chunks_exact(gb)) {
        let d = f16::from_le_bytes([s[0], s[1]]).to_f32();
        for (i, x) in group.iter_mut().enumerate() {
            let q = if c == Codec::Q8_0 { f32::from(s[2 + i] as i8) } else { f32::from((s[2 + i / 2] >> (4 * (i % 2))) & 15) - 8.0 };
            *x = f16::from_f32(q * d);
        }
    }
}

/// The first 8 bytes of SHA-256 of `bytes`, as SQLite stores integers.
pub fn checksum(bytes: &[u8]) -> i64 {
    let h = Sha256::digest(bytes);
    i64::from_le_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(g: &Geometry) -> Block {
        let f = |i: usize, s: f32| f16::from_f32(((i as f32 * 0.37).sin() * s) + if i % 97 == 0 { 9.0 } else { 0.0 });
        Block { k: (0..g.values()).map(|i| f(i, 2.0)).collect(), v: (0..g.values()).map(|i| f(i + 5, 0.5)).collect() }
    }

    #[test]
    fn f16_round_trip_is_exact_and_lossy_codecs_are_close() {
        let g = Geometry { rows: 6, head_dim: 64, block_tokens: 16 };
        let b = sample(&g);
        let enc = Codec::F16.encode(&g, &b);
        assert_eq!(enc.len(), g.bytes());
        assert_eq!(Codec::F16.decode(&g, &enc).expect("decode"), b, "f16 is lossless");

        for (c, ratio, tol) in [(Codec::Q8_0, 1.88, 0.01), (Codec::Q4_0, 3.55, 0.15)] {
            let enc = c.encode(&g, &b);
            assert_eq!(enc.len(), c.block_bytes(&g));
            assert!((g.bytes() as f64 / enc.len() as f64) > ratio, "{c}: {} bytes", enc.len());
            let d = c.decode(&g, &enc).expect("decode");
            for (src, dst) in [(&b.k, &d.k), (&b.v, &d.v)] {
                for (row_s, row_d) in src.chunks(32).zip(dst.chunks(32)) {
                    let amax = row_s.iter().map(|x| x.to_f32().abs()).fold(0.0, f32::max);
                    for (x, y) in row_s.iter().zip(row_d) {
                        assert!((x.to_f32() - y.to_f32()).abs() <= amax * tol + 1e-3, "{c}: {x} -> {y} (amax {amax})");
                    }
                }
            }
        }
        assert!(matches!(Codec::F16.decode(&g, &enc[1..]), Err(CodecError::Size { .. })));
        assert_eq!(Codec::parse("q8_0"), Ok(Codec::Q8_0));
        assert!(Codec::parse("zip").is_err());
    }

    #[test]
    fn checksum_sees_one_flipped_bit() {
        let mut bytes = vec![7u8; 4096];
        let c = checksum(&bytes);
        bytes[1234] ^= 0x10;
        assert_ne!(c, checksum(&bytes));
    }
}
