//! Swizzled shared-memory tiles: where element `(row, col)` of a 2-D tile lives in shared memory,
//! so that both the 16-byte stores of a coalesced (blocked) layout and the `ldmatrix` reads of
//! the tensor-core operand loads are free of bank conflicts.
//!
//! This is the single source of truth for shared-memory offsets: the lowering computes addresses
//! with [`SwizzledShared::offset`], the CPU emulator places and finds elements with it and with
//! its inverse [`SwizzledShared::coords`]; the bank model ([`bank`], [`is_conflict_free_16b`]) is
//! what the tests (and any layout-stage assertion) judge a layout by.
//!
//! # The swizzle
//!
//! Triton's `SharedEncodingAttr` (`#shared<{vec, perPhase, maxPhase, order}>`; triton-lang/triton
//! `include/triton/Dialect/TritonGPU/IR/TritonGPUAttrDefs.td`, the "swizzled row-major layout"
//! description): the tile is stored with dimension `order[0]` contiguous (a *storage row* runs
//! along it) and `order[1]` strided. Within a storage row, elements are grouped in vectors of
//! `vec` contiguous elements, and the vector index is XORed with the row's *phase*:
//!
//! ```text
//! phase  = (row / per_phase) % max_phase
//! offset = row * row_len + ((col / vec) ^ phase) * vec + col % vec
//! ```
//!
//! With `vec` elements = 16 bytes this is the XOR swizzle on 16-byte chunks; it equals CUTLASS's
//! `cute::Swizzle<B, M, S>` (NVIDIA/cutlass `include/cute/swizzle.hpp`: `offset ^ ((offset &
//! yyy_msk) >> S)` with `yyy_msk = (2^B - 1) << (M + S)`) for `M = log2(vec)`, `B =
//! log2(max_phase)`, `S = log2(row_len * per_phase) - M` ([`SwizzledShared::cute_swizzle`]); for a
//! 64-element f16 row that is the familiar `Swizzle<3, 3, 3>`.
//!
//! # The chooser
//!
//! [`SwizzledShared::for_mma_operand`] follows Triton's Ampere rule for `mma.sync` operands
//! (`SharedEncodingAttr::get(dotOpEnc, ...)`, the `isAmpere()` branch: `perPhase = 128 /
//! (rowLen * elemBytes)` clamped to 1, `vec = matShape` along the contiguous dimension (8
//! elements of 16 bits: 16 bytes), `maxPhase = 8 / perPhase`): one phase spans 128 bytes of rows
//! (the 32 four-byte banks), and 8 phases separate the 8 rows an `ldmatrix` matrix reads. For f16
//! and bf16:
//!
//! | row length (elements) | row bytes | vec | per_phase | max_phase | CUTLASS |
//! | --- | --- | --- | --- | --- | --- |
//! | 32 | 64 | 8 | 2 | 4 | `Swizzle<2, 3, 3>` |
//! | 64 | 128 | 8 | 1 | 8 | `Swizzle<3, 3, 3>` |
//! | 128 | 256 | 8 | 1 | 8 | `Swizzle<3, 3, 4>` |
//! | 256 | 512 | 8 | 1 | 8 | `Swizzle<3, 3, 5>` |
//!
//! # The bank model
//!
//! Shared memory has 32 banks of 4 bytes: byte address `a` is in bank `(a / 4) % 32`. A warp's
//! 16-byte-per-lane access (a vectorised store, or `ldmatrix`, whose 8 row addresses per 8x8
//! matrix are read together) is served 8 lanes (128 bytes) at a time; it takes one wavefront when
//! those 8 accesses cover the 32 banks exactly once, that is, when they hit 8 distinct 16-byte
//! bank groups `(a / 16) % 8`.

/// Banks of shared memory.
pub const SHARED_BANKS: usize = 32;

/// Bytes per bank.
pub const BANK_BYTES: usize = 4;

/// Bytes one lane moves in a vectorised shared access, and in one `ldmatrix` row.
pub const ACCESS_BYTES: usize = 16;

/// Lanes whose 16-byte accesses are served together (one wavefront covers 128 bytes).
pub const LANES_PER_PHASE: usize = SHARED_BANKS * BANK_BYTES / ACCESS_BYTES;

/// The bank of a byte address.
pub fn bank(byte_addr: usize) -> usize {
    (byte_addr / BANK_BYTES) % SHARED_BANKS
}

/// Whether the 16-byte accesses at `byte_addrs` (the 8 lanes of one phase of a vectorised
/// access, or the 8 row addresses of one `ldmatrix` 8x8 matrix) are served in one wavefront:
/// each address is 16-byte aligned and together they cover all 32 banks exactly once.
pub fn is_conflict_free_16b(byte_addrs: &[usize]) -> bool {
    if byte_addrs.len() != LANES_PER_PHASE {
        return false;
    }
    let mut hits = [0u32; SHARED_BANKS];
    for &addr in byte_addrs {
        if addr % ACCESS_BYTES != 0 {
            return false;
        }
        for byte in (addr..addr + ACCESS_BYTES).step_by(BANK_BYTES) {
            hits[bank(byte)] += 1;
        }
    }
    hits.iter().all(|&h| h == 1)
}

/// A CUTLASS `cute::Swizzle<B, M, S>` (positive `S`): bits `[M + S, M + S + B)` of an offset are
/// XORed into bits `[M, M + B)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CuteSwizzle {
    pub b: u32,
    pub m: u32,
    pub s: u32,
}

impl CuteSwizzle {
    /// `offset ^ ((offset & yyy_msk) >> S)`, as `cute::Swizzle::apply`.
    pub fn apply(&self, offset: usize) -> usize {
        let yyy_msk = ((1usize << self.b) - 1) << (self.m + self.s);
        offset ^ ((offset & yyy_msk) >> self.s)
    }
}

/// A 2-D tile in shared memory, swizzled as Triton's `#shared<{vec, perPhase, maxPhase, order}>`
/// (see the module doc). Coordinates are logical `[dim0, dim1]` of the tile; `order[0]` is the
/// contiguous dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwizzledShared {
    /// Elements per swizzled vector (16 bytes for the layouts [`Self::for_mma_operand`] picks).
    pub vec: usize,
    /// Consecutive storage rows that share a phase.
    pub per_phase: usize,
    /// Number of distinct phases.
    pub max_phase: usize,
    /// Dimensions from fastest varying (contiguous) to slowest.
    pub order: [usize; 2],
    /// The logical shape of the tile.
    pub shape: [usize; 2],
    /// Elements of a storage row per slab: the contiguous dimension is cut into slabs that are
    /// stored one after the other, each holding every row (the whole row, one slab, unless
    /// [`Self::in_slabs`]). `wgmma` reads rows of at most 128 bytes, so a longer row is slabbed.
    pub slab: usize,
}

impl SwizzledShared {
    /// A swizzled tile; every parameter a power of two, and the XOR must stay inside a row
    /// (`vec * max_phase <= row length`).
    pub fn new(
        vec: usize,
        per_phase: usize,
        max_phase: usize,
        order: [usize; 2],
        shape: [usize; 2],
    ) -> SwizzledShared {
        assert!(
            order == [0, 1] || order == [1, 0],
            "order must be a permutation of [0, 1], got {order:?}"
        );
        for (name, v) in [
            ("vec", vec),
            ("per_phase", per_phase),
            ("max_phase", max_phase),
            ("shape[0]", shape[0]),
            ("shape[1]", shape[1]),
        ] {
            assert!(
                v.is_power_of_two(),
                "{name} must be a power of two, got {v}"
            );
        }
        let layout = SwizzledShared {
            vec,
            per_phase,
            max_phase,
            order,
            shape,
            slab: shape[order[0]],
        };
        assert!(
            max_phase == 1 || vec * max_phase <= layout.row_len(),
            "swizzle leaves the row: vec {vec} x max_phase {max_phase} > row length {}",
            layout.row_len()
        );
        layout
    }

    /// The same tile with its rows cut into slabs of `slab` elements (a power of two that
    /// divides the row and holds the swizzle).
    pub fn in_slabs(self, slab: usize) -> SwizzledShared {
        assert!(
            slab.is_power_of_two() && self.row_len().is_multiple_of(slab),
            "slab {slab} does not divide the row length {}",
            self.row_len()
        );
        assert!(
            self.max_phase == 1 || self.vec * self.max_phase <= slab,
            "swizzle leaves the slab: vec {} x max_phase {} > slab {slab}",
            self.vec,
            self.max_phase
        );
        SwizzledShared { slab, ..self }
    }

    /// The same bytes seen as the transposed tile.
    pub fn transposed(&self) -> SwizzledShared {
        SwizzledShared {
            order: [self.order[1], self.order[0]],
            shape: [self.shape[1], self.shape[0]],
            ..*self
        }
    }

    /// The same tile without a swizzle (row-major along `order`).
    pub fn unswizzled(order: [usize; 2], shape: [usize; 2]) -> SwizzledShared {
        SwizzledShared::new(1, 1, 1, order, shape)
    }

    /// The swizzle for a tile read by `ldmatrix` as an `mma.sync` operand and written with
    /// 16-byte vectors: Triton's Ampere rule (module doc). `elem_bytes` is 2 for f16/bf16 (the
    /// rule gives 16-byte vectors for 1-, 2- and 4-byte elements alike).
    pub fn for_mma_operand(
        elem_bytes: usize,
        shape: [usize; 2],
        order: [usize; 2],
    ) -> SwizzledShared {
        assert!(
            matches!(elem_bytes, 1 | 2 | 4),
            "element size {elem_bytes} bytes"
        );
        let row_len = shape[order[0]];
        let vec = (ACCESS_BYTES / elem_bytes).min(row_len);
        let row_bytes = row_len * elem_bytes;
        // Rows that fit in the 128 bytes of one pass over the banks share a phase.
        let per_phase = (SHARED_BANKS * BANK_BYTES / row_bytes).max(1);
        // Eight rows of an ldmatrix matrix need eight phases; no more than a row has vectors.
        let max_phase = (LANES_PER_PHASE / per_phase).clamp(1, row_len / vec);
        SwizzledShared::new(vec, per_phase, max_phase, order, shape)
    }

    /// The layout `wgmma` reads through a matrix descriptor (the PTX ISA's canonical layouts,
    /// [`super::wgmma`]): slabs of one swizzle span (128 bytes when the row is that long; 64 or
    /// 32 for a shorter one), 16-byte vectors, 8 phases over 8 rows of 128 bytes, 4 over 8 of
    /// 64, 2 over 8 of 32. `None` for a tile no swizzle mode covers: a row under 32 bytes, or
    /// rows not in groups of 8.
    pub fn for_wgmma_operand(
        elem_bytes: usize,
        shape: [usize; 2],
        order: [usize; 2],
    ) -> Option<SwizzledShared> {
        let (row_len, rows) = (shape[order[0]], shape[order[1]]);
        let span = (row_len * elem_bytes).min(super::wgmma::MAX_SWIZZLE_BYTES);
        if span < super::wgmma::MIN_SWIZZLE_BYTES || !rows.is_multiple_of(8) {
            return None;
        }
        let layout = SwizzledShared::new(
            ACCESS_BYTES / elem_bytes,
            SHARED_BANKS * BANK_BYTES / span,
            span / ACCESS_BYTES,
            order,
            shape,
        );
        Some(layout.in_slabs(span / elem_bytes))
    }

    /// The swizzle span in bytes (128, 64 or 32) when this is a layout `wgmma` reads
    /// ([`Self::for_wgmma_operand`]) for `elem_bytes` elements.
    pub fn wgmma_swizzle_bytes(&self, elem_bytes: usize) -> Option<usize> {
        let span = self.slab * elem_bytes;
        let canonical = SwizzledShared::for_wgmma_operand(elem_bytes, self.shape, self.order);
        (canonical == Some(*self)).then_some(span)
    }

    /// Elements along the contiguous dimension.
    pub fn row_len(&self) -> usize {
        self.shape[self.order[0]]
    }

    /// Storage rows (along the strided dimension).
    pub fn rows(&self) -> usize {
        self.shape[self.order[1]]
    }

    /// Elements in the tile (the allocation is `len() * elem_bytes` bytes).
    pub fn len(&self) -> usize {
        self.shape[0] * self.shape[1]
    }

    /// Whether the tile has no elements (never, for a valid shape).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The phase of storage row `row`.
    pub fn phase(&self, row: usize) -> usize {
        (row / self.per_phase) % self.max_phase
    }

    /// The element offset of logical `coords`.
    pub fn offset(&self, coords: [usize; 2]) -> usize {
        let row = coords[self.order[1]];
        let col = coords[self.order[0]];
        debug_assert!(
            row < self.rows() && col < self.row_len(),
            "{coords:?} outside {:?}",
            self.shape
        );
        self.slab_start(col) + self.offset_in_slab(row, col % self.slab)
    }

    /// Where the slab that holds column `col` starts.
    fn slab_start(&self, col: usize) -> usize {
        col / self.slab * self.slab * self.rows()
    }

    fn offset_in_slab(&self, row: usize, col: usize) -> usize {
        let chunk = (col / self.vec) ^ self.phase(row);
        row * self.slab + chunk * self.vec + col % self.vec
    }

    /// The element offset of logical `coords` before the swizzle: where a sub-tile that starts
    /// there starts, for hardware that applies the swizzle to addresses itself (`wgmma`).
    pub fn unswizzled_offset(&self, coords: [usize; 2]) -> usize {
        let (row, col) = (coords[self.order[1]], coords[self.order[0]]);
        self.slab_start(col) + row * self.slab + col % self.slab
    }

    /// The logical coordinates stored at element `offset`: the inverse of [`Self::offset`].
    pub fn coords(&self, offset: usize) -> [usize; 2] {
        debug_assert!(offset < self.len());
        let slab_elems = self.slab * self.rows();
        let (slab, offset) = (offset / slab_elems, offset % slab_elems);
        let row = offset / self.slab;
        let within = offset % self.slab;
        let col = slab * self.slab
            + ((within / self.vec) ^ self.phase(row)) * self.vec
            + within % self.vec;
        let mut coords = [0; 2];
        coords[self.order[1]] = row;
        coords[self.order[0]] = col;
        coords
    }

    /// Whether `count` elements from `coords` along the contiguous dimension are contiguous in
    /// memory too (a vector access of them is one access).
    pub fn is_contiguous_run(&self, coords: [usize; 2], count: usize) -> bool {
        let col = coords[self.order[0]];
        col % self.vec + count <= self.vec
            || self.max_phase == 1 && col % self.slab + count <= self.slab
    }

    /// The equivalent CUTLASS swizzle of element offsets into a row-major (along `order`) slab,
    /// when there is one (CUTLASS needs `B <= S`).
    pub fn cute_swizzle(&self) -> Option<CuteSwizzle> {
        let log2 = |v: usize| v.trailing_zeros();
        let m = log2(self.vec);
        let b = log2(self.max_phase);
        let s = (log2(self.slab) + log2(self.per_phase)).checked_sub(m)?;
        (b <= s).then_some(CuteSwizzle { b, m, s })
    }
}
