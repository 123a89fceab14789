//! Stores through the drained loops' buffers: which `store_block`s first move their tile into
//! the coalescing layout through shared memory, so that it leaves the program in 16-byte vector
//! stores.
//!
//! An mma accumulator's layout gives each thread pairs of adjacent elements: a 128 x 128 tile
//! of 16-bit elements leaves in 64 4-byte stores a thread, each warp's a scatter of 16-byte
//! pieces over 8 rows, and the memory pipe's queue is what a short program's last microseconds
//! wait on (docs/PERF.md, 2026-11-26). Triton converts such a value to the coalescing blocked
//! layout before its store, and FlashAttention-2 writes O so: each thread writes its pairs into
//! a swizzled shared tile (conflict-free, as `ldmatrix`'s operands are), the block meets at a
//! barrier, and each thread reads 16 contiguous bytes of a row back and stores them whole: 16
//! stores a thread for that tile. On `wgmma` the TMA store does the same where it can
//! ([`super::tma_store`]). The conversion's addresses derive from the thread index read again
//! (`thread::lower`): from the prelude's, LLVM kept them live across the loops, and ptxas
//! spilled in them (docs/PERF.md, twenty-eighth session).
//!
//! A store of a 2-D tile of 16-bit elements qualifies where it stands in the kernel's top level
//! after every pipelined loop, whose buffers it goes through: they are drained there (a
//! `cp.async` loop waits for its last copies, TMA issues none past the end), and it takes them
//! only where no TMA store took them and its tile fits, so that it never grows shared memory;
//! and where the coalescing layout's accesses are wider than those of the layout it is held in
//! (the divisibility analysis proves both aligned): on `mma.sync` every output tile, on `wgmma`
//! those not described whole for TMA (dK and dV). The conversion is a [`Conversion`] at the
//! store ([`ConversionKind::ThroughBuffers`]): the layout text prints it.

use kiln_dsl::ir::Kernel;

use super::pipeline::{StoreAfterLoops, stores_after_loops};
use super::swizzle::SwizzledShared;
use super::{
    BlockedLayout, Conversion, ConversionKind, Layout, LayoutAssignment, SharedLayout, ThreadMap,
};

/// Adds a conversion through the drained loops' buffers before each `store_block` that
/// qualifies (module doc).
pub(super) fn apply(kernel: &Kernel, assignment: &mut LayoutAssignment) {
    // Where TMA stores took the drained buffers, they took every store they could.
    let by_tma = assignment.tma_stores.values().any(|s| !s.own_tile);
    // The fused dK/dV by turns (not shipped): compute-sanitizer's racecheck reports hazards
    // between the conversion's writes and reads there where the query loop runs once (run 331,
    // docs/PERF.md, twenty-eighth session), which the emulator does not find; until that is
    // understood, its stores stay in registers.
    if assignment.pipelines.is_empty() || by_tma || assignment.has_one_warpgroup_dots() {
        return;
    }
    let stores = stores_after_loops(kernel, assignment, None, |assignment, store, offset| {
        coalesced(kernel, assignment, store, offset)
    });
    for (index, conversion) in stores {
        assignment
            .conversions
            .entry(index)
            .or_default()
            .push(conversion);
    }
}

/// The conversion of `store`'s value into the coalescing layout through a tile `offset` bytes
/// into the drained loops' buffers, where that layout's vector stores are wider.
fn coalesced(
    kernel: &Kernel,
    assignment: &LayoutAssignment,
    store: StoreAfterLoops<'_>,
    offset: usize,
) -> Option<Conversion> {
    let elem_bytes = kernel.dtype(store.value).size_bytes();
    let shape = <[usize; 2]>::try_from(kernel.ty(store.value).shape()).ok()?;
    // 16-bit tiles, what every kernel stores after its loops: an f32 tile would go through the
    // same code, but none is stored so yet, and none is tested.
    if elem_bytes != 2 {
        return None;
    }
    let held = assignment.layout(store.value)?.thread_map(&shape)?;
    let read = BlockedLayout::coalesced(&shape, elem_bytes, assignment.num_warps);
    let read_map = read.thread_map(&shape);
    let vector = |map: &ThreadMap| {
        let divisibility = &assignment.divisibility;
        divisibility.widest_vector(store.ptr, map, store.boundary_check, elem_bytes)
    };
    if !read_map.is_exclusive() || vector(&read_map) <= vector(&held) {
        return None;
    }
    let tile = SwizzledShared::for_mma_operand(elem_bytes, shape, [1, 0]);
    Some(Conversion {
        value: store.value,
        to: Layout::Blocked(read),
        kind: ConversionKind::ThroughBuffers {
            shared: SharedLayout::from_swizzled(&tile),
            offset,
        },
    })
}
