//! Weights repacked at upload for the matmul kernels (kernels/wgsl/packed_<type>.wgsl): Q4_0,
//! Q4_1 and Q8_0 blocks split into 16-byte-aligned quant words and a separate region of scales,
//! so that a lane reads a chunk's quants with aligned 16-byte loads (the raw 18- and 34-byte
//! GGUF blocks are only 2-byte aligned). The values, and so the products, are the same bits.
//! Other types stay raw GGUF blocks (bytes.wgsl + dequant_<type>.wgsl).

use crate::gguf::GgmlType;

/// Whether matrices of `ty` are repacked (their matmul kernel reads packed_<type>.wgsl).
pub(crate) fn packed(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

/// The matmul parameter `row_bytes` for rows of `cols` values stored in `row_bytes` bytes:
/// chunks per row for packed types (the kernels' row offset is then a chunk index), else bytes.
pub(crate) fn row_param(ty: GgmlType, cols: usize, row_bytes: usize) -> usize {
    if packed(ty) {
        cols / 32
    } else {
        row_bytes
    }
}

/// Rows of `ty` (raw GGUF blocks, `parts` one after the other, each a whole number of rows of
/// `cols` values) in the layout the kernel reads: packed (see packed_<type>.wgsl), zero-padded to
/// 16 bytes, or the parts concatenated for the other types.
pub(crate) fn pack_rows(ty: GgmlType, cols: usize, parts: &[&[u8]]) -> Vec<u8> {
    let bytes: usize = parts.iter().map(|p| p.len()).sum();
    if !packed(ty) || !cols.is_multiple_of(32) {
        let mut out = Vec::with_capacity(bytes);
        parts.iter().for_each(|p| out.extend_from_slice(p));
        return out;
    }
    // (block bytes, scale bytes at the block's start, quant bytes)
    let (bs, sb) = match ty {
        GgmlType::Q4_0 => (18, 2),
        GgmlType::Q4_1 => (20, 4),
        _ => (34, 2),
    };
    let qb = bs - sb;
    let n = bytes / bs;
    let mut out = vec![0u8; (n * bs).div_ceil(16) * 16];
    let (quants, scales) = out.split_at_mut(n * qb);
    let blocks = parts.iter().flat_map(|p| p.chunks_exact(bs));
    for ((b, q), s) in blocks.zip(quants.chunks_exact_mut(qb)).zip(scales.chunks_exact_mut(sb)) {
        s.copy_from_slice(&b[..sb]);
        q.copy_from_slice(&b[sb..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_0_blocks_split_into_quants_then_scales() {
        let blocks: Vec<u8> = (0..36u8).collect(); // two blocks of 18 bytes
        let out = pack_rows(GgmlType::Q4_0, 64, &[&blocks[..18], &blocks[18..]]);
        assert_eq!(out.len(), 48);
        assert_eq!(&out[..16], &blocks[2..18]);
        assert_eq!(&out[16..32], &blocks[20..36]);
        assert_eq!(&out[32..36], &[0, 1, 18, 19]);
        assert_eq!(row_param(GgmlType::Q4_0, 64, 36), 2);
        assert_eq!(pack_rows(GgmlType::Q4K, 256, &[&blocks]), blocks);
    }
}
