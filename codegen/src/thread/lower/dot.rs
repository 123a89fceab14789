//! `dot` on tensor cores: operands staged in swizzled shared memory, read into fragments with
//! `ldmatrix`, multiplied with `mma.sync.m16n8k16`; and the accumulator of one `dot` taken as
//! the A operand of the next without moving it. Every fragment position comes from
//! [`crate::layout::mma`], every shared-memory offset from [`crate::layout::swizzle`]'s layout.
//!
//! A `dot` runs k step by k step: each step loads just the fragments it needs (`ldmatrix` on
//! first use), then runs the step's `reps_m x reps_n` instructions, so that only one step's
//! operand fragments are live at a time.

use std::collections::HashMap;

use kiln_dsl::ir::{Inst as TileInst, Kernel, Op as TileOp, Region, Value};

use super::{Lowering, Result, memory_type, unsupported};
use crate::layout::mma::{
    A_REGS_PER_MMA, ACC_REGS_PER_MMA, B_REGS_PER_MMA, Ldmatrix, MmaV2, Operand, a_register_from_acc,
};
use crate::layout::swizzle::SwizzledShared;
use crate::layout::{
    ConversionKind, Layout, LayoutAssignment, PipelinedLoop, SharedLayout, THREADS_PER_WARP,
    ThreadMap, linear_terms, nested_regions, walk_insts,
};
use crate::thread::ir::{IntOp, Op, Reg, Space, Type};
use crate::{CodegenError, Stage};

/// A tile in shared memory: where it starts and how its elements are laid out.
#[derive(Clone, Copy, Debug)]
pub(super) struct SharedTile {
    pub base: SharedBase,
    pub layout: SwizzledShared,
    /// The 16-bit element type.
    pub elem: Type,
}

/// Where a shared tile starts.
#[derive(Clone, Copy, Debug)]
pub(super) enum SharedBase {
    /// At a fixed byte offset.
    Fixed(u32),
    /// In buffer `slot` (an i32 register) of consecutive buffers of `bytes` each from byte
    /// `buffers`: a pipelined load's tile of the current iteration.
    Slot { buffers: u32, bytes: u32, slot: Reg },
}

impl SharedTile {
    /// The same bytes seen as the transposed tile.
    fn transposed(&self) -> SharedTile {
        SharedTile {
            layout: self.layout.transposed(),
            ..*self
        }
    }
}

/// The ring a TMA loop's top-level staged tiles take a buffer of ([`ring_staged`]): this
/// iteration's slot of its `stages`, and the depth of the body's block.
#[derive(Clone, Copy, Debug)]
pub(super) struct StagingRing {
    pub slot: Reg,
    pub stages: u32,
    pub depth: usize,
}

/// How [`Lowering::write_tile`] computes its addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Addressing {
    /// Each access's own, from its position: what staging wants, often in a loop body (shared
    /// addresses, loop-invariant, stay live across its iterations: the backward ran 5-10% slower
    /// so at D128, docs/PERF.md, 2026-11-26).
    PerAccess,
    /// One address per thread-dependent offset, the other accesses an immediate from one of
    /// them ([`Lowering::tile_addresses`]): a write made once, at the program's end.
    Shared,
}

/// Accesses to staged tiles since the last barrier: a write must wait for the reads before it,
/// a read for the writes.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Pending {
    pub reads: bool,
    pub writes: bool,
}

/// The bytes of a tile of `value`: what a TMA copy of it brings (`expect_tx`).
pub(super) fn tile_bytes(kernel: &Kernel, value: Value) -> u32 {
    let shape = kernel.ty(value).shape();
    let elems: usize = shape.iter().product();
    (elems * kernel.dtype(value).size_bytes()) as u32
}

/// The bytes a tile of `value` takes in shared memory, aligned for the next.
pub(super) fn aligned_tile_bytes(kernel: &Kernel, layouts: &LayoutAssignment, value: Value) -> u32 {
    layouts.shared_tile_bytes(kernel, value) as u32
}

/// Where staged tiles go in shared memory: the tiles of refilled TMA loads (a persistent
/// kernel's per-tile loads, [`super::refill`]; those sharing the ring's slot have none) from 0,
/// `refill_buffers` of each, up to `refilled`; every other staged tile from there, each at its
/// own place (with `ring_staging`, one a buffer of its loop's ring where it is staged at the
/// top level of a TMA loop that frees its buffers on barriers: [`ring_staged`]), then from
/// `reduction` the tile the TMA stores of their own share (`atomic_add`s
/// by TMA, stores in loops); above them, from `staged`, pipelined loads' buffers, a loop's above
/// those of the loops around it, so that sibling loops reuse the same bytes (and TMA stores
/// after the loops the same bytes again, one after the other: the layout stage lets them only
/// where they fit);
/// from `barriers`, TMA loops' `mbarrier`s, stacked alike; from `once_barriers`, one `mbarrier`
/// for each top-level or refilled load TMA copies and buffer of it (and an `empty` one each
/// after those, where some are refilled); the scratch above all, from `end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct SharedPlan {
    /// How many tiles each refilled load takes by turns: two where they fit, so that the
    /// producer copies the next tile's while the consumers still read this one's (a
    /// persistent kernel runs one program an SM: shared memory it leaves unused buys nothing).
    pub refill_buffers: u32,
    /// Whether tiles staged at the top level of a TMA loop that frees its buffers on barriers
    /// take one buffer a stage of its ring (where they fit), so that writing this iteration's
    /// waits for no reads of the last one's.
    pub ring_staging: bool,
    pub refilled: u32,
    pub reduction: u32,
    pub staged: u32,
    pub barriers: u32,
    pub once_barriers: u32,
    pub end: u32,
}

/// The alignment of the scratch after the barriers: a 128-byte shift keeps a bank pattern.
const SCRATCH_ALIGN: u32 = 128;

impl SharedPlan {
    /// The plan with the most buffers that fits in `max_shared_bytes`: two of each refilled
    /// load where there are some, then ring-staged tiles, else one and none.
    pub fn of(kernel: &Kernel, layouts: &LayoutAssignment, max_shared_bytes: u32) -> SharedPlan {
        let refilled = refilled_bytes(kernel, layouts, 1, usize::MAX) > 0;
        let mut plan =
            Self::with_refill_buffers(kernel, layouts, if refilled { 2 } else { 1 }, true);
        while plan.end > max_shared_bytes {
            match plan.smaller(kernel, layouts) {
                Some(smaller) => plan = smaller,
                None => break,
            }
        }
        plan
    }

    /// The next plan with fewer buffers: without ring-staged tiles, then with one tile of each
    /// refilled load; `None` where there is none.
    pub fn smaller(&self, kernel: &Kernel, layouts: &LayoutAssignment) -> Option<SharedPlan> {
        if self.ring_staging {
            Some(Self::with_refill_buffers(
                kernel,
                layouts,
                self.refill_buffers,
                false,
            ))
        } else if self.refill_buffers > 1 {
            Some(Self::with_refill_buffers(kernel, layouts, 1, true))
        } else {
            None
        }
    }

    /// The plan with `refill_buffers` tiles of each refilled load, and ring-staged tiles or
    /// not.
    pub fn with_refill_buffers(
        kernel: &Kernel,
        layouts: &LayoutAssignment,
        refill_buffers: u32,
        ring_staging: bool,
    ) -> SharedPlan {
        let refilled = refilled_bytes(kernel, layouts, refill_buffers, usize::MAX);
        // Tiles staged from registers (a ring's stages of each where ring-staged), and those
        // one-shot TMA loads fill.
        let rings = if ring_staging {
            ring_staged(kernel, layouts)
        } else {
            HashMap::new()
        };
        let (mut conversions, mut ring_staging) = (0, false);
        let mut next = 0;
        walk_insts(&kernel.body, &mut next, &mut |index, _| {
            let buffers = rings.get(&index).copied().unwrap_or(1);
            for c in layouts.conversions_at(index) {
                if c.kind == ConversionKind::Stage {
                    conversions += buffers * aligned_tile_bytes(kernel, layouts, c.value);
                    ring_staging |= buffers > 1;
                }
            }
        });
        let staged = refilled
            + conversions
            + layouts
                .tma_once_loads()
                .filter(|l| !l.refills() && l.has_tile())
                .map(|l| aligned_tile_bytes(kernel, layouts, l.value))
                .sum::<u32>();
        let reduction = staged;
        let staged = staged
            + layouts
                .own_tile_stores()
                .map(|r| aligned_tile_bytes(kernel, layouts, r.value))
                .max()
                .unwrap_or(0);
        let buffers = nested_loop_bytes(layouts, &kernel.body, &mut 0, &|p| {
            pipeline_buffer_bytes(kernel, layouts, p)
        });
        let barriers = nested_loop_bytes(layouts, &kernel.body, &mut 0, &|p| {
            pipeline_barrier_bytes(layouts, p)
        });
        let kinds = if refilled > 0 { 2 } else { 1 };
        let once = kinds
            * refill_buffers
            * layouts.tma_once_loads().count() as u32
            * super::pipeline::MBARRIER_BYTES;
        let end = if barriers + once == 0 {
            staged + buffers
        } else {
            (staged + buffers + barriers + once).next_multiple_of(SCRATCH_ALIGN)
        };
        SharedPlan {
            refill_buffers,
            ring_staging,
            refilled,
            reduction,
            staged,
            barriers: staged + buffers,
            once_barriers: staged + buffers + barriers,
            end,
        }
    }
}

/// The bytes the tiles of refilled loads with a tile of their own take among the first
/// `loads` TMA once-loads, `refill_buffers` tiles each: where the next one starts
/// ([`super::refill`]), or with every load, `SharedPlan::refilled`.
pub(super) fn refilled_bytes(
    kernel: &Kernel,
    layouts: &LayoutAssignment,
    refill_buffers: u32,
    loads: usize,
) -> u32 {
    layouts
        .tma_once_loads()
        .take(loads)
        .filter(|l| l.refills() && l.has_tile())
        .map(|l| refill_buffers * aligned_tile_bytes(kernel, layouts, l.value))
        .sum()
}

/// The instructions whose staged tiles take one buffer a stage of their loop's ring, by index,
/// with the ring's stages: those at the top level of the body of a TMA loop that frees its
/// buffers on barriers (where the body starts with no barrier, a single tile would wait for
/// the last iteration's reads of it). The buffer iteration i writes (its slot, i mod `stages`)
/// is written again `stages` iterations on, and each iteration between meets at a barrier
/// after writing its own (before reading it, or at its loop's top: [`super::pipeline`]),
/// after the reads of the buffer it overwrites ended with their iteration (every `wgmma` of a
/// body is waited for at its end).
pub(super) fn ring_staged(kernel: &Kernel, layouts: &LayoutAssignment) -> HashMap<usize, u32> {
    let mut rings = HashMap::new();
    if !layouts.frees_on_barriers() {
        return rings;
    }
    let mut next = 0;
    walk_insts(&kernel.body, &mut next, &mut |index, inst| {
        let (TileOp::For { body, .. }, Some(pipeline)) = (&inst.op, layouts.pipeline_at(index))
        else {
            return;
        };
        if !pipeline.uses_tma() {
            return;
        }
        // The body's top-level instructions, numbered as `walk_insts` numbers them.
        let mut at = index + 1;
        for top in &body.insts {
            rings.insert(at, pipeline.stages);
            let mut nested = at + 1;
            for region in nested_regions(&top.op) {
                walk_insts(region, &mut nested, &mut |_, _| {});
            }
            at = nested;
        }
    });
    rings
}

/// What `region` needs at once of what `bytes` gives each pipelined loop: per instruction, a
/// loop's own and the most its body's loops need, the most of these over the instructions.
fn nested_loop_bytes(
    layouts: &LayoutAssignment,
    region: &Region,
    next: &mut usize,
    bytes: &dyn Fn(&PipelinedLoop) -> u32,
) -> u32 {
    let mut most = 0;
    for inst in &region.insts {
        let own = layouts.pipeline_at(*next).map_or(0, bytes);
        *next += 1;
        let inner = nested_regions(&inst.op)
            .into_iter()
            .map(|nested| nested_loop_bytes(layouts, nested, next, bytes))
            .max()
            .unwrap_or(0);
        most = most.max(own + inner);
    }
    most
}

/// The bytes of a TMA loop's `mbarrier`s: a `full` one per buffer, and an `empty` one in a
/// program whose warpgroups take turns (none without TMA).
pub(super) fn pipeline_barrier_bytes(layouts: &LayoutAssignment, pipeline: &PipelinedLoop) -> u32 {
    let kinds = if layouts.frees_on_barriers() { 2 } else { 1 };
    if pipeline.uses_tma() {
        kinds * pipeline.stages * super::pipeline::MBARRIER_BYTES
    } else {
        0
    }
}

/// The bytes of every buffer of a pipelined loop.
pub(super) fn pipeline_buffer_bytes(
    kernel: &Kernel,
    layouts: &LayoutAssignment,
    pipeline: &PipelinedLoop,
) -> u32 {
    pipeline
        .loads
        .iter()
        .map(|l| pipeline.stages * aligned_tile_bytes(kernel, layouts, l.value))
        .sum()
}

/// How many consecutive registers of `map` one vector store can write to `layout` (1: none):
/// every thread holds each element once, its registers come in runs along the contiguous
/// dimension that stay within one swizzled vector (contiguous in shared memory, 16 bytes at most).
fn vector_run(map: &ThreadMap, layout: &SwizzledShared) -> usize {
    if !map.is_exclusive() {
        return 1;
    }
    map.run_along(layout.order[0], layout.vec.min(8))
}

/// The accesses of a tile in the layout `map` to a shared tile in `layout`, each its first
/// register and how many it moves: a vector where registers run along the contiguous dimension.
fn vector_accesses(map: &ThreadMap, layout: &SwizzledShared) -> Vec<(usize, usize)> {
    let run = vector_run(map, layout);
    let mut accesses = Vec::new();
    let mut i = 0;
    while i < map.registers.len() {
        let len = if run > 1 && map.registers[i][layout.order[0]].is_multiple_of(run) {
            run
        } else {
            1
        };
        accesses.push((i, len));
        i += len;
    }
    accesses
}

/// An operand's 32-bit registers, loaded from shared memory on first use.
pub(super) enum Fragments {
    Registers(Vec<Reg>),
    Shared {
        tile: SharedTile,
        loads: Vec<Ldmatrix>,
        /// Each load's row address (a shared pointer), by load.
        addresses: Vec<Reg>,
        regs: Vec<Option<Reg>>,
    },
}

impl Lowering<'_> {
    /// The 16-bit pair register type of `elem`, or an error: tensor cores take f16 and bf16.
    pub(super) fn packed_type(&self, inst: &TileInst, elem: Type) -> Result<Type> {
        match elem {
            Type::F16 => Ok(Type::F16x2),
            Type::BF16 => Ok(Type::BF16x2),
            other => Err(unsupported(
                inst,
                format!("expected f16 or bf16 mma operands, got {}", other.name()),
            )),
        }
    }

    /// `value` (in registers) into a new swizzled tile of shared memory: each owner stores its
    /// elements where `layout` puts them, after a barrier if staged tiles were read since the
    /// last one; at a TMA loop's top level, with ring staging, into this iteration's buffer of
    /// its ring with no barrier ([`ring_staged`]).
    pub(super) fn stage(&mut self, inst: &TileInst, value: Value, layout: &Layout) -> Result<()> {
        let Layout::Shared(shared) = layout else {
            return Err(CodegenError::internal(
                Stage::Thread,
                "a staging into a distributed layout",
            ));
        };
        let shape = self.shape(value);
        let tile_layout = shared.swizzled([shape[0], shape[1]]);
        let regs = self.regs(value)?;
        let map = self
            .value_map(inst, value)?
            .ok_or_else(|| unsupported(inst, "expected a tile to stage"))?;
        let elem = self.ty(regs[0]);
        self.packed_type(inst, elem)?;
        let bytes = aligned_tile_bytes(self.kernel, self.layouts, value);
        let ring = self
            .staging_ring
            .filter(|ring| ring.depth == self.blocks.len());
        let base = match ring {
            Some(ring) => SharedBase::Slot {
                buffers: self.next_staged,
                bytes,
                slot: ring.slot,
            },
            None => SharedBase::Fixed(self.next_staged),
        };
        let tile = SharedTile {
            base,
            layout: tile_layout,
            elem,
        };
        self.next_staged += ring.map_or(1, |ring| ring.stages) * bytes;
        if self.pending.reads && ring.is_none() {
            self.barrier();
        }
        self.write_tile(&map, &regs, &tile, Addressing::PerAccess);
        self.pending.writes = true;
        self.shared_tiles.insert(value, tile);
        self.staged_by_threads.insert(value);
        if self.layouts.arrives_when_staged(value) {
            self.arrived_for_owner = self.arrive_for_the_owner();
        }
        Ok(())
    }

    /// `value` in layout `to` through a swizzled tile `offset` bytes into the drained loops'
    /// buffers ([`ConversionKind::ThroughBuffers`]): the block meets (other warps may still read
    /// the loops' last buffers), each owner writes its elements, the block meets again, and every
    /// thread reads what `to` gives it, in vectors.
    pub(super) fn convert_through_buffers(
        &mut self,
        inst: &TileInst,
        value: Value,
        to: &Layout,
        shared: &SharedLayout,
        offset: usize,
    ) -> Result<Vec<Reg>> {
        let regs = self.regs(value)?;
        let shape = self.shape(value);
        let &[rows, cols] = shape.as_slice() else {
            return Err(unsupported(
                inst,
                "expected a 2-D tile to convert through shared memory",
            ));
        };
        let from = self
            .value_map(inst, value)?
            .ok_or_else(|| unsupported(inst, "expected a tile to convert"))?;
        let to = self.map(inst, to, &shape)?;
        let tile = SharedTile {
            base: SharedBase::Fixed(self.next_buffer + offset as u32),
            layout: shared.swizzled([rows, cols]),
            elem: memory_type(self.dtype(value)),
        };
        // A store converted before this one after the loops read it already (dK before dV).
        if self.tid_again.is_none() {
            self.read_tid_again();
        }
        // The loops ended at a barrier where their drain met (TMA's); anything staged since,
        // or a loop's reads not met yet (`cp.async`'s), may still be read.
        if self.pending.reads || self.pending.writes {
            self.barrier();
        }
        self.write_tile(&from, &regs, &tile, Addressing::Shared);
        self.pending.writes = true;
        self.barrier();
        let read = self.read_tile(&to, &tile);
        self.pending.reads = true;
        Ok(read)
    }

    /// Writes `regs`, a tile in the layout `map` describes, into the shared `tile`: as vectors
    /// where the registers run along the tile's contiguous dimension, each element by its owner.
    pub(super) fn write_tile(
        &mut self,
        map: &ThreadMap,
        regs: &[Reg],
        tile: &SharedTile,
        addressing: Addressing,
    ) {
        let accesses = vector_accesses(map, &tile.layout);
        let positions = self.positions(map);
        let slots = match addressing {
            Addressing::PerAccess => accesses
                .iter()
                .map(|&(i, _)| {
                    let index = self.swizzled_index(&tile.layout, &positions[i].coords);
                    self.tile_slot(tile, index)
                })
                .collect(),
            Addressing::Shared => {
                let firsts: Vec<_> = accesses.iter().map(|&(i, _)| (map, i)).collect();
                self.tile_addresses(tile, &firsts)
            }
        };
        for ((i, len), slot) in accesses.into_iter().zip(slots) {
            // Vectors come only from exclusive maps, whose every element has one owner.
            if len > 1 {
                self.emit_effect(Op::StoreVector {
                    ptr: slot,
                    values: regs[i..i + len].to_vec(),
                    pred: None,
                });
            } else {
                self.emit_effect(Op::Store {
                    ptr: slot,
                    value: regs[i],
                    pred: positions[i].owner,
                });
            }
        }
    }

    /// Reads the tile the layout `map` describes from the shared `tile`: as vectors where the
    /// registers run along its contiguous dimension, one address per thread-dependent offset
    /// (as [`Addressing::Shared`] writes).
    pub(super) fn read_tile(&mut self, map: &ThreadMap, tile: &SharedTile) -> Vec<Reg> {
        let accesses = vector_accesses(map, &tile.layout);
        let firsts: Vec<_> = accesses.iter().map(|&(i, _)| (map, i)).collect();
        let slots = self.tile_addresses(tile, &firsts);
        let mut regs = Vec::new();
        for ((_, len), ptr) in accesses.into_iter().zip(slots) {
            if len > 1 {
                regs.extend(
                    self.emit_multi(Op::LoadVector { ptr, pred: None }, &vec![tile.elem; len]),
                );
            } else {
                let load = Op::Load {
                    ptr,
                    pred: None,
                    other: None,
                };
                regs.push(self.emit(load, tile.elem));
            }
        }
        regs
    }

    /// `trans` of a staged tile: the same shared memory, seen transposed.
    pub(super) fn transposed_view(&mut self, inst: &TileInst, value: Value) -> Result<()> {
        let tile = self.shared_tiles.get(&value).copied().ok_or_else(|| {
            CodegenError::internal(
                Stage::Thread,
                format!("`trans` of %{}, which is not in shared memory", value.0),
            )
        })?;
        self.shared_tiles.insert(inst.results[0], tile.transposed());
        if self.staged_by_threads.contains(&value) {
            self.staged_by_threads.insert(inst.results[0]);
        }
        Ok(())
    }

    /// A pointer to element `index` (i32) of a shared tile.
    pub(super) fn tile_slot(&mut self, tile: &SharedTile, index: Reg) -> Reg {
        match tile.base {
            SharedBase::Fixed(offset) => self.shared_slot(offset, index, tile.elem),
            SharedBase::Slot {
                buffers,
                bytes,
                slot,
            } => {
                let bytes = self.i32_const(bytes as i64);
                let offset = self.int(IntOp::Mul, slot, bytes);
                let start = self.shared_slot(buffers, offset, Type::I8);
                self.emit(
                    Op::PtrAdd {
                        ptr: start,
                        offset: index,
                        elem: tile.elem,
                    },
                    Type::Ptr(Space::Shared),
                )
            }
        }
    }

    /// The addresses in `tile` of a thread's accesses, each register `r` of a thread map. An
    /// access whose offset is another's plus the same constant in every thread takes that
    /// one's address plus an immediate: otherwise LLVM hoists one 64-bit address per access
    /// out of a loop (80 `ldmatrix`es in a 128 x 64 forward), and they spill.
    pub(super) fn tile_addresses(
        &mut self,
        tile: &SharedTile,
        accesses: &[(&ThreadMap, usize)],
    ) -> Vec<Reg> {
        let threads = self.layouts.num_warps * THREADS_PER_WARP;
        let offsets: Vec<Vec<usize>> = accesses
            .iter()
            .map(|&(map, r)| {
                (0..threads)
                    .map(|t| {
                        let position = map.position(t / THREADS_PER_WARP, t % THREADS_PER_WARP, r);
                        tile.layout.offset([position.coords[0], position.coords[1]])
                    })
                    .collect()
            })
            .collect();
        let mut addresses: Vec<Reg> = Vec::new();
        for (i, relative) in constant_offsets(&offsets).into_iter().enumerate() {
            let address = match relative {
                Some((earlier, delta)) => {
                    let delta = self.i32_const(delta);
                    self.emit(
                        Op::PtrAdd {
                            ptr: addresses[earlier],
                            offset: delta,
                            elem: tile.elem,
                        },
                        Type::Ptr(Space::Shared),
                    )
                }
                None => {
                    // Only this register's position: the map may have many.
                    let (map, r) = accesses[i];
                    let single = ThreadMap {
                        registers: vec![map.registers[r].clone()],
                        ..map.clone()
                    };
                    let coords = self.positions(&single).remove(0).coords;
                    let index = self.swizzled_index(&tile.layout, &coords);
                    self.tile_slot(tile, index)
                }
            };
            addresses.push(address);
        }
        addresses
    }

    /// The element index (i32) of `coords` in a swizzled tile: [`SwizzledShared::offset`] in
    /// registers.
    pub(super) fn swizzled_index(&mut self, layout: &SwizzledShared, coords: &[Reg]) -> Reg {
        let (row, col) = (coords[layout.order[1]], coords[layout.order[0]]);
        let log2 = |v: usize| v.trailing_zeros() as i64;
        let per_phase = self.i32_const(log2(layout.per_phase));
        let phase_mask = self.i32_const(layout.max_phase as i64 - 1);
        let vec_shift = self.i32_const(log2(layout.vec));
        let vec_mask = self.i32_const(layout.vec as i64 - 1);
        let slab_len = self.i32_const(layout.slab as i64);
        let phase_row = self.int(IntOp::LShr, row, per_phase);
        let phase = self.int(IntOp::And, phase_row, phase_mask);
        let chunk = self.int(IntOp::LShr, col, vec_shift);
        let swizzled = self.int(IntOp::Xor, chunk, phase);
        let chunk_start = self.int(IntOp::Shl, swizzled, vec_shift);
        let within = self.int(IntOp::And, col, vec_mask);
        let row_start = self.int(IntOp::Mul, row, slab_len);
        let in_row = self.int(IntOp::Add, chunk_start, within);
        let index = self.int(IntOp::Add, row_start, in_row);
        if layout.slab == layout.row_len() {
            return index;
        }
        // A slabbed tile: the column's slab bits passed through the XOR (`max_phase * vec <=
        // slab`) as if slabs sat side by side in a row of `slab`; each is `rows` rows long.
        let slab_mask = self.i32_const(!(layout.slab as i64 - 1));
        let slab_col = self.int(IntOp::And, col, slab_mask);
        let rows_after = self.i32_const(layout.rows() as i64 - 1);
        let slab_rows = self.int(IntOp::Mul, slab_col, rows_after);
        self.int(IntOp::Add, index, slab_rows)
    }

    /// How the `dot` at hand gets operand `op` (`value`, of logical `shape`).
    pub(super) fn fragments(
        &mut self,
        inst: &TileInst,
        mma: MmaV2,
        op: Operand,
        value: Value,
        shape: [usize; 2],
    ) -> Result<Fragments> {
        let conversion = self
            .layouts
            .dot_operand(self.current_inst, value)
            .ok_or_else(|| {
                CodegenError::internal(Stage::Thread, "a dot operand without its conversion")
            })?;
        if conversion.kind == ConversionKind::AccumulatorAsA {
            let regs = self.regs(value)?;
            let elem = self.ty(regs[0]);
            let packed = self.packed_type(inst, elem)?;
            let count = mma.operand_registers(op, shape);
            return Ok(Fragments::Registers(
                (0..count)
                    .map(|r| {
                        let (lo, hi) = a_register_from_acc(r);
                        let (lo, hi) = (regs[lo], regs[hi]);
                        // Rounded from f32 here (`p.to::<T>()`): round and pack in one.
                        let op = match (self.narrowed.get(&lo), self.narrowed.get(&hi)) {
                            (Some(&lo), Some(&hi)) => Op::PackRounded { lo, hi },
                            _ => Op::Pack { lo, hi },
                        };
                        self.emit(op, packed)
                    })
                    .collect(),
            ));
        }
        self.shared_fragments(mma, op, value, shape)
    }

    /// Operand `op` (`value`, of logical `shape`) read from its shared tile with `ldmatrix`,
    /// each load issued on first use ([`Lowering::fragment`]).
    fn shared_fragments(
        &mut self,
        mma: MmaV2,
        op: Operand,
        value: Value,
        shape: [usize; 2],
    ) -> Result<Fragments> {
        let tile = self.shared_tiles.get(&value).copied().ok_or_else(|| {
            CodegenError::internal(
                Stage::Thread,
                format!("dot operand %{} is not in shared memory", value.0),
            )
        })?;
        let order = tile.layout.order;
        let loads = mma.ldmatrix_loads(op, shape, order, 0);
        // Each load's row address: the warp's part (the operand's thread base at lane 0), the
        // lane's (its row within the load's matrices), and the load's first origin.
        let (warp_terms, _) = linear_terms(2, mma.num_warps(), &|warp, _| {
            mma.operand_thread_base(op, warp, 0).to_vec()
        })
        .map_err(|m| CodegenError::internal(Stage::Thread, m))?;
        let maps = loads
            .iter()
            .map(|load| {
                let (lane_terms, _) =
                    linear_terms(2, 1, &|_, lane| load.lane_offset(lane).to_vec())
                        .map_err(|m| CodegenError::internal(Stage::Thread, m))?;
                Ok(ThreadMap {
                    shape: shape.to_vec(),
                    bases: (0..2)
                        .map(|d| [warp_terms[d].clone(), lane_terms[d].clone()].concat())
                        .collect(),
                    extents: shape.to_vec(),
                    registers: vec![load.origins[0].to_vec()],
                    replicas: Vec::new(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let accesses: Vec<_> = maps.iter().map(|map| (map, 0)).collect();
        let addresses = self.tile_addresses(&tile, &accesses);
        Ok(Fragments::Shared {
            tile,
            loads,
            addresses,
            regs: vec![None; mma.operand_registers(op, shape)],
        })
    }

    /// A `wgmma`'s A operand `value`, whose accumulator layout `to` is the parent of, loaded
    /// from its shared tile into registers whole ([`crate::CompileOptions::resident_a`]).
    pub(super) fn resident_a(
        &mut self,
        inst: &TileInst,
        value: Value,
        to: &Layout,
    ) -> Result<Vec<Reg>> {
        let Layout::DotOperand(operand) = to else {
            return Err(CodegenError::internal(
                Stage::Thread,
                format!("%{} in registers as {to}, not as a dot operand", value.0),
            ));
        };
        let Layout::Mma(parent) = &*operand.parent else {
            return Err(CodegenError::internal(
                Stage::Thread,
                "a dot operand whose parent is no mma layout",
            ));
        };
        let mma = parent.as_v2();
        let shape = self.shape(value);
        let shape = [shape[0], shape[1]];
        let mut fragments = self.shared_fragments(mma, Operand::A, value, shape)?;
        (0..mma.operand_registers(Operand::A, shape))
            .map(|r| self.fragment(inst, &mut fragments, r))
            .collect()
    }

    /// Operand register `reg`, loading its `ldmatrix` (after a barrier if staged tiles were
    /// written since the last one) on first use.
    fn fragment(&mut self, inst: &TileInst, fragments: &mut Fragments, reg: usize) -> Result<Reg> {
        match fragments {
            Fragments::Registers(regs) => Ok(regs[reg]),
            Fragments::Shared {
                tile,
                loads,
                addresses,
                regs,
            } => {
                if let Some(loaded) = regs[reg] {
                    return Ok(loaded);
                }
                let which = loads
                    .iter()
                    .position(|l| l.dest.contains(&reg))
                    .ok_or_else(|| {
                        CodegenError::internal(Stage::Thread, "an operand register no load fills")
                    })?;
                if self.pending.writes {
                    self.barrier();
                }
                let load = &loads[which];
                let packed = self.packed_type(inst, tile.elem)?;
                let results = self.emit_multi(
                    Op::Ldmatrix {
                        ptr: addresses[which],
                        count: load.num() as u8,
                        trans: load.trans,
                    },
                    &vec![packed; load.num()],
                );
                self.pending.reads = true;
                for (&dest, result) in load.dest.iter().zip(results) {
                    regs[dest] = Some(result);
                }
                regs[reg].ok_or_else(|| {
                    CodegenError::internal(Stage::Thread, "ldmatrix left its register empty")
                })
            }
        }
    }

    /// `lhs [M, K] @ rhs [K, N] + acc`, in the result's mma layout.
    pub(super) fn dot(
        &mut self,
        inst: &TileInst,
        lhs: Value,
        rhs: Value,
        acc: Value,
    ) -> Result<Vec<Reg>> {
        let Some(Layout::Mma(layout)) = self.layouts.layout(inst.results[0]) else {
            return Err(unsupported(inst, "expected an mma accumulator layout"));
        };
        let mma = layout.as_v2();
        if let Some(ptr) = self.layouts.one_warpgroup_dot(self.current_inst) {
            return self.one_warpgroup_dot(inst, [lhs, rhs, acc], ptr);
        }
        if self.issues_wgmma(inst) {
            return self.wgmma_dot(inst, mma, [lhs, rhs, acc], true);
        }
        let (a_shape, b_shape) = (self.shape(lhs), self.shape(rhs));
        let (a_shape, b_shape) = ([a_shape[0], a_shape[1]], [b_shape[0], b_shape[1]]);
        for (op, shape) in [(Operand::A, a_shape), (Operand::B, b_shape)] {
            mma.check_operand_shape(op, shape)
                .map_err(|m| unsupported(inst, m))?;
        }
        let mut out = self.regs(acc)?;
        let mut a = self.fragments(inst, mma, Operand::A, lhs, a_shape)?;
        let mut b = self.fragments(inst, mma, Operand::B, rhs, b_shape)?;
        let [reps_m, reps_k] = mma.operand_reps(Operand::A, a_shape);
        let reps_n = mma.operand_reps(Operand::B, b_shape)[1];
        for rep_k in 0..reps_k {
            for rep_m in 0..reps_m {
                for rep_n in 0..reps_n {
                    let a_first = (rep_m * reps_k + rep_k) * A_REGS_PER_MMA;
                    let b_first = (rep_n * reps_k + rep_k) * B_REGS_PER_MMA;
                    let c_first = (rep_m * reps_n + rep_n) * ACC_REGS_PER_MMA;
                    let a_regs = (a_first..a_first + A_REGS_PER_MMA)
                        .map(|r| self.fragment(inst, &mut a, r))
                        .collect::<Result<Vec<Reg>>>()?;
                    let b_regs = (b_first..b_first + B_REGS_PER_MMA)
                        .map(|r| self.fragment(inst, &mut b, r))
                        .collect::<Result<Vec<Reg>>>()?;
                    let c_regs = out[c_first..c_first + ACC_REGS_PER_MMA].to_vec();
                    let d = self.emit_multi(
                        Op::Mma {
                            a: a_regs,
                            b: b_regs,
                            c: c_regs,
                        },
                        &[Type::F32; ACC_REGS_PER_MMA],
                    );
                    out[c_first..c_first + ACC_REGS_PER_MMA].copy_from_slice(&d);
                }
            }
        }
        Ok(out)
    }
}

/// For each per-thread offset vector, the first earlier one it equals plus a constant in every
/// thread, and that constant: `None` where there is none (the vector is a base of its own).
fn constant_offsets(offsets: &[Vec<usize>]) -> Vec<Option<(usize, i64)>> {
    let mut relative = Vec::with_capacity(offsets.len());
    let mut bases: Vec<usize> = Vec::new();
    for (i, offset) in offsets.iter().enumerate() {
        let found = bases.iter().find_map(|&b| {
            let delta = offset[0] as i64 - offsets[b][0] as i64;
            offset
                .iter()
                .zip(&offsets[b])
                .all(|(&o, &p)| o as i64 - p as i64 == delta)
                .then_some((b, delta))
        });
        if found.is_none() {
            bases.push(i);
        }
        relative.push(found);
    }
    relative
}

#[cfg(test)]
mod tests {
    use super::constant_offsets;

    #[test]
    fn offsets_group_by_constant_difference() {
        // Thread offsets of a 3-bit XOR swizzle: k steps 0 and 4 differ by a constant (bit 3
        // is outside the XOR), k steps 0 and 1 do not.
        let step = |k: usize| (0..8).map(|t| ((2 * k) ^ t) * 8).collect::<Vec<usize>>();
        let offsets: Vec<Vec<usize>> = (0..8).map(step).collect();
        let relative = constant_offsets(&offsets);
        assert_eq!(&relative[..4], &[None, None, None, None]);
        for (k, &r) in relative.iter().enumerate().skip(4) {
            assert_eq!(r, Some((k - 4, 64)), "k step {k}");
        }
        assert_eq!(
            constant_offsets(&[vec![5, 9], vec![2, 6]]),
            [None, Some((0, -3))]
        );
    }
}
