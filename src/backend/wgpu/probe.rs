//! Speed probes of the decode matmul on a real GPU (ignored; `cargo test --release --lib
//! wgpu_matmul_probe -- --ignored --nocapture`): GPU time per dispatch of N back-to-back
//! dispatches in one compute pass (timestamps at the pass's ends), for kernel variants of the
//! 1.1B model's shapes. Measurement only: nothing here is used by the runner.

use std::sync::Arc;

use super::context::{WgpuContext, XSrc};
use super::pipeline::{kernel, Kernel, B};
use super::options::WgpuOptions;
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
    let k = kernel(&ctx.device, "stream", STREAM, &mm4, ctx.options().shader_checks).expect("stream");
    // a plain read of the same bytes: the bandwidth floor of a dispatch of this size
    report("stream read, 1056 workgroups", time(ctx, &k, &[(&ps, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)], (1056, 1)));
    let p0 = uniform_buf(ctx, &[0, 0, 0, 0]);
    report("empty dispatch (1 workgroup)", time(ctx, &k, &[(&p0, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)], (1, 1)));
}


fn probe_q8(ctx: &Arc<WgpuContext>, label: &str, rows: usize, cols: usize) {
    let ty = GgmlType::Q4_0;
    let raw = random_matrix(ty, rows, cols, 0.0, 0.02, 7).expect("matrix");
    let packed = pack_rows(ty, cols, &[&raw]);
    let w = ctx.storage_init("w", &packed).expect("w");
    let nc = cols / 32;
    // a Q8 row (q8_act.wgsl): int8 values, then (d, s, isum, 0) per block
    let mut xw = vec![0x01020304u32; 12 * nc];
    for c in 0..nc {
        xw[8 * nc + 4 * c..8 * nc + 4 * c + 4].copy_from_slice(&[0.01f32.to_bits(), 0.1f32.to_bits(), 80, 0]);
    }
    let x = ctx.storage_init("xq", bytemuck::cast_slice(&xw)).expect("x");
    let y = ctx.storage("y", (rows * 4) as u64).expect("y");
    let mb = packed.len() as f64 / 1e6;
    let pm = uniform_buf(ctx, &[rows as u32, cols as u32, 1, row_param(ty, cols, raw.len() / rows) as u32, 0, 0, 0, 0]);
    let binds = [(&pm, 0, None), (&w, 0, None), (&x, 0, None), (&y, 0, None)];
    if let Some(k) = ctx.kernels.matvec.get(&(ty, XSrc::Q8)) {
        let ms = time(ctx, k, &binds, ctx.matmul_grid(rows, 1));
        println!("| {label} {rows}x{cols} | matvec_q8.wgsl (Q8 activations, integer dots) | {:.2} us | {:.0} GB/s |", ms * 1e3, mb / ms);
    }
}

#[test]
#[ignore]
fn wgpu_matmul_probe() {
    let opts = WgpuOptions { allow_software: std::env::var_os("FORGE_PROBE_SOFTWARE").is_some(), ..WgpuOptions::from_env().expect("FORGE_WGPU_*") };
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

/// Whether each adapter offers `Features::EXPERIMENTAL_COOPERATIVE_MATRIX` (tensor cores through
/// VK_KHR_cooperative_matrix), and the shapes / types it lists (`cargo test --release --lib
/// wgpu_cooperative_matrix_probe -- --ignored --nocapture`). Printing only.
#[test]
#[ignore]
fn wgpu_cooperative_matrix_probe() {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
    for a in pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all())) {
        let info = a.get_info();
        let coop = a.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        println!("{} ({:?}, {} {}): EXPERIMENTAL_COOPERATIVE_MATRIX {coop}", info.name, info.backend, info.driver, info.driver_info);
        for p in a.cooperative_matrix_properties() {
            println!("  {p:?}");
        }
    }
}
