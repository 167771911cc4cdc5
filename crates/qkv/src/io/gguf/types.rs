//! ggml's tensor types as GGUF stores them: the code in a tensor info, the weights per
//! block and the bytes per block (ggml's `ggml_type_traits`). Every type's size is
//! known, so a file's tensors can be bounds-checked whatever they hold; the types qkv
//! computes with are those [`GgmlType::dequantizes`] says.

use crate::weights::ggml::BlockType;
use crate::weights::int8::q8_0;

/// A ggml tensor type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType {
    pub code: u32,
    pub name: &'static str,
    /// weights per block (1 for plain numbers)
    pub block: usize,
    /// bytes per block
    pub block_bytes: usize,
}

/// (code, name, weights per block, bytes per block) of every type ggml defines; the
/// sizes of the types qkv computes with are their layouts' own.
const TYPES: &[(u32, &str, usize, usize)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (
        2,
        "Q4_0",
        BlockType::Q4_0.weights(),
        BlockType::Q4_0.bytes(),
    ),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", q8_0::WEIGHTS, q8_0::BYTES),
    (9, "Q8_1", 32, 40),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", BlockType::Q4K.weights(), BlockType::Q4K.bytes()),
    (13, "Q5_K", BlockType::Q5K.weights(), BlockType::Q5K.bytes()),
    (14, "Q6_K", BlockType::Q6K.weights(), BlockType::Q6K.bytes()),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    pub const F32: GgmlType = GgmlType::known(0);
    pub const F16: GgmlType = GgmlType::known(1);
    pub const Q4_0: GgmlType = GgmlType::known(2);
    pub const Q8_0: GgmlType = GgmlType::known(8);
    pub const Q4_K: GgmlType = GgmlType::known(12);
    pub const Q5_K: GgmlType = GgmlType::known(13);
    pub const Q6_K: GgmlType = GgmlType::known(14);
    pub const BF16: GgmlType = GgmlType::known(30);

    /// The type of `code`, if ggml defines one.
    pub fn from_code(code: u32) -> Option<GgmlType> {
        TYPES
            .iter()
            .find(|t| t.0 == code)
            .map(|&(code, name, block, block_bytes)| GgmlType {
                code,
                name,
                block,
                block_bytes,
            })
    }

    /// The type called `name` (`Q4_K`, case as ggml writes it).
    pub fn from_name(name: &str) -> Option<GgmlType> {
        TYPES
            .iter()
            .find(|t| t.1 == name)
            .and_then(|t| GgmlType::from_code(t.0))
    }

    const fn known(code: u32) -> GgmlType {
        let mut i = 0;
        while i < TYPES.len() {
            if TYPES[i].0 == code {
                let (code, name, block, block_bytes) = TYPES[i];
                return GgmlType {
                    code,
                    name,
                    block,
                    block_bytes,
                };
            }
            i += 1;
        }
        panic!("a ggml type code listed in TYPES")
    }

    /// Bytes of `n` weights, or `None` when `n` is not a whole number of blocks or the
    /// count overflows.
    pub fn bytes_of(self, n: usize) -> Option<usize> {
        n.is_multiple_of(self.block)
            .then(|| (n / self.block).checked_mul(self.block_bytes))?
    }

    /// The 4- to 6-bit block type this is, for those the products compute from as
    /// stored ([`crate::weights::ggml`]).
    pub fn block_type(self) -> Option<BlockType> {
        match self {
            GgmlType::Q4_0 => Some(BlockType::Q4_0),
            GgmlType::Q4_K => Some(BlockType::Q4K),
            GgmlType::Q5_K => Some(BlockType::Q5K),
            GgmlType::Q6_K => Some(BlockType::Q6K),
            _ => None,
        }
    }

    /// Whether qkv reads this type's values (as f32).
    pub fn dequantizes(self) -> bool {
        [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ]
        .contains(&self)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name)
    }
}
