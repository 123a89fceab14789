//! TMA stores: which `store_block`s write their tile out of shared memory with the Tensor
//! Memory Accelerator rather than from registers.
//!
//! A store from an mma accumulator's layout writes 4 bytes a thread per instruction, each warp a
//! scatter of 16-byte pieces over 8 rows: a 128 x 128 tile of 16-bit elements is 32 stores a
//! thread, and where a program is short (the forward at seqlen 1k) the memory pipe's queue is
//! what its last microseconds wait on (docs/PERF.md, 2026-11-26). FlashAttention-3 writes O
//! through shared memory with TMA instead, and so does kiln where it can: each thread writes its
//! elements into a swizzled shared tile (conflict-free 4-byte stores), the block meets at a
//! barrier after fencing the async proxy, and one lane issues a `cp.async.bulk.tensor` per
//! slab one swizzle span wide (128 bytes, or 64 or 32 for a shorter row), which clips what lies
//! outside the array itself. The lane waits for the copies to have read shared memory before
//! the program ends. Where each warpgroup holds rows of its own (the `wgmma` accumulator), each
//! stores them alone, meeting only its own warps at a named barrier: a warpgroup that finishes
//! first need not wait for the others.
//!
//! A store qualifies where `dot`s run on `wgmma` (sm_90a) and it stands in the kernel's top
//! level after its pipelined loops, which all copy with TMA (its tile goes where their buffers
//! were, and fits there: a TMA loop ends with every copy landed and a `bar.sync`), with no
//! pipelined loop and no load after it (the program waits for its copies to have read shared
//! memory, not for their writes to land); its tile is 2-D of 16-bit elements that a TMA box
//! covers, and its array is described whole by kernel arguments, as a TMA load's must be
//! ([`super::pipeline`]).
//!
//! An `atomic_add` of a 2-D f32 tile through a block pointer described the same way is a TMA
//! reduction (`cp.reduce.async.bulk.tensor .add`), anywhere in the kernel, loops included: its
//! tile is its own (every reduction shares one, after the staged tiles), and before writing it
//! the issuing lanes wait for the last reduction's reads. Through a block pointer of order
//! [0, 1] (a transposed view of its array) it goes through a shared tile of that order, which is
//! the array's row-major tile; where each warpgroup holds its own rows of the value, they are
//! whole slabs.
//!
//! With a producer warpgroup, a `store_block` inside a loop (a persistent kernel's output, once
//! a tile) goes out the same way, from that tile of its own: each warpgroup writes its band once
//! the last store's reads are done, while the producer's copies for the next tile go on.

use std::collections::{BTreeMap, BTreeSet};

use kiln_dsl::DType;
use kiln_dsl::ir::{Inst, Kernel, Op, Value};

use super::divisibility::{Divisibility, definitions};
use super::pipeline::{
    Carriers, loop_carriers, stores_after_loops, tile_loops, tma_view, top_level,
};
use super::swizzle::SwizzledShared;
use super::wgmma::WARPS_PER_WARPGROUP;
use super::{LayoutAssignment, SharedLayout, THREADS_PER_WARP};

/// A `store_block` TMA copies out of shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaStore {
    /// The stored tile, as it is in registers.
    pub value: Value,
    /// The layout of the shared tile it goes through: what the map's box and swizzle read.
    pub shared: SharedLayout,
    /// The tensor map it copies through (an index into the kernel's maps), and the
    /// `make_block_ptr` offsets that index the array's leading dimensions, outermost first.
    pub map: usize,
    pub leading: Vec<Value>,
    /// How many bands of rows the tile is stored in: where each warpgroup holds a band of its
    /// own (the `wgmma` accumulator, warps along M), each stores its band as soon as it has
    /// written it, without waiting for the others (the map's box is one band); else 1.
    pub bands: usize,
    /// An `atomic_add`: TMA adds the tile into the array.
    pub reduce: bool,
    /// From a shared tile of its own (every such store shares one, see the module doc), the
    /// last one's reads waited for before writing it, rather than from the drained loops'
    /// buffers: a reduction, or a store inside a loop.
    pub own_tile: bool,
    /// The reduction of a `dot` one warpgroup computes
    /// ([`LayoutAssignment::one_warpgroup_dot`]): that warpgroup writes the whole tile (one
    /// band) and meets only its own warps; it met the others before the `dot`, once their
    /// issuing lanes had waited for their last reductions' reads.
    pub by_one_warpgroup: bool,
}

impl TmaStore {
    /// Whether the block pointer is a transposed view of its array (order [0, 1]): the shared
    /// tile's storage rows are the value's columns, and a band is whole slabs.
    pub fn transposed(&self) -> bool {
        self.shared.order == [0, 1]
    }
}

/// Finds the kernel's TMA stores and reductions and records them in `assignment`, after its
/// pipelined loops.
pub(super) fn apply(
    kernel: &Kernel,
    divisibility: &Divisibility,
    assignment: &mut LayoutAssignment,
) {
    if !assignment.uses_wgmma() {
        return;
    }
    let views = Views {
        kernel,
        divisibility,
        definitions: definitions(kernel),
        carriers: loop_carriers(&kernel.body),
    };
    let mut stores = stores(&views, assignment);
    let mut own_tile = stores_in_loops(&views, assignment);
    own_tile.append(&mut reductions(&views, assignment));
    one_band_unless_all_alike(kernel, assignment, &mut own_tile);
    stores.append(&mut own_tile);
    assignment.tma_stores = stores;
}

/// The stores from a tile of their own share it, each waiting for the last one's reads: the same
/// bands of rows for all, or one band (the whole block meets) if they differ.
fn one_band_unless_all_alike(
    kernel: &Kernel,
    assignment: &mut LayoutAssignment,
    stores: &mut BTreeMap<usize, TmaStore>,
) {
    let bands: BTreeSet<usize> = stores.values().map(|s| s.bands).collect();
    if bands.len() < 2 {
        return;
    }
    for store in stores.values_mut() {
        store.bands = 1;
        // A band of slabs copies by the same box; one of rows copies a band's rows.
        if store.transposed() {
            continue;
        }
        let mut whole = assignment.tensor_maps[store.map].clone();
        let lead = whole.box_shape.len() - 2;
        whole.box_shape[lead] = kernel.ty(store.value).shape()[0] as u32;
        store.map = assignment.tensor_map(whole);
    }
}

/// What deciding a tile's TMA view takes of the kernel ([`tma_view`]).
struct Views<'k> {
    kernel: &'k Kernel,
    divisibility: &'k Divisibility,
    definitions: Vec<Option<&'k Inst>>,
    carriers: Carriers<'k>,
}

/// The top-level `store_block`s TMA copies out of the drained loops' buffers.
fn stores(views: &Views<'_>, assignment: &mut LayoutAssignment) -> BTreeMap<usize, TmaStore> {
    let kernel = views.kernel;
    let pipelines = &assignment.pipelines;
    if pipelines.is_empty() || !pipelines.values().all(|p| p.uses_tma()) {
        return BTreeMap::new();
    }
    // The program waits for its copies to have read shared memory, not for their writes.
    let mut last_load = None;
    let mut next = 0;
    super::walk_insts(&kernel.body, &mut next, &mut |index, inst| {
        if matches!(inst.op, Op::Load { .. } | Op::LoadBlock { .. }) {
            last_load = Some(index);
        }
    });
    stores_after_loops(kernel, assignment, last_load, |assignment, store, _| {
        through_shared(views, assignment, (store.ptr, store.value), false)
    })
}

/// The `store_block`s in the body of a top-level loop that is not pipelined, where a producer
/// warpgroup feeds the kernel (a persistent kernel's output, once a tile), that TMA copies out of
/// a tile of their own, as reductions: the warpgroups' stores from registers would queue in the
/// memory pipe while the next tile starts.
fn stores_in_loops(
    views: &Views<'_>,
    assignment: &mut LayoutAssignment,
) -> BTreeMap<usize, TmaStore> {
    let mut found = Vec::new();
    for (start, body) in tile_loops(views.kernel, assignment) {
        for (index, inst) in top_level(body, start + 1) {
            if let Op::StoreBlock { ptr, value, .. } = &inst.op {
                found.push((index, *ptr, *value));
            }
        }
    }
    let mut stores = BTreeMap::new();
    for (index, ptr, value) in found {
        if let Some(store) = through_shared(views, assignment, (ptr, value), false) {
            stores.insert(
                index,
                TmaStore {
                    own_tile: true,
                    ..store
                },
            );
        }
    }
    stores
}

/// The f32 `atomic_add`s of block pointers, anywhere in the kernel, that TMA adds into their
/// array (`cp.reduce.async.bulk.tensor .add`) from a tile of their own: one bulk reduction a
/// slab instead of a vector atomic per 4 elements a thread (the fused backward's dQ, as
/// FlashAttention-3 adds it). They share one tile with the stores in loops
/// ([`one_band_unless_all_alike`]).
fn reductions(views: &Views<'_>, assignment: &mut LayoutAssignment) -> BTreeMap<usize, TmaStore> {
    let kernel = views.kernel;
    let mut found = Vec::new();
    let mut next = 0;
    super::walk_insts(&kernel.body, &mut next, &mut |index, inst| {
        if let Op::AtomicAddBlock { ptr, value, .. } = &inst.op {
            found.push((index, *ptr, *value));
        }
    });
    let mut reductions = BTreeMap::new();
    for (index, ptr, value) in found {
        if kernel.dtype(value) != DType::F32 {
            continue;
        }
        let view = (ptr, value);
        let by_one_warpgroup = index > 0 && assignment.one_warpgroup_dot(index - 1).is_some();
        if let Some(reduction) = through_shared(views, assignment, view, true) {
            // One band: the warpgroup that computed it holds every row.
            let reduction = TmaStore {
                by_one_warpgroup,
                ..reduction
            };
            reductions.insert(index, reduction);
        }
    }
    reductions
}

/// How `value`, a 2-D tile of 16-bit elements (f32 for a reduction) stored at `ptr`, goes out
/// through a swizzled shared tile by TMA, if it can: the tile's layout, the tensor map (its box
/// one band of rows) and the bands. A reduction through a block pointer of order [0, 1] (a
/// transposed view of its array) goes through a tile whose first dimension is contiguous: the
/// tile's storage rows are its columns, and a band is then whole slabs.
fn through_shared(
    views: &Views<'_>,
    assignment: &mut LayoutAssignment,
    (ptr, value): (Value, Value),
    reduce: bool,
) -> Option<TmaStore> {
    let kernel = views.kernel;
    let elem_bytes = kernel.dtype(value).size_bytes();
    let shape = <[usize; 2]>::try_from(kernel.ty(value).shape()).ok()?;
    if elem_bytes != if reduce { 4 } else { 2 } {
        return None;
    }
    // Reductions only through transposed views: no store needs one yet, and none is tested.
    let orders: &[[usize; 2]] = if reduce { &[[1, 0], [0, 1]] } else { &[[1, 0]] };
    let (shared, (mut spec, leading)) = orders.iter().find_map(|&order| {
        let tile = SwizzledShared::for_wgmma_operand(elem_bytes, shape, order)?;
        let shared = SharedLayout::from_swizzled(&tile);
        let view = (ptr, value, Some(&shared));
        let found = tma_view(
            kernel,
            views.divisibility,
            &views.definitions,
            &views.carriers,
            view,
            true,
        )?;
        Some((shared, found))
    })?;
    let transposed = shared.order == [0, 1];
    let band_multiple = match shared.slab {
        Some(slab) if transposed => slab as usize,
        _ => 8,
    };
    let bands = row_bands(assignment, value, shape, band_multiple);
    if !transposed {
        let lead = spec.box_shape.len() - 2;
        spec.box_shape[lead] = (shape[0] / bands) as u32;
    }
    let map = assignment.tensor_map(spec);
    Some(TmaStore {
        value,
        shared,
        map,
        leading,
        bands,
        reduce,
        own_tile: reduce,
        by_one_warpgroup: false,
    })
}

/// The warpgroups of the program where each holds only rows `[w R, (w + 1) R)` of `value`, a
/// tile of `shape` (`R`, its rows over the warpgroups, a multiple of `multiple`: 8-row
/// swizzle periods, or whole slabs where its rows are the shared tile's columns); 1 where they
/// do not, or the program has one warpgroup.
fn row_bands(
    assignment: &LayoutAssignment,
    value: Value,
    shape: [usize; 2],
    multiple: usize,
) -> usize {
    let groups = (assignment.num_warps / WARPS_PER_WARPGROUP) as usize;
    let rows = shape[0] / groups.max(1);
    if groups < 2 || !shape[0].is_multiple_of(groups) || !rows.is_multiple_of(multiple) {
        return 1;
    }
    let Some(map) = assignment
        .layout(value)
        .and_then(|layout| layout.thread_map(&shape))
    else {
        return 1;
    };
    let banded = (0..assignment.num_warps).all(|warp| {
        let band = (warp / WARPS_PER_WARPGROUP) as usize * rows;
        (0..THREADS_PER_WARP).all(|lane| {
            (0..map.registers.len()).all(|r| {
                let row = map.position(warp, lane, r).coords[0];
                (band..band + rows).contains(&row)
            })
        })
    });
    if banded { groups } else { 1 }
}
