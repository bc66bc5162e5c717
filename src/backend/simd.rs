//! CPU instruction-set levels ([`SimdLevel`]), detected at run time: what `hardware` reports and
//! what the CPU backend (`cpu`, which re-exports it) chooses its kernels by. On the ground floor of
//! `backend` so that neither of the two imports the other for it.

/// Instruction-set level of the CPU kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SimdLevel {
    /// Portable reference kernels.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL/VNNI on top of `Avx2` (whose kernels it uses where it has none of
    /// its own).
    Avx512Vnni,
    /// aarch64 NEON (baseline on that architecture).
    Neon,
}

impl SimdLevel {
    /// The best level this CPU supports.
    pub fn detect() -> SimdLevel {
        *Self::available().last().expect("scalar is always available")
    }

    /// Every level this CPU supports, `Scalar` first, best last.
    pub fn available() -> Vec<SimdLevel> {
        [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni, SimdLevel::Neon].into_iter().filter(|l| l.supported()).collect()
    }

    /// Whether this CPU can run the level's kernels (run-time detection).
    pub fn supported(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Vnni => {
                SimdLevel::Avx2.supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The level called `name` (as [`SimdLevel::name`] prints it).
    pub fn from_name(name: &str) -> Option<SimdLevel> {
        [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::Avx512Vnni, SimdLevel::Neon].into_iter().find(|l| l.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Scalar => "scalar",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512Vnni => "avx512vnni",
            SimdLevel::Neon => "neon",
        }
    }
}

/// Whether the CPU backend multiplies with AMX-INT8 tiles (prefill over the repacked 16-row
/// layouts, `cpu::amx`): `Ok` with what was found, or `Err` with why not. Detected once; never
/// fails or panics. Needs CPUID AMX-TILE and AMX-INT8, the OS enabling tile state in XCR0, the
/// AVX-512 level (the layouts and the float half of the kernels are its), and on Linux the
/// process's permission for tile data (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`,
/// requested here). `FORGE_AMX=0` turns it off (to compare with one binary).
pub fn amx_status() -> &'static Result<&'static str, String> {
    static STATUS: std::sync::OnceLock<Result<&'static str, String>> = std::sync::OnceLock::new();
    STATUS.get_or_init(detect_amx)
}

/// Whether [`amx_status`] is `Ok`.
pub fn amx_usable() -> bool {
    amx_status().is_ok()
}

fn detect_amx() -> Result<&'static str, String> {
    if std::env::var("FORGE_AMX").is_ok_and(|v| v == "0" || v == "off") {
        return Err("turned off by FORGE_AMX".into());
    }
    amx_arch()
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_arch() -> Result<&'static str, String> {
    Err("AMX kernels are built for x86-64 Linux only".into())
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[allow(unused_unsafe)] // CPUID is safe from Rust 1.94; MSRV is older
fn amx_arch() -> Result<&'static str, String> {
    use std::arch::x86_64::{__cpuid_count, __get_cpuid_max};
    // SAFETY: CPUID exists on every x86-64 CPU; leaf 7 is queried only when reported.
    let edx = unsafe {
        if __get_cpuid_max(0).0 < 7 {
            return Err("CPU lacks CPUID leaf 7 (no AMX)".into());
        }
        __cpuid_count(7, 0).edx
    };
    let (tile, int8) = (edx & (1 << 24) != 0, edx & (1 << 25) != 0);
    if !(tile && int8) {
        return Err(format!("CPU lacks AMX-INT8 (amx_tile {tile}, amx_int8 {int8})"));
    }
    if !SimdLevel::Avx512Vnni.supported() {
        return Err("CPU has AMX but not the AVX-512 level its kernels build on".into());
    }
    // SAFETY: leaf 1 exists on every x86-64 CPU. ECX bit 27: OSXSAVE (XGETBV usable).
    if !std::arch::is_x86_feature_detected!("xsave") || unsafe { __cpuid_count(1, 0).ecx } & (1 << 27) == 0 {
        return Err("CPU has AMX but the OS does not enable XSAVE".into());
    }
    // SAFETY: XSAVE and OSXSAVE were checked just above, so XGETBV is usable.
    let xcr0 = unsafe { xgetbv0() };
    if xcr0 & (3 << 17) != 3 << 17 {
        return Err(format!("OS does not enable AMX tile state (XCR0 {xcr0:#x})"));
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with ARCH_REQ_XCOMP_PERM only asks the kernel for permission to use an
    // extended state component; it touches no memory of ours.
    let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    if rc != 0 {
        return Err(format!("Linux refused tile data permission (arch_prctl: {})", std::io::Error::last_os_error()));
    }
    Ok("AMX-INT8 tiles (prefill over repacked Q4_0/Q4_1/Q5_0/Q8_0/Q4_K/Q6_K, 16+ tokens)")
}

/// XCR0, the OS-enabled state components.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[target_feature(enable = "xsave")]
fn xgetbv0() -> u64 {
    // SAFETY: the caller checked XSAVE and OSXSAVE; register 0 always exists.
    unsafe { std::arch::x86_64::_xgetbv(0) }
}
