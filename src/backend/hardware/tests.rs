//! Unit tests of `backend::hardware` (CPU, memory and GPU detection, parsers).

use super::*;
use std::path::PathBuf;

#[test]
fn detect_works_here() {
    let hw = detect();
    assert!(hw.logical_cpus >= 1);
    assert!(hw.physical_cores >= 1 && hw.physical_cores <= hw.logical_cpus);
    assert_eq!(hw.physical_cores, physical_cores());
    assert_eq!(hw.simd_level, SimdLevel::detect());
    if let (Some(t), Some(a)) = (hw.memory_total_bytes, hw.memory_available_bytes) {
        assert!(t > 0 && a <= t);
    }
    assert_eq!(hw.tier, Tier::from_gpus(&hw.gpus));
    #[cfg(target_arch = "x86_64")]
    if matches!(hw.simd_level, SimdLevel::Avx2 | SimdLevel::Avx512Vnni) {
        for f in ["avx2", "fma", "f16c"] {
            assert!(hw.simd_features.contains(&f), "{f} missing from {:?}", hw.simd_features);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if hw.simd_level == SimdLevel::Avx512Vnni {
        for f in ["avx512f", "avx512bw", "avx512vl", "avx512vnni"] {
            assert!(hw.simd_features.contains(&f), "{f} missing from {:?}", hw.simd_features);
        }
    }
    let json = serde_json::to_value(&hw).expect("serializes");
    assert_eq!(json["simd_level"], hw.simd_level.name());
    assert_eq!(json["tier"], serde_json::to_value(hw.tier).expect("tier"));
}

/// The development and CI machines have no GPU; set FORGE_EXPECT_GPU on one that has.
#[test]
fn this_machine_is_cpu_only() {
    if std::env::var_os("FORGE_EXPECT_GPU").is_some() || Path::new("/sys/class/drm/card0").exists() {
        return;
    }
    assert_eq!(detect().tier, Tier::CpuOnly);
}

fn gpu(kind: GpuKind) -> GpuInfo {
    GpuInfo {
        address: "0000:00:02.0".into(),
        vendor_id: None,
        device_id: None,
        vendor: "unknown",
        class: Some(0x030000),
        kind,
        vram_total_bytes: None,
        boot_vga: None,
        drm_card: None,
        driver: None,
    }
}

#[test]
fn tier_from_gpu_lists() {
    use GpuKind::*;
    assert_eq!(Tier::from_gpus(&[]), Tier::CpuOnly);
    assert_eq!(Tier::from_gpus(&[gpu(DisplayOnly)]), Tier::CpuOnly);
    assert_eq!(Tier::from_gpus(&[gpu(Integrated)]), Tier::CpuWithIgpu);
    assert_eq!(Tier::from_gpus(&[gpu(Discrete), gpu(Discrete)]), Tier::CpuWithDgpu);
    assert_eq!(Tier::from_gpus(&[gpu(Unknown)]), Tier::CpuWithDgpu);
    assert_eq!(Tier::from_gpus(&[gpu(DisplayOnly), gpu(Discrete)]), Tier::CpuWithDgpu);
    assert_eq!(Tier::from_gpus(&[gpu(Discrete), gpu(Integrated)]), Tier::CpuWithIgpuAndDgpu);
    assert_eq!(Tier::CpuWithIgpuAndDgpu.to_string(), "cpu+igpu+dgpu");
    assert_eq!(serde_json::to_string(&Tier::CpuWithIgpu).expect("json"), "\"cpu_with_igpu\"");
}

#[test]
fn classification_heuristics() {
    use GpuKind::*;
    const GIB: u64 = 1 << 30;
    assert_eq!(classify_gpu(Some(VENDOR_INTEL), Some(0x9a49), Some(true), None), Integrated);
    assert_eq!(classify_gpu(Some(VENDOR_INTEL), Some(0x56a0), Some(false), None), Discrete); // Arc A770
    assert_eq!(classify_gpu(Some(VENDOR_NVIDIA), Some(0x2330), None, None), Discrete);
    assert_eq!(classify_gpu(Some(VENDOR_AMD), Some(0x1681), Some(true), Some(512 << 20)), Integrated);
    assert_eq!(classify_gpu(Some(VENDOR_AMD), Some(0x1681), Some(false), Some(GIB)), Integrated);
    assert_eq!(classify_gpu(Some(VENDOR_AMD), Some(0x744c), Some(true), Some(24 * GIB)), Discrete);
    assert_eq!(classify_gpu(Some(VENDOR_AMD), Some(0x744c), Some(false), Some(8 * GIB)), Discrete);
    assert_eq!(classify_gpu(Some(VENDOR_AMD), None, Some(true), None), Integrated);
    assert_eq!(classify_gpu(Some(VENDOR_AMD), None, None, None), Discrete);
    assert_eq!(classify_gpu(Some(0x1a03), Some(0x2000), Some(true), None), DisplayOnly); // ASPEED BMC
    assert_eq!(classify_gpu(Some(0x5143), None, None, None), Unknown);
    assert_eq!(classify_gpu(None, None, None, None), Unknown);
}

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    fs::write(path, text).expect("write");
}

fn pci_dev(sys: &Path, addr: &str, class: &str, vendor: &str, device: &str) -> PathBuf {
    let d = sys.join("bus/pci/devices").join(addr);
    write(&d.join("class"), class);
    write(&d.join("vendor"), vendor);
    write(&d.join("device"), device);
    d
}

fn drm_card(sys: &Path, card: &str, target: &Path) {
    let c = sys.join("class/drm").join(card);
    fs::create_dir_all(&c).expect("mkdir");
    std::os::unix::fs::symlink(target, c.join("device")).expect("symlink");
}

#[test]
fn scan_synthetic_sysfs() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let sys = tmp.path();
    // not display controllers
    pci_dev(sys, "0000:00:00.0", "0x060000\n", "0x8086\n", "0x0d57\n");
    pci_dev(sys, "0000:00:03.0", "0x020000\n", "0x1af4\n", "0x1041\n");
    // Intel iGPU, AMD dGPU with 16 GiB, AMD APU, NVIDIA 3D controller, ASPEED BMC
    let intel = pci_dev(sys, "0000:00:02.0", "0x030000\n", "0x8086\n", "0x9a49\n");
    write(&intel.join("boot_vga"), "1\n");
    let amd = pci_dev(sys, "0000:03:00.0", "0x030000\n", "0x1002\n", "0x73bf\n");
    write(&amd.join("boot_vga"), "0\n");
    write(&amd.join("mem_info_vram_total"), "17163091968\n");
    let apu = pci_dev(sys, "0000:05:00.0", "0x030000\n", "0x1002\n", "0x1681\n");
    write(&apu.join("mem_info_vram_total"), "536870912\n");
    pci_dev(sys, "0000:41:00.0", "0x030200\n", "0x10de\n", "0x2330\n");
    pci_dev(sys, "0000:02:00.0", "0x030000\n", "0x1a03\n", "0x2000\n");
    drm_card(sys, "card1", &amd);
    drm_card(sys, "card0", &intel);
    fs::create_dir_all(sys.join("class/drm/card0-HDMI-A-1")).expect("mkdir");
    // a SoC GPU and a firmware framebuffer, both outside PCI
    let soc = sys.join("devices/platform/fde60000.gpu");
    fs::create_dir_all(&soc).expect("mkdir");
    drm_card(sys, "card2", &soc);
    let fb = sys.join("devices/platform/simple-framebuffer.0");
    fs::create_dir_all(&fb).expect("mkdir");
    std::os::unix::fs::symlink(sys.join("bus/platform/drivers/simple-framebuffer"), fb.join("driver")).expect("symlink");
    drm_card(sys, "card3", &fb);

    let gpus = scan_gpus(sys);
    let summary: Vec<_> = gpus.iter().map(|g| (g.address.as_str(), g.kind, g.drm_card.as_deref())).collect();
    assert_eq!(
        summary,
        vec![
            ("0000:00:02.0", GpuKind::Integrated, Some("card0")),
            ("0000:02:00.0", GpuKind::DisplayOnly, None),
            ("0000:03:00.0", GpuKind::Discrete, Some("card1")),
            ("0000:05:00.0", GpuKind::Integrated, None),
            ("0000:41:00.0", GpuKind::Discrete, None),
            ("fde60000.gpu", GpuKind::Integrated, Some("card2")),
        ]
    );
    let amd = &gpus[2];
    assert_eq!((amd.vendor, amd.vendor_id, amd.device_id), ("AMD", Some(0x1002), Some(0x73bf)));
    assert_eq!((amd.vram_total_bytes, amd.boot_vga), (Some(17_163_091_968), Some(false)));
    assert_eq!(gpus[1].vendor, "ASPEED");
    assert_eq!(Tier::from_gpus(&gpus), Tier::CpuWithIgpuAndDgpu);

    // garbage and missing roots are not errors
    assert!(scan_gpus(&sys.join("nonexistent")).is_empty());
    write(&sys.join("bus/pci/devices/0000:09:00.0/class"), "not hex");
    assert_eq!(scan_gpus(sys).len(), gpus.len());
}

#[test]
fn cpuinfo_parsing() {
    let text = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.30GHz\n\
                physical id\t: 0\ncore id\t\t: 0\n\n\
                processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor @ 2.30GHz\nphysical id\t: 0\ncore id\t\t: 0\n\n\
                processor\t: 2\nphysical id\t: 0\ncore id\t\t: 1\n\n\
                processor\t: 3\nphysical id\t: 1\ncore id\t\t: 0\n";
    let info = parse_cpuinfo(text);
    assert_eq!(info.model_name.as_deref(), Some("Intel(R) Xeon(R) Processor @ 2.30GHz"));
    assert_eq!(info.cpus.len(), 4);
    assert_eq!(info.cpus[3], CpuEntry { processor: Some(3), physical_id: Some(1), core_id: Some(0) });
    // (0,0) twice (hyper-threads), (0,1), (1,0)
    assert_eq!(info.physical_cores(None), Some(3));
    let mask = parse_cpu_list("0-1").expect("list");
    assert_eq!(info.physical_cores(Some(&mask)), Some(1));

    // ARM: no core ids, model from "Model"/"Hardware"
    let arm = "processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd asimddp\n\nprocessor\t: 1\n\nModel\t\t: Raspberry Pi 5 Model B Rev 1.0\n";
    let info = parse_cpuinfo(arm);
    assert_eq!(info.model_name.as_deref(), Some("Raspberry Pi 5 Model B Rev 1.0"));
    assert_eq!(info.physical_cores(None), None);
    assert_eq!(parse_cpuinfo(""), CpuInfoText::default());
}

#[test]
fn cpu_lists() {
    let set = |v: &[usize]| v.iter().copied().collect::<BTreeSet<_>>();
    assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Some(set(&[0, 1, 2, 3, 8, 10, 11])));
    assert_eq!(parse_cpu_list("5"), Some(set(&[5])));
    assert_eq!(parse_cpu_list("3-1"), None);
    assert_eq!(parse_cpu_list("x"), None);
    assert_eq!(parse_cpu_list("0-99999999999"), None);
    let status = "Name:\tcat\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\nMems_allowed_list:\t0\n";
    assert_eq!(parse_cpus_allowed(status), Some(set(&[0, 1])));
    assert_eq!(parse_cpus_allowed("Name:\tcat\n"), None);
}

#[test]
fn sysfs_topology() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = tmp.path();
    // 2 cores x 2 threads on package 0, cpu4 offline (no topology), cpufreq ignored
    for (cpu, core) in [(0, 0), (1, 1), (2, 0), (3, 1)] {
        write(&root.join(format!("cpu{cpu}/topology/core_id")), &format!("{core}\n"));
        write(&root.join(format!("cpu{cpu}/topology/physical_package_id")), "0\n");
    }
    fs::create_dir_all(root.join("cpu4")).expect("mkdir");
    fs::create_dir_all(root.join("cpufreq")).expect("mkdir");
    assert_eq!(cores_from_sysfs(root, None), Some(2));
    assert_eq!(cores_from_sysfs(root, Some(&parse_cpu_list("0,2").expect("list"))), Some(1));
    assert_eq!(cores_from_sysfs(&root.join("missing"), None), None);
}

#[test]
fn meminfo_parsing() {
    let text = "MemTotal:       24684096 kB\nMemFree:        23273556 kB\nMemAvailable:   24215684 kB\nHugePages_Total:       0\n";
    let m = parse_meminfo(text);
    assert_eq!(m.total_bytes, Some(24_684_096 * 1024));
    assert_eq!(m.available_bytes, Some(24_215_684 * 1024));
    // old kernels have no MemAvailable; garbage gives None, not a panic
    let m = parse_meminfo("MemTotal: 1000 kB\n");
    assert_eq!((m.total_bytes, m.available_bytes), (Some(1_024_000), None));
    assert_eq!(parse_meminfo("MemTotal: lots kB\nMemAvailable: 99999999999999999999 kB\n"), MemInfo::default());
    assert_eq!(parse_hex("0x030200\n"), Some(0x030200));
    assert_eq!(parse_hex("zz"), None);
}
