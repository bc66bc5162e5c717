//! `forge-cache hardware [--json]`: what `backend::hardware::detect` sees on this machine, as a
//! short aligned table or as one JSON object, plus the wgpu adapter the GPU tier would use, the
//! HIP device (or why none is used) and the layer split `--backend split` would choose for the
//! model (`--model`, default SmolLM2).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use forge_cache::backend::cpu::CpuBackend;
use forge_cache::backend::hardware::{self, GpuInfo, GpuKind, HardwareInfo};
use forge_cache::backend::wgpu::{WgpuContext, WgpuOptions};
use forge_cache::engine::placement::{place, BackendChoice, PlacementOptions};
use forge_cache::engine::Model;

#[derive(Debug, Args)]
pub struct HardwareArgs {
    /// Print the detected hardware as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Accept a software GPU adapter (lavapipe / llvmpipe) for the wgpu tier.
    #[arg(long)]
    pub igpu_allow_software: bool,
    /// The model whose automatic layer split is shown (default: SmolLM2 when present).
    #[arg(long)]
    pub model: Option<PathBuf>,
}

pub fn run(args: &HardwareArgs) -> anyhow::Result<()> {
    let info = hardware::detect();
    let opts = WgpuOptions { allow_software: args.igpu_allow_software, ..WgpuOptions::from_env()? };
    let wgpu = match WgpuContext::new(opts) {
        Ok(c) => {
            let a = c.adapter();
            format!("{} ({}, {}, {})", a.name, a.device_type, a.backend, a.driver)
        }
        Err(e) => format!("none: {e}"),
    };
    let dgpu = forge_cache::backend::hip::status();
    let path = forge_cache::models::resolve_llm(args.model.as_deref()).map_err(anyhow::Error::msg)?;
    let split = if path.is_file() {
        let mut model = Model::load(&path, Arc::new(CpuBackend::new(0)?))?;
        let o = PlacementOptions { backend: BackendChoice::Split, split: None, allow_software: args.igpu_allow_software };
        let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
        match place(&mut model, &o) {
            Ok(p) => format!("{name}: {p}"),
            Err(e) => format!("{name}: {e}"),
        }
    } else {
        format!("no model at {}", path.display())
    };
    if args.json {
        let mut v = serde_json::to_value(&info)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("wgpu_adapter".into(), wgpu.into());
            o.insert("hip_device".into(), dgpu.into());
            o.insert("split".into(), split.into());
        }
        println!("{}", serde_json::to_string(&v)?);
    } else {
        print!("{}", render(&info));
        println!("wgpu    {wgpu}");
        println!("dgpu    {dgpu}");
        println!("split   {split}");
    }
    Ok(())
}

/// The human-readable table.
fn render(info: &HardwareInfo) -> String {
    let mut rows: Vec<(&str, String)> = Vec::new();
    let model = info.cpu_model.as_deref().unwrap_or("unknown model");
    rows.push(("cpu", format!("{model} ({})", info.arch)));
    rows.push(("cores", format!("{} physical, {} logical", info.physical_cores, info.logical_cpus)));
    let features = if info.simd_features.is_empty() { "none detected".to_string() } else { info.simd_features.join(" ") };
    rows.push(("simd", format!("{} kernels ({features})", info.simd_level.name())));
    rows.push(("amx", info.amx.clone()));
    let memory = match (info.memory_total_bytes, info.memory_available_bytes) {
        (Some(t), Some(a)) => format!("{} total, {} available", gib(t), gib(a)),
        (Some(t), None) => format!("{} total", gib(t)),
        _ => "unknown".to_string(),
    };
    rows.push(("memory", memory));
    if info.gpus.is_empty() {
        rows.push(("gpus", "none".to_string()));
    }
    for (i, g) in info.gpus.iter().enumerate() {
        rows.push((if i == 0 { "gpus" } else { "" }, gpu_line(g)));
    }
    rows.push(("rocm", if info.rocm_kfd { "/dev/kfd present" } else { "no /dev/kfd" }.to_string()));
    rows.push(("tier", info.tier.to_string()));

    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 2;
    rows.iter().map(|(k, v)| format!("{k:<width$}{v}\n")).collect()
}

fn gpu_line(g: &GpuInfo) -> String {
    let kind = match g.kind {
        GpuKind::Integrated => "integrated",
        GpuKind::Discrete => "discrete",
        GpuKind::Unknown => "unknown kind",
        GpuKind::DisplayOnly => "display only",
    };
    let mut s = g.vendor.to_string();
    if let (Some(v), Some(d)) = (g.vendor_id, g.device_id) {
        s.push_str(&format!(" {v:04x}:{d:04x}"));
    }
    s.push_str(&format!(" {kind} at {}", g.address));
    if let Some(vram) = g.vram_total_bytes {
        s.push_str(&format!(", {} VRAM", gib(vram)));
    }
    if let Some(card) = &g.drm_card {
        s.push_str(&format!(", {card}"));
    }
    if let Some(driver) = &g.driver {
        s.push_str(&format!(", driver {driver}"));
    }
    s
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use forge_cache::backend::cpu::SimdLevel;
    use forge_cache::backend::hardware::Tier;

    fn sample(gpus: Vec<GpuInfo>) -> HardwareInfo {
        HardwareInfo {
            arch: "x86_64",
            logical_cpus: 2,
            physical_cores: 2,
            cpu_model: Some("Test CPU".into()),
            simd_features: vec!["avx2", "fma"],
            simd_level: SimdLevel::Avx2,
            amx: "not used: CPU lacks AMX-INT8 (amx_tile false, amx_int8 false)".into(),
            memory_total_bytes: Some(24 << 30),
            memory_available_bytes: Some(20 << 30),
            tier: Tier::from_gpus(&gpus),
            gpus,
            rocm_kfd: false,
        }
    }

    #[test]
    fn table_without_gpus() {
        let text = render(&sample(vec![]));
        assert_eq!(
            text,
            "cpu     Test CPU (x86_64)\n\
             cores   2 physical, 2 logical\n\
             simd    avx2 kernels (avx2 fma)\n\
             amx     not used: CPU lacks AMX-INT8 (amx_tile false, amx_int8 false)\n\
             memory  24.0 GiB total, 20.0 GiB available\n\
             gpus    none\n\
             rocm    no /dev/kfd\n\
             tier    cpu-only\n"
        );
    }

    #[test]
    fn table_with_gpus() {
        let gpu = |address: &str, vendor_id, kind, vram| GpuInfo {
            address: address.into(),
            vendor_id: Some(vendor_id),
            device_id: Some(0x1234),
            vendor: if vendor_id == 0x10de { "NVIDIA" } else { "Intel" },
            class: Some(0x030000),
            kind,
            vram_total_bytes: vram,
            boot_vga: None,
            drm_card: Some("card0".into()),
            driver: None,
        };
        let info = sample(vec![
            gpu("0000:00:02.0", 0x8086, GpuKind::Integrated, None),
            gpu("0000:01:00.0", 0x10de, GpuKind::Discrete, Some(8 << 30)),
        ]);
        let text = render(&info);
        assert!(text.contains("gpus    Intel 8086:1234 integrated at 0000:00:02.0, card0\n"), "{text}");
        assert!(text.contains("\n        NVIDIA 10de:1234 discrete at 0000:01:00.0, 8.0 GiB VRAM, card0\n"), "{text}");
        assert!(text.ends_with("tier    cpu+igpu+dgpu\n"), "{text}");
    }
}
