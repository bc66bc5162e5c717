// embed.wgsl — embedding lookup: OUT[t, :] = dequantized row IDS[t] of the table W.
// Composed at pipeline creation as bytes.wgsl + dequant_<type>.wgsl + this file.
//
// Bindings (group 0):
//   0 uniform P { cols, n_tok, row_bytes, _ }
//   1 storage read  W: array<u32>          [vocab, row_bytes] raw GGUF blocks
//   2 storage read  IDS: array<u32>        [n_tok] token ids (checked < vocab by the host)
//   3 storage rw    OUT: array<vec4<f32>>  [n_tok, cols]
// Dispatch: one thread per (token, 32-element chunk), 256 per workgroup, workgroups laid out
// (x, y) with linear index y * num_workgroups.x + x. Bitwise equal to gguf::dequantize_row.

struct P {
    cols: u32,
    n_tok: u32,
    row_bytes: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> W: array<u32>;
@group(0) @binding(2) var<storage, read> IDS: array<u32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    let i = (wg.y * nw.x + wg.x) * 256u + li;
    let nc = p.cols / 32u;
    if (i >= p.n_tok * nc) {
        return;
    }
    let t = i / nc;
    let c = i % nc;
    let w = dequant_chunk(IDS[t] * p.row_bytes, c);
    let o = (t * p.cols + c * 32u) / 4u;
    for (var k = 0u; k < 8u; k++) {
        OUT[o + k] = w[k];
    }
}
