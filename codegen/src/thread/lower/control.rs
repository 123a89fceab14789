//! Structured control flow: a tile `for` or `if` becomes the thread program's, with one carried
//! register (or result) per register of each carried tile. Bounds and conditions are scalars,
//! the same in every thread. Accesses to staged tiles pending at a barrier are joined
//! conservatively: anything may be pending at a loop's head and after it.

use kiln_dsl::ir::{Inst as TileInst, Region, Value};

use super::dot::Pending;
use super::producer::Role;
use super::{Lowering, Result};
use crate::layout::walk_insts;
use crate::thread::ir::{Block, Inst, Op, Reg, Type};

impl Lowering<'_> {
    /// Lowers `region` into a block of its own, after what `top` emits, ending in a yield of
    /// what the region yields, then of the registers `top` gave, then of those `bottom` gives.
    /// `bottom` runs after the region, its `dot`s complete, with the length of the block `top`
    /// made.
    fn nested_block(
        &mut self,
        region: &Region,
        top: impl FnOnce(&mut Self) -> Result<Vec<Reg>>,
        bottom: impl FnOnce(&mut Self, usize) -> Result<Vec<Reg>>,
    ) -> Result<(Block, Vec<Vec<Reg>>)> {
        self.blocks.push(Vec::new());
        let yielded = top(self).and_then(|mut extra| {
            let top_len = self.blocks.last().map_or(0, Vec::len);
            let yielded = self.region(region)?;
            extra.extend(bottom(self, top_len)?);
            Ok((yielded, extra))
        });
        let mut insts = self.blocks.pop().unwrap_or_default();
        let (yielded, extra) = yielded?;
        let mut values: Vec<Reg> = yielded.iter().flatten().copied().collect();
        values.extend(extra);
        insts.push(Inst {
            results: Vec::new(),
            op: Op::Yield(values),
            loc: self.loc,
        });
        Ok((Block { insts }, yielded))
    }

    /// Carries `start` through a loop beside its values: each register an init and a fresh
    /// loop parameter, which it returns.
    pub(super) fn carry(
        &mut self,
        start: Vec<Reg>,
        init: &mut Vec<Reg>,
        params: &mut Vec<Reg>,
    ) -> Vec<Reg> {
        start
            .into_iter()
            .map(|r| {
                init.push(r);
                let reg = self.new_reg(Type::I32);
                params.push(reg);
                reg
            })
            .collect()
    }

    /// Fresh registers of the same types and grouping as `like`.
    pub(super) fn fresh(&mut self, like: &[Vec<Reg>]) -> Vec<Vec<Reg>> {
        like.iter()
            .map(|regs| {
                regs.iter()
                    .map(|&r| {
                        let ty = self.ty(r);
                        self.new_reg(ty)
                    })
                    .collect()
            })
            .collect()
    }

    /// Whether `body`, of the `for` being lowered, holds an instruction (by pre-order index)
    /// for which `holds` is true.
    pub(super) fn any_in_body(&self, body: &Region, holds: impl Fn(usize) -> bool) -> bool {
        let mut next = self.current_inst + 1;
        let mut any = false;
        crate::layout::walk_insts(body, &mut next, &mut |index, _| any |= holds(index));
        any
    }

    /// Whether `body`, of the `for` being lowered, writes staged tiles from registers
    /// (`ConversionKind::Stage`, generic-proxy writes that a barrier must fence for `wgmma`).
    fn stages_in(&self, body: &Region) -> bool {
        self.any_in_body(body, |index| {
            self.layouts
                .conversions_at(index)
                .iter()
                .any(|c| c.kind == crate::layout::ConversionKind::Stage)
        })
    }

    /// A `for`; a pipelined one ([`super::pipeline`]) carries its buffer slot beside the
    /// tile values, after a prologue, and drains its copies after it.
    pub(super) fn for_loop(
        &mut self,
        inst: &TileInst,
        lower: Value,
        upper: Value,
        step: Value,
        init: &[Value],
        body: &Region,
    ) -> Result<Vec<Vec<Reg>>> {
        // An enclosing body's copies go before this loop's own.
        self.after_opening_wgmmas();
        let loc = self.loc;
        let (lower, upper, step) = (self.reg(lower)?, self.reg(upper)?, self.reg(step)?);
        let init: Vec<Vec<Reg>> = init.iter().map(|&v| self.regs(v)).collect::<Result<_>>()?;
        let stages = self.stages_in(body);
        let mut takes_turns = false;
        let pipeline = match self.layouts.pipeline_at(self.current_inst) {
            Some(info) => {
                let bounds = [lower, upper, step];
                let index = self.current_inst;
                // Its prologue may have gone ahead of it ([`super::pipeline::early_prologue`]).
                let mut pipeline = match self.early_pipeline.take_if(|(at, _)| *at == index) {
                    Some((_, pipeline)) => {
                        // The prologue's barrier came before what was staged since, and a
                        // body without a barrier at its top assumes no staged writes pending.
                        if self.pending.writes && pipeline.frees_on_barriers() {
                            self.barrier();
                        }
                        pipeline
                    }
                    None => self.pipeline_prologue(inst, info, &body.params, &init, bounds)?,
                };
                // A body that issues `wgmma`s issues its first ones before the copies.
                pipeline.defer_copies = body.insts.iter().any(|i| self.issues_wgmma(i));
                // A body that stages a tile meets at a barrier of the block every iteration:
                // turns there only add a wait (the fused D128 dK/dV without them 1.01-1.02x,
                // runs 237-240, twentieth session).
                takes_turns =
                    info.uses_tma() && pipeline.defer_copies && !stages && self.begin_turns();
                Some(pipeline)
            }
            None => None,
        };
        let iv = self.new_reg(self.ty(lower));
        let params = self.fresh(&init);
        self.bind(body.params[0], vec![iv]);
        let outer_counter = self.loop_counter.replace([iv, lower, step]);
        for (&param, regs) in body.params[1..].iter().zip(&params) {
            self.bind(param, regs.clone());
        }
        let mut flat_init: Vec<Reg> = init.iter().flatten().copied().collect();
        let mut flat_params: Vec<Reg> = params.iter().flatten().copied().collect();
        // The pipeline's own carried state (its buffer slot, and with TMA the phase), from 0,
        // or where a producer's ring stands.
        let state: Vec<Reg> = match &pipeline {
            Some(pipeline) => {
                let start = if self.role == Role::Consumer && pipeline.state_len() == 2 {
                    self.ring_start()
                } else {
                    (0..pipeline.state_len())
                        .map(|_| self.i32_const(0))
                        .collect()
                };
                self.carry(start, &mut flat_init, &mut flat_params)
            }
            None => Vec::new(),
        };
        // A loop around TMA loops that a producer feeds carries the ring's slot and phase.
        let carries_ring =
            pipeline.as_ref().is_none_or(|p| p.state_len() != 2) && self.nests_tma_loop(body);
        if carries_ring {
            let start = self.ring_start();
            let ring = self.carry(start, &mut flat_init, &mut flat_params);
            self.ring = Some([ring[0], ring[1]]);
        }
        // Staged tiles: the body may follow its own last iteration, and the loop may not run;
        // writes are pending only if some were before it or the body stages tiles.
        let pending = Pending {
            reads: true,
            writes: self.pending.writes || stages,
        };
        self.pending = pending;
        // The body's staged tiles may take its ring's buffers ([`Self::pipeline_top`]).
        let outer_ring = self.staging_ring;
        // Where the body holds one `dot` of one warpgroup, nested ones counted, its owners
        // take turns by iteration (`wgmma.rs`).
        let mut owned = 0;
        walk_insts(body, &mut (self.current_inst + 1), &mut |index, _| {
            owned += usize::from(self.layouts.one_warpgroup_dot(index).is_some());
        });
        let turns_body = (owned == 1).then_some(self.blocks.len() + 1);
        let outer_body = std::mem::replace(&mut self.owner_turns_body, turns_body);
        let outer_turns = std::mem::take(&mut self.owner_turns_open);
        // With `loop_tid`, on `mma.sync`, the body derives its thread fields from `%tid.x`
        // read again at its top ([`crate::CompileOptions::loop_tid`]); after the loop, the
        // fields come from where they did before it.
        let outer_tid = self.tid_again;
        let reads_tid = self.loop_tid && !self.layouts.uses_wgmma();
        let body = self.nested_block(
            body,
            |this| {
                if reads_tid {
                    this.read_tid_again();
                }
                match &pipeline {
                    Some(pipeline) => {
                        this.pipeline_top(inst, pipeline, &body.params, &params, iv, &state)
                    }
                    None => Ok(Vec::new()),
                }
            },
            |this, top| {
                if takes_turns {
                    this.close_turn()?;
                }
                if let Some(pipeline) = &pipeline {
                    this.pipeline_bottom(pipeline, &state, top);
                }
                Ok(if carries_ring {
                    this.ring_start()
                } else {
                    Vec::new()
                })
            },
        );
        self.loop_counter = outer_counter;
        self.tid_again = outer_tid;
        self.staging_ring = outer_ring;
        self.owner_turns_body = outer_body;
        let (body_block, _) = body?;
        self.pending = pending;
        let results = self.fresh(&init);
        let mut flat_results: Vec<Reg> = results.iter().flatten().copied().collect();
        let state_end: Vec<Reg> = state.iter().map(|_| self.new_reg(Type::I32)).collect();
        flat_results.extend(&state_end);
        if self.role == Role::Consumer && state_end.len() == 2 {
            self.ring = Some([state_end[0], state_end[1]]);
        }
        if carries_ring {
            let ring_end = [self.new_reg(Type::I32), self.new_reg(Type::I32)];
            flat_results.extend(ring_end);
            self.ring = Some(ring_end);
        }
        self.push(Inst {
            results: flat_results,
            op: Op::For {
                lower,
                upper,
                step,
                init: flat_init,
                iv,
                params: flat_params,
                body: body_block,
            },
            loc,
        });
        if takes_turns {
            self.end_turns();
        }
        if let Some(pipeline) = &pipeline {
            self.pipeline_drain(pipeline);
        }
        // The owners' barriers by iteration parity start afresh after it (`wgmma.rs`).
        if std::mem::replace(&mut self.owner_turns_open, outer_turns) {
            self.barrier();
        }
        Ok(results)
    }

    pub(super) fn if_else(
        &mut self,
        cond: Value,
        then_region: &Region,
        else_region: &Region,
    ) -> Result<Vec<Vec<Reg>>> {
        let loc = self.loc;
        let cond = self.reg(cond)?;
        let before = self.pending;
        let (then_block, yielded) =
            self.nested_block(then_region, |_| Ok(Vec::new()), |_, _| Ok(Vec::new()))?;
        let after_then = std::mem::replace(&mut self.pending, before);
        let (else_block, _) =
            self.nested_block(else_region, |_| Ok(Vec::new()), |_, _| Ok(Vec::new()))?;
        self.pending.reads |= after_then.reads;
        self.pending.writes |= after_then.writes;
        let results = self.fresh(&yielded);
        self.push(Inst {
            results: results.iter().flatten().copied().collect(),
            op: Op::If {
                cond,
                then_block,
                else_block,
            },
            loc,
        });
        Ok(results)
    }
}
