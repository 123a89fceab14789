//! Hopper's warpgroup tensor cores (sm_90a): `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}`
//! reads its operands from shared memory through 64-bit matrix descriptors (A may come from
//! registers instead) and accumulates in registers.
//!
//! The accumulator of a warpgroup's instruction is, warp by warp, the `mma.sync` one
//! ([`super::mma`]): warp `w` of the warpgroup holds rows `16 w .. 16 w + 16` of the 64, and
//! its registers `d_{4 j} .. d_{4 j + 3}` are the `c0..c3` of columns `8 j .. 8 j + 8`. So a
//! CTA's accumulator is an [`super::mma::MmaV2`] layout with every warp along M (`warps_per_cta
//! = [num_warps, 1]`), and an A operand in registers is that layout's A operand: a `dot` on
//! `wgmma` changes how the products are computed, not where any value lives.
//!
//! This module is the hardware's side of the shared-memory operands: the descriptor's bits
//! ([`Descriptor`]) and the canonical layouts ([`Descriptor::element_offset`]), which the CPU
//! emulator evaluates; the lowering writes tiles with [`super::swizzle::SwizzledShared`]'s
//! offsets and builds descriptors with [`operand_descriptor`], so the two meet only in shared
//! memory and a mismatch fails in the emulator.
//!
//! # Sources
//!
//! - PTX ISA 8.x/9.0, "Asynchronous Warpgroup Level Matrix Shared Memory Layout" (9.7.15.5.1.2):
//!   the canonical layouts as CuTe layouts, in units of `T = 16 bytes / element` elements:
//!   K-major with a swizzle of `S` bytes is `Swizzle<log2(S / 16), 4, 3> o ((8, m), (T, 2k)) :
//!   ((S / 16 * T, SBO), (1, T))`, MN-major `Swizzle<..> o ((T, S / 16, m), (8, k)) : ((1, T,
//!   LBO), (S / 16 * T, SBO))`; the leading byte offset is unused (1) for swizzled K-major
//!   layouts; the swizzle acts on byte addresses, so a tile starts at a multiple of `8 S` bytes.
//! - "Matrix Descriptor Format" (9.7.15.5.1.2.2): start address, LBO and SBO in 16-byte units
//!   in bits 0-13, 16-29 and 32-45, base offset in 49-51 (0: tiles are aligned), the swizzle
//!   mode in 62-63 (1: 128 bytes, 2: 64, 3: 32).

use super::swizzle::SwizzledShared;

/// Rows of one instruction: a warpgroup's.
pub const WGMMA_M: usize = 64;
/// The reduction depth of one instruction for 16-bit operands.
pub const WGMMA_K: usize = 16;
/// The widest instruction.
pub const MAX_N: usize = 256;
/// Warps in a warpgroup; a warpgroup's first warp is a multiple of it.
pub const WARPS_PER_WARPGROUP: u32 = 4;
/// The widest swizzle (and the longest slab row) a descriptor describes.
pub const MAX_SWIZZLE_BYTES: usize = 128;
/// The narrowest swizzle kiln uses: 16 elements of 16 bits, one instruction's K.
pub const MIN_SWIZZLE_BYTES: usize = 32;
/// The alignment of a shared tile `wgmma` or TMA reads: the swizzle acts on address bits up to
/// 1024.
pub const TILE_ALIGN: usize = 1024;

/// Which dimension of an operand is contiguous in shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Major {
    /// K contiguous (`imm-trans` 0): A `[m, k]` row-major, B `[k, n]` column-major.
    K,
    /// M or N contiguous (`imm-trans` 1).
    MN,
}

/// A shared-memory matrix descriptor, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The shared-memory byte address of the operand's element `(0, 0)`, before the swizzle.
    pub start: u32,
    /// Leading dimension byte offset: MN-major, from one swizzle span of MN to the next.
    pub lbo: u32,
    /// Stride dimension byte offset: from one group of 8 rows (K-major: of MN; MN-major: of K)
    /// to the next.
    pub sbo: u32,
    /// 128, 64 or 32.
    pub swizzle_bytes: u32,
}

impl Descriptor {
    /// The 64-bit descriptor `wgmma` takes.
    pub fn encode(&self) -> u64 {
        let field = |bytes: u32| ((bytes >> 4) & 0x3fff) as u64;
        let mode: u64 = match self.swizzle_bytes {
            128 => 1,
            64 => 2,
            32 => 3,
            other => panic!("no descriptor swizzle mode for {other} bytes"),
        };
        field(self.start) | field(self.lbo) << 16 | field(self.sbo) << 32 | mode << 62
    }

    /// The descriptor `bits` encodes, or what makes it one kiln does not emit.
    pub fn decode(bits: u64) -> Result<Descriptor, String> {
        let field = |shift: u32| (((bits >> shift) & 0x3fff) as u32) << 4;
        let swizzle_bytes = match bits >> 62 {
            1 => 128,
            2 => 64,
            3 => 32,
            _ => return Err(format!("descriptor {bits:#x} is not swizzled")),
        };
        if (bits >> 49) & 7 != 0 {
            return Err(format!("descriptor {bits:#x} has a base offset"));
        }
        Ok(Descriptor {
            start: field(0),
            lbo: field(16),
            sbo: field(32),
            swizzle_bytes,
        })
    }

    /// The shared byte address `wgmma` reads element `(mn, k)` of its operand at (`mn` along M
    /// or N, `k < 16`), for `elem_bytes`-byte elements: the canonical layout, then the swizzle
    /// on the address (bits `[4, 4 + log2(S / 16))` XOR bits `[7, ..)`).
    pub fn element_offset(&self, major: Major, elem_bytes: usize, mn: usize, k: usize) -> u32 {
        let span = self.swizzle_bytes as usize;
        let per_span = span / elem_bytes;
        let linear = match major {
            Major::K => (mn % 8) * span + (mn / 8) * self.sbo as usize + k * elem_bytes,
            Major::MN => {
                (mn % per_span) * elem_bytes
                    + (mn / per_span) * self.lbo as usize
                    + (k % 8) * span
                    + (k / 8) * self.sbo as usize
            }
        };
        let address = self.start as usize + linear;
        let bits = (span / 16).trailing_zeros();
        let mask = ((1usize << bits) - 1) << 4;
        (address ^ ((address >> 3) & mask)) as u32
    }
}

/// How `wgmma` reads an operand stored in `tile` (logical `[m, k]` for A, `[k, n]` for B,
/// `is_a` saying which), of `elem_bytes`-byte elements: its major-ness and the descriptor of
/// the sub-matrix at logical `origin`, for a tile at byte `base` (a multiple of `8 S`). `None`
/// if the tile is not in a layout `wgmma` reads.
pub fn operand_descriptor(
    tile: &SwizzledShared,
    elem_bytes: usize,
    is_a: bool,
    base: u32,
    origin: [usize; 2],
) -> Option<(Major, Descriptor)> {
    let span = tile.wgmma_swizzle_bytes(elem_bytes)?;
    let k_dim = if is_a { 1 } else { 0 };
    let major = if tile.order[0] == k_dim {
        Major::K
    } else {
        Major::MN
    };
    let descriptor = Descriptor {
        start: base + (tile.unswizzled_offset(origin) * elem_bytes) as u32,
        // K-major: unused, "assumed 1"; MN-major: from one slab to the next.
        lbo: match major {
            Major::K => 16,
            Major::MN => (tile.rows() * span) as u32,
        },
        sbo: (8 * span) as u32,
        swizzle_bytes: span as u32,
    };
    Some((major, descriptor))
}
