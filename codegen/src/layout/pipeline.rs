//! Software pipelining, the layout stage's last pass: which loads of a streaming loop are
//! copied into shared memory with `cp.async`, several iterations ahead.
//!
//! A load qualifies (Triton's `Pipeliner` for `mma.sync`) when it sits directly in a `for`
//! body, reads a block pointer the loop carries and yields advanced by the same amounts every
//! iteration (`k_block = advance(k_block, [BLOCK_N, 0])`), and only `dot`s read what it loads
//! (directly or through a `trans` that only dots read), so that the tile need never be in
//! registers: the layout stage staged it into a swizzled shared tile (a TMA loop also takes row
//! vectors that registers read: see the last paragraph). The copy must also move 16
//! bytes per thread and vector ([`Divisibility::vector_elems`]: the block pointer's base,
//! strides and offsets are aligned, a checked dimension along the vectors is a multiple of
//! them) from an exclusive blocked layout whose runs fill whole swizzled vectors.
//!
//! Such a loop with `num_stages = S` gets `S` shared buffers per load: a prologue issues the
//! copies of iterations `0 .. S - 2` (one `cp.async` group each); iteration `i` waits for its
//! own group (`cp.async.wait_group S - 2`), meets the block at a barrier, issues the copies of
//! iteration `i + S - 1` into the buffer iteration `i - 1` read, then computes on buffer
//! `i % S` while those copies fly. Rows outside the array, and iterations past the loop's end,
//! copy zero source bytes (`src_size = 0`: zero-filled, nothing read). The thread stage
//! ([`mod@crate::thread::lower`]) emits that; this pass only decides, and drops the staging of
//! each pipelined load.
//!
//! Where `dot`s run on `wgmma` (sm_90a), a loop whose every load reads an array described whole
//! by kernel arguments (its block pointer comes, through `advance`s and loops that carry it, from
//! a `make_block_ptr` whose base is a pointer argument and whose shape and strides are
//! arguments or constants, the last stride 1) copies with the Tensor Memory Accelerator instead:
//! one thread issues a `cp.async.bulk.tensor` per 128-byte-wide slab of each swizzled tile, on an
//! `mbarrier` per buffer that everyone waits on. The launch builds the arrays' tensor maps
//! ([`TensorMapSpec`]); rows outside the array are zero-filled by the copy itself. A load at the
//! kernel's top level that only `dot`s read, of such an array, is one TMA copy too, into its
//! staged tile ([`OnceLoad`]), at any `num_stages`; its staging is dropped likewise.
//!
//! A TMA loop also streams the loads of its body that only registers read (no `dot`), of row
//! vectors of 16- or 32-bit floats, from
//! arrays described whole, whose tiles TMA can copy unswizzled (rows of 16-byte multiples, at
//! most 256 elements a dimension): the backward's per-row statistics, which the scores
//! want in their column layout, 16 to 32 columns a thread. Their buffers are plain row-major
//! tiles ([`PipelinedLoad::shared`] is `None`), filled with the loop's other copies, and where
//! the load stands each thread reads its elements from the iteration's buffer: the data is
//! there, waited for with the rest, rather than each thread loading from global memory when
//! the scores want it.

use std::collections::{BTreeMap, HashMap};

use kiln_dsl::ir::{Inst, Kernel, Op, Region, Value};
use kiln_dsl::passes::for_each_operand;
use kiln_dsl::types::DType;
use kiln_dsl::{MapScalar, TensorMapSpec};

use super::divisibility::{Divisibility, advanced_params, constant_int, defined_in, definitions};
use super::{ConversionKind, Layout, LayoutAssignment, SharedLayout};
use crate::CompileOptions;

/// Bytes one `cp.async.cg` moves.
pub const COPY_BYTES: usize = 16;

/// A load a loop streams through shared memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelinedLoad {
    /// The `load_block`'s pre-order index.
    pub inst_index: usize,
    /// What it loads: a tile only `dot`s read, from the shared buffer of the iteration.
    pub value: Value,
    /// The carried block pointer it reads.
    pub param: Value,
    /// How far the loop advances that pointer per iteration, per dimension.
    pub deltas: Vec<Delta>,
    pub boundary_check: Vec<usize>,
    /// Each buffer's layout: the staging layout the load would otherwise have had; `None` for
    /// a load whose tile registers read, a row-major tile copied unswizzled (with TMA only).
    pub shared: Option<SharedLayout>,
    /// With TMA: the tensor map it copies through (an index into the kernel's maps), and the
    /// `make_block_ptr` offsets that index the array's leading dimensions, outermost first.
    pub tma: Option<TmaLoad>,
}

impl PipelinedLoad {
    /// Whether each thread reads its part of the tile from the buffer into registers, where
    /// the load stands, rather than `dot`s reading the buffer.
    pub fn read_in_registers(&self) -> bool {
        self.shared.is_none()
    }
}

/// How a pipelined load copies with TMA: through the kernel's tensor map `map`, whose box is
/// one copy (a 128-, 64- or 32-byte slab of the tile's rows; unswizzled, the whole tile).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmaLoad {
    pub map: usize,
    pub leading: Vec<Value>,
}

/// A load copied with TMA into a staged tile of its own (the layout stage's `once_loads`):
/// once, at the kernel's top level, or once an iteration of a top-level loop that a producer
/// warpgroup feeds (`refill`: a persistent kernel's tile loop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OnceLoad {
    /// What it loads: a tile only `dot`s read.
    pub value: Value,
    /// The tile's layout: the staging layout the load would otherwise have had.
    pub shared: SharedLayout,
    pub tma: TmaLoad,
    /// In a loop's body, the pre-order index of the body's last instruction that reads the
    /// tile (or a `trans` view of it): the consumers free the tile after it (once its `dot`s
    /// are waited for), and the producer copies the next iteration's (a `full` and an `empty`
    /// `mbarrier` of its own). `None` at the top level: copied once.
    pub released_after: Option<usize>,
    /// Refilled into the slot of the ring the loop's TMA loops stream through, in the buffer of
    /// the ring's load of this index, rather than into a tile of its own (the layout stage's
    /// `ring_refills`).
    pub ring: Option<usize>,
}

impl OnceLoad {
    /// Whether it is copied once an iteration of a loop, by the producer.
    pub fn refills(&self) -> bool {
        self.released_after.is_some()
    }

    /// Whether it has a shared tile of its own (not a slot of the ring).
    pub fn has_tile(&self) -> bool {
        self.ring.is_none()
    }
}

/// How far a pipelined load's block pointer moves per iteration along one dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delta {
    Constant(i64),
    /// A scalar defined before the loop.
    Value(Value),
}

/// A pipelined loop: its depth and loads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipelinedLoop {
    pub stages: u32,
    pub loads: Vec<PipelinedLoad>,
}

impl PipelinedLoop {
    /// Whether its loads copy with TMA (all of them do, or none).
    pub fn uses_tma(&self) -> bool {
        self.loads.iter().all(|l| l.tma.is_some())
    }
}

/// Finds the pipelined loads of `kernel` (none below two stages) and records them, by the
/// pre-order index of their `for`, in `assignment`, dropping their staging conversions.
pub(super) fn apply(
    kernel: &Kernel,
    options: &CompileOptions,
    divisibility: &Divisibility,
    assignment: &mut LayoutAssignment,
) {
    if options.num_stages < 2 {
        return;
    }
    let readers = readers(kernel);
    let definitions = definitions(kernel);
    let carriers = loop_carriers(&kernel.body);
    let mut loops = BTreeMap::new();
    let mut next = 0;
    find_loops(&kernel.body, &mut next, &mut |for_index, body| {
        let advanced = advanced_params(body);
        let inside = defined_in(body);
        let mut at = for_index + 1;
        let mut loads = Vec::new();
        let mut read_in_registers = Vec::new();
        for inst in &body.insts {
            let inst_index = at;
            at += inst_count(inst);
            let Op::LoadBlock {
                ptr,
                boundary_check,
            } = &inst.op
            else {
                continue;
            };
            let value = inst.results[0];
            let Some(deltas) = advanced.get(ptr) else {
                continue;
            };
            let deltas: Option<Vec<Delta>> = deltas
                .iter()
                .map(|&d| match constant_int(kernel, &definitions, d) {
                    Some(c) => Some(Delta::Constant(c)),
                    None if inside.contains(&d) => None,
                    None => Some(Delta::Value(d)),
                })
                .collect();
            let Some(deltas) = deltas else {
                continue;
            };
            let mut load = PipelinedLoad {
                inst_index,
                value,
                param: *ptr,
                deltas,
                boundary_check: boundary_check.clone(),
                shared: None,
                tma: None,
            };
            match readers[value.index()] {
                Readers::Dots => {}
                // Row vectors only: a 2-D tile's unswizzled buffer would conflict on banks.
                Readers::Registers
                    if kernel.ty(value).shape().len() == 1
                        && matches!(kernel.dtype(value), DType::F16 | DType::BF16 | DType::F32) =>
                {
                    read_in_registers.push(load);
                    continue;
                }
                _ => continue,
            }
            let Some(shared) = staging(assignment, value) else {
                continue;
            };
            if !copies_whole_vectors(kernel, assignment, divisibility, inst, &shared) {
                continue;
            }
            load.shared = Some(shared);
            loads.push(load);
        }
        if assignment.uses_wgmma() && !loads.is_empty() {
            let view = |l: &PipelinedLoad| {
                let view = (l.param, l.value, l.shared.as_ref());
                tma_view(kernel, divisibility, &definitions, &carriers, view, false)
            };
            let views: Option<Vec<_>> = loads.iter().map(view).collect();
            if let Some(views) = views {
                // A TMA loop: the loads registers read join it where TMA can copy them too.
                let joining: Vec<_> = read_in_registers
                    .into_iter()
                    .filter_map(|l| view(&l).map(|v| (l, v)))
                    .collect();
                let (joined, joined_views): (Vec<_>, Vec<_>) = joining.into_iter().unzip();
                loads.extend(joined);
                for (load, (spec, leading)) in
                    loads.iter_mut().zip(views.into_iter().chain(joined_views))
                {
                    let map = assignment.tensor_map(spec);
                    load.tma = Some(TmaLoad { map, leading });
                }
            }
        }
        if !loads.is_empty() {
            loops.insert(
                for_index,
                PipelinedLoop {
                    stages: options.num_stages,
                    loads,
                },
            );
        }
    });
    for pipelined in loops.values() {
        for load in pipelined.loads.iter().filter(|l| !l.read_in_registers()) {
            for conversions in assignment.conversions.values_mut() {
                conversions.retain(|c| !(c.value == load.value && c.kind == ConversionKind::Stage));
            }
        }
    }
    assignment.conversions.retain(|_, c| !c.is_empty());
    assignment.pipelines = loops;
}

/// The kernel's top-level loads that only `dot`s read (staged) from arrays described whole, by
/// the pre-order index of their `load_block`, their staging dropped: each is one TMA copy into
/// its tile, issued where the load stands and waited for where the tile is first read, rather
/// than a load into registers and a store to shared memory that wait for the data where the load
/// stands (the forward's first K and last V tiles). With a producer warpgroup, so are such
/// loads in the body of a top-level loop that is not itself pipelined (a persistent kernel's
/// loop over its tiles: Q, the first K and last V of each).
pub(super) fn once_loads(
    kernel: &Kernel,
    divisibility: &Divisibility,
    assignment: &mut LayoutAssignment,
) -> BTreeMap<usize, OnceLoad> {
    if !assignment.uses_wgmma() {
        return BTreeMap::new();
    }
    // A tile also read in registers must be loaded into them.
    let readers = readers(kernel);
    let definitions = definitions(kernel);
    let carriers = loop_carriers(&kernel.body);
    let mut once = BTreeMap::new();
    // The candidates: each top-level instruction, and each instruction of a producer's tile
    // loop's body, by pre-order index.
    let mut candidates: Vec<_> = top_level(&kernel.body, 0)
        .map(|(at, inst)| (at, inst, None))
        .collect();
    for (start, body) in tile_loops(kernel, assignment) {
        let in_loop = Some((body, start + 1));
        candidates.extend(top_level(body, start + 1).map(|(at, inst)| (at, inst, in_loop)));
    }
    for (inst_index, inst, in_loop) in candidates {
        let Op::LoadBlock { ptr, .. } = &inst.op else {
            continue;
        };
        let value = inst.results[0];
        let dots_only = readers[value.index()] == Readers::Dots;
        let Some(shared) = staging(assignment, value).filter(|_| dots_only) else {
            continue;
        };
        let view = (*ptr, value, Some(&shared));
        if let Some((spec, leading)) =
            tma_view(kernel, divisibility, &definitions, &carriers, view, false)
        {
            let map = assignment.tensor_map(spec);
            let tma = TmaLoad { map, leading };
            let released_after = in_loop.map(|(body, start)| last_reader(body, start, value));
            let load = OnceLoad {
                value,
                shared,
                tma,
                released_after,
                ring: None,
            };
            once.insert(inst_index, load);
        }
    }
    ring_refills(kernel, assignment, &mut once);
    for load in once.values() {
        for conversions in assignment.conversions.values_mut() {
            conversions.retain(|c| !(c.value == load.value && c.kind == ConversionKind::Stage));
        }
    }
    assignment.conversions.retain(|_, c| !c.is_empty());
    once
}

/// A top-level `store_block` after the pipelined loops ([`stores_after_loops`]).
pub(super) struct StoreAfterLoops<'k> {
    pub ptr: Value,
    pub value: Value,
    pub boundary_check: &'k [usize],
}

/// The top-level `store_block`s after every pipelined loop (and after instruction
/// `not_before`) that `through_shared` takes, each given where its tile would start (bytes
/// from the drained loops' buffers), as long as their tiles fit one after the other where
/// those buffers were: by pre-order index.
pub(super) fn stores_after_loops<T>(
    kernel: &Kernel,
    assignment: &mut LayoutAssignment,
    not_before: Option<usize>,
    mut through_shared: impl FnMut(&mut LayoutAssignment, StoreAfterLoops<'_>, usize) -> Option<T>,
) -> BTreeMap<usize, T> {
    let room = drained_room(kernel, assignment);
    let last_loop = assignment.pipelines.keys().next_back().copied();
    let mut stores = BTreeMap::new();
    let mut taken = 0;
    for (index, inst) in top_level(&kernel.body, 0) {
        let Op::StoreBlock {
            ptr,
            value,
            boundary_check,
        } = &inst.op
        else {
            continue;
        };
        let after = |last: Option<usize>| last.is_some_and(|l| l > index);
        let bytes = assignment.shared_tile_bytes(kernel, *value);
        if after(last_loop) || after(not_before) || taken + bytes > room {
            continue;
        }
        let store = StoreAfterLoops {
            ptr: *ptr,
            value: *value,
            boundary_check,
        };
        if let Some(store) = through_shared(assignment, store, taken) {
            taken += bytes;
            stores.insert(index, store);
        }
    }
    stores
}

/// The most shared memory any pipelined loop's buffers take: the room that stores after the
/// loops have where the buffers were (every top-level loop's buffers start at the same place,
/// a nested loop's above its outer one's: `thread::lower`'s shared plan, so that the largest
/// single loop's is a safe bound).
fn drained_room(kernel: &Kernel, assignment: &LayoutAssignment) -> usize {
    let buffers = |p: &PipelinedLoop| {
        let tiles: usize = p
            .loads
            .iter()
            .map(|l| assignment.shared_tile_bytes(kernel, l.value))
            .sum();
        p.stages as usize * tiles
    };
    assignment
        .pipelines
        .values()
        .map(buffers)
        .max()
        .unwrap_or(0)
}

/// The instructions of `region`, its first at pre-order index `start`, each with its index.
pub(super) fn top_level(region: &Region, start: usize) -> impl Iterator<Item = (usize, &Inst)> {
    region.insts.iter().scan(start, |at, inst| {
        let index = *at;
        *at += inst_count(inst);
        Some((index, inst))
    })
}

/// Where a producer warpgroup feeds the kernel, its top-level loops that are not pipelined (a
/// persistent kernel's loop over its tiles), each with its pre-order index and body.
pub(super) fn tile_loops<'k>(
    kernel: &'k Kernel,
    assignment: &LayoutAssignment,
) -> Vec<(usize, &'k Region)> {
    if !assignment.producer {
        return Vec::new();
    }
    top_level(&kernel.body, 0)
        .filter_map(|(at, inst)| match &inst.op {
            Op::For { body, .. } if assignment.pipeline_at(at).is_none() => Some((at, body)),
            _ => None,
        })
        .collect()
}

/// With a producer, the refilled loads at the top of a loop over tiles that fill one slot of the
/// ring its TMA loops stream through take that slot instead of tiles of their own, and the ring
/// runs on across tiles (FlashAttention-3's): one load of each size of the ring's loads, in
/// their order, before the body's first TMA loop, each last read before that loop too (a slot
/// held into the loop would leave it one buffer short). The persistent forward's first K and
/// last V tiles are such a pair; its Q, read by the key loops, keeps a tile of its own. One loop
/// at most (the first such), whose loads are the only ones sharing a slot.
fn ring_refills(
    kernel: &Kernel,
    assignment: &LayoutAssignment,
    once: &mut BTreeMap<usize, OnceLoad>,
) {
    for (start, body) in tile_loops(kernel, assignment) {
        // The body's first TMA loop, by pre-order index.
        let mut first_loop = None;
        super::walk_insts(body, &mut (start + 1), &mut |index, _| {
            if first_loop.is_none() && assignment.pipeline_at(index).is_some_and(|p| p.uses_tma()) {
                first_loop = Some(index);
            }
        });
        let Some((first_loop, ring)) =
            first_loop.and_then(|index| Some((index, assignment.pipeline_at(index)?)))
        else {
            continue;
        };
        let sized = |value: Value| (kernel.ty(value).shape().to_vec(), kernel.dtype(value));
        let mut candidates = once
            .iter()
            .filter(|&(&index, load)| {
                index > start
                    && index < first_loop
                    && load.released_after.is_some_and(|last| last < first_loop)
            })
            .map(|(&index, load)| (index, sized(load.value)));
        let mut slot = Vec::new();
        for wanted in ring.loads.iter().map(|l| sized(l.value)) {
            match candidates.find(|(_, size)| *size == wanted) {
                Some((index, _)) => slot.push(index),
                None => break,
            }
        }
        if slot.len() != ring.loads.len() {
            continue;
        }
        for (i, index) in slot.into_iter().enumerate() {
            if let Some(load) = once.get_mut(&index) {
                load.ring = Some(i);
            }
        }
        return;
    }
}

/// The `for` that carries each loop-carried body parameter, with the parameter's position
/// among the carried values ([`loop_carriers`]).
pub(super) type Carriers<'k> = HashMap<Value, (&'k Inst, usize)>;

/// The kernel's [`Carriers`].
pub(super) fn loop_carriers(region: &Region) -> Carriers<'_> {
    let mut out = HashMap::new();
    for inst in &region.insts {
        if let Op::For { body, .. } = &inst.op {
            for (j, &param) in body.params.iter().skip(1).enumerate() {
                out.insert(param, (inst, j));
            }
        }
        for nested in super::assign::nested_regions(&inst.op) {
            out.extend(loop_carriers(nested));
        }
    }
    out
}

/// Follows `advance`s back to the block pointer they move.
fn unadvanced(definitions: &[Option<&Inst>], mut value: Value) -> Value {
    while let Some(Inst {
        op: Op::Advance { ptr, .. },
        ..
    }) = definitions[value.index()]
    {
        value = *ptr;
    }
    value
}

/// The `make_block_ptr` every value of the block pointer `value` comes from, through
/// `advance`s and loops that carry it (a loop's yield must be the carried pointer advanced).
fn block_origin<'k>(
    definitions: &[Option<&'k Inst>],
    carriers: &Carriers<'k>,
    value: Value,
) -> Option<&'k Inst> {
    let mut value = unadvanced(definitions, value);
    loop {
        let (for_inst, j) = match definitions[value.index()] {
            Some(
                inst @ Inst {
                    op: Op::MakeBlockPtr { .. },
                    ..
                },
            ) => return Some(inst),
            Some(
                inst @ Inst {
                    op: Op::For { .. },
                    results,
                    ..
                },
            ) => (inst, results.iter().position(|&r| r == value)?),
            Some(_) => return None,
            None => *carriers.get(&value)?,
        };
        let Op::For { init, body, .. } = &for_inst.op else {
            return None;
        };
        let Some(Op::Yield { values }) = body.insts.last().map(|i| &i.op) else {
            return None;
        };
        if unadvanced(definitions, values[j]) != body.params[j + 1] {
            return None;
        }
        value = unadvanced(definitions, init[j]);
    }
}

/// The tensor map TMA can move the tile `value` through, between the block pointer `ptr` and a
/// shared tile of layout `shared` (`None`: a plain row-major tile), and the offsets indexing its
/// array's leading dimensions, if it can (see the module doc). Only a TMA reduction
/// (`may_transpose`, [`super::tma_store`]) goes through a transposed view.
pub(super) fn tma_view(
    kernel: &Kernel,
    divisibility: &Divisibility,
    definitions: &[Option<&Inst>],
    carriers: &Carriers<'_>,
    (ptr, value, shared): (Value, Value, Option<&SharedLayout>),
    may_transpose: bool,
) -> Option<(TensorMapSpec, Vec<Value>)> {
    // Reached through values the loop sees, the `make_block_ptr` is in a region around the
    // loop: its leading offsets are in scope there.
    let origin = block_origin(definitions, carriers, ptr)?;
    let Op::MakeBlockPtr {
        base,
        shape,
        strides,
        offsets,
        order,
    } = &origin.op
    else {
        return None;
    };
    let argument = |v: Value| kernel.args.iter().position(|&a| a == v);
    let scalar = |v: Value| -> Option<MapScalar> {
        if let Some(c) = constant_int(kernel, definitions, v) {
            return Some(MapScalar::Const(c));
        }
        match definitions[v.index()] {
            None => argument(v).map(MapScalar::Arg),
            Some(Inst {
                op: Op::Cast { value },
                ..
            }) if definitions[value.index()].is_none() => argument(*value).map(MapScalar::Arg),
            Some(_) => None,
        }
    };
    let shape: Option<Vec<_>> = shape.iter().map(|&v| scalar(v)).collect();
    let map_strides: Option<Vec<_>> = strides.iter().map(|&v| scalar(v)).collect();
    let (mut shape, mut map_strides) = (shape?, map_strides?);
    let mut strides = strides.clone();
    // Row-major tiles: the block's dimensions from the last (contiguous) one down; or, into a
    // shared tile whose first dimension is contiguous, a 2-D block of order [0, 1] over an
    // array whose second-to-last dimension is (a transposed view): TMA sees the array with
    // its last two dimensions swapped, and the shared tile as its storage rows.
    let tile_shape = kernel.ty(value).shape();
    let transposed = shared.is_some_and(|s| s.order == [0, 1]);
    if transposed && !may_transpose {
        return None;
    }
    let expected: Vec<usize> = if transposed {
        vec![0, 1]
    } else {
        (0..tile_shape.len()).rev().collect()
    };
    if *order != expected {
        return None;
    }
    if transposed {
        let last = shape.len().checked_sub(1).filter(|&l| l >= 1)?;
        shape.swap(last - 1, last);
        map_strides.swap(last - 1, last);
        strides.swap(last - 1, last);
    }
    if map_strides.last() != Some(&MapScalar::Const(1)) {
        return None;
    }
    // What TMA asks of the array, proved from what launches guarantee (and check): a 16-byte
    // aligned base and strides in multiples of 16 bytes. Otherwise a launch could be refused
    // where `cp.async` serves.
    let elem_bytes = kernel.dtype(value).size_bytes();
    let aligned = |v: Value, scale: u64| (divisibility.divisor(v) * scale).is_multiple_of(16);
    if !aligned(*base, 1)
        || !strides[..strides.len() - 1]
            .iter()
            .all(|&s| aligned(s, elem_bytes as u64))
    {
        return None;
    }
    let (box_tile, swizzle_bytes) = match shared {
        Some(shared) => {
            let tile = shared.swizzled(<[usize; 2]>::try_from(tile_shape).ok()?);
            let swizzle_bytes = tile.wgmma_swizzle_bytes(elem_bytes)?;
            let rows = tile.rows();
            if rows > MAX_BOX {
                return None;
            }
            (vec![rows, swizzle_bytes / elem_bytes], swizzle_bytes)
        }
        // One copy of the whole tile, unswizzled: its rows whole 16-byte multiples.
        None => {
            let row_bytes = tile_shape.last()? * elem_bytes;
            if !row_bytes.is_multiple_of(16) || tile_shape.iter().any(|&d| d > MAX_BOX) {
                return None;
            }
            (tile_shape.to_vec(), 0)
        }
    };
    let lead = shape.len().checked_sub(tile_shape.len())?;
    let mut box_shape = vec![1; lead];
    box_shape.extend(box_tile.iter().map(|&d| d as u32));
    let spec = TensorMapSpec {
        dtype: kernel.dtype(value),
        base: argument(*base)?,
        shape,
        strides: map_strides,
        box_shape,
        swizzle_bytes: swizzle_bytes as u32,
    };
    Some((spec, offsets[..lead].to_vec()))
}

/// The most elements a TMA box has along a dimension.
const MAX_BOX: usize = 256;

/// The shared layout `value` is staged into, if the layout stage staged it.
fn staging(assignment: &LayoutAssignment, value: Value) -> Option<SharedLayout> {
    assignment.all_conversions().find_map(|c| match &c.to {
        Layout::Shared(shared) if c.value == value && c.kind == ConversionKind::Stage => {
            Some(shared.clone())
        }
        _ => None,
    })
}

/// Whether each thread's part of the load, in its blocked layout, is whole 16-byte vectors
/// along the contiguous dimension, each landing in one swizzled vector of `shared`, at
/// addresses the divisibility analysis proves aligned.
fn copies_whole_vectors(
    kernel: &Kernel,
    assignment: &LayoutAssignment,
    divisibility: &Divisibility,
    inst: &Inst,
    shared: &SharedLayout,
) -> bool {
    let Op::LoadBlock {
        ptr,
        boundary_check,
    } = &inst.op
    else {
        return false;
    };
    let value = inst.results[0];
    let Some(Layout::Blocked(blocked)) = assignment.layout(value) else {
        return false;
    };
    let elem_bytes = kernel.dtype(value).size_bytes();
    let vec = COPY_BYTES / elem_bytes;
    let dim = blocked.order[0];
    let map = blocked.thread_map(kernel.ty(value).shape());
    map.is_exclusive()
        && map.run_along(dim, vec) == vec
        && shared.order[0] == dim
        && shared.vec as usize >= vec
        && divisibility.vector_elems(*ptr, dim, boundary_check, elem_bytes, vec) == vec
}

/// How a loaded tile is read: by `dot`s only (as operands, not accumulators, directly or through
/// a `trans` that only dots read), by registers only (no `dot` operand), both, or not at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Readers {
    Dots,
    Registers,
    Both,
    Unread,
}

/// By value: who reads it ([`Readers`]).
fn readers(kernel: &Kernel) -> Vec<Readers> {
    let count = kernel.values.len();
    let (mut uses, mut operand_uses) = (vec![0usize; count], vec![0usize; count]);
    let mut transposes = Vec::new();
    let mut next = 0;
    super::walk_insts(&kernel.body, &mut next, &mut |_, inst| {
        for_each_operand(&inst.op, |v| uses[v.index()] += 1);
        match &inst.op {
            Op::Dot { lhs, rhs, .. } => {
                operand_uses[lhs.index()] += 1;
                operand_uses[rhs.index()] += 1;
            }
            Op::Trans { value } => transposes.push((*value, inst.results[0])),
            _ => {}
        }
    });
    for (input, result) in transposes {
        if uses[result.index()] > 0 && uses[result.index()] == operand_uses[result.index()] {
            operand_uses[input.index()] += 1;
        }
    }
    (0..count)
        .map(|v| match (uses[v], operand_uses[v]) {
            (0, _) => Readers::Unread,
            (_, 0) => Readers::Registers,
            (n, operands) if n == operands => Readers::Dots,
            _ => Readers::Both,
        })
        .collect()
}

/// The pre-order index of the last instruction of `body` (a loop's, its first instruction at
/// `start`) that reads `value` or a `trans` view of it, directly or in its regions.
fn last_reader(body: &Region, start: usize, value: Value) -> usize {
    let mut views = vec![value];
    let mut last = start;
    let mut at = start;
    for inst in &body.insts {
        let mut reads = false;
        let mut note = |op: &Op, results: &[Value]| {
            for_each_operand(op, |v| reads |= views.contains(&v));
            if let Op::Trans { value } = op
                && views.contains(value)
            {
                views.push(results[0]);
            }
        };
        note(&inst.op, &inst.results);
        let mut next = at + 1;
        for nested in super::assign::nested_regions(&inst.op) {
            super::walk_insts(nested, &mut next, &mut |_, i| note(&i.op, &i.results));
        }
        if reads && !matches!(inst.op, Op::Trans { .. }) {
            last = at;
        }
        at = next;
    }
    last
}

/// Instructions `inst` accounts for in the pre-order numbering: itself and its regions'.
pub(crate) fn inst_count(inst: &Inst) -> usize {
    1 + super::assign::nested_regions(&inst.op)
        .into_iter()
        .flat_map(|r| &r.insts)
        .map(inst_count)
        .sum::<usize>()
}

/// Calls `f` with the pre-order index and body of every `for` in `region`, outer loops first.
fn find_loops(region: &Region, next: &mut usize, f: &mut dyn FnMut(usize, &Region)) {
    for inst in &region.insts {
        let index = *next;
        *next += 1;
        if let Op::For { body, .. } = &inst.op {
            f(index, body);
        }
        for nested in super::assign::nested_regions(&inst.op) {
            find_loops(nested, next, f);
        }
    }
}
