// bytes.wgsl — byte access to raw GGUF block bytes, prepended to every dequantizing kernel.
//
// Bindings: none of its own; reads the kernel's `W: array<u32>` (binding 1), which holds a tensor's
// GGUF bytes exactly as in the file, little-endian, zero-padded to whole words. Offsets are in bytes
// from the start of W. Every GGML block is at least 2-byte aligned in a row, so 16- and 32-bit reads
// take even offsets; a 32-bit read at an offset of 2 mod 4 joins two words. `WT` is the element
// type of W for the kernels that declare W as `array<WT>` (matmul.wgsl, matmul_vec.wgsl).

alias WT = u32;

fn ld_u8(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 3u) * 8u)) & 0xFFu;
}

// b even
fn ld_u16(b: u32) -> u32 {
    return (W[b >> 2u] >> ((b & 2u) * 8u)) & 0xFFFFu;
}

// b even
fn ld_u32(b: u32) -> u32 {
    let i = b >> 2u;
    if ((b & 2u) == 0u) {
        return W[i];
    }
    return (W[i] >> 16u) | (W[i + 1u] << 16u);
}

// f16 at even byte offset b, as f32 (exact).
fn ld_f16(b: u32) -> f32 {
    return unpack2x16float(ld_u16(b)).x;
}

// The four bytes of a word as u32 lanes (byte 0 first).
fn bytes4(q: u32) -> vec4<u32> {
    return vec4<u32>(q & 0xFFu, (q >> 8u) & 0xFFu, (q >> 16u) & 0xFFu, q >> 24u);
}
