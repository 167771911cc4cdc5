//! Intel AMX (Advanced Matrix Extensions, Sapphire Rapids and later Xeons): eight tile
//! registers of up to 16 rows × 64 bytes, and a unit that multiplies two of them into a
//! third. `tdpbf16ps` adds a 16×32 bf16 tile times a 32×16 bf16 tile (K in pairs) into a
//! 16×16 f32 tile: 8192 multiply-adds an instruction, about 16 times an AVX-512 FMA's
//! work in the same cycles. `tdpbsud` does the same with bytes into i32 (64 steps of K).
//!
//! Linux hands the tile registers to a process only when it asks (`arch_prctl`), because
//! they enlarge every saved thread state by 8 KiB. [`bf16`] and [`int8`] ask once, for
//! the whole process, and answer whether the unit can be used: the CPU has it, the
//! kernel enabled it, the permission was given, and `QKV_ISA` does not cap the vector
//! width below AVX-512 (the cap turns off AMX as it turns off the other wide forms).
//!
//! Every kernel uses one tile layout (`Tiles`): tiles 0–3 are four 16×16 sums (two row
//! tiles × two column tiles), 4–5 two row tiles of the left operand, 6–7 two column
//! tiles of the right one, all 16 rows of 64 bytes. A kernel configures the tiles at the
//! start of each task (the configuration belongs to the thread) and releases them at its
//! end, through `Tiles`.

/// Whether this process can run `tdpbf16ps` (and AVX512-BF16, which every AMX CPU has).
pub fn bf16() -> bool {
    state().bf16
}

/// Whether this process can run `tdpbsud` (AMX-INT8).
pub fn int8() -> bool {
    state().int8
}

#[derive(Clone, Copy)]
struct State {
    bf16: bool,
    int8: bool,
}

/// The CPU's and kernel's answer, asked once.
fn state() -> State {
    static STATE: std::sync::OnceLock<State> = std::sync::OnceLock::new();
    *STATE.get_or_init(|| {
        let none = State {
            bf16: false,
            int8: false,
        };
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            use crate::ops::isa::Isa;
            if Isa::detect() != Isa::Avx512 || !is_x86_feature_detected!("avx512bf16") {
                return none;
            }
            let (tile, bf16, int8) = linux::cpu_features();
            if !tile || !linux::tiles_enabled() || !linux::request_tiles() {
                return none;
            }
            State { bf16, int8 }
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            none
        }
    })
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod linux {
    /// (AMX-TILE, AMX-BF16, AMX-INT8) from cpuid leaf 7: EDX bits 24, 22 and 25.
    pub(super) fn cpu_features() -> (bool, bool, bool) {
        // SAFETY: cpuid leaves 0 and 7 exist on every x86-64 CPU that has AVX-512.
        #[allow(unused_unsafe)] // a safe function from Rust 1.94 on
        let edx = unsafe { std::arch::x86_64::__cpuid_count(7, 0) }.edx;
        let bit = |b: u32| edx & (1 << b) != 0;
        (bit(24), bit(22), bit(25))
    }

    /// Whether the kernel enabled the tile state in XCR0 (bits 17 and 18).
    pub(super) fn tiles_enabled() -> bool {
        let osxsave = {
            // SAFETY: leaf 1 exists on every x86-64 CPU.
            #[allow(unused_unsafe)]
            let ecx = unsafe { std::arch::x86_64::__cpuid(1) }.ecx;
            ecx & (1 << 27) != 0
        };
        if !osxsave {
            return false;
        }
        let xcr0: u64;
        // SAFETY: OSXSAVE is set, so xgetbv is allowed; it reads XCR0 and nothing else.
        unsafe {
            let (lo, hi): (u32, u32);
            std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
                options(nomem, nostack, preserves_flags));
            xcr0 = (u64::from(hi) << 32) | u64::from(lo);
        }
        xcr0 & (0b11 << 17) == 0b11 << 17
    }

    /// Asks Linux for the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM,
    /// XFEATURE_XTILEDATA)`), for every thread of the process.
    pub(super) fn request_tiles() -> bool {
        const SYS_ARCH_PRCTL: usize = 158;
        const ARCH_REQ_XCOMP_PERM: usize = 0x1023;
        const XFEATURE_XTILEDATA: usize = 18;
        let ret: isize;
        // SAFETY: the system call reads its two integer arguments and changes only the
        // process's permission; rcx and r11 are the registers `syscall` overwrites.
        unsafe {
            std::arch::asm!("syscall",
                inlateout("rax") SYS_ARCH_PRCTL as isize => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM, in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _, lateout("r11") _, options(nostack));
        }
        ret == 0
    }
}

/// The tile configuration of every kernel, held for one task: tiles configured on
/// creation (which zeroes them), released when dropped.
pub(crate) struct Tiles(());

/// The 64-byte block `ldtilecfg` reads: palette 1, then each tile's bytes a row and rows.
#[repr(C, align(64))]
struct Config {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl Tiles {
    /// Bytes in a tile's row.
    pub(crate) const ROW_BYTES: usize = 64;
    /// Rows in a tile.
    pub(crate) const ROWS: usize = 16;

    /// Configures the eight tiles as 16 rows of 64 bytes each.
    ///
    /// # Safety
    /// [`bf16`] or [`int8`] returned true in this process.
    #[cfg(target_arch = "x86_64")]
    pub(crate) unsafe fn configure() -> Tiles {
        let mut config = Config {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            config.bytes_per_row[t] = Self::ROW_BYTES as u16;
            config.rows[t] = Self::ROWS as u8;
        }
        std::arch::asm!("ldtilecfg [{0}]", in(reg) &config as *const Config,
            options(nostack, readonly, preserves_flags));
        Tiles(())
    }
}

#[cfg(target_arch = "x86_64")]
impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure`, which needs AMX.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem, preserves_flags)) };
    }
}

/// The multiply-add a block runs, which sets what its tiles hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dot {
    /// `tdpbf16ps`: rows of 32 bf16 (K in pairs), f32 sums.
    Bf16,
    /// `tdpbsud`: rows of 64 signed bytes on the left, quads of 64 unsigned bytes on
    /// the right (K in quads), i32 sums, exact.
    Int8,
}

/// The operands of one block of four 16×16 sums: two row tiles of the left operand
/// times two column tiles of the right one, over `k_tiles` tiles of K.
pub(crate) struct Block<'a> {
    /// The first row tile's first row; the second tile starts 16 rows later.
    pub left: *const u8,
    /// Bytes from one left row to the next, at least `k_tiles · 64`.
    pub left_stride: usize,
    /// Whether the second row tile takes part (else its sums are neither read nor
    /// written).
    pub both: bool,
    pub k_tiles: usize,
    /// The two column tiles of each K tile.
    pub right: &'a PanelTiles<'a>,
    /// Where sum (t, c) starts from and is stored to, and its row stride in bytes:
    /// 16 rows of 16 four-byte elements.
    pub places: [[(*mut u8, usize); 2]; 2],
    /// Whether the sums start from their places (else from zero).
    pub accumulate: bool,
}

/// Words (4 bytes) of one column tile: 16 rows of 64 bytes.
const TILE_WORDS: usize = Tiles::ROWS * Tiles::ROW_BYTES / 4;

/// The right operand of a block: two weight panels laid out as column tiles, K tile
/// after K tile (16 rows of 64 bytes each, one after another, as the bf16 and int8
/// panels both are). Whole tiles are read in place; the last group of fewer rows (K
/// not a multiple of the tile's) is copied into a zero-padded tile.
pub(crate) struct PanelTiles<'a> {
    panels: [&'a [u32]; 2],
    /// K tiles wholly inside the panels.
    full: usize,
    tails: [[u32; TILE_WORDS]; 2],
}

impl<'a> PanelTiles<'a> {
    /// Two panels of the same length.
    pub(crate) fn new(panels: [&'a [u32]; 2]) -> Self {
        assert_eq!(panels[0].len(), panels[1].len());
        let full = panels[0].len() / TILE_WORDS;
        let mut tails = [[0u32; TILE_WORDS]; 2];
        for (tail, panel) in tails.iter_mut().zip(&panels) {
            let rest = &panel[full * TILE_WORDS..];
            tail[..rest.len()].copy_from_slice(rest);
        }
        PanelTiles {
            panels,
            full,
            tails,
        }
    }

    /// Each panel's K tile kt: in place, or the zero-padded tail.
    fn at(&self, kt: usize) -> [*const u8; 2] {
        std::array::from_fn(|c| match kt < self.full {
            true => self.panels[c][kt * TILE_WORDS..].as_ptr().cast(),
            false => self.tails[c].as_ptr().cast(),
        })
    }
}

/// Runs a block ([`Block`]) with `dot`: sum (t, c) (+)= (row tile t)·(column tile c)
/// for t = 0 and, when `both`, 1; each sum is stored back to its place.
///
/// # Safety
/// Tiles configured by [`Tiles::configure`] on this thread, for a CPU with `dot`
/// ([`bf16`] or [`int8`]); every pointer valid for the rows and strides above, the
/// places the caller's own.
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn block(dot: Dot, b: &Block<'_>) {
    use std::arch::asm;
    let [[(p00, s00), (p01, s01)], [(p10, s10), (p11, s11)]] = b.places;
    assert!(b.k_tiles * Tiles::ROW_BYTES <= b.left_stride);
    if b.accumulate {
        asm!(
            "tileloadd tmm0, [{p00} + {s00}]",
            "tileloadd tmm1, [{p01} + {s01}]",
            "tileloadd tmm2, [{p10} + {s10}]",
            "tileloadd tmm3, [{p11} + {s11}]",
            p00 = in(reg) p00, s00 = in(reg) s00,
            p01 = in(reg) p01, s01 = in(reg) s01,
            p10 = in(reg) p10, s10 = in(reg) s10,
            p11 = in(reg) p11, s11 = in(reg) s11,
            options(nostack, readonly)
        );
    } else {
        asm!(
            "tilezero tmm0",
            "tilezero tmm1",
            "tilezero tmm2",
            "tilezero tmm3",
            options(nostack, nomem)
        );
    }
    // sums $s0, $s1 += row tile $a times the column tiles in tmm6, tmm7, by `dot`
    macro_rules! dot_row_tile {
        ($a:literal, $s0:literal, $s1:literal) => {
            match dot {
                Dot::Bf16 => asm!(
                    concat!("tdpbf16ps ", $s0, ", ", $a, ", tmm6"),
                    concat!("tdpbf16ps ", $s1, ", ", $a, ", tmm7"),
                    options(nostack, nomem)
                ),
                Dot::Int8 => asm!(
                    concat!("tdpbsud ", $s0, ", ", $a, ", tmm6"),
                    concat!("tdpbsud ", $s1, ", ", $a, ", tmm7"),
                    options(nostack, nomem)
                ),
            }
        };
    }
    let (a_stride, b_stride) = (b.left_stride, Tiles::ROW_BYTES);
    let a0 = b.left;
    let a1 = b.left.wrapping_add(Tiles::ROWS * a_stride);
    for kt in 0..b.k_tiles {
        let [b0, b1] = b.right.at(kt);
        let at = kt * Tiles::ROW_BYTES;
        asm!(
            "tileloadd tmm6, [{b0} + {bs}]",
            "tileloadd tmm7, [{b1} + {bs}]",
            "tileloadd tmm4, [{a0} + {as_}]",
            b0 = in(reg) b0,
            b1 = in(reg) b1,
            a0 = in(reg) a0.add(at),
            bs = in(reg) b_stride,
            as_ = in(reg) a_stride,
            options(nostack, readonly)
        );
        dot_row_tile!("tmm4", "tmm0", "tmm1");
        if b.both {
            asm!(
                "tileloadd tmm5, [{a1} + {as_}]",
                a1 = in(reg) a1.add(at),
                as_ = in(reg) a_stride,
                options(nostack, readonly)
            );
            dot_row_tile!("tmm5", "tmm2", "tmm3");
        }
    }
    asm!(
        "tilestored [{p00} + {s00}], tmm0",
        "tilestored [{p01} + {s01}], tmm1",
        p00 = in(reg) p00, s00 = in(reg) s00,
        p01 = in(reg) p01, s01 = in(reg) s01,
        options(nostack)
    );
    if b.both {
        asm!(
            "tilestored [{p10} + {s10}], tmm2",
            "tilestored [{p11} + {s11}], tmm3",
            p10 = in(reg) p10, s10 = in(reg) s10,
            p11 = in(reg) p11, s11 = in(reg) s11,
            options(nostack)
        );
    }
}
