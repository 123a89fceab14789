//! Warp specialisation (FlashAttention-3's): a producer warpgroup of its own issues every TMA
//! loop's copies, the consumer warps only compute. The program splits by role once the
//! barriers are set up:
//!
//! ```text
//! mbarrier.init full(s), 1; mbarrier.init empty(s), consumers (thread 0); fence; bar.sync 0
//! if tid < 128:                              // the producer warpgroup
//!     setmaxnreg.dec 40                      // CompileOptions::register_split
//!     if tid < 32: the kernel's address arithmetic and loops, each TMA loop's iteration:
//!         mbarrier.try_wait.parity empty(slot), phase ^ 1   // the consumers freed the buffer
//!         mbarrier.arrive.expect_tx full(slot); cp.async.bulk.tensor .. -> buffer slot
//! else:                                      // the consumers, thread ids from 0
//!     setmaxnreg.inc 232                     // what the producer gave back
//!     the kernel, each TMA loop's iteration waiting on full(slot) and arriving on empty(slot),
//!     every block-wide barrier a named one of the consumers (none around the TMA loops where
//!     they stage no tile among the buffers: their turns then run through the program,
//!     [`super::turns`])
//! ```
//!
//! Both roles walk the same loops in the same order over one ring of buffers: a TMA loop takes
//! up the buffer slot and phase where the one before it stopped (they load tiles of the same
//! shapes into the same buffers), so the producer runs ahead across loops as far as the
//! `empty` barriers let it. The producer lowers only what its copies need (scalars and block
//! pointers); every tile op is the consumers'.

use kiln_dsl::ir::{Inst as TileInst, Op as TileOp, Region, Value};
use kiln_dsl::passes::for_each_operand;

use super::dot::aligned_tile_bytes;
use super::pipeline::MBARRIER_BYTES;
use super::turns::WARPGROUP_THREADS;
use super::{Lowering, Result, unsupported};
use crate::RegisterSplit;
use crate::layout::{THREADS_PER_WARP, nested_regions, walk_insts};
use crate::thread::ir::{Block, Constant, Inst, IntCmp, IntOp, Op, Reg, Type};

/// Which part of a warp-specialised program is being lowered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// No producer: every warp runs the whole kernel.
    Whole,
    /// The producer warpgroup's first warp: address arithmetic, loops and TMA copies.
    Producer,
    /// The consumer warps: everything else, their thread ids counted from 0.
    Consumer,
}

impl Role {
    /// The first of the block's threads this role's program counts from (its `tid` is the
    /// thread's index less this): the consumers count after the producer warpgroup.
    pub(super) fn first_thread(self) -> u32 {
        match self {
            Role::Consumer => WARPGROUP_THREADS,
            Role::Whole | Role::Producer => 0,
        }
    }
}

/// The consumers' named barrier: the last of the 16 (turns and stores take the first).
const CONSUMER_BARRIER: i64 = 15;

impl Lowering<'_> {
    /// Lowers `body` twice, as the producer and as the consumers, behind the barriers' setup,
    /// each role taking its `registers`.
    pub(super) fn split_roles(&mut self, body: &Region, registers: RegisterSplit) -> Result<()> {
        let tid = self.tid;
        self.init_ring_barriers(tid)?;
        let start = self.snapshot();

        self.role = Role::Producer;
        self.blocks.push(Vec::new());
        self.emit_effect(Op::SetMaxNreg {
            increase: false,
            regs: registers.producer,
        });
        let warp_size = self.i32_const(THREADS_PER_WARP as i64);
        let first_warp = self.icmp(IntCmp::Ult, tid, warp_size);
        self.blocks.push(Vec::new());
        self.region(body)?;
        let copies = self.blocks.pop().unwrap_or_default();
        self.push(Inst {
            results: Vec::new(),
            op: Op::If {
                cond: first_warp,
                then_block: Block { insts: copies },
                else_block: Block { insts: Vec::new() },
            },
            loc: None,
        });
        let producer = self.blocks.pop().unwrap_or_default();

        self.restore(start);
        self.role = Role::Consumer;
        let producers = self.emit_prelude(
            Op::Const(Constant::Int(self.role.first_thread() as i64)),
            Type::I32,
        );
        self.tid = self.emit_prelude(Op::Int(IntOp::Sub, tid, producers), Type::I32);
        self.consumer_barrier =
            Some(self.emit_prelude(Op::Const(Constant::Int(CONSUMER_BARRIER)), Type::I32));
        self.blocks.push(Vec::new());
        self.emit_effect(Op::SetMaxNreg {
            increase: true,
            regs: registers.consumer,
        });
        let program_turns = self.begin_program_turns();
        self.region(body)?;
        if program_turns {
            self.pass_turn();
            self.end_turns();
        }
        let consumers = self.blocks.pop().unwrap_or_default();

        let is_producer = self.icmp(IntCmp::Ult, tid, producers);
        self.push(Inst {
            results: Vec::new(),
            op: Op::If {
                cond: is_producer,
                then_block: Block { insts: producer },
                else_block: Block { insts: consumers },
            },
            loc: None,
        });
        Ok(())
    }

    /// Sets up every TMA loop's barriers before the roles split (they share one ring, at the
    /// first loop's place): `full` ones that the producer's arrival and its copies complete,
    /// `empty` ones that every consumer thread arrives on.
    fn init_ring_barriers(&mut self, tid: Reg) -> Result<()> {
        // The instructions inside a branch: a ring the branch's sides would move apart.
        let mut in_branch = Vec::new();
        let mut next = 0;
        walk_insts(&self.kernel.body, &mut next, &mut |index, inst| {
            if let TileOp::If { .. } = inst.op {
                let mut inner = index + 1;
                for nested in nested_regions(&inst.op) {
                    walk_insts(nested, &mut inner, &mut |i, _| in_branch.push(i));
                }
            }
        });
        let mut stages = None;
        // Every TMA loop's buffers, per load: one ring serves them all only if they match.
        let mut ring_buffers: Option<Vec<u32>> = None;
        for (index, pipeline) in self.layouts.pipelines() {
            if !pipeline.uses_tma() {
                continue;
            }
            let buffers: Vec<u32> = pipeline
                .loads
                .iter()
                .map(|l| aligned_tile_bytes(self.kernel, self.layouts, l.value))
                .collect();
            if ring_buffers.get_or_insert_with(|| buffers.clone()) != &buffers {
                return Err(crate::CodegenError::Options {
                    message: format!(
                        "a producer warpgroup feeds TMA loops that load tiles of the same sizes \
                         into one ring of buffers; `{}` has loops of {:?} and {buffers:?} bytes",
                        self.kernel.name(),
                        ring_buffers.unwrap_or_default()
                    ),
                });
            }
            if in_branch.contains(&index) {
                return Err(crate::CodegenError::Options {
                    message: format!(
                        "a producer warpgroup feeds TMA loops outside branches; `{}` has one \
                         inside an `if`",
                        self.kernel.name()
                    ),
                });
            }
            stages = Some(pipeline.stages);
        }
        let Some(stages) = stages else {
            return Err(crate::CodegenError::Options {
                message: format!(
                    "a producer warpgroup issues TMA loops' copies; `{}` has no TMA loop",
                    self.kernel.name()
                ),
            });
        };
        let zero = self.i32_const(0);
        let issuer = self.icmp(IntCmp::Eq, tid, zero);
        self.init_refill_barriers(issuer);
        let full = self.next_barrier;
        self.init_tma_barriers(full, Some(full + stages * MBARRIER_BYTES), stages, issuer);
        self.emit_effect(Op::Barrier);
        Ok(())
    }

    /// The producer's lowering of a top-level or nested instruction: what yields, loops, and
    /// address arithmetic whose operands it has; every other op (tiles, loads, stores, `dot`s)
    /// is the consumers'. Returns what a `yield` names (no registers for a value it skipped).
    pub(super) fn produce(&mut self, inst: &TileInst) -> Result<Option<Vec<Vec<Reg>>>> {
        match &inst.op {
            TileOp::Yield { values } => Ok(Some(
                values
                    .iter()
                    .map(|v| self.values[v.index()].clone().unwrap_or_default())
                    .collect(),
            )),
            TileOp::For {
                lower,
                upper,
                step,
                init,
                body,
            } => {
                self.producer_loop(inst, [*lower, *upper, *step], init, body)?;
                Ok(None)
            }
            TileOp::If { .. } => {
                if inst.results.iter().any(|&r| self.is_address(r)) {
                    return Err(unsupported(
                        inst,
                        "a producer warpgroup cannot follow a branch that yields scalars",
                    ));
                }
                Ok(None)
            }
            TileOp::LoadBlock { ptr, .. } => {
                if let Some((rank, load)) = self.layouts.tma_once_at(self.current_inst)
                    && load.refills()
                {
                    self.produce_refill(inst, *ptr, rank, &load.clone())?;
                }
                Ok(None)
            }
            TileOp::Load { .. }
            | TileOp::Store { .. }
            | TileOp::StoreBlock { .. }
            | TileOp::AtomicAdd { .. } => Ok(None),
            _ => {
                let mut bound = true;
                for_each_operand(&inst.op, |v| bound &= self.values[v.index()].is_some());
                if bound && inst.results.iter().all(|&r| self.is_address(r)) {
                    let results = self.inst(inst)?;
                    for (&result, regs) in inst.results.iter().zip(results) {
                        self.bind(result, regs);
                    }
                }
                Ok(None)
            }
        }
    }

    /// Whether `value` is a scalar or a block pointer: what the producer computes.
    fn is_address(&self, value: Value) -> bool {
        let ty = self.kernel.ty(value);
        ty.is_scalar() || matches!(ty, kiln_dsl::types::Type::BlockPtr { .. })
    }

    /// The producer's `for`: it carries what it computes (scalars, block pointers) and, for a
    /// TMA loop, the ring's slot and phase; each iteration waits for its buffer's `empty` phase
    /// and copies the iteration's tiles into it.
    fn producer_loop(
        &mut self,
        inst: &TileInst,
        bounds: [Value; 3],
        init: &[Value],
        body: &Region,
    ) -> Result<()> {
        let index = self.current_inst;
        let [lower, upper, step] = [
            self.reg(bounds[0])?,
            self.reg(bounds[1])?,
            self.reg(bounds[2])?,
        ];
        let kept: Vec<usize> = (0..init.len())
            .filter(|&i| self.values[init[i].index()].is_some())
            .collect();
        let init_regs: Vec<Vec<Reg>> = kept
            .iter()
            .map(|&i| self.regs(init[i]))
            .collect::<Result<_>>()?;
        let pipeline = match self.layouts.pipeline_at(index) {
            Some(info) if info.uses_tma() => {
                let info = info.clone();
                let all: Vec<Vec<Reg>> = init
                    .iter()
                    .map(|v| self.values[v.index()].clone().unwrap_or_default())
                    .collect();
                Some(self.pipeline_prologue(
                    inst,
                    &info,
                    &body.params,
                    &all,
                    [lower, upper, step],
                )?)
            }
            _ => None,
        };
        let iv = self.new_reg(self.ty(lower));
        let params = self.fresh(&init_regs);
        self.bind(body.params[0], vec![iv]);
        let outer_counter = self.loop_counter.replace([iv, lower, step]);
        for (k, &i) in kept.iter().enumerate() {
            self.bind(body.params[1 + i], params[k].clone());
        }
        let mut flat_init: Vec<Reg> = init_regs.iter().flatten().copied().collect();
        let mut flat_params: Vec<Reg> = params.iter().flatten().copied().collect();
        // A TMA loop carries the ring; so does one around TMA loops.
        let state: Vec<Reg> = if pipeline.is_some() || self.nests_tma_loop(body) {
            let start = self.ring_start();
            let state = self.carry(start, &mut flat_init, &mut flat_params);
            self.ring = Some([state[0], state[1]]);
            state
        } else {
            Vec::new()
        };
        self.blocks.push(Vec::new());
        let mut next_state = Vec::new();
        if let Some(pipeline) = &pipeline {
            let all: Vec<Vec<Reg>> = (0..init.len())
                .map(|i| match kept.iter().position(|&k| k == i) {
                    Some(k) => params[k].clone(),
                    None => Vec::new(),
                })
                .collect();
            next_state = self.produce_iteration(inst, pipeline, &body.params, &all, &state)?;
        }
        let yielded = self.region_insts(body)?;
        self.loop_counter = outer_counter;
        if pipeline.is_none() && !state.is_empty() {
            // Where the ring stands after the TMA loops of the body.
            next_state = self.ring_start();
        }
        let mut values: Vec<Reg> = Vec::new();
        for (&i, init) in kept.iter().zip(&init_regs) {
            let regs = yielded.get(i).cloned().unwrap_or_default();
            if regs.len() != init.len() {
                return Err(unsupported(
                    inst,
                    "a producer warpgroup needs every scalar a loop carries computed without tiles",
                ));
            }
            values.extend(regs);
        }
        values.extend(next_state);
        let mut insts = self.blocks.pop().unwrap_or_default();
        insts.push(Inst {
            results: Vec::new(),
            op: Op::Yield(values),
            loc: self.loc,
        });
        let results = self.fresh(&init_regs);
        let mut flat_results: Vec<Reg> = results.iter().flatten().copied().collect();
        let ring_end: Vec<Reg> = state.iter().map(|_| self.new_reg(Type::I32)).collect();
        flat_results.extend(&ring_end);
        self.push(Inst {
            results: flat_results,
            op: Op::For {
                lower,
                upper,
                step,
                init: flat_init,
                iv,
                params: flat_params,
                body: Block { insts },
            },
            loc: Some(inst.loc),
        });
        for (k, &i) in kept.iter().enumerate() {
            self.bind(inst.results[i], results[k].clone());
        }
        if !state.is_empty() {
            self.ring = Some([ring_end[0], ring_end[1]]);
        }
        if let Some(pipeline) = &pipeline {
            self.pipeline_drain(pipeline);
        }
        Ok(())
    }

    /// What the lowering of the kernel's body changes, as it stands before it: the consumers
    /// lower the body again from there.
    fn snapshot(&self) -> Start {
        Start {
            values: self.values.clone(),
            next_inst: self.next_inst,
            next_staged: self.next_staged,
            next_buffer: self.next_buffer,
            next_barrier: self.next_barrier,
            scratch: self.scratch,
            tma_store_bytes: self.tma_store_bytes,
        }
    }

    fn restore(&mut self, start: Start) {
        self.values = start.values;
        self.next_inst = start.next_inst;
        self.next_staged = start.next_staged;
        self.next_buffer = start.next_buffer;
        self.next_barrier = start.next_barrier;
        self.scratch = start.scratch;
        self.tma_store_bytes = start.tma_store_bytes;
        self.ring = None;
        self.fields.clear();
        self.tid_again = None;
        self.uniform_warpgroup = None;
        self.shared_tiles.clear();
        self.staged_by_threads.clear();
        self.buffered.clear();
        self.once_loads.clear();
        self.releases.clear();
        self.loop_counter = None;
        self.ring_slot = None;
        self.hoisted.clear();
        self.converted.clear();
        self.partial_totals.clear();
        self.narrowed.clear();
    }

    /// One producer iteration of a TMA loop: waits until the consumers freed buffer `slot`
    /// (`state[0]`; the `empty` phase before the `full` one it fills, parity 1 at first: a
    /// fresh barrier's previous phase counts as complete), then copies the iteration's tiles
    /// into it. Returns the next iteration's slot and phase.
    fn produce_iteration(
        &mut self,
        inst: &TileInst,
        pipeline: &super::pipeline::Pipeline,
        body_params: &[Value],
        blocks: &[Vec<Reg>],
        state: &[Reg],
    ) -> Result<Vec<Reg>> {
        let one = self.i32_const(1);
        let always = self.int_const(Type::I1, 1);
        let empty_parity = self.int(IntOp::Xor, state[1], one);
        self.issue_tma(
            inst,
            pipeline,
            body_params,
            blocks,
            0,
            always,
            state[0],
            Some(empty_parity),
        )?;
        Ok(self.advance_ring(pipeline.stages(), state, None))
    }

    /// Whether `body`, of the `for` being lowered, holds a TMA loop a producer feeds: the loop
    /// then carries the ring's slot and phase.
    pub(super) fn nests_tma_loop(&self, body: &Region) -> bool {
        if self.role == Role::Whole {
            return false;
        }
        self.any_in_body(body, |index| {
            self.layouts
                .pipeline_at(index)
                .is_some_and(|p| p.uses_tma())
        })
    }

    /// The ring's slot and phase where the next TMA loop starts: where the last one stopped,
    /// or 0 and 0.
    pub(super) fn ring_start(&mut self) -> Vec<Reg> {
        match self.ring {
            Some(state) => state.to_vec(),
            None => vec![self.i32_const(0), self.i32_const(0)],
        }
    }
}

/// What [`Lowering::snapshot`] keeps.
struct Start {
    values: Vec<Option<Vec<Reg>>>,
    next_inst: usize,
    next_staged: u32,
    next_buffer: u32,
    next_barrier: u32,
    scratch: u32,
    tma_store_bytes: u32,
}
