//! Speed probes of the decode matmul on a real GPU (ignored; `cargo test --release --lib
//! wgpu_matmul_probe -- --ignored --nocapture`): GPU time per dispatch of N back-to-back
//! dispatches in one compute pass (timestamps at the pass's ends), for kernel variants of the
//! 1.1B model's shapes. Measurement only: nothing here is used by the runner.

use std::sync::Arc;

use super::context::{kernel, Kernel, WgpuContext, WgpuOptions, XSrc, B};
use super::pack::{pack_rows, row_param};
use crate::gguf::synth::random_matrix;
use crate::gguf::GgmlType;

const N: u32 = 100;

/// Milliseconds per dispatch of `k` over `binds` on `grid`, best of 3 passes of N dispatches.
fn time(ctx: &WgpuContext, k: &Kernel, binds: &[(&wgpu::Buffer, u64, Option<u64>)], grid: (u32, u32)) -> f64 {
    let bg = ctx.bind(k, binds);
    let qs = ctx.device.create_query_set(&wgpu::QuerySetDescriptor { label: None, ty: wgpu::QueryType::Timestamp, count: 2 });
    let resolved = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 16,
        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
        mapped_at_creation: false,
    });
    let mut best = f64::MAX;
    for _ in 0..3 {
        let mut enc = ctx.encoder();
        {
            let writes = wgpu::ComputePassTimestampWrites { query_set: &qs, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: Some(1) };
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(writes) });
            pass.set_pipeline(&k.pipeline);
            pass.set_bind_group(0, &bg, &[]);
            for _ in 0..N {
                pass.dispatch_workgroups(grid.0, grid.1, 1);
            }
        }
        enc.resolve_query_set(&qs, 0..2, &resolved, 0);
        let mut t = [0u64; 2];
        ctx.map_read(enc, &resolved, 0, &ctx.staging("ts", 16), 16, |b| t.copy_from_slice(bytemuck::cast_slice(b))).expect("read");
        let ms = t[1].saturating_sub(t[0]) as f64 * f64::from(ctx.queue.get_timestamp_period()) / 1e6 / f64::from(N);
        best = best.min(ms);
    }
    best
}

fn uniform_buf(ctx: &WgpuContext, words: &[u32]) -> wgpu::Buffer {
    let b = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: 64,
        usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let mut w = [0u32; 16];
    w[..words.len()].copy_from_slice(words);
    ctx.queue.write_buffer(&b, 0, bytemuck::cast_slice(&w));
    b
}

const STREAM: &str = "
@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> X: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {
    var a = vec4<u32>(0u);
    for (var i = g.x; i < p.x; i += nw.x * 256u) {
        a = a ^ W[i];
    }
    if (a.x == 12345u) { Y[0] = a.y; }
}";

fn probe(ctx: &Arc<WgpuContext>, label: &str, rows: usize, cols: usize) {
    let quiet = label == "warm-up";
    let ty = GgmlType::Q4_0;
    let raw = random_matrix(ty, rows, cols, 0.0, 0.02, 7).expect("matrix");
    let packed = pack_rows(ty, cols, &[&raw]);
    let w = ctx.storage_init("w", &packed).expect("w");
    let x = ctx.storage_init("x", bytemuck::cast_slice(&vec![0.5f32; cols])).expect("x");
    let y = ctx.storage("y", (rows * 4) as u64).expect("y");
    let mb = packed.len() as f64 / 1e6;
    let pm = uniform_buf(ctx, &[rows as u32, cols as u32, 1, row_param(ty, cols, raw.len() / rows) as u32, rows as u32, 0, 0, 0]);
    let binds = [(&pm, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)];
    let report = |name: &str, ms: f64| if !quiet { println!("| {label} {rows}x{cols} | {name} | {:.2} us | {:.0} GB/s |", ms * 1e3, mb / ms) };
    let mm = &ctx.kernels.matmul[&ty];
    report("matmul.wgsl (8 rows x 32 lanes)", time(ctx, mm, &binds, ctx.matmul_grid(rows, 1)));
    let mm4 = [B::Uniform, B::Read, B::Read, B::Rw];
    if let Some(k) = ctx.kernels.matvec.get(&(ty, XSrc::Plain)) {
        report(&format!("matmul_vec.wgsl ({})", ctx.decode_kernels()), time(ctx, k, &binds, ctx.matmul_grid(rows, 1)));
    }
    let words = (packed.len() / 16) as u32;
    let ps = uniform_buf(ctx, &[words, 0, 0, 0]);
    let k = kernel(&ctx.device, "stream", STREAM, &mm4).expect("stream");
    // a plain read of the same bytes: the bandwidth floor of a dispatch of this size
    report("stream read, 1056 workgroups", time(ctx, &k, &[(&ps, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)], (1056, 1)));
    let p0 = uniform_buf(ctx, &[0, 0, 0, 0]);
    report("empty dispatch (1 workgroup)", time(ctx, &k, &[(&p0, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)], (1, 1)));
}


/// Experimental decode matmul on Q8 activations (integer dot products), Q4_0 packed weights.
/// X: qs as 2 vec4<u32> per chunk, then (d bits, sum) per chunk as vec2 pairs in vec4 words.
const Q8MV: &str = "
@group(0) @binding(0) var<uniform> p: vec4<u32>;
@group(0) @binding(1) var<storage, read> W: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> X: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> Y: array<f32>;
const LANES: u32 = 32u;
const ROWS: u32 = 8u;
STAGE_DECL
fn xq(i: u32) -> vec4<u32> { return XLOAD; }
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    let nc = p.y / 32u;
    STAGE_CODE
    let lane = li % LANES;
    let r = wg.x * ROWS + li / LANES;
    var acc = 0.0;
    if (r < p.x) {
        for (var c = lane; c < nc; c += LANES) {
            let i = r * nc + c;
            let q = W[i];
            let sw = W[p.x * nc + i / 8u][(i / 2u) % 4u];
            let dw = unpack2x16float(sw >> (16u * (i % 2u))).x;
            let x0 = xq(2u * c);
            let x1 = xq(2u * c + 1u);
            let xm = xq(2u * nc + c / 2u);
            let xd = bitcast<f32>(xm[2u * (c % 2u)]);
            let xs = bitcast<i32>(xm[2u * (c % 2u) + 1u]);
            let m = 0x0F0F0F0Fu;
            var s = dot4I8Packed(q.x & m, x0.x) + dot4I8Packed(q.y & m, x0.y) + dot4I8Packed(q.z & m, x0.z) + dot4I8Packed(q.w & m, x0.w);
            s += dot4I8Packed((q.x >> 4u) & m, x1.x) + dot4I8Packed((q.y >> 4u) & m, x1.y) + dot4I8Packed((q.z >> 4u) & m, x1.z) + dot4I8Packed((q.w >> 4u) & m, x1.w);
            acc = acc + dw * xd * f32(s - 8 * xs);
        }
    }
    for (var st = LANES / 2u; st > 0u; st = st >> 1u) {
        acc = acc + subgroupShuffleXor(acc, st);
    }
    if (lane == 0u && r < p.x) { Y[r] = acc; }
}";

fn q8_src(lanes: u32, staged: bool) -> String {
    let (decl, code, load) = if staged {
        (
            "var<workgroup> XS: array<vec4<u32>, 1024>;",
            "for (var j = li; j < 2u * nc + (nc + 1u) / 2u; j += 256u) { XS[j] = X[j]; } workgroupBarrier();",
            "XS[i]",
        )
    } else {
        ("", "", "X[i]")
    };
    Q8MV.replace("const LANES: u32 = 32u;", &format!("const LANES: u32 = {lanes}u;"))
        .replace("const ROWS: u32 = 8u;", &format!("const ROWS: u32 = {}u;", 256 / lanes))
        .replace("STAGE_DECL", decl)
        .replace("STAGE_CODE", code)
        .replace("XLOAD", load)
}

fn probe_q8(ctx: &Arc<WgpuContext>, label: &str, rows: usize, cols: usize) {
    let ty = GgmlType::Q4_0;
    let raw = random_matrix(ty, rows, cols, 0.0, 0.02, 7).expect("matrix");
    let packed = pack_rows(ty, cols, &[&raw]);
    let w = ctx.storage_init("w", &packed).expect("w");
    let nc = cols / 32;
    let mut xw = vec![0x01020304u32; 8 * nc + 4 * nc.div_ceil(2)];
    for c in 0..nc {
        xw[8 * nc + 2 * c] = 0.01f32.to_bits();
        xw[8 * nc + 2 * c + 1] = 80;
    }
    let x = ctx.storage_init("xq", bytemuck::cast_slice(&xw)).expect("x");
    let y = ctx.storage("y", (rows * 4) as u64).expect("y");
    let mb = packed.len() as f64 / 1e6;
    let pm = uniform_buf(ctx, &[rows as u32, cols as u32, 0, 0]);
    let binds = [(&pm, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)];
    let mm4 = [B::Uniform, B::Read, B::Read, B::Rw];
    for staged in [false, true] {
        for lanes in [32u32, 16, 8, 4] {
            let k = match kernel(&ctx.device, "q8mv", &q8_src(lanes, staged), &mm4) {
                Ok(k) => k,
                Err(e) => return eprintln!("q8 kernel: {e}"),
            };
            let ms = time(ctx, &k, &binds, (rows.div_ceil((256 / lanes) as usize) as u32, 1));
            println!("| {label} {rows}x{cols} | q8 int dot, {lanes} lanes, x {} | {:.2} us | {:.0} GB/s |", if staged { "staged" } else { "global" }, ms * 1e3, mb / ms);
        }
    }
}

#[test]
#[ignore]
fn wgpu_matmul_probe() {
    let opts = WgpuOptions { allow_software: std::env::var_os("FORGE_PROBE_SOFTWARE").is_some(), matmul_lanes: None, decode_kernels: None, attention_one: None };
    let ctx = match WgpuContext::new(opts) {
        Ok(c) => c,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    if !ctx.timestamps {
        return eprintln!("skipped: no timestamps");
    }
    println!("{:?}; {N} dispatches per pass, best of 3", ctx.adapter());
    println!("| shape | kernel | per dispatch | weights / time |\n|---|---|---|---|");
    // warm-up (clocks ramp up over a second or two), then the measured rounds
    for _ in 0..4 {
        probe(&ctx, "warm-up", 11264, 2048);
    }
    probe(&ctx, "gate_up", 11264, 2048);
    probe(&ctx, "down", 2048, 5632);
    probe(&ctx, "qkv", 2560, 2048);
    probe_q8(&ctx, "gate_up", 11264, 2048);
    probe_q8(&ctx, "down", 2048, 5632);
    probe_q8(&ctx, "qkv", 2560, 2048);
}
