//! Probes of cooperative matrices (tensor cores through `VK_KHR_cooperative_matrix`) on a real
//! GPU, for a tensor-core prefill matmul of the Q8 path: measurement only, nothing here is used
//! by the runner. Ignored test (`cargo test --release --lib coop_matrix -- --ignored
//! --nocapture`); it skips where no adapter offers `Features::EXPERIMENTAL_COOPERATIVE_MATRIX`
//! with `SHADER_F16` (lavapipe, and so CI).
//!
//! The idea it checks: the Q4 / Q8 quant integers (weight nibbles 0..=15 or -128..=127,
//! activations -127..=127) are exact in f16, their products (|p| <= 2^14) and the sums of a block
//! of 32 (|s| < 2^20) exact in an f32 accumulator, so a 16x16x16 f16 product with f32
//! accumulation, two per block, gives each block's integer dot exactly, whatever order the
//! hardware adds in; the float part (block scales, the decode's lane tree) then stays the
//! decode's, so the bits too.
//!
//! Found (H100, wgpu 30 / naga 30.0.1, NVIDIA 580.159.04 Vulkan): naga parses, validates and
//! writes SPIR-V for `enable wgpu_cooperative_matrix;` with `coop_mat16x16<f16, A|B>` /
//! `coop_mat16x16<f32, C>`, `coopLoadT` from workgroup and storage memory, `coopMultiplyAdd`,
//! `coopStoreT` and `+` of accumulators (naga 30 has only the 8x8 and 16x16 shapes; the device
//! must be asked for the feature with `ExperimentalFeatures::enabled()`, an `unsafe` opt-in).
//! The 16x32 by 32x16 products of quant-range integers (Q4 nibbles, Q8 values, and the extreme
//! -128 x -127 x 32) are exact. Throughput from workgroup memory, 32x32 subgroup tiles (4 tile
//! loads per 4 products): 158-160 tera-ops/s, against ~41 tera-int-ops/s for the dot4I8Packed
//! tiles on the 1.1B's gate|up (docs/perf.md), so ~3.9x on the integer part at best.
//!
//! Built since: branch s103's exact-integer tile (each block's dot through workgroup memory,
//! measured 2.3x slower than the dot4I8Packed tiles) and coop_tile_probe.rs's full-K f16 tiles
//! (no per-block round trip, f16 numerics: 14.9 ms for the 1.1B's matmuls with Q4_0 weights
//! against 25.7 for the integer tiles). docs/perf.md has the figures.

use super::instance;

/// `Y = A x B` for one 16x32 A (workgroup memory) and 32x16 B (storage), in two 16x16x16 steps.
const EXACT: &str = "
enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> WA: array<f16>;
@group(0) @binding(1) var<storage, read> XB: array<f16>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
var<workgroup> sa: array<f16, 512>;
@compute @workgroup_size(32)
fn main(@builtin(local_invocation_index) li: u32) {
    for (var i = li; i < 512u; i += 32u) {
        sa[i] = WA[i];
    }
    workgroupBarrier();
    var c = coop_mat16x16<f32, C>();
    for (var k = 0u; k < 2u; k++) {
        let a = coopLoadT<coop_mat16x16<f16, A>>(&sa[16u * k], 32u);
        let b = coopLoadT<coop_mat16x16<f16, B>>(&XB[256u * k], 16u);
        c = coopMultiplyAdd(a, b, c);
    }
    coopStoreT(c, &Y[0], 16u);
}";

/// Throughput: each subgroup of 4 multiplies a 32x16 by a 16x32 tile (2 + 2 loads from
/// workgroup memory, 4 products: a 32x32 subgroup tile) `ITERS` times.
const SPEED: &str = "
enable f16;
enable wgpu_cooperative_matrix;
@group(0) @binding(0) var<storage, read> WA: array<f16>;
@group(0) @binding(1) var<storage, read_write> Y: array<f32>;
var<workgroup> sa: array<f16, 4096>;
@compute @workgroup_size(128)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {
    for (var i = li; i < 4096u; i += 128u) {
        sa[i] = WA[i];
    }
    workgroupBarrier();
    let sg = li / 32u;
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();
    var c2 = coop_mat16x16<f32, C>();
    var c3 = coop_mat16x16<f32, C>();
    for (var it = 0u; it < 256u; it++) {
        let o = ((it + sg) & 7u) * 512u;
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&sa[o], 32u);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&sa[o + 16u], 32u);
        let b0 = coopLoadT<coop_mat16x16<f16, B>>(&sa[(o + 256u) & 4095u], 16u);
        let b1 = coopLoadT<coop_mat16x16<f16, B>>(&sa[(o + 1024u) & 4095u], 16u);
        c0 = coopMultiplyAdd(a0, b0, c0);
        c1 = coopMultiplyAdd(a0, b1, c1);
        c2 = coopMultiplyAdd(a1, b0, c2);
        c3 = coopMultiplyAdd(a1, b1, c3);
    }
    coopStoreT(c0 + c1 + c2 + c3, &Y[(wg.x * 4u + sg) * 256u], 16u);
}";
const ITERS: f64 = 256.0;

/// A device with cooperative matrices and f16 (and timestamps where offered), or why not.
pub(super) fn coop_device() -> Result<(wgpu::Device, wgpu::Queue, String), String> {
    let want = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    for a in pollster::block_on(instance().enumerate_adapters(wgpu::Backends::all())) {
        if !a.features().contains(want) {
            continue;
        }
        let info = a.get_info();
        let features = want | (a.features() & wgpu::Features::TIMESTAMP_QUERY);
        let (device, queue) = pollster::block_on(a.request_device(&wgpu::DeviceDescriptor {
            label: Some("coop probe"),
            required_features: features,
            required_limits: a.limits(),
            // SAFETY: a probe (ignored test) of an experimental feature; its results are checked
            // against integer arithmetic and nothing else runs on this device.
            experimental_features: unsafe { wgpu::ExperimentalFeatures::enabled() },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| e.to_string())?;
        return Ok((device, queue, format!("{} ({:?}, {} {})", info.name, info.backend, info.driver, info.driver_info)));
    }
    Err("no adapter with EXPERIMENTAL_COOPERATIVE_MATRIX and SHADER_F16".into())
}

pub(super) fn storage(device: &wgpu::Device, queue: &wgpu::Queue, bytes: &[u8], rw: bool) -> wgpu::Buffer {
    let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | if rw { wgpu::BufferUsages::COPY_SRC } else { wgpu::BufferUsages::empty() };
    let b = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: bytes.len() as u64, usage, mapped_at_creation: false });
    queue.write_buffer(&b, 0, bytes);
    b
}

/// Compiles `src`; `checks`: with naga's injected index clamps (off: as the runner's kernels,
/// `pipeline::shader_module`).
pub(super) fn pipeline(device: &wgpu::Device, src: &str, checks: bool) -> wgpu::ComputePipeline {
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let module = super::pipeline::shader_module(device, None, src, checks);
    let p = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: None,
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        panic!("cooperative-matrix kernel: {e}");
    }
    p
}

pub(super) fn bind(device: &wgpu::Device, p: &wgpu::ComputePipeline, bufs: &[&wgpu::Buffer]) -> wgpu::BindGroup {
    let entries: Vec<wgpu::BindGroupEntry> = bufs.iter().enumerate().map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() }).collect();
    device.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &p.get_bind_group_layout(0), entries: &entries })
}

pub(super) fn read_f32(device: &wgpu::Device, queue: &wgpu::Queue, src: &wgpu::Buffer) -> Vec<f32> {
    let st = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: src.size(), usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
    let mut enc = device.create_command_encoder(&Default::default());
    enc.copy_buffer_to_buffer(src, 0, &st, 0, src.size());
    queue.submit([enc.finish()]);
    st.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("map"));
    device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
    let v = bytemuck::cast_slice::<u8, f32>(&st.slice(..).get_mapped_range().expect("mapped")[..]).to_vec();
    v
}

pub(super) fn f16s(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|&x| half::f16::from_f32(x as f32).to_bits().to_le_bytes()).collect()
}

/// 16x32 by 32x16 products of quant-range integers (weights -8..=15 and -128..=127 against
/// activations -127..=127, and the extremes) through cooperative matrices equal the integer
/// products exactly; then the throughput of f16 products with f32 accumulation from workgroup
/// memory (32x32 subgroup tiles), in tera-ops/s (2 per multiply-add).
#[test]
#[ignore]
fn coop_matrix_exact_integer_products() {
    let (device, queue, name) = match coop_device() {
        Ok(d) => d,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    println!("{name}");
    let exact = pipeline(&device, EXACT, true);
    let mut seed = 12345u64;
    let mut rnd = |lo: i32, hi: i32| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        lo + ((seed >> 33) % (hi - lo + 1) as u64) as i32
    };
    for (wlo, whi, case) in [(-8, 15, "q4"), (-128, 127, "q8"), (-128, -128, "extreme")] {
        let a: Vec<i32> = (0..512).map(|_| rnd(wlo, whi)).collect();
        let b: Vec<i32> = (0..512).map(|_| if case == "extreme" { -127 } else { rnd(-127, 127) }).collect();
        let (wa, xb) = (storage(&device, &queue, &f16s(&a), false), storage(&device, &queue, &f16s(&b), false));
        let y = storage(&device, &queue, &[0u8; 1024], true);
        let bg = bind(&device, &exact, &[&wa, &xb, &y]);
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&exact);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(1, 1, 1);
        }
        queue.submit([enc.finish()]);
        let got = read_f32(&device, &queue, &y);
        for m in 0..16 {
            for n in 0..16 {
                let want: i32 = (0..32).map(|k| a[m * 32 + k] * b[k * 16 + n]).sum();
                assert_eq!(got[m * 16 + n], want as f32, "{case}: ({m}, {n})");
            }
        }
        println!("{case}: 256 block dots exact");
    }
    if !device.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
        return eprintln!("no timestamps: no throughput");
    }
    let speed = pipeline(&device, SPEED, true);
    let groups = 132 * 16u32;
    let wa = storage(&device, &queue, &f16s(&(0..4096).map(|i| i % 7 - 3).collect::<Vec<_>>()), false);
    let y = storage(&device, &queue, &vec![0u8; groups as usize * 4 * 256 * 4], true);
    let bg = bind(&device, &speed, &[&wa, &y]);
    let best = time_passes(&device, &queue, &speed, &bg, [groups, 1, 1], 10, 8).into_iter().fold(f64::MAX, f64::min);
    let ops = f64::from(groups) * 4.0 * ITERS * 4.0 * 2.0 * 16.0 * 16.0 * 16.0;
    println!("f16 x f16 -> f32 products from workgroup memory: {:.1} tera-ops/s ({:.3} ms per dispatch)", ops / best / 1e12, best * 1e3);
}

/// Seconds per dispatch of `p` over `groups`, one figure per pass of `per_pass` dispatches
/// (GPU timestamps around the pass), `passes` passes. Needs `Features::TIMESTAMP_QUERY`.
pub(super) fn time_passes(device: &wgpu::Device, queue: &wgpu::Queue, p: &wgpu::ComputePipeline, bg: &wgpu::BindGroup, groups: [u32; 3], per_pass: u32, passes: u32) -> Vec<f64> {
    let qs = device.create_query_set(&wgpu::QuerySetDescriptor { label: None, ty: wgpu::QueryType::Timestamp, count: 2 });
    let resolved = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 16, usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC, mapped_at_creation: false });
    let st = device.create_buffer(&wgpu::BufferDescriptor { label: None, size: 16, usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, mapped_at_creation: false });
    let mut out = Vec::new();
    for _ in 0..passes {
        let mut enc = device.create_command_encoder(&Default::default());
        {
            let writes = wgpu::ComputePassTimestampWrites { query_set: &qs, beginning_of_pass_write_index: Some(0), end_of_pass_write_index: Some(1) };
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: Some(writes) });
            pass.set_pipeline(p);
            pass.set_bind_group(0, bg, &[]);
            for _ in 0..per_pass {
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
            }
        }
        enc.resolve_query_set(&qs, 0..2, &resolved, 0);
        enc.copy_buffer_to_buffer(&resolved, 0, &st, 0, 16);
        queue.submit([enc.finish()]);
        st.slice(..).map_async(wgpu::MapMode::Read, |r| r.expect("map"));
        device.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        let t: Vec<u64> = bytemuck::cast_slice::<u8, u64>(&st.slice(..).get_mapped_range().expect("mapped")[..]).to_vec();
        st.unmap();
        out.push(t[1].saturating_sub(t[0]) as f64 * f64::from(queue.get_timestamp_period()) / 1e9 / f64::from(per_pass));
    }
    out
}
