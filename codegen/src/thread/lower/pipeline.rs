//! A pipelined loop ([`crate::layout::pipeline`]) in the thread program: its loads become
//! `cp.async` copies from global into multi-buffered swizzled shared tiles, issued
//! `stages - 1` iterations ahead.
//!
//! ```text
//! [bar.sync, if staged tiles were read]   // the buffers may have been read by an outer iteration
//! for s in 0 .. stages - 1: cp.async tile(s) -> buffer s; commit    // the prologue
//! for iv, slot = 0 (the buffer of this iteration):
//!     cp.async.wait_group stages - 2      // this thread's copies of this iteration landed
//!     bar.sync                            // everyone's did, and buffer slot - 1 is read out
//!     cp.async tile(iv + (stages - 1) step) -> buffer slot - 1; commit
//!     ... the body, its dots reading buffer slot ...
//!     yield .., slot + 1 (mod stages)
//! cp.async.wait_group 0                   // nothing in flight after the loop
//! ```
//!
//! A copy moves 16 bytes; a row outside the array, or an iteration past the loop's end, copies
//! zero source bytes (zero-filled, nothing read). Every thread commits a group each time, empty
//! or not, so that the wait counts stay uniform. Where the body issues `wgmma`s, its copies go
//! right after its first ones (before the next instruction that emits code, or the first
//! `wgmma` wait).
//!
//! With TMA ([`crate::layout::pipeline`]) warp 0 copies whole tiles (one elected lane), one
//! `full` `mbarrier` per buffer:
//!
//! ```text
//! [bar.sync, if staged tiles were read]
//! mbarrier.init bar(s), 1 (thread 0); fence.mbarrier_init; bar.sync    // everyone sees them
//! for s in 0 .. stages - 1, if iteration s exists:
//!     mbarrier.arrive.expect_tx bar(s), bytes of the tiles (thread 0)
//!     cp.async.bulk.tensor per slab -> buffer s (warp 0, one lane)
//! for iv, slot = 0, phase = 0:
//!     mbarrier.wait.parity bar(slot), phase   // this iteration's tiles landed
//!     bar.sync                                // buffer slot - 1 is read out
//!     [if iteration iv + (stages - 1) step exists: copies into buffer slot - 1]
//!     ... the body ...
//!     yield .., slot + 1 (mod stages), phase flipped where the slot wraps
//! bar.sync; mbarrier.inval bar(s) (thread 0)  // nothing in flight: past the end nothing was issued
//! ```
//!
//! The kernel's first TMA loop at its top level may set up its barriers and issue its first
//! copies ahead of the loop, where what they need is computed and a `dot` follows to hide
//! them behind ([`early_prologue`]).
//!
//! A top-level load copied once with TMA ([`Lowering::load_once_by_tma`]) has an `mbarrier` of
//! its own, waited for once where its tile is first read.
//!
//! With a producer warpgroup ([`super::producer`]) the consumers neither set up barriers nor
//! copy: each iteration waits on its `full` barrier and arrives on its `empty` one, and the
//! ring's slot and phase go on from one TMA loop into the next; the producer's loop copies.
//! Consumers that stage no tile among the buffers drop the `bar.sync`s around the loop too
//! ([`super::turns`]).
//!
//! In a program whose warpgroups take turns ([`super::turns`]) they must run apart, so every
//! TMA loop's `bar.sync` of each iteration goes: every buffer also has an `empty` `mbarrier`
//! that every thread arrives on at the end of the body (its `dot`s done with the buffer), and
//! warp 0 waits for the buffer's previous `empty` phase before copying into it again. With one warpgroup the
//! `bar.sync` stays: the `wgmma`s already hold its warps together, and the barriers cost more
//! (docs/PERF.md).

use std::collections::HashMap;

use kiln_dsl::ir::{Inst as TileInst, Kernel, Op as TileOp, Value};

use super::dot::{
    Pending, SharedBase, SharedTile, StagingRing, aligned_tile_bytes, pipeline_barrier_bytes,
    pipeline_buffer_bytes, tile_bytes,
};
use super::memory::BlockRegs;
use super::producer::Role;
use super::{Lowering, Result, memory_type, unsupported};
use crate::layout::pipeline::COPY_BYTES;
use crate::layout::pipeline::inst_count;
use crate::layout::{
    Delta, Layout, LayoutAssignment, OnceLoad, PipelinedLoad, PipelinedLoop, THREADS_PER_WARP,
    TmaLoad, nested_regions,
};
use crate::thread::ir::{Cast, Inst, IntCmp, IntOp, Op, Reg, Space, TmaCopy, Type};

/// Bytes of one `mbarrier`.
pub(super) const MBARRIER_BYTES: u32 = 8;

/// A pipelined loop's buffers and bounds, while its body is lowered.
pub(super) struct Pipeline {
    loop_info: PipelinedLoop,
    /// Each load's first buffer (bytes) and the bytes of one.
    buffers: Vec<(u32, u32)>,
    upper: Reg,
    step: Reg,
    tma: Option<TmaIssue>,
    /// Whether the copies at the top wait for the body's first `wgmma`s
    /// ([`Lowering::copies_now_or_later`]).
    pub defer_copies: bool,
}

/// A TMA loop's barriers and issuers.
#[derive(Clone, Copy)]
struct TmaIssue {
    /// The first buffer's `full` `mbarrier` (bytes; the others follow), whose phase completes
    /// when the buffer's copies landed.
    barriers: u32,
    /// In a program whose warpgroups take turns, the first buffer's `empty` `mbarrier` (the
    /// others follow), whose phase completes when every thread is done reading the buffer.
    empty: Option<u32>,
    /// Whether this thread sets the barriers up and arrives on them (thread 0).
    issuer: Reg,
    /// Whether this thread's warp issues the copies (warp 0, from one elected lane: a copy
    /// predicated per thread would make ptxas loop over the threads that might issue it).
    issuing_warp: Reg,
}

impl Pipeline {
    /// Whether its buffers are freed on `empty` barriers, its body lowered as if no staged
    /// writes were pending at its top ([`Lowering::pipeline_top`]).
    pub fn frees_on_barriers(&self) -> bool {
        self.tma.is_some_and(|t| t.empty.is_some())
    }

    /// Buffers per pipelined load.
    pub fn stages(&self) -> u32 {
        self.loop_info.stages
    }

    /// The registers the loop carries for it: the buffer slot, and with TMA the phase parity.
    pub fn state_len(&self) -> usize {
        if self.tma.is_some() { 2 } else { 1 }
    }
}

impl Lowering<'_> {
    /// Before the loop: reserves the buffers and issues the copies of the first `stages - 1`
    /// iterations, from the block pointers the loop starts with (`init`, by carried value).
    pub(super) fn pipeline_prologue(
        &mut self,
        inst: &TileInst,
        loop_info: &PipelinedLoop,
        body_params: &[Value],
        init: &[Vec<Reg>],
        bounds: [Reg; 3],
    ) -> Result<Pipeline> {
        let [lower, upper, step] = bounds;
        let buffers = self.loop_buffers(loop_info);
        self.next_buffer += pipeline_buffer_bytes(self.kernel, self.layouts, loop_info);
        let tma = loop_info.uses_tma().then(|| {
            let zero = self.i32_const(0);
            let warp_size = self.i32_const(THREADS_PER_WARP as i64);
            TmaIssue {
                barriers: self.next_barrier,
                empty: (self.layouts.frees_on_barriers())
                    .then_some(self.next_barrier + loop_info.stages * MBARRIER_BYTES),
                issuer: self.icmp(IntCmp::Eq, self.tid, zero),
                issuing_warp: self.icmp(IntCmp::Ult, self.tid, warp_size),
            }
        });
        self.next_barrier += pipeline_barrier_bytes(self.layouts, loop_info);
        let pipeline = Pipeline {
            loop_info: loop_info.clone(),
            buffers,
            upper,
            step,
            tma,
            defer_copies: false,
        };
        // The buffers may still be read by what ran before (an outer loop's last iteration);
        // a producer's copies into them wait for the consumers' `empty` arrivals instead.
        if self.pending.reads && !(self.consumers_run_apart() && pipeline.tma.is_some()) {
            self.barrier();
        }
        // Where a producer warpgroup fills the buffers, the barriers were set up before the
        // roles split ([`super::producer`]).
        if self.role != Role::Whole && pipeline.tma.is_some() {
            return Ok(pipeline);
        }
        if let Some(TmaIssue {
            barriers,
            empty,
            issuer,
            ..
        }) = pipeline.tma
        {
            self.init_tma_barriers(barriers, empty, loop_info.stages, issuer);
            self.barrier();
            for ahead in 0..loop_info.stages - 1 {
                let exists = self.iteration_exists(&pipeline, lower, ahead)?;
                let stage = self.i32_const(ahead as i64);
                self.issue_tma(
                    inst,
                    &pipeline,
                    body_params,
                    init,
                    ahead,
                    exists,
                    stage,
                    None,
                )?;
            }
            return Ok(pipeline);
        }
        for ahead in 0..loop_info.stages - 1 {
            let exists = self.iteration_exists(&pipeline, lower, ahead)?;
            for (i, load) in loop_info.loads.iter().enumerate() {
                let carried = carried_index(inst, body_params, load.param)?;
                let (buffers, bytes) = pipeline.buffers[i];
                let base = SharedBase::Fixed(buffers + ahead * bytes);
                self.issue_copies(inst, load, &init[carried], ahead, exists, base)?;
            }
            self.emit_effect(Op::CpAsyncCommit);
        }
        Ok(pipeline)
    }

    /// The prologue of the loop at `early` ahead of the loop, at [`early_prologue`]'s place:
    /// what the loop's lowering then takes up.
    pub(super) fn early_pipeline_prologue(&mut self, early: EarlyPrologue) -> Result<()> {
        let for_index = early.for_index;
        let for_inst = &self.kernel.body.insts[early.for_position];
        let loc = self.loc.replace(for_inst.loc);
        let pipeline = self.early_prologue_of(for_inst, for_index, early.for_position);
        self.loc = loc;
        self.early_pipeline = Some((for_index, pipeline?));
        Ok(())
    }

    fn early_prologue_of(
        &mut self,
        for_inst: &TileInst,
        for_index: usize,
        for_position: usize,
    ) -> Result<Pipeline> {
        let (
            Some(loop_info),
            TileOp::For {
                lower,
                upper,
                step,
                init,
                body,
            },
        ) = (self.layouts.pipeline_at(for_index), &for_inst.op)
        else {
            return Err(unsupported(for_inst, "expected a pipelined loop"));
        };
        // A bound that is a constant not lowered yet (the DSL makes them where they are used).
        for &bound in [lower, upper, step] {
            let constant = self.kernel.body.insts[..for_position]
                .iter()
                .find(|i| i.results.contains(&bound) && matches!(i.op, TileOp::Constant(_)));
            if let Some(constant) = constant
                && self.values[bound.index()].is_none()
            {
                let regs = self.inst(constant)?;
                self.bind(bound, regs.into_iter().next().unwrap_or_default());
            }
        }
        let bounds = [self.reg(*lower)?, self.reg(*upper)?, self.reg(*step)?];
        // Only the pipelined loads' block pointers are defined yet; the prologue reads no other.
        let init: Vec<Vec<Reg>> = init
            .iter()
            .map(|v| self.values[v.index()].clone().unwrap_or_default())
            .collect();
        self.pipeline_prologue(for_inst, loop_info, &body.params, &init, bounds)
    }

    /// At the top of the body: waits for this iteration's tiles, binds each pipelined load to
    /// its buffer `slot` (`state[0]`), and issues the copies `stages - 1` iterations ahead into
    /// the buffer the previous iteration read (after the body's first `wgmma`s, where the
    /// pipeline says so). Returns the next iteration's state.
    pub(super) fn pipeline_top(
        &mut self,
        inst: &TileInst,
        pipeline: &Pipeline,
        body_params: &[Value],
        params: &[Vec<Reg>],
        iv: Reg,
        state: &[Reg],
    ) -> Result<Vec<Reg>> {
        let stages = pipeline.loop_info.stages;
        let slot = state[0];
        match pipeline.tma {
            Some(TmaIssue {
                barriers, empty, ..
            }) => {
                let bar = self.barrier_of(barriers, slot);
                self.emit_effect(Op::MbarrierWait {
                    bar,
                    parity: state[1],
                    warps: None,
                });
                if empty.is_some() {
                    if self.ring_staging {
                        self.staging_ring = Some(StagingRing {
                            slot,
                            stages,
                            depth: self.blocks.len(),
                        });
                    }
                    // No barrier: the copies into buffer slot - 1 wait on its `empty` barrier.
                    // The body is lowered as if staged tiles had reads pending here but no
                    // writes; where it leaves writes pending, [`Self::pipeline_bottom`] puts a
                    // barrier here.
                    self.pending = Pending {
                        reads: true,
                        writes: false,
                    };
                } else {
                    self.barrier();
                }
            }
            None => {
                self.emit_effect(Op::CpAsyncWait {
                    pending: stages - 2,
                });
                // `cp.async` writes in the generic proxy, which `wgmma` must see fenced.
                self.pending.writes = true;
                self.barrier();
            }
        }
        let zero = self.i32_const(0);
        let last = self.i32_const(stages as i64 - 1);
        let one = self.i32_const(1);
        let is_first = self.icmp(IntCmp::Eq, slot, zero);
        let before = self.int(IntOp::Sub, slot, one);
        let write_slot = self.emit(
            Op::Select {
                cond: is_first,
                if_true: last,
                if_false: before,
            },
            Type::I32,
        );
        let ahead = stages - 1;
        let exists = self.iteration_exists(pipeline, iv, ahead)?;
        for (i, load) in pipeline.loop_info.loads.iter().enumerate() {
            let (buffers, bytes) = pipeline.buffers[i];
            if load.read_in_registers() {
                let buffer = self.buffer_of(buffers, bytes, slot);
                self.buffered.insert(load.value, buffer);
                continue;
            }
            let tile = self.buffer_tile(inst, load, buffers, bytes, slot)?;
            self.shared_tiles.insert(load.value, tile);
        }
        // Buffer slot - 1 was last read in the previous iteration, the phase of its `empty`
        // barrier before this iteration's `full` one (parity 1 at first: a fresh barrier's
        // previous phase counts as complete).
        let empty_parity = match pipeline.tma {
            Some(TmaIssue { empty: Some(_), .. }) => {
                let flipped = self.int(IntOp::Xor, state[1], one);
                Some(self.emit(
                    Op::Select {
                        cond: is_first,
                        if_true: flipped,
                        if_false: state[1],
                    },
                    Type::I32,
                ))
            }
            _ => None,
        };
        self.copies_now_or_later(pipeline.defer_copies, |this| {
            if this.role == Role::Consumer && pipeline.tma.is_some() {
                return Ok(());
            }
            if pipeline.tma.is_some() {
                return this.issue_tma(
                    inst,
                    pipeline,
                    body_params,
                    params,
                    ahead,
                    exists,
                    write_slot,
                    empty_parity,
                );
            }
            for (i, load) in pipeline.loop_info.loads.iter().enumerate() {
                let (buffers, bytes) = pipeline.buffers[i];
                let carried = carried_index(inst, body_params, load.param)?;
                let base = SharedBase::Slot {
                    buffers,
                    bytes,
                    slot: write_slot,
                };
                this.issue_copies(inst, load, &params[carried], ahead, exists, base)?;
            }
            this.emit_effect(Op::CpAsyncCommit);
            Ok(())
        })?;
        Ok(self.advance_ring(stages, state, Some(write_slot)))
    }

    /// The loop state after this iteration's: the slot after `state[0]` of a ring of `stages`
    /// buffers (with two, `written`, the one this iteration refilled, where there is one), and
    /// with TMA the phase parity `state[1]`, flipped where the slot wraps.
    pub(super) fn advance_ring(
        &mut self,
        stages: u32,
        state: &[Reg],
        written: Option<Reg>,
    ) -> Vec<Reg> {
        let zero = self.i32_const(0);
        let (next, wraps) = match written {
            Some(written) if stages == 2 => (written, None),
            _ => {
                let one = self.i32_const(1);
                let after = self.int(IntOp::Add, state[0], one);
                let stages_reg = self.i32_const(stages as i64);
                let wraps = self.icmp(IntCmp::Eq, after, stages_reg);
                let next = self.emit(
                    Op::Select {
                        cond: wraps,
                        if_true: zero,
                        if_false: after,
                    },
                    Type::I32,
                );
                (next, Some(wraps))
            }
        };
        if state.len() == 1 {
            return vec![next];
        }
        // Each pass over the buffers waits for the other phase parity.
        let wraps = wraps.unwrap_or_else(|| self.icmp(IntCmp::Eq, next, zero));
        let flip = self.emit(Op::Cast(Cast::ZExt, wraps), Type::I32);
        vec![next, self.int(IntOp::Xor, state[1], flip)]
    }

    /// At the end of the body, its `dot`s complete: every thread arrives on the `empty` barrier
    /// of the buffer it read (`state[0]`), and where the body leaves staged writes pending, the
    /// top gets the barrier [`Self::pipeline_top`] left out (at `top`, an index in the body's
    /// block).
    pub(super) fn pipeline_bottom(&mut self, pipeline: &Pipeline, state: &[Reg], top: usize) {
        let Some(TmaIssue {
            empty: Some(empty), ..
        }) = pipeline.tma
        else {
            return;
        };
        let bar = self.barrier_of(empty, state[0]);
        self.emit_effect(Op::MbarrierArrive { bar });
        if self.pending.writes {
            let barrier = self.barrier_ops();
            let loc = self.loc;
            if let Some(block) = self.blocks.last_mut() {
                for (i, op) in barrier.into_iter().enumerate() {
                    block.insert(
                        top + i,
                        Inst {
                            results: Vec::new(),
                            op,
                            loc,
                        },
                    );
                }
            }
        }
    }

    /// After the loop: no copy stays in flight (the last iterations' copies of iterations past
    /// the end still zero-fill their buffers; TMA issues none past the end), and the buffers are
    /// free for the next loop (whose prologue meets a barrier first: anything may be pending
    /// after a loop). TMA's barriers are invalidated once everyone has stopped waiting on them.
    pub(super) fn pipeline_drain(&mut self, pipeline: &Pipeline) {
        match pipeline.tma {
            Some(TmaIssue {
                barriers,
                empty,
                issuer,
                ..
            }) => {
                // A producer's ring of buffers goes on into the next TMA loop; the producer
                // itself waits for nobody, nor do consumers that stage no tile where the
                // buffers were.
                if self.role != Role::Producer && !self.consumers_run_apart() {
                    self.barrier();
                }
                if self.role != Role::Whole {
                    self.next_buffer -=
                        pipeline_buffer_bytes(self.kernel, self.layouts, &pipeline.loop_info);
                    self.next_barrier -= pipeline_barrier_bytes(self.layouts, &pipeline.loop_info);
                    return;
                }
                for stage in 0..pipeline.loop_info.stages {
                    let stage = self.i32_const(stage as i64);
                    for first in [barriers].into_iter().chain(empty) {
                        let bar = self.barrier_of(first, stage);
                        self.emit_effect(Op::MbarrierInval { bar, pred: issuer });
                    }
                }
            }
            None => self.emit_effect(Op::CpAsyncWait { pending: 0 }),
        }
        self.next_buffer -= pipeline_buffer_bytes(self.kernel, self.layouts, &pipeline.loop_info);
        self.next_barrier -= pipeline_barrier_bytes(self.layouts, &pipeline.loop_info);
    }

    /// Emits what `copies` makes, or where `defer`, holds it back until the body has issued
    /// its first `wgmma`s: the copies' instructions (TMA's wait for warp-uniform operands,
    /// cp.async's addresses) would otherwise run before the tensor cores start. The barrier
    /// at the top already freed the buffer they write, so any later point of the body will do.
    fn copies_now_or_later(
        &mut self,
        defer: bool,
        copies: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        // One loop's at a time: a loop nested (in an `if`) before the outer body's first
        // `wgmma`s emits its own at once, the outer ones still held.
        if !defer || self.deferred_copies.is_some() {
            return copies(self);
        }
        self.blocks.push(Vec::new());
        let made = copies(self);
        let insts = self.blocks.pop().unwrap_or_default();
        made?;
        self.deferred_copies = Some((self.blocks.len(), insts));
        Ok(())
    }

    /// After a body's opening `wgmma`s (at the first instruction after them, a `wgmma` wait, a
    /// loop, or the body's end, whichever comes first): passes the warpgroup's turn on
    /// ([`super::turns`]), then emits the copies held back by [`Self::copies_now_or_later`],
    /// where this is the block of the body that held them.
    pub(super) fn after_opening_wgmmas(&mut self) {
        self.pass_turn();
        let depth = self.blocks.len();
        if let Some((_, insts)) = self.deferred_copies.take_if(|(at, _)| *at == depth) {
            for inst in insts {
                self.push(inst);
            }
        }
    }

    /// Thread `issuer` sets up a TMA loop's barriers, `stages` of each kind from `full` (and
    /// `empty`): a `full` one counts one arrival (the copier's), an `empty` one every thread's;
    /// then the fence that lets the async proxy see them (a barrier must follow).
    pub(super) fn init_tma_barriers(
        &mut self,
        full: u32,
        empty: Option<u32>,
        stages: u32,
        issuer: Reg,
    ) {
        for stage in 0..stages {
            let stage = self.i32_const(stage as i64);
            let empty = empty.map(|empty| (empty, self.threads));
            for (first, count) in [(full, 1)].into_iter().chain(empty) {
                let bar = self.barrier_of(first, stage);
                self.emit_effect(Op::MbarrierInit {
                    bar,
                    count,
                    pred: issuer,
                });
            }
        }
        self.emit_effect(Op::FenceMbarrierInit);
    }

    /// The `mbarrier` of buffer `slot` (an i32 register).
    pub(super) fn barrier_of(&mut self, barriers: u32, slot: Reg) -> Reg {
        let bytes = self.i32_const(MBARRIER_BYTES as i64);
        let offset = self.int(IntOp::Mul, slot, bytes);
        self.shared_slot(barriers, offset, Type::I8)
    }

    /// Buffer `slot` (an i32 register) of consecutive buffers of `bytes` each from byte
    /// `buffers`.
    pub(super) fn buffer_of(&mut self, buffers: u32, bytes: u32, slot: Reg) -> Reg {
        let size = self.i32_const(bytes as i64);
        let offset = self.int(IntOp::Mul, slot, size);
        self.shared_slot(buffers, offset, Type::I8)
    }

    /// Where a pipelined loop's buffers go from `next_buffer` on: each load's first buffer and
    /// the bytes of one, a load's `stages` buffers after the one's before.
    pub(super) fn loop_buffers(&self, loop_info: &PipelinedLoop) -> Vec<(u32, u32)> {
        let mut next = self.next_buffer;
        loop_info
            .loads
            .iter()
            .map(|load| {
                let bytes = aligned_tile_bytes(self.kernel, self.layouts, load.value);
                let buffer = (next, bytes);
                next += loop_info.stages * bytes;
                buffer
            })
            .collect()
    }

    /// The TMA copies of every load's tile `ahead` iterations after the one the carried block
    /// pointers (`blocks`, by carried value) point at, into buffer `stage` (an i32 register),
    /// where the iteration `exists`: warp 0 waits for the buffer's `empty` phase of parity
    /// `empty_parity` (none for a buffer never filled), thread 0 arrives expecting all their
    /// bytes, warp 0 copies each tile by slabs.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn issue_tma(
        &mut self,
        inst: &TileInst,
        pipeline: &Pipeline,
        body_params: &[Value],
        blocks: &[Vec<Reg>],
        ahead: u32,
        exists: Reg,
        stage: Reg,
        empty_parity: Option<Reg>,
    ) -> Result<()> {
        let Some(TmaIssue {
            barriers,
            empty,
            issuer,
            issuing_warp,
        }) = pipeline.tma
        else {
            return Err(unsupported(
                inst,
                "expected a pipelined loop that copies with TMA",
            ));
        };
        let pred = self.int(IntOp::And, issuer, exists);
        let warps = self.int(IntOp::And, issuing_warp, exists);
        if let (Some(parity), Some(empty)) = (empty_parity, empty) {
            let bar = self.barrier_of(empty, stage);
            self.emit_effect(Op::MbarrierWait {
                bar,
                parity,
                warps: Some(warps),
            });
        }
        let bar = self.barrier_of(barriers, stage);
        let bytes = pipeline
            .loop_info
            .loads
            .iter()
            .map(|l| tile_bytes(self.kernel, l.value))
            .sum();
        self.emit_effect(Op::MbarrierArriveExpectTx { bar, bytes, pred });
        let mut copies = Vec::new();
        for (i, load) in pipeline.loop_info.loads.iter().enumerate() {
            let Some(TmaLoad { map, leading }) = &load.tma else {
                return Err(unsupported(inst, "expected a load that copies with TMA"));
            };
            let carried = carried_index(inst, body_params, load.param)?;
            let block = self.advanced_block(load, &blocks[carried], ahead)?;
            let (buffers, buffer_bytes) = pipeline.buffers[i];
            let tile = self.buffer_of(buffers, buffer_bytes, stage);
            copies.extend(self.tma_copies(inst, tile, &block, *map, leading, load.value)?);
        }
        self.emit_tma_loads(copies, bar, warps);
        Ok(())
    }

    /// `copies`, completing on `bar`, each from one lane of the warps where `warps` holds.
    /// Where the warps that compute also copy, in one op: its lane is elected once, not once a
    /// copy (dK/dV 1.00-1.04x). A producer warpgroup's stay one op each: grouped, ptxas
    /// scheduled the D128 forward's consumer loop 16 instructions longer, 0.96-0.98x (run 230,
    /// docs/PERF.md, nineteenth session).
    pub(super) fn emit_tma_loads(&mut self, copies: Vec<TmaCopy>, bar: Reg, warps: Reg) {
        if self.role == Role::Whole {
            self.emit_effect(Op::TmaLoad { copies, bar, warps });
            return;
        }
        for copy in copies {
            self.emit_effect(Op::TmaLoad {
                copies: vec![copy],
                bar,
                warps,
            });
        }
    }

    /// The TMA copies of `value`'s tile at `block` through tensor map `map` (its leading
    /// dimensions indexed by `leading`) into the shared tile at `tile`, slab by slab (an
    /// unswizzled map's box is the whole tile: one copy).
    pub(super) fn tma_copies(
        &mut self,
        inst: &TileInst,
        tile: Reg,
        block: &BlockRegs,
        map: usize,
        leading: &[Value],
        value: Value,
    ) -> Result<Vec<TmaCopy>> {
        if self.layouts.tensor_maps[map].swizzle_bytes == 0 {
            let mut coords: Vec<Reg> = block
                .offsets
                .iter()
                .rev()
                .map(|&o| self.tma_coord(o))
                .collect();
            coords.extend(self.leading_coords(leading)?);
            return Ok(vec![TmaCopy {
                dst: tile,
                map,
                coords,
            }]);
        }
        let [rows, cols] = <[usize; 2]>::try_from(self.shape(value))
            .map_err(|_| unsupported(inst, "expected a 2-D tile to copy with TMA"))?;
        let slab = self.slab_elems(map, cols);
        let origin = [block.offsets[0], block.offsets[1]].map(|r| self.tma_coord(r));
        let lead = self.leading_coords(leading)?;
        let slabs: Vec<Vec<Reg>> = (0..cols / slab)
            .map(|s| self.tma_slab(origin, &lead, s * slab))
            .collect();
        let slab_bytes = (rows * slab * self.dtype(value).size_bytes()) as i64;
        let mut copies = Vec::new();
        for (s, coords) in slabs.into_iter().enumerate() {
            let dst = if s == 0 {
                tile
            } else {
                let skip = self.i32_const(s as i64 * slab_bytes);
                self.emit(
                    Op::PtrAdd {
                        ptr: tile,
                        offset: skip,
                        elem: Type::I8,
                    },
                    Type::Ptr(Space::Shared),
                )
            };
            copies.push(TmaCopy { dst, map, coords });
        }
        Ok(copies)
    }

    /// The registers of `block` moved `ahead` iterations along `load`'s deltas.
    fn advanced_block(
        &mut self,
        load: &PipelinedLoad,
        block: &[Reg],
        ahead: u32,
    ) -> Result<BlockRegs> {
        let mut block = BlockRegs::from_regs(block);
        for (offset, delta) in block.offsets.iter_mut().zip(&load.deltas) {
            let distance = match *delta {
                Delta::Constant(c) => self.int_const(Type::I64, c * ahead as i64),
                Delta::Value(value) => {
                    let reg = self.reg(value)?;
                    let reg = match self.ty(reg) {
                        Type::I64 => reg,
                        _ => self.emit(Op::Cast(Cast::SExt, reg), Type::I64),
                    };
                    let times = self.int_const(Type::I64, ahead as i64);
                    self.int(IntOp::Mul, reg, times)
                }
            };
            *offset = self.int(IntOp::Add, *offset, distance);
        }
        Ok(block)
    }

    /// Whether iteration `from + ahead * step` of the loop exists: the step is positive,
    /// `from` is below the upper bound, and so is `from + ahead * step`, tested without a
    /// wrap as `upper - from > ahead * step` in 64 unsigned bits (the difference of two values
    /// of the induction variable's type fits them).
    fn iteration_exists(&mut self, pipeline: &Pipeline, from: Reg, ahead: u32) -> Result<Reg> {
        let ty = self.ty(from);
        let zero = self.int_const(ty, 0);
        let positive = self.icmp(IntCmp::Sgt, pipeline.step, zero);
        let below = self.icmp(IntCmp::Slt, from, pipeline.upper);
        let runs = self.int(IntOp::And, positive, below);
        if ahead == 0 {
            return Ok(runs);
        }
        let widen = |this: &mut Self, r: Reg| match ty {
            Type::I64 => r,
            _ => this.emit(Op::Cast(Cast::ZExt, r), Type::I64),
        };
        let remaining = self.int(IntOp::Sub, pipeline.upper, from);
        let remaining = widen(self, remaining);
        let step = widen(self, pipeline.step);
        let times = self.int_const(Type::I64, ahead as i64);
        let distance = self.int(IntOp::Mul, step, times);
        let beyond = self.icmp(IntCmp::Ugt, remaining, distance);
        Ok(self.int(IntOp::And, runs, beyond))
    }

    /// Where a pipelined load registers read stands: each thread reads its elements from the
    /// iteration's buffer (row-major), in runs along the last dimension of up to 16 bytes.
    pub(super) fn load_from_buffer(&mut self, inst: &TileInst) -> Result<Vec<Reg>> {
        let value = inst.results[0];
        let buffer = *self
            .buffered
            .get(&value)
            .ok_or_else(|| unsupported(inst, "expected a pipelined load inside its loop's body"))?;
        let map = self
            .value_map(inst, value)?
            .ok_or_else(|| unsupported(inst, "expected a tile to read from its buffer"))?;
        let shape = self.shape(value);
        let elem = memory_type(self.dtype(value));
        let vector = map.run_along(shape.len() - 1, COPY_BYTES / elem.bytes() as usize);
        let mut regs = Vec::new();
        for run in self.positions(&map).chunks(vector) {
            let index = self.linear_index(&run[0].coords, &shape);
            let ptr = self.emit(
                Op::PtrAdd {
                    ptr: buffer,
                    offset: index,
                    elem,
                },
                Type::Ptr(Space::Shared),
            );
            regs.extend(self.emit_multi(Op::LoadVector { ptr, pred: None }, &vec![elem; vector]));
        }
        Ok(regs)
    }

    /// The shared tile of a pipelined load in buffer `slot`.
    fn buffer_tile(
        &mut self,
        inst: &TileInst,
        load: &PipelinedLoad,
        buffers: u32,
        bytes: u32,
        slot: Reg,
    ) -> Result<SharedTile> {
        let shape = self.shape(load.value);
        let elem = memory_type(self.dtype(load.value));
        if !matches!(elem, Type::F16 | Type::BF16) {
            return Err(unsupported(
                inst,
                "expected a pipelined load of f16 or bf16",
            ));
        }
        let shared = load
            .shared
            .as_ref()
            .ok_or_else(|| unsupported(inst, "expected a pipelined load that dots read"))?;
        Ok(SharedTile {
            base: SharedBase::Slot {
                buffers,
                bytes,
                slot,
            },
            layout: shared.swizzled([shape[0], shape[1]]),
            elem,
        })
    }

    /// This thread's 16-byte copies of `load`'s tile `ahead` iterations after the one `block`
    /// (a carried block pointer's registers) points at, into the tile at `base`: nothing is
    /// read where the row is outside the array or the iteration does not exist.
    fn issue_copies(
        &mut self,
        inst: &TileInst,
        load: &PipelinedLoad,
        block: &[Reg],
        ahead: u32,
        exists: Reg,
        base: SharedBase,
    ) -> Result<()> {
        let block = self.advanced_block(load, block, ahead)?;
        let Some(Layout::Blocked(blocked)) = self.layouts.layout(load.value).cloned() else {
            return Err(unsupported(
                inst,
                "expected a pipelined load in a blocked layout",
            ));
        };
        let shape = self.shape(load.value);
        let elem = memory_type(self.dtype(load.value));
        let shared = load
            .shared
            .as_ref()
            .ok_or_else(|| unsupported(inst, "expected a pipelined load that dots read"))?;
        let tile = SharedTile {
            base,
            layout: shared.swizzled([shape[0], shape[1]]),
            elem,
        };
        let map = blocked.thread_map(&shape);
        let vector = COPY_BYTES / elem.bytes() as usize;
        let sources = self.block_addresses(&block, elem, &map, vector, &load.boundary_check);
        let runs: Vec<_> = (0..map.registers.len())
            .step_by(vector)
            .map(|r| (&map, r))
            .collect();
        let destinations = self.tile_addresses(&tile, &runs);
        let full = self.i32_const(COPY_BYTES as i64);
        let none = self.i32_const(0);
        for ((src, inside), dst) in sources.into_iter().zip(destinations) {
            let copy = self.and_pred(Some(exists), inside).unwrap_or(exists);
            let src_bytes = self.emit(
                Op::Select {
                    cond: copy,
                    if_true: full,
                    if_false: none,
                },
                Type::I32,
            );
            self.emit_effect(Op::CpAsync {
                dst,
                src,
                src_bytes,
            });
        }
        Ok(())
    }
}

/// Which carried value (0-based, after the induction variable) `param` is.
fn carried_index(inst: &TileInst, body_params: &[Value], param: Value) -> Result<usize> {
    body_params
        .iter()
        .skip(1)
        .position(|&p| p == param)
        .ok_or_else(|| {
            unsupported(
                inst,
                "a pipelined load of a block pointer the loop does not carry",
            )
        })
}

/// Where the kernel's first loop at its top level, if it is a TMA loop, sets up its barriers
/// and issues its first copies, if earlier than the loop itself: right after the last
/// top-level instruction that defines what they need (the loop's bounds, the block pointers
/// its pipelined loads start from and the offsets they advance by). Its first tiles then
/// load while the code before the loop runs: only where that code has a `dot` to hide
/// them behind (the forward's first key block's scores and softmax). Loads alone overlap
/// with the copies anyway, and the staging between would cost a barrier of its own (the dQ
/// kernel's: 2-3% slower at seqlen 1k, docs/PERF.md, run 42).
pub(super) fn early_prologue(kernel: &Kernel, layouts: &LayoutAssignment) -> Option<EarlyPrologue> {
    /// Whether `inst` or an instruction nested in it is one `pick` picks.
    fn any(inst: &TileInst, pick: &dyn Fn(&TileOp) -> bool) -> bool {
        pick(&inst.op)
            || nested_regions(&inst.op)
                .into_iter()
                .any(|r| r.insts.iter().any(|i| any(i, pick)))
    }
    let insts = &kernel.body.insts;
    let starts: Vec<usize> = insts
        .iter()
        .scan(0, |next, inst| {
            let start = *next;
            *next += inst_count(inst);
            Some(start)
        })
        .collect();
    let at = insts
        .iter()
        .position(|i| any(i, &|op| matches!(op, TileOp::For { .. })))?;
    let loop_info = layouts.pipeline_at(starts[at])?;
    let TileOp::For {
        lower,
        upper,
        step,
        init,
        body,
    } = &insts[at].op
    else {
        return None;
    };
    if !loop_info.uses_tma() {
        return None;
    }
    let mut needed = vec![*lower, *upper, *step];
    for load in &loop_info.loads {
        let carried = body.params.iter().skip(1).position(|&p| p == load.param)?;
        needed.push(init[carried]);
        needed.extend(load.deltas.iter().filter_map(|d| match d {
            Delta::Value(v) => Some(*v),
            Delta::Constant(_) => None,
        }));
    }
    // Constants count as defined from the start: the prologue lowers its own.
    let defined_at: HashMap<Value, usize> = insts[..at]
        .iter()
        .enumerate()
        .filter(|(_, inst)| !matches!(inst.op, TileOp::Constant(_)))
        .flat_map(|(p, inst)| inst.results.iter().map(move |&r| (r, p)))
        .collect();
    let earliest = needed
        .iter()
        .filter_map(|v| defined_at.get(v))
        .map(|p| p + 1)
        .max()
        .unwrap_or(0);
    let crosses_dot = insts[earliest..at]
        .iter()
        .any(|i| any(i, &|op| matches!(op, TileOp::Dot { .. })));
    (earliest < at && crosses_dot).then(|| EarlyPrologue {
        before: starts[earliest],
        for_index: starts[at],
        for_position: at,
    })
}

/// [`early_prologue`]'s place for a loop's prologue.
#[derive(Clone, Copy, Debug)]
pub(super) struct EarlyPrologue {
    /// The pre-order index of the top-level instruction it goes before.
    pub before: usize,
    /// The loop's pre-order index, and its position among the top-level instructions.
    pub for_index: usize,
    pub for_position: usize,
}

impl Lowering<'_> {
    /// A top-level load that TMA copies into its staged tile ([`LayoutAssignment::tma_once_at`],
    /// the `rank`-th such load): thread 0 sets up the load's `mbarrier` and arrives expecting the
    /// tile's bytes, warp 0 copies it by slabs, and whoever first reads the tile waits for the
    /// barrier's first phase there ([`Self::wait_for_once_loads`]), not here. The barrier is
    /// never invalidated: its bytes serve nothing else.
    pub(super) fn load_once_by_tma(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        rank: usize,
        load: &OnceLoad,
    ) -> Result<()> {
        let value = load.value;
        let start = self.next_staged;
        self.next_staged += aligned_tile_bytes(self.kernel, self.layouts, value);
        self.place_once_tile(inst, load, SharedBase::Fixed(start))?;
        let zero = self.i32_const(0);
        let issuer = self.icmp(IntCmp::Eq, self.tid, zero);
        let bar = self.once_barrier(rank, zero);
        self.emit_effect(Op::MbarrierInit {
            bar,
            count: 1,
            pred: issuer,
        });
        // Everyone sees the barrier set up before anyone waits on it.
        self.emit_effect(Op::FenceMbarrierInit);
        self.barrier();
        let tile = self.emit(
            Op::SharedAddress { offset: start },
            Type::Ptr(Space::Shared),
        );
        self.copy_whole_tile(inst, ptr, load, tile, bar)?;
        let first_phase = self.i32_const(0);
        self.once_loads.push((value, Some((bar, first_phase))));
        Ok(())
    }

    /// The shared tile of one-shot or refilled load `load`, at `base`: where `dot`s read its
    /// value.
    pub(super) fn place_once_tile(
        &mut self,
        inst: &TileInst,
        load: &OnceLoad,
        base: SharedBase,
    ) -> Result<()> {
        let value = load.value;
        let [rows, cols] = <[usize; 2]>::try_from(self.shape(value))
            .map_err(|_| unsupported(inst, "expected a 2-D tile to copy with TMA"))?;
        self.shared_tiles.insert(
            value,
            SharedTile {
                base,
                layout: load.shared.swizzled([rows, cols]),
                elem: memory_type(self.dtype(value)),
            },
        );
        Ok(())
    }

    /// Thread 0 arrives on `bar` expecting the bytes of `load`'s tile, and warp 0 copies the
    /// tile at block pointer `ptr` into the shared tile at `tile`, slab by slab.
    pub(super) fn copy_whole_tile(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        load: &OnceLoad,
        tile: Reg,
        bar: Reg,
    ) -> Result<()> {
        let zero = self.i32_const(0);
        let issuer = self.icmp(IntCmp::Eq, self.tid, zero);
        let warp_size = self.i32_const(THREADS_PER_WARP as i64);
        let issuing_warp = self.icmp(IntCmp::Ult, self.tid, warp_size);
        let value = load.value;
        let bytes = tile_bytes(self.kernel, value);
        self.emit_effect(Op::MbarrierArriveExpectTx {
            bar,
            bytes,
            pred: issuer,
        });
        let block = BlockRegs::from_regs(&self.regs(ptr)?);
        let TmaLoad { map, leading } = &load.tma;
        let copies = self.tma_copies(inst, tile, &block, *map, leading, value)?;
        self.emit_tma_loads(copies, bar, issuing_warp);
        Ok(())
    }

    /// Before an instruction that reads a tile a top-level TMA copy fills (directly, through a
    /// `trans` view of it, by a conversion at the instruction, or anywhere in its regions):
    /// waits for the copy, once. A loop or branch that reads it waits before it, so that the
    /// wait stands where every later read passes.
    pub(super) fn wait_for_once_loads(&mut self, inst: &TileInst) {
        if self.once_loads.iter().all(|(_, bar)| bar.is_none()) {
            return;
        }
        let used = self.values_read(inst);
        // A `trans` view reads nothing yet: its result stands for the same tile.
        if let TileOp::Trans { value } = inst.op
            && let Some(&(_, bar)) = self.once_loads.iter().find(|(v, _)| *v == value)
        {
            self.once_loads.push((inst.results[0], bar));
            return;
        }
        for i in 0..self.once_loads.len() {
            let (value, bar) = self.once_loads[i];
            let Some((bar, parity)) = bar.filter(|_| used.contains(&value)) else {
                continue;
            };
            self.emit_effect(Op::MbarrierWait {
                bar,
                parity,
                warps: None,
            });
            // The views of the same tile are waited for too.
            for entry in &mut self.once_loads {
                if entry.1.is_some_and(|(b, _)| b == bar) {
                    entry.1 = None;
                }
            }
        }
    }
}
