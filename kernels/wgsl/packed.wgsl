// packed.wgsl — what the repacked weight decoders (packed_<type>.wgsl, pack.rs) share; prepended
// before one of them. W (binding 1) is `array<WT>`: 16-byte words.

alias WT = vec4<u32>;

// A chunk's packed words as loaded by `load_chunk` (q1: Q8_0's second 16 bytes, unused by the
// 4-bit types; s: the chunk's scale word).
struct Raw {
    q: vec4<u32>,
    q1: vec4<u32>,
    s: u32,
}
