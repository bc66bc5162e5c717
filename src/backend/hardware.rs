//! Hardware detection: CPU cores and SIMD features, memory, GPUs, and the execution [`Tier`] they
//! imply.
//!
//! Everything is read from Linux pseudo-files (`/proc/cpuinfo`, `/proc/meminfo`,
//! `/proc/self/status`, `/sys/devices/system/cpu`, `/sys/bus/pci/devices`, `/sys/class/drm`) and
//! from CPUID. Every read is optional: a missing or odd file leaves a field `None` or empty, so
//! [`detect`] never fails and never panics (on a non-Linux system it reports the CPU only). The
//! parsing is done by pure functions over text or over a sysfs root, tested on synthetic inputs.
//!
//! GPU classification is a heuristic from PCI ids (see [`classify_gpu`]); it decides which tiers
//! of backends are worth trying, not whether one will actually run.

use std::collections::BTreeSet;
use std::fmt;
use std::fs;
use std::path::Path;

use serde::{Serialize, Serializer};

use super::simd::SimdLevel;

/// PCI vendor ids.
pub const VENDOR_INTEL: u16 = 0x8086;
pub const VENDOR_AMD: u16 = 0x1002;
pub const VENDOR_NVIDIA: u16 = 0x10de;

/// AMD GPUs with less dedicated VRAM than this are taken for APUs (integrated).
pub const AMD_IGPU_VRAM_LIMIT: u64 = 2 << 30;

/// Vendors whose display controllers only drive a screen (server BMCs, virtual machines): reported,
/// never counted as a compute GPU.
const DISPLAY_ONLY_VENDORS: &[(u16, &str)] = &[
    (0x1a03, "ASPEED"),
    (0x102b, "Matrox"),
    (0x1234, "QEMU/Bochs"),
    (0x15ad, "VMware"),
    (0x1af4, "virtio"),
    (0x1013, "Cirrus Logic"),
    (0x1414, "Microsoft Hyper-V"),
    (0x80ee, "VirtualBox"),
];

/// DRM drivers of non-PCI cards that are plain framebuffers, not GPUs.
const FRAMEBUFFER_DRIVERS: &[&str] = &["simple-framebuffer", "simpledrm", "efi-framebuffer", "vkms", "ofdrm", "vesa-framebuffer"];

/// What a display controller is, as far as scheduling work on it goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuKind {
    /// Shares memory with the CPU (Intel iGPU, AMD APU, SoC GPU).
    Integrated,
    /// Has its own memory (NVIDIA, AMD Radeon/Instinct, Intel Arc).
    Discrete,
    /// A vendor this module does not know; counted as discrete.
    Unknown,
    /// Display only (BMC or virtual adapter); not counted.
    DisplayOnly,
}

/// One GPU (display controller) found in sysfs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuInfo {
    /// PCI address (`0000:01:00.0`), or the sysfs device name of a non-PCI (SoC) GPU.
    pub address: String,
    /// PCI vendor id (sysfs `vendor`), when readable.
    pub vendor_id: Option<u16>,
    /// PCI device id (sysfs `device`), when readable.
    pub device_id: Option<u16>,
    /// Vendor name for display ("Intel", "AMD", "NVIDIA", ...; "unknown").
    pub vendor: &'static str,
    /// PCI class code (`0x03xxxx` for display controllers).
    pub class: Option<u32>,
    /// Integrated, discrete, unknown or display only.
    pub kind: GpuKind,
    /// Dedicated VRAM as amdgpu reports it (`mem_info_vram_total`); None elsewhere.
    pub vram_total_bytes: Option<u64>,
    /// Whether the firmware used this device as the boot display (`boot_vga`).
    pub boot_vga: Option<bool>,
    /// DRM card name (`card0`) when a DRM driver is bound.
    pub drm_card: Option<String>,
    /// Kernel driver bound to the device (`amdgpu`, `i915`, `nvidia`, ...).
    pub driver: Option<String>,
}

/// Execution tier: which kinds of processors the backends can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Tier {
    CpuOnly,
    CpuWithIgpu,
    CpuWithDgpu,
    CpuWithIgpuAndDgpu,
}

impl Tier {
    /// The tier of a machine with these GPUs (display-only adapters do not count; unknown ones
    /// count as discrete).
    pub fn from_kinds(kinds: impl IntoIterator<Item = GpuKind>) -> Tier {
        let (mut igpu, mut dgpu) = (false, false);
        for k in kinds {
            match k {
                GpuKind::Integrated => igpu = true,
                GpuKind::Discrete | GpuKind::Unknown => dgpu = true,
                GpuKind::DisplayOnly => {}
            }
        }
        match (igpu, dgpu) {
            (false, false) => Tier::CpuOnly,
            (true, false) => Tier::CpuWithIgpu,
            (false, true) => Tier::CpuWithDgpu,
            (true, true) => Tier::CpuWithIgpuAndDgpu,
        }
    }

    pub fn from_gpus(gpus: &[GpuInfo]) -> Tier {
        Tier::from_kinds(gpus.iter().map(|g| g.kind))
    }

    pub fn name(self) -> &'static str {
        match self {
            Tier::CpuOnly => "cpu-only",
            Tier::CpuWithIgpu => "cpu+igpu",
            Tier::CpuWithDgpu => "cpu+dgpu",
            Tier::CpuWithIgpuAndDgpu => "cpu+igpu+dgpu",
        }
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything [`detect`] found.
#[derive(Debug, Clone, Serialize)]
pub struct HardwareInfo {
    /// Target architecture of this build (`x86_64`, `aarch64`, ...).
    pub arch: &'static str,
    /// CPUs this process may run on (affinity and cgroup quota applied).
    pub logical_cpus: usize,
    /// Physical cores among them (see [`physical_cores`]).
    pub physical_cores: usize,
    /// CPU model name from `/proc/cpuinfo` (see [`CpuInfoText::model_name`]).
    pub cpu_model: Option<String>,
    /// SIMD features detected at run time, e.g. `["sse4.2", "avx", "avx2", "fma", "f16c"]`.
    pub simd_features: Vec<&'static str>,
    /// The level the CPU kernels will use.
    #[serde(serialize_with = "serialize_simd")]
    pub simd_level: SimdLevel,
    /// Whether prefill uses AMX-INT8 tiles: `used: ...` or `not used: <why>` (`simd::amx_status`).
    pub amx: String,
    /// `MemTotal` of `/proc/meminfo`, bytes.
    pub memory_total_bytes: Option<u64>,
    /// `MemAvailable` of `/proc/meminfo`, bytes.
    pub memory_available_bytes: Option<u64>,
    /// GPUs found in sysfs.
    pub gpus: Vec<GpuInfo>,
    /// `/dev/kfd` exists (the ROCm kernel driver is loaded).
    pub rocm_kfd: bool,
    /// Execution tier derived from `gpus`.
    pub tier: Tier,
}

fn serialize_simd<S: Serializer>(level: &SimdLevel, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(level.name())
}

/// Detects the machine. Never fails or panics; what cannot be read is left out.
pub fn detect() -> HardwareInfo {
    let cpuinfo = read_text(Path::new("/proc/cpuinfo"));
    let cpu_model = cpuinfo.as_deref().and_then(|t| parse_cpuinfo(t).model_name);
    let mem = read_text(Path::new("/proc/meminfo")).map(|t| parse_meminfo(&t)).unwrap_or_default();
    let gpus = scan_gpus(Path::new("/sys"));
    let tier = Tier::from_gpus(&gpus);
    HardwareInfo {
        arch: std::env::consts::ARCH,
        logical_cpus: logical_cpus(),
        physical_cores: physical_cores(),
        cpu_model,
        simd_features: simd_features(),
        simd_level: SimdLevel::detect(),
        amx: match super::simd::amx_status() {
            Ok(what) => format!("used: {what}"),
            Err(why) => format!("not used: {why}"),
        },
        memory_total_bytes: mem.total_bytes,
        memory_available_bytes: mem.available_bytes,
        gpus,
        rocm_kfd: Path::new("/dev/kfd").exists(),
        tier,
    }
}

// ---------------------------------------------------------------------------------------------
// CPU

/// CPUs this process may use: `available_parallelism` (affinity mask and cgroup quota), at least 1.
pub fn logical_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// Physical cores this process may use: distinct (package, die, core) among the CPUs in its
/// affinity mask, from sysfs topology, else from `/proc/cpuinfo`, else the logical CPU count.
/// Capped by [`logical_cpus`] (a cgroup quota of 2 CPUs on a 64-core host gives 2). Never 0,
/// never fails.
pub fn physical_cores() -> usize {
    let logical = logical_cpus();
    let allowed = read_text(Path::new("/proc/self/status")).and_then(|t| parse_cpus_allowed(&t));
    let allowed = allowed.as_ref();
    let physical = cores_from_sysfs(Path::new("/sys/devices/system/cpu"), allowed)
        .or_else(|| {
            let text = read_text(Path::new("/proc/cpuinfo"))?;
            parse_cpuinfo(&text).physical_cores(allowed)
        })
        .unwrap_or(logical);
    physical.min(logical).max(1)
}

/// One `processor` block of `/proc/cpuinfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuEntry {
    /// `processor`: the logical CPU number.
    pub processor: Option<usize>,
    /// `physical id`: the package (socket).
    pub physical_id: Option<u32>,
    /// `core id`: the core within its package.
    pub core_id: Option<u32>,
}

/// What this module uses from `/proc/cpuinfo`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuInfoText {
    /// `model name` (x86), else `Model` / `Hardware` (some ARM kernels).
    pub model_name: Option<String>,
    /// One entry per `processor` block, in file order.
    pub cpus: Vec<CpuEntry>,
}

impl CpuInfoText {
    /// Distinct (physical id, core id) pairs among the CPUs in `allowed` (all when None);
    /// None when the text has no core ids (ARM kernels omit them).
    pub fn physical_cores(&self, allowed: Option<&BTreeSet<usize>>) -> Option<usize> {
        let mut cores = BTreeSet::new();
        for cpu in &self.cpus {
            let in_mask = match (allowed, cpu.processor) {
                (Some(set), Some(p)) => set.contains(&p),
                _ => true,
            };
            if let (true, Some(core)) = (in_mask, cpu.core_id) {
                cores.insert((cpu.physical_id.unwrap_or(0), core));
            }
        }
        (!cores.is_empty()).then_some(cores.len())
    }
}

/// Parses `/proc/cpuinfo` text.
pub fn parse_cpuinfo(text: &str) -> CpuInfoText {
    let mut out = CpuInfoText::default();
    let mut fallback_model: Option<String> = None;
    let mut cur: Option<CpuEntry> = None;
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "processor" => {
                out.cpus.extend(cur.take());
                cur = Some(CpuEntry { processor: value.parse().ok(), ..CpuEntry::default() });
            }
            "physical id" => {
                if let Some(c) = cur.as_mut() {
                    c.physical_id = value.parse().ok();
                }
            }
            "core id" => {
                if let Some(c) = cur.as_mut() {
                    c.core_id = value.parse().ok();
                }
            }
            "model name" if out.model_name.is_none() && !value.is_empty() => out.model_name = Some(value.to_string()),
            "Model" | "Hardware" if fallback_model.is_none() && !value.is_empty() => {
                fallback_model = Some(value.to_string())
            }
            _ => {}
        }
    }
    out.cpus.extend(cur);
    if out.model_name.is_none() {
        out.model_name = fallback_model;
    }
    out
}

/// Parses a kernel CPU list such as `0-3,8,10-11`. None if malformed.
pub fn parse_cpu_list(text: &str) -> Option<BTreeSet<usize>> {
    let mut set = BTreeSet::new();
    for part in text.trim().split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                // a sane bound: no machine has a million CPUs, and it keeps a bad file cheap
                if a > b || b >= 1 << 20 {
                    return None;
                }
                set.extend(a..=b);
            }
            None => {
                set.insert(part.parse().ok()?);
            }
        }
    }
    Some(set)
}

/// The `Cpus_allowed_list` of `/proc/self/status` text.
pub fn parse_cpus_allowed(status: &str) -> Option<BTreeSet<usize>> {
    let line = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    parse_cpu_list(line).filter(|s| !s.is_empty())
}

/// Distinct (package, die, core) among `cpuN` folders of `cpu_root` (`/sys/devices/system/cpu`)
/// in `allowed`. Offline CPUs have no topology and are skipped. None if nothing was readable.
pub fn cores_from_sysfs(cpu_root: &Path, allowed: Option<&BTreeSet<usize>>) -> Option<usize> {
    let mut cores = BTreeSet::new();
    for entry in fs::read_dir(cpu_root).ok()?.flatten() {
        let name = entry.file_name();
        let Some(n) = name.to_str().and_then(|s| s.strip_prefix("cpu")).and_then(|s| s.parse::<usize>().ok()) else {
            continue;
        };
        if allowed.is_some_and(|set| !set.contains(&n)) {
            continue;
        }
        let topo = entry.path().join("topology");
        let Some(core) = read_text(&topo.join("core_id")).and_then(|t| t.trim().parse::<i64>().ok()) else {
            continue;
        };
        let package = read_text(&topo.join("physical_package_id")).and_then(|t| t.trim().parse::<i64>().ok());
        let die = read_text(&topo.join("die_id")).and_then(|t| t.trim().parse::<i64>().ok());
        cores.insert((package.unwrap_or(0), die.unwrap_or(0), core));
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// SIMD features of this CPU, detected at run time (names as in the crate docs).
pub fn simd_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::arch::is_x86_feature_detected!($f) { out.push($f); } )* };
        }
        probe!("sse4.2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512vnni");
        if x86::avxvnni() {
            out.push("avxvnni");
        }
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            out.push("neon");
        }
        if std::arch::is_aarch64_feature_detected!("dotprod") {
            out.push("dotprod");
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// AVX-VNNI (VEX-encoded VNNI): CPUID leaf 7 subleaf 1, EAX bit 4. Probed by hand because
    /// `is_x86_feature_detected!("avxvnni")` is unstable before Rust 1.89 (MSRV is 1.85).
    #[allow(unused_unsafe)]
    pub fn avxvnni() -> bool {
        use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
        // AVX detection includes the OS saving YMM state, which VEX-encoded VNNI needs.
        if !std::arch::is_x86_feature_detected!("avx") {
            return false;
        }
        // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 and its subleaf 1 are queried only
        // when the CPU reports them.
        unsafe {
            if __get_cpuid_max(0).0 < 7 || __cpuid_count(7, 0).eax < 1 {
                return false;
            }
            __cpuid_count(7, 1).eax & (1 << 4) != 0
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

/// What this module uses from `/proc/meminfo`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemInfo {
    /// `MemTotal`, bytes.
    pub total_bytes: Option<u64>,
    /// `MemAvailable`, bytes.
    pub available_bytes: Option<u64>,
}

/// Parses `/proc/meminfo` text (`MemTotal:  24684096 kB`).
pub fn parse_meminfo(text: &str) -> MemInfo {
    let mut out = MemInfo::default();
    for line in text.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let slot = match key.trim() {
            "MemTotal" => &mut out.total_bytes,
            "MemAvailable" => &mut out.available_bytes,
            _ => continue,
        };
        let mut words = value.split_whitespace();
        let number = words.next().and_then(|n| n.parse::<u64>().ok());
        let scale = match words.next() {
            Some("kB") | Some("KB") | Some("kb") => 1024,
            None => 1,
            Some(_) => continue,
        };
        *slot = number.and_then(|n| n.checked_mul(scale));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// GPUs

/// Classifies a GPU from its PCI vendor/device ids, amdgpu's VRAM size and `boot_vga`.
///
/// * Intel → integrated, except Arc discrete device ids (DG1 `0x4905..=0x4909`, Alchemist
///   `0x5690..=0x56ff`, Battlemage `0xe200..=0xe2ff`).
/// * AMD → integrated when amdgpu reports less than 2 GiB of VRAM (an APU's carve-out); when the
///   VRAM size is unknown, integrated if it is the boot display; else discrete. VRAM wins over
///   `boot_vga` because a desktop's only Radeon is the boot display too.
/// * NVIDIA → discrete.
/// * BMC / virtual-machine adapters → display only; anything else → unknown.
pub fn classify_gpu(vendor: Option<u16>, device: Option<u16>, boot_vga: Option<bool>, vram: Option<u64>) -> GpuKind {
    match vendor {
        Some(VENDOR_INTEL) => match device {
            Some(0x4905..=0x4909 | 0x5690..=0x56ff | 0xe200..=0xe2ff) => GpuKind::Discrete,
            _ => GpuKind::Integrated,
        },
        Some(VENDOR_AMD) => match (vram, boot_vga) {
            (Some(v), _) if v < AMD_IGPU_VRAM_LIMIT => GpuKind::Integrated,
            (Some(_), _) => GpuKind::Discrete,
            (None, Some(true)) => GpuKind::Integrated,
            (None, _) => GpuKind::Discrete,
        },
        Some(VENDOR_NVIDIA) => GpuKind::Discrete,
        Some(v) if DISPLAY_ONLY_VENDORS.iter().any(|(id, _)| *id == v) => GpuKind::DisplayOnly,
        _ => GpuKind::Unknown,
    }
}

fn vendor_name(vendor: Option<u16>) -> &'static str {
    match vendor {
        Some(VENDOR_INTEL) => "Intel",
        Some(VENDOR_AMD) => "AMD",
        Some(VENDOR_NVIDIA) => "NVIDIA",
        Some(v) => DISPLAY_ONLY_VENDORS.iter().find(|(id, _)| *id == v).map_or("unknown", |(_, n)| n),
        None => "unknown",
    }
}

/// Finds display controllers under a sysfs root (`/sys`): PCI devices of class `0x03xxxx` in
/// `bus/pci/devices`, plus DRM cards (`class/drm/cardN/device`) that are not PCI (SoC GPUs).
/// Sorted by address; never fails (unreadable entries are skipped).
pub fn scan_gpus(sys: &Path) -> Vec<GpuInfo> {
    let mut gpus: Vec<GpuInfo> = Vec::new();
    for dir in sorted_entries(&sys.join("bus/pci/devices")) {
        let class = read_hex(&dir.join("class"));
        if class.is_some_and(|c| c >> 16 == 0x03) {
            gpus.push(gpu_from_device_dir(&dir, file_name(&dir), class));
        }
    }

    for card in sorted_entries(&sys.join("class/drm")) {
        let card_name = file_name(&card);
        let is_card = card_name.strip_prefix("card").is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
        if !is_card {
            continue; // renderD128, card0-HDMI-A-1 (connectors), version
        }
        let dev = card.join("device");
        let Some(target) = fs::canonicalize(&dev).ok() else {
            continue;
        };
        let address = file_name(&target);
        if let Some(g) = gpus.iter_mut().find(|g| g.address == address) {
            if g.drm_card.is_none() {
                g.drm_card = Some(card_name);
            }
            continue;
        }
        let class = read_hex(&dev.join("class"));
        let mut gpu = if dev.join("vendor").is_file() {
            // A PCI device not listed under bus/pci (unusual); a non-display class is not a GPU.
            if class.is_some_and(|c| c >> 16 != 0x03) {
                continue;
            }
            gpu_from_device_dir(&dev, address, class)
        } else {
            // A platform (SoC) GPU: integrated, unless it is a plain framebuffer.
            let driver = driver_name(&dev);
            if driver.as_deref().is_some_and(|d| FRAMEBUFFER_DRIVERS.contains(&d)) {
                continue;
            }
            GpuInfo {
                address,
                vendor_id: None,
                device_id: None,
                vendor: "soc",
                class: None,
                kind: GpuKind::Integrated,
                vram_total_bytes: None,
                boot_vga: None,
                drm_card: None,
                driver,
            }
        };
        gpu.drm_card = Some(card_name);
        gpus.push(gpu);
    }
    gpus.sort_by(|a, b| a.address.cmp(&b.address));
    gpus
}

fn gpu_from_device_dir(dir: &Path, address: String, class: Option<u32>) -> GpuInfo {
    let vendor_id = read_hex(&dir.join("vendor")).and_then(|v| u16::try_from(v).ok());
    let device_id = read_hex(&dir.join("device")).and_then(|v| u16::try_from(v).ok());
    let boot_vga = read_text(&dir.join("boot_vga")).map(|t| t.trim() == "1");
    let vram_total_bytes = read_text(&dir.join("mem_info_vram_total")).and_then(|t| t.trim().parse().ok());
    GpuInfo {
        address,
        vendor_id,
        device_id,
        vendor: vendor_name(vendor_id),
        class,
        kind: classify_gpu(vendor_id, device_id, boot_vga, vram_total_bytes),
        vram_total_bytes,
        boot_vga,
        drm_card: None,
        driver: driver_name(dir),
    }
}

// ---------------------------------------------------------------------------------------------
// small readers (all optional)

/// A small pseudo-file as text; None if unreadable. Reads at most 1 MiB.
fn read_text(path: &Path) -> Option<String> {
    use std::io::Read;
    let file = fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    file.take(1 << 20).read_to_end(&mut buf).ok()?;
    String::from_utf8(buf).ok()
}

/// A sysfs hex value such as `0x030000`.
fn read_hex(path: &Path) -> Option<u32> {
    parse_hex(&read_text(path)?)
}

/// Parses `0x10de` / `10de` (surrounding whitespace allowed).
pub fn parse_hex(text: &str) -> Option<u32> {
    let t = text.trim();
    let t = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")).unwrap_or(t);
    u32::from_str_radix(t, 16).ok()
}

fn driver_name(device_dir: &Path) -> Option<String> {
    let link = fs::read_link(device_dir.join("driver")).ok()?;
    link.file_name().and_then(|n| n.to_str()).map(str::to_string)
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

/// Paths in `dir`, sorted; empty if unreadable.
fn sorted_entries(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir).map(|rd| rd.flatten().map(|e| e.path()).collect()).unwrap_or_default();
    v.sort();
    v
}

#[cfg(test)]
mod tests;
