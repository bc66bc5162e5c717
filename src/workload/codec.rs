//! How a block is written to disk, and the checksum that guards it.
//!
//! * `f16` (the default): the engine's own f16 values, byte for byte. Lossless, so a block read
//!   back after a restart gives exactly the logits (and greedy tokens) of computing it again.
//! * `q8_0`: each head row (one position of one KV head, `head_dim` values) in groups of 32: an
//!   f16 scale and 32 signed bytes (34 bytes per 32 values, 1.88x smaller). Lossy.
//! * `q4_0`: the same with 4-bit values (18 bytes per 32 values, 3.56x smaller). Lossy.
//!
//! The lossy codecs trade token-for-token identity after a restart for disk space; their effect
//! is measured in `docs/perf.md` ("KV reuse"). The checksum ([`checksum`], 64 bits) of the
//! encoded bytes is kept in the block's `kv_lineage` row: a block whose bytes do not match is
//! never served.

use half::{f16, slice::HalfFloatSliceExt};

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
        if self == Codec::F16 && cfg!(target_endian = "little") {
            for half in [&b.k, &b.v] {
                out.extend_from_slice(bytemuck::cast_slice::<u16, u8>(half.reinterpret_cast()));
            }
            return out;
        }
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
        if self == Codec::F16 && cfg!(target_endian = "little") {
            // Little-endian f16 bytes are the values' memory: one copy each.
            let (kb, vb) = bytes.split_at(n * 2);
            let mut b = Block { k: vec![f16::ZERO; n], v: vec![f16::ZERO; n] };
            bytemuck::cast_slice_mut::<u16, u8>(b.k.reinterpret_cast_mut()).copy_from_slice(kb);
            bytemuck::cast_slice_mut::<u16, u8>(b.v.reinterpret_cast_mut()).copy_from_slice(vb);
            return Ok(b);
        }
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

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;

fn round(acc: u64, word: u64) -> u64 {
    acc.wrapping_add(word.wrapping_mul(P2)).rotate_left(31).wrapping_mul(P1)
}

/// A 64-bit checksum of `bytes` (as SQLite stores integers), in the style of xxHash64: four
/// independent lanes of multiply-rotate rounds over 8-byte words, merged and avalanched. It
/// guards against damage (a flipped bit, a torn or misplaced write), not against an attacker,
/// who could rewrite the rows too; at ~10 GB/s it costs ~2 ms per 1,000 stored tokens of
/// SmolLM2-135M, where SHA-256 cost ~30 ms (`codec_speed`).
pub fn checksum(bytes: &[u8]) -> i64 {
    let mut lanes = [P1.wrapping_add(P2), P2, 0, P1.wrapping_neg()];
    let mut chunks = bytes.chunks_exact(32);
    for c in &mut chunks {
        for (i, lane) in lanes.iter_mut().enumerate() {
            let w = u64::from_le_bytes(c[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            *lane = round(*lane, w);
        }
    }
    let mut h = lanes[0].rotate_left(1).wrapping_add(lanes[1].rotate_left(7)).wrapping_add(lanes[2].rotate_left(12)).wrapping_add(lanes[3].rotate_left(18));
    for lane in lanes {
        h = (h ^ round(0, lane)).wrapping_mul(P1).wrapping_add(P3);
    }
    h = h.wrapping_add(bytes.len() as u64);
    let rest = chunks.remainder();
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        h = (h ^ round(0, u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))).rotate_left(27).wrapping_mul(P1).wrapping_add(P3);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b).wrapping_mul(P3)).rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^= h >> 32;
    h as i64
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

    /// What reading 1,024 stored tokens of SmolLM2-135M costs besides the read itself:
    /// `cargo test --release --lib codec_speed -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn codec_speed() {
        let g = Geometry { rows: 90, head_dim: 64, block_tokens: 16 };
        let b = sample(&g);
        for c in Codec::ALL {
            let enc = c.encode(&g, &b);
            let t = std::time::Instant::now();
            for _ in 0..64 {
                std::hint::black_box(checksum(&enc));
            }
            let sum = t.elapsed();
            let t = std::time::Instant::now();
            for _ in 0..64 {
                std::hint::black_box(c.decode(&g, &enc).expect("decode"));
            }
            let dec = t.elapsed();
            let t = std::time::Instant::now();
            for _ in 0..64 {
                std::hint::black_box(c.encode(&g, &b));
            }
            eprintln!("{c}: 64 blocks ({} MB): checksum {sum:?}, decode {dec:?}, encode {:?}", 64 * enc.len() / 1_000_000, t.elapsed());
        }
    }

    #[test]
    fn checksum_sees_one_flipped_bit() {
        let bytes: Vec<u8> = (0..4099u32).map(|i| (i.wrapping_mul(2654435761) >> 11) as u8).collect();
        let c = checksum(&bytes);
        let mut sums = std::collections::HashSet::new();
        for at in [0, 1, 31, 32, 1234, 4095, 4096, 4098] {
            for bit in 0..8 {
                let mut b = bytes.clone();
                b[at] ^= 1 << bit;
                let s = checksum(&b);
                assert_ne!(c, s, "byte {at} bit {bit}");
                sums.insert(s);
            }
        }
        assert_eq!(sums.len(), 64, "every flip gives another sum");
        assert_ne!(checksum(&bytes[..4098]), c, "length matters");
        assert_ne!(checksum(&[0u8; 64]), checksum(&[0u8; 65]));
    }
}
