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
