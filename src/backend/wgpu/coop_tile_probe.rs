//! Probe: how fast can a tensor-core matmul written in WGSL run at the 1.1B's prefill shapes,
//! when each (row, token) output is one f32 accumulation over the whole of K (no per-block
//! round trip through workgroup memory, unlike branch s103's exact-integer tile)? Measurement
//! only, nothing here is used by the runner. Ignored test (`cargo test --release --lib
//! coop_tile_full -- --ignored --nocapture`); it skips where no adapter offers cooperative matrices
//! with f16 (lavapipe, and so CI).
//!
//! The question behind it (docs/perf.md, "Where the 1.1B's wgpu prefill stands"): the 1.1B's
//! wgpu pp512 needs its step at <= 14.7 GPU ms for 0.8x llama.cpp; the matmuls take 25.7 of
//! 31.2 ms with dot4I8Packed at ~30% of that instruction's peak. A full-K f16 tile is the fastest
//! order WGSL can reach; it would change the tier's numerics (weights d * (q - 8) rounded to f16,
//! activations in f16, the tensor core's own summation order, which decode would then have to
//! share), so it is worth building only if it is fast enough. Variants, each checked exactly
//! against integer arithmetic on sampled outputs before it is timed:
//! - `f16`: A (weights, f16, row-major) and B (tokens, f16) staged through workgroup memory,
//!   the next stage's loads in flight during the products (register prefetch), `ks` values of K
//!   per stage; one stage buffer (two barriers per stage) or two (one barrier, the next stage
//!   stored after this stage's products). (Fragments loaded by `coopLoad` straight from storage
//!   were slower than staged ones at every shape, docs/perf.md; that variant is gone.)
//! - `raw` / `raw_loads`: products from workgroup memory only, the fragments kept in registers
//!   or loaded every step (not checked): the ceiling of a tile shape, without and with the
//!   fragment loads.
//! - `stage_only` / `store_only`: `f16`'s staging without the products, and its stores into
//!   workgroup memory and barriers alone (not checked): where a staged tile's time goes.
//! - `q4`: as `f16`, but the weights are Q4_0 (16 nibble bytes per block of 32, one f16 scale)
//!   and dequantized to f16 while staged: f32(2^23 + n) from the bits, minus 2^23 + 8, times d,
//!   rounded to f16 (naga 30 types a `bitcast<vec2<f16>>` of a u32 as f32, so no f16 bit tricks).
//!
//! A workgroup is `wgm` x `wgn` subgroups of 32 (NVIDIA) along the rows and the tokens; each
//! subgroup holds `sgm` x `sgn` 16x16 f32 accumulators (llama.cpp's Vulkan mul_mm with
//! cooperative matrices: 2 x 2 subgroups of 4 x 4, a 128 x 128 tile).
//!
//! Found (H200, docs/perf.md "Full-K tensor-core tiles, probed"): compiled as the runner's
//! kernels are (without naga's index clamps), the best Q4 tiles run at 95-118 tera-ops/s and
//! take 9.5 ms for the 1.1B's 22 layers of matmuls against 25.7 for today's integer tiles:
//! llama.cpp's own Vulkan rate. Two stage buffers gain nothing. The GPU drops to 345 MHz while
//! the CPU prepares a shape, so the tiles are timed interleaved, round by round.
//!
//! `coop_chain_latency` (ignored too) times one subgroup's chain of dependent products, what an
//! output's K steps are in a one-token step: 32-36 ns per product on the H200 (docs/perf.md).

use super::coop_probe::{bind, coop_device, f16s, pipeline, read_f32, storage, time_passes};
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Load {
    F16,
    Q4,
    /// Products from workgroup memory alone (no loads from storage, no barriers in the loop,
    /// results not checked): the fragments do not depend on the loop, so they stay in
    /// registers: the products' ceiling for a tile shape.
    Raw,
    /// As `Raw`, the fragments' addresses moving with the loop (loaded every step): the
    /// products and the fragment loads from workgroup memory, without staging.
    RawLoads,
    /// As `F16` without the products (results not checked): the feed alone.
    StageOnly,
    /// As `StageOnly` without the loads from storage (constants stored): stores and barriers.
    StoreOnly,
}

impl Load {
    /// Staged as f16 values (`F16` and its parts).
    fn f16_staged(self) -> bool {
        matches!(self, Load::F16 | Load::StageOnly | Load::StoreOnly)
    }
    /// Runs the products and so gives checkable results.
    fn checked(self) -> bool {
        !matches!(self, Load::Raw | Load::RawLoads | Load::StageOnly | Load::StoreOnly)
    }
}

#[derive(Clone, Copy, Debug)]
struct Tile {
    load: Load,
    /// Subgroups along the rows and along the tokens (32 invocations each).
    wgm: u32,
    wgn: u32,
    /// 16x16 accumulators per subgroup along the rows and along the tokens.
    sgm: u32,
    sgn: u32,
    /// Values of K per stage (staged loads).
    ks: u32,
    /// Padding of a workgroup-memory row, f16s (8: rows 16-byte aligned; 2: an odd number of
    /// 4-byte words per row, so 32 rows start in 32 different banks).
    pad: u32,
    /// Staging tasks by rows (lane i takes row i of a chunk column: stores to 32 rows at once)
    /// instead of by chunks (consecutive lanes take consecutive 8-value chunks of a row).
    by_rows: bool,
    /// Stage buffers in workgroup memory (staged feeds): 1 (two barriers per stage, the
    /// products waiting for the stores) or 2 (one barrier, the next stage stored after this
    /// stage's products).
    bufs: u32,
    /// naga's index clamps kept (the runner drops them: `pipeline::kernel_on`).
    checks: bool,
}

impl Tile {
    fn rows(&self) -> u32 {
        16 * self.sgm * self.wgm
    }
    fn tokens(&self) -> u32 {
        16 * self.sgn * self.wgn
    }
    fn threads(&self) -> u32 {
        32 * self.wgm * self.wgn
    }
}

/// The WGSL of `t` for an m x k weight matrix and n tokens (Y is [n][m] f32).
fn kernel(t: Tile, m: u32, k: u32) -> String {
    let (tm, tn, ks) = (t.rows(), t.tokens(), t.ks);
    let sa = ks + t.pad; // workgroup row stride in f16s
    let mut s = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n");
    match t.load {
        Load::Raw | Load::RawLoads => s += "@group(0) @binding(0) var<storage, read> W: array<f16>;\n@group(0) @binding(1) var<storage, read> X: array<f16>;\n",
        Load::F16 | Load::StageOnly | Load::StoreOnly => s += "@group(0) @binding(0) var<storage, read> W: array<vec4<f16>>;\n@group(0) @binding(1) var<storage, read> X: array<vec4<f16>>;\n",
        Load::Q4 => s += "@group(0) @binding(0) var<storage, read> W: array<vec2<u32>>;\n@group(0) @binding(1) var<storage, read> X: array<vec4<f16>>;\n@group(0) @binding(3) var<storage, read> S: array<u32>;\n",
    }
    s += "@group(0) @binding(2) var<storage, read_write> Y: array<f32>;\n";
    let _ = writeln!(s, "var<workgroup> sa: array<f16, {}>;\nvar<workgroup> sb: array<f16, {}>;", t.bufs * tm * sa, t.bufs * tn * sa);
    // Eight f16 (two vec4s) into workgroup memory at `at`. (naga 30 types a
    // `bitcast<vec2<f16>>` of a u32 as f32, so f16 data is read as f16 vectors.)
    // Components written out: a loop indexing the vectors ran as slow as local memory.
    for arr in ["a", "b"] {
        let _ = writeln!(s, "fn put_{arr}(at: u32, w0: vec4<f16>, w1: vec4<f16>) {{ s{arr}[at] = w0.x; s{arr}[at + 1u] = w0.y; s{arr}[at + 2u] = w0.z; s{arr}[at + 3u] = w0.w; s{arr}[at + 4u] = w1.x; s{arr}[at + 5u] = w1.y; s{arr}[at + 6u] = w1.z; s{arr}[at + 7u] = w1.w; }}");
    }
    // Half a Q4_0 block (8 bytes: elements 8h .. 8h + 7 low nibbles, + 16 high) to f16:
    // f32(2^23 + n) from the bits, minus 2^23 + 8, times d (exact in f32), rounded to f16.
    let _ = writeln!(s, "fn put_q4(at: u32, w: vec2<u32>, d: f32) {{
for (var i = 0u; i < 2u; i++) {{
    let v = vec4<u32>(select(w.x, w.y, i == 1u)) >> vec4<u32>(0u, 8u, 16u, 24u);
    let lo = (bitcast<vec4<f32>>((v & vec4<u32>(15u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0)) * d;
    let hi = (bitcast<vec4<f32>>(((v >> vec4<u32>(4u)) & vec4<u32>(15u)) | vec4<u32>(0x4B000000u)) - vec4<f32>(8388616.0)) * d;
    let e = at + 4u * i;
    let l = vec4<f16>(lo);
    let h = vec4<f16>(hi);
    sa[e] = l.x; sa[e + 1u] = l.y; sa[e + 2u] = l.z; sa[e + 3u] = l.w;
    sa[e + 16u] = h.x; sa[e + 17u] = h.y; sa[e + 18u] = h.z; sa[e + 19u] = h.w;
}}
}}");
    let nt = t.threads();
    let _ = writeln!(s, "@compute @workgroup_size({nt})\nfn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {{");
    let _ = writeln!(s, "    let sg = li / 32u;\n    let rs = (sg % {}u) * {}u;\n    let ts = (sg / {}u) * {}u;\n    let r0 = wg.x * {tm}u;\n    let t0 = wg.y * {tn}u;", t.wgm, 16 * t.sgm, t.wgm, 16 * t.sgn);
    for i in 0..t.sgm {
        for j in 0..t.sgn {
            let _ = writeln!(s, "    var c{i}{j} = coop_mat16x16<f32, C>();");
        }
    }
    let products = |s: &mut String, a: &dyn Fn(u32) -> String, b: &dyn Fn(u32) -> String| {
        for i in 0..t.sgm {
            let _ = writeln!(s, "        let a{i} = {};", a(i));
        }
        for j in 0..t.sgn {
            let _ = writeln!(s, "        let b{j} = {};", b(j));
        }
        for i in 0..t.sgm {
            for j in 0..t.sgn {
                let _ = writeln!(s, "        c{i}{j} = coopMultiplyAdd(a{i}, b{j}, c{i}{j});");
            }
        }
    };
    match t.load {
        Load::Raw | Load::RawLoads => {
            s += "    if (li == 0u) { sa[0] = W[0]; sb[0] = X[0]; }\n    workgroupBarrier();\n";
            let _ = writeln!(s, "    for (var k = 0u; k < {k}u; k += {ks}u) {{");
            // RawLoads: an offset of 0 or `pad` values that alternates with the step (stays in the row).
            let o = if t.load == Load::RawLoads { format!("((k / 32u) & 1u) * {}u + ", t.pad) } else { String::new() };
            assert!(t.load == Load::Raw || ks == 32, "RawLoads is written for 32 values per step");
            for kk in (0..ks).step_by(16) {
                s += "        {\n";
                products(&mut s, &|i| format!("coopLoadT<coop_mat16x16<f16, A>>(&sa[(rs + {}u) * {sa}u + {o}{kk}u], {sa}u)", 16 * i), &|j| format!("coopLoad<coop_mat16x16<f16, B>>(&sb[(ts + {}u) * {sa}u + {o}{kk}u], {sa}u)", 16 * j));
                s += "        }\n";
            }
            s += "    }\n";
        }
        Load::F16 | Load::Q4 | Load::StageOnly | Load::StoreOnly => {
            // Staging tasks: A as vec4s of 8 f16 (f16) or half blocks (q4), B as vec4s of 8 f16;
            // thread li takes tasks li, li + nt, ... (the last round guarded where short).
            let (ta, tb) = if t.load.f16_staged() { (tm * ks / 8, tn * ks / 8) } else { (tm * ks / 16, tn * ks / 8) };
            let (na, nb) = (ta.div_ceil(nt), tb.div_ceil(nt));
            let (av, bv) = (ks / 8, ks / 8);
            let (aty, dty) = if t.load.f16_staged() { ("array<vec4<f16>, 2>", "") } else { ("vec2<u32>", "u32") };
            for x in 0..na {
                let _ = writeln!(s, "    var ra{x}: {aty};");
                if !dty.is_empty() {
                    let _ = writeln!(s, "    var rd{x}: {dty};");
                }
            }
            for y in 0..nb {
                let _ = writeln!(s, "    var rb{y}: array<vec4<f16>, 2>;");
            }
            let guard = |count: u32, x: u32| if nt * (x + 1) > count { format!("if (li + {}u < {count}u) ", nt * x) } else { String::new() };
            // Task -> (row, 8-value chunk) of the A and B stages.
            let (rows_a, rows_b) = (tm, tn);
            let split = |task: &str, rows: u32, per_row: u32| -> (String, String) {
                if t.by_rows {
                    (format!("{task} % {rows}u"), format!("{task} / {rows}u"))
                } else {
                    (format!("{task} / {per_row}u"), format!("{task} % {per_row}u"))
                }
            };
            let fetch = |s: &mut String, kexpr: &str| {
                for x in 0..na {
                    let task = format!("(li + {}u)", nt * x);
                    let g = guard(ta, x);
                    match t.load {
                        Load::StoreOnly => {
                            let _ = writeln!(s, "        {g}{{ ra{x}[0] = vec4<f16>(f16({kexpr})); ra{x}[1] = ra{x}[0]; }}");
                        }
                        Load::F16 | Load::StageOnly => {
                            let (row, ch) = split(&task, rows_a, av);
                            let _ = writeln!(s, "        {g}{{ let at = 2u * ((r0 + {row}) * {}u + ({kexpr}) / 8u + {ch}); ra{x}[0] = W[at]; ra{x}[1] = W[at + 1u]; }}", k / 8);
                        }
                        _ => {
                            // task: row = task / (2 * ks / 32), block-half within the stage.
                            let hb = 2 * ks / 32;
                            let _ = writeln!(s, "        {g}{{ ra{x} = W[(r0 + {task} / {hb}u) * {}u + ({kexpr}) / 16u + {task} % {hb}u];", 2 * k / 32);
                            let _ = writeln!(s, "            rd{x} = S[(r0 + {task} / {hb}u) * {}u + ({kexpr}) / 32u + ({task} % {hb}u) / 2u]; }}", k / 32);
                        }
                    }
                }
                for y in 0..nb {
                    let task = format!("(li + {}u)", nt * y);
                    let g = guard(tb, y);
                    if t.load == Load::StoreOnly {
                        let _ = writeln!(s, "        {g}{{ rb{y}[0] = vec4<f16>(f16({kexpr})); rb{y}[1] = rb{y}[0]; }}");
                    } else {
                        let (row, ch) = split(&task, rows_b, bv);
                        let _ = writeln!(s, "        {g}{{ let at = 2u * ((t0 + {row}) * {}u + ({kexpr}) / 8u + {ch}); rb{y}[0] = X[at]; rb{y}[1] = X[at + 1u]; }}", k / 8);
                    }
                }
            };
            // The staged registers into workgroup memory at offsets `ba` (A) and `bb` (B).
            let store = |s: &mut String, ba: &str, bb: &str| {
                for x in 0..na {
                    let task = format!("(li + {}u)", nt * x);
                    match t.load {
                        Load::F16 | Load::StageOnly | Load::StoreOnly => {
                            let (row, ch) = split(&task, rows_a, av);
                            let _ = writeln!(s, "        {}{{ put_a({ba} + ({row}) * {sa}u + ({ch}) * 8u, ra{x}[0], ra{x}[1]); }}", guard(ta, x));
                        }
                        _ => {
                            let hb = 2 * ks / 32;
                            let _ = writeln!(s, "        {}{{ put_q4({ba} + ({task} / {hb}u) * {sa}u + (({task} % {hb}u) / 2u) * 32u + ({task} % 2u) * 8u, ra{x}, unpack2x16float(rd{x}).x); }}", guard(ta, x));
                        }
                    }
                }
                for y in 0..nb {
                    let task = format!("(li + {}u)", nt * y);
                    let (row, ch) = split(&task, rows_b, bv);
                    let _ = writeln!(s, "        {}{{ put_b({bb} + ({row}) * {sa}u + ({ch}) * 8u, rb{y}[0], rb{y}[1]); }}", guard(tb, y));
                }
            };
            // The products of one stage, fragments from offsets `ba` and `bb`.
            let stage_products = |s: &mut String, ba: &str, bb: &str| {
                for kk in (0..ks).step_by(16) {
                    if !t.load.checked() {
                        break;
                    }
                    s.push_str("        {\n");
                    products(s, &|i| format!("coopLoadT<coop_mat16x16<f16, A>>(&sa[{ba} + (rs + {}u) * {sa}u + {kk}u], {sa}u)", 16 * i), &|j| format!("coopLoad<coop_mat16x16<f16, B>>(&sb[{bb} + (ts + {}u) * {sa}u + {kk}u], {sa}u)", 16 * j));
                    s.push_str("        }\n");
                }
            };
            fetch(&mut s, "0u");
            if t.bufs == 1 {
                // barrier, store, barrier, next stage's loads issued, products.
                let _ = writeln!(s, "    for (var k = 0u; k < {k}u; k += {ks}u) {{\n        workgroupBarrier();");
                store(&mut s, "0u", "0u");
                let _ = writeln!(s, "        workgroupBarrier();\n        if (k + {ks}u < {k}u) {{");
                fetch(&mut s, &format!("k + {ks}u"));
                s += "        }\n";
                stage_products(&mut s, "0u", "0u");
            } else {
                // Two stage buffers, one barrier per stage: the next stage's loads issued, this
                // stage's products from buffer (k / ks) % 2, the next stage stored into the
                // other (last read by the previous stage's products, before the barrier).
                store(&mut s, "0u", "0u");
                let _ = writeln!(s, "    workgroupBarrier();\n    for (var k = 0u; k < {k}u; k += {ks}u) {{");
                let _ = writeln!(s, "        let cur = (k / {ks}u) & 1u;\n        let ca = cur * {}u;\n        let cb = cur * {}u;\n        let na = {}u - ca;\n        let nb = {}u - cb;", tm * sa, tn * sa, tm * sa, tn * sa);
                let _ = writeln!(s, "        let more = k + {ks}u < {k}u;\n        if (more) {{");
                fetch(&mut s, &format!("k + {ks}u"));
                s += "        }\n";
                stage_products(&mut s, "ca", "cb");
                s += "        if (more) {\n";
                store(&mut s, "na", "nb");
                s += "        }\n        workgroupBarrier();\n";
            }
            s += "    }\n";
            if matches!(t.load, Load::StageOnly | Load::StoreOnly) {
                // Keep the staged values (and the bindings) live.
                let _ = writeln!(s, "    Y[((wg.y * {}u) + wg.x) * {nt}u + li] = f32(sa[li]) + f32(sb[li]) + f32(W[0].x) + f32(X[0].x);\n}}", m / tm);
                return s;
            }
        }
    }
    for i in 0..t.sgm {
        for j in 0..t.sgn {
            let _ = writeln!(s, "    coopStore(c{i}{j}, &Y[(t0 + ts + {}u) * {m}u + r0 + rs + {}u], {m}u);", 16 * j, 16 * i);
        }
    }
    s += "}\n";
    s
}

fn rng(seed: &mut u64, lo: i32, hi: i32) -> i32 {
    *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    lo + ((*seed >> 33) % (hi - lo + 1) as u64) as i32
}

/// Q4_0 blocks of nibbles `n` (0..=15, row-major [m][k]): 16 bytes per block (byte j: element j
/// low, j + 16 high) and the scale 1.0 as f16 bits, one u32 per block.
fn q4_bytes(n: &[i32]) -> (Vec<u8>, Vec<u8>) {
    let mut q = Vec::with_capacity(n.len() / 2);
    for b in n.chunks(32) {
        for j in 0..16 {
            q.push((b[j] | (b[j + 16] << 4)) as u8);
        }
    }
    let blocks = n.len() / 32;
    let s = (0..blocks).flat_map(|_| u32::from(half::f16::ONE.to_bits()).to_le_bytes()).collect();
    (q, s)
}

/// The 1.1B's prefill matmuls at 512 tokens, per layer: (name, rows, columns).
const SHAPES: [(&str, u32, u32); 4] = [("gate|up", 11264, 2048), ("down", 2048, 5632), ("q|k|v", 2560, 2048), ("o", 2048, 2048)];
const TOKENS: u32 = 512;
const LAYERS: f64 = 22.0;
/// Timing rounds per shape, the tiles interleaved.
const ROUNDS: usize = 5;

#[test]
#[ignore]
fn coop_tile_full_k_speed_at_the_1_1b_shapes() {
    let (device, queue, name) = match coop_device() {
        Ok(d) => d,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    if !device.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
        return eprintln!("skipped: no timestamps");
    }
    println!("{name}");
    let plain = |load, wgm, wgn, sgm, sgn, ks| Tile { load, wgm, wgn, sgm, sgn, ks, pad: 8, by_rows: false, bufs: 1, checks: false };
    let two = |t: Tile| Tile { bufs: 2, ..t };
    // The previous calls' tiles were compiled with naga's index clamps (`checks`); the runner's
    // kernels are not. (Earlier findings, docs/perf.md: `Direct` loads are slower than staged
    // ones; rows of an odd number of words and stores by rows do not pay; 64-value stages only
    // help `o`.)
    let tiles: Vec<Tile> = vec![
        plain(Load::Raw, 4, 2, 2, 2, 32),
        plain(Load::RawLoads, 4, 2, 2, 2, 32),
        plain(Load::StoreOnly, 4, 2, 2, 2, 32),
        Tile { checks: true, ..plain(Load::Q4, 4, 2, 2, 2, 32) },
        plain(Load::StageOnly, 4, 2, 2, 2, 32),
        plain(Load::Q4, 4, 2, 2, 2, 32),
        two(plain(Load::Q4, 4, 2, 2, 2, 32)),
        plain(Load::Q4, 4, 2, 2, 2, 64),
        plain(Load::Q4, 2, 2, 4, 2, 32),
        two(plain(Load::Q4, 2, 2, 4, 2, 32)),
        plain(Load::Q4, 2, 2, 4, 4, 32),
        two(plain(Load::Q4, 2, 2, 4, 4, 32)),
        plain(Load::F16, 2, 2, 4, 4, 32),
        two(plain(Load::F16, 2, 2, 4, 4, 32)),
        plain(Load::F16, 4, 2, 2, 2, 64),
    ];
    // FORGE_PROBE_SHAPES: only the shapes whose names contain it (a short warm-up pass).
    let only = std::env::var("FORGE_PROBE_SHAPES").unwrap_or_default();
    let mut best_total = std::collections::BTreeMap::<&str, f64>::new();
    for (shape, m, k) in SHAPES {
        if !shape.contains(only.as_str()) {
            continue;
        }
        let mut seed = 7u64 + u64::from(m) * 31 + u64::from(k);
        // Weights as nibbles 0..=15 (q4: value n - 8 at d = 1) or as the values n - 8 (f16).
        let nib: Vec<i32> = (0..(m * k) as usize).map(|_| rng(&mut seed, 0, 15)).collect();
        let xs: Vec<i32> = (0..(TOKENS * k) as usize).map(|_| rng(&mut seed, -8, 8)).collect();
        let wf16 = storage(&device, &queue, &f16s(&nib.iter().map(|n| n - 8).collect::<Vec<_>>()), false);
        let (q, sc) = q4_bytes(&nib);
        let (wq4, sq4) = (storage(&device, &queue, &q, false), storage(&device, &queue, &sc, false));
        let x = storage(&device, &queue, &f16s(&xs), false);
        let y = storage(&device, &queue, &vec![0u8; (m * TOKENS * 4) as usize], true);
        // Compile and check every tile, then time them interleaved, round by round (the GPU's
        // clocks drift within a call: a tile timed alone read up to 3x slow late in a pass).
        let mut runs = Vec::new();
        for &t in &tiles {
            if m % t.rows() != 0 || TOKENS % t.tokens() != 0 || k % t.ks != 0 {
                continue;
            }
            let p = pipeline(&device, &kernel(t, m, k), t.checks);
            let bg = match t.load {
                Load::Q4 => bind(&device, &p, &[&wq4, &x, &y, &sq4]),
                _ => bind(&device, &p, &[&wf16, &x, &y]),
            };
            let groups = [m / t.rows(), TOKENS / t.tokens(), 1];
            // Clear Y, run once, check sampled outputs exactly (integers, |sum| < 2^24).
            queue.write_buffer(&y, 0, &vec![0u8; (m * TOKENS * 4) as usize]);
            time_passes(&device, &queue, &p, &bg, groups, 1, 1);
            let got = read_f32(&device, &queue, &y);
            for _ in 0..if t.load.checked() { 2000 } else { 0 } {
                let (r, tok) = (rng(&mut seed, 0, m as i32 - 1) as usize, rng(&mut seed, 0, TOKENS as i32 - 1) as usize);
                let want: i32 = (0..k as usize).map(|c| (nib[r * k as usize + c] - 8) * xs[tok * k as usize + c]).sum();
                assert_eq!(got[tok * m as usize + r], want as f32, "{shape} {t:?}: row {r}, token {tok}");
            }
            runs.push((t, p, bg, groups, Vec::new()));
        }
        // Rounds: each tile warmed by 10 untimed dispatches, then 3 timed passes of 10.
        for _ in 0..ROUNDS {
            for (_, p, bg, groups, sec) in &mut runs {
                time_passes(&device, &queue, p, bg, *groups, 10, 1);
                sec.extend(time_passes(&device, &queue, p, bg, *groups, 10, 3));
            }
        }
        let mut best = f64::MAX;
        for (t, _, _, _, sec) in &mut runs {
            sec.sort_by(f64::total_cmp);
            let med = sec[sec.len() / 2];
            let ops = 2.0 * f64::from(m) * f64::from(k) * f64::from(TOKENS);
            println!("{shape:8} {m:5} x {k:4} x {TOKENS}  {:9?} {}x{} ({}x{} subgroups) ks {:2} pad {} {} bufs {} {}: median {:.3} ms (min {:.3}, max {:.3}) {:6.1} tera-ops/s, x22 layers {:.2} ms", t.load, t.rows(), t.tokens(), t.wgm, t.wgn, t.ks, t.pad, if t.by_rows { "by rows" } else { "by chunks" }, t.bufs, if t.checks { "clamped" } else { "unclamped" }, med * 1e3, sec[0] * 1e3, sec[sec.len() - 1] * 1e3, ops / med / 1e12, med * LAYERS * 1e3);
            if t.load.checked() {
                best = best.min(med);
            }
        }
        best_total.insert(shape, best * LAYERS * 1e3);
    }
    let total: f64 = best_total.values().sum();
    println!("best tile per shape (any feed but Raw), x22 layers: {best_total:?}, total {total:.2} ms (today's dot4I8Packed tiles: 25.7 ms; 0.8x llama.cpp needs the whole step <= 14.7 ms)");
}

/// One subgroup's chain of dependent 16 x 16 x 16 products: `loads` fragments loaded from
/// workgroup memory every step (else kept in registers), `chains` independent accumulators
/// taking turns (1: one chain, as an output's K steps are). 132 workgroups of one subgroup (one
/// per SM of an H200). What bounds a one-token step on tensor cores (docs/perf.md).
fn chain_kernel(steps: u32, loads: bool, chains: u32) -> String {
    let mut s = String::from("enable f16;\nenable wgpu_cooperative_matrix;\n@group(0) @binding(0) var<storage, read> W: array<f16>;\n@group(0) @binding(1) var<storage, read> X: array<f16>;\n@group(0) @binding(2) var<storage, read_write> Y: array<f32>;\nvar<workgroup> sa: array<f16, 1280>;\nvar<workgroup> sb: array<f16, 1280>;\n");
    s += "@compute @workgroup_size(32)\nfn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wg: vec3<u32>) {\n";
    s += "    for (var i = li; i < 1280u; i += 32u) { sa[i] = W[i % 64u]; sb[i] = X[i % 64u]; }\n    workgroupBarrier();\n";
    for c in 0..chains {
        let _ = writeln!(s, "    var c{c} = coop_mat16x16<f32, C>();");
    }
    s += "    var a = coopLoadT<coop_mat16x16<f16, A>>(&sa[0], 40u);\n    var b = coopLoad<coop_mat16x16<f16, B>>(&sb[0], 40u);\n";
    let _ = writeln!(s, "    for (var i = 0u; i < {}u; i++) {{", steps / chains);
    for c in 0..chains {
        if loads {
            let _ = writeln!(s, "        a = coopLoadT<coop_mat16x16<f16, A>>(&sa[((i + {c}u) % 2u) * 16u], 40u);\n        b = coopLoad<coop_mat16x16<f16, B>>(&sb[((i + {c}u) % 2u) * 16u], 40u);");
        }
        let _ = writeln!(s, "        c{c} = coopMultiplyAdd(a, b, c{c});");
    }
    s += "    }\n";
    for c in 1..chains {
        let _ = writeln!(s, "    c0 = c0 + c{c};");
    }
    s += "    coopStore(c0, &Y[wg.x * 256u], 16u);\n}\n";
    s
}

#[test]
#[ignore]
fn coop_chain_latency() {
    let (device, queue, name) = match coop_device() {
        Ok(d) => d,
        Err(e) => return eprintln!("skipped: {e}"),
    };
    println!("{name}");
    let w = storage(&device, &queue, &f16s(&(0..64).map(|i| i % 3 - 1).collect::<Vec<_>>()), false);
    let y = storage(&device, &queue, &vec![0u8; 132 * 256 * 4], true);
    const STEPS: u32 = 4096;
    for (loads, chains) in [(false, 1), (true, 1), (false, 4), (true, 4), (true, 8)] {
        let p = pipeline(&device, &chain_kernel(STEPS, loads, chains), false);
        let bg = bind(&device, &p, &[&w, &w, &y]);
        time_passes(&device, &queue, &p, &bg, [132, 1, 1], 20, 1);
        let mut sec = time_passes(&device, &queue, &p, &bg, [132, 1, 1], 5, 7);
        sec.sort_by(f64::total_cmp);
        let med = sec[sec.len() / 2];
        println!("loads {loads:5} chains {chains}: {STEPS} products in {:.1} us, {:.1} ns per product", med * 1e6, med * 1e9 / f64::from(STEPS));
    }
}
