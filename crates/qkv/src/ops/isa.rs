//! Which vector instruction set this CPU runs, tested once at run time, and the
//! `QKV_ISA` cap that narrows it for measuring and testing the narrower forms.

/// The vector instruction sets the kernels have forms for, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512 F (16 f32 lanes, 32 registers).
    Avx512,
    /// AVX2 with FMA (8 lanes, 16 registers).
    Avx2,
    /// Plain loops.
    Portable,
}

impl Isa {
    /// The best instruction set this CPU runs (the standard library caches the test).
    /// `QKV_ISA=avx2` or `portable` caps it, to measure or test a narrower path on a
    /// wider CPU; a cap above what the CPU has is ignored.
    #[inline]
    pub fn detect() -> Isa {
        let cpu = Self::cpu();
        match cap() {
            Some(cap) if cap.rank() > cpu.rank() => cap,
            _ => cpu,
        }
    }

    /// Every form this CPU runs, widest first: what the tests compare.
    pub fn available() -> Vec<Isa> {
        let cpu = Self::cpu();
        [Isa::Avx512, Isa::Avx2, Isa::Portable]
            .into_iter()
            .filter(|isa| isa.rank() >= cpu.rank())
            .collect()
    }

    fn cpu() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// 0 for the widest; a larger rank is a narrower set.
    fn rank(self) -> u8 {
        self as u8
    }
}

/// The `QKV_ISA` cap, read once.
fn cap() -> Option<Isa> {
    static CAP: std::sync::OnceLock<Option<Isa>> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| match std::env::var("QKV_ISA").ok()?.as_str() {
        "avx512" => Some(Isa::Avx512),
        "avx2" => Some(Isa::Avx2),
        "portable" => Some(Isa::Portable),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::Isa;

    #[test]
    fn available_forms_start_with_the_detected_cpu_form_and_end_portable() {
        let forms = Isa::available();
        assert_eq!(forms.last(), Some(&Isa::Portable));
        assert!(forms.windows(2).all(|w| w[0].rank() < w[1].rank()));
        assert!(forms.contains(&Isa::detect()));
    }
}
