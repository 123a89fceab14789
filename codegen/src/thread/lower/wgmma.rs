//! `dot` on Hopper's warpgroup tensor cores: each warpgroup issues one
//! `wgmma.mma_async.m64nNk16` per 64 rows of its M and k step, B (and A, unless it is an
//! earlier `dot`'s accumulator in registers) read from the staged tile through a matrix
//! descriptor ([`crate::layout::wgmma`]), and commits them as one group. Nothing waits for the
//! group until an op uses the result (or control flow joins): the `dot`s and whatever comes
//! between run at once, as FlashAttention-3's softmax runs beside the next `P @ V`.
//!
//! ```text
//! [fence.proxy.async; bar.sync, if staged tiles were written]
//! wgmma.fence                            // register writes land before the wgmmas read them
//! for rep_m: wgmma.mma_async acc[rep_m], a(rep_m, k), b(k) for every k step, in one statement
//! wgmma.commit_group
//! ...                                    // ops that do not use the result
//! wgmma.wait_group n acc..               // n: the groups committed after this one
//! ```
//!
//! A `dot` of a zero accumulator issues its first step with `scale-d` false: no register is
//! set to zero for it. A `dot` of one warpgroup's rows in a program of several is issued by
//! one warpgroup, by turns, in a branch with the reduction that is its one use
//! ([`Lowering::one_warpgroup_dot`]). Each descriptor is its tile's base plus a constant, added by LLVM or,
//! with [`crate::CompileOptions::descriptors_at_issue`], in the statement itself.

use kiln_dsl::ir::{Inst as TileInst, Op as TileOp, Value};

use super::dot::Pending;
use super::dot::{Fragments, SharedTile};
use super::turns::{OWNER_BARRIERS, WARPGROUP_THREADS};
use super::{Lowering, Result, unsupported};
use crate::layout::mma::{A_REGS_PER_MMA, ACC_REGS_PER_MMA, MMA_M, MMA_N, MmaV2, Operand};
use crate::layout::wgmma::{
    Descriptor, Major, WARPS_PER_WARPGROUP, WGMMA_K, WGMMA_M, operand_descriptor,
};
use crate::layout::{ConversionKind, Id, IdField, Layout, MmaVersion, is_zero_splat};
use crate::thread::ir::{
    Block, Cast, Constant, Inst, IntCmp, IntOp, Op, Reg, ShuffleMode, Type, WgmmaA, WgmmaDesc,
    WgmmaStep,
};
use crate::{CodegenError, Stage};

/// The `dot`s of the region being lowered whose groups are in flight, each with the count of
/// groups committed up to and including its own.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    dots: Vec<(Value, u32)>,
    committed: u32,
}

impl InFlight {
    /// Whether no `dot` is in flight.
    pub fn is_empty(&self) -> bool {
        self.dots.is_empty()
    }

    /// Whether the `dot` of result `value` is in flight.
    pub fn holds(&self, value: Value) -> bool {
        self.dots.iter().any(|&(v, _)| v == value)
    }

    /// Into a region: its ops see none of the `dot`s in flight around it (an `if` waits before
    /// it for those its branches use; a loop for all). Returns those, for [`Self::leave`].
    pub fn enter(&mut self) -> InFlight {
        InFlight {
            dots: std::mem::take(&mut self.dots),
            committed: self.committed,
        }
    }

    /// Out of a region, which waited for its own `dot`s. If it committed any, a path through it
    /// may have waited for everything and another through its sibling for nothing, so the
    /// groups counted since do not tell how many follow an outer `dot`'s: each is then waited
    /// for with nothing left pending.
    pub fn leave(&mut self, outer: InFlight) {
        let committed = self.committed;
        self.dots = outer.dots;
        if committed != outer.committed {
            for (_, group) in &mut self.dots {
                *group = committed;
            }
        }
    }
}

/// A shared operand's descriptors: the warpgroup's own (an i64 register) plus a constant per
/// instruction.
struct Descriptors {
    tile: SharedTile,
    is_a: bool,
    base: Reg,
    major: Major,
}

impl Lowering<'_> {
    /// `lhs [M, K] @ rhs [K, N] + acc` with the accumulator in `mma`'s fragments (every warp
    /// along M); the group takes its warpgroup's turn at the tensor cores where they take
    /// turns and `turn` says so.
    pub(super) fn wgmma_dot(
        &mut self,
        inst: &TileInst,
        mma: MmaV2,
        [lhs, rhs, acc]: [Value; 3],
        turn: bool,
    ) -> Result<Vec<Reg>> {
        let (a_shape, b_shape) = (self.shape(lhs), self.shape(rhs));
        let (a_shape, b_shape) = ([a_shape[0], a_shape[1]], [b_shape[0], b_shape[1]]);
        for (op, shape) in [(Operand::A, a_shape), (Operand::B, b_shape)] {
            mma.check_operand_shape(op, shape)
                .map_err(|m| unsupported(inst, m))?;
        }
        let [reps_m, reps_k] = mma.operand_reps(Operand::A, a_shape);
        let n = b_shape[1];
        let per_rep = n / MMA_N * ACC_REGS_PER_MMA;
        let rows_per_rep = MMA_M * mma.num_warps() as usize;
        let mut acc_regs = self.regs(acc)?;
        let accumulate = !is_zero_splat(acc, |v| self.definitions[v.index()].map(|i| &i.op));
        // A in registers: an accumulator's, loaded here, or loaded before the loop (then the
        // dot's conversion of it is `Hoisted`, and `converted` holds its registers).
        let a_conversion = self
            .layouts
            .dot_operand(self.current_inst, lhs)
            .map(|c| (c.kind.clone(), c.to.clone()));
        let a_registers = match a_conversion {
            Some((ConversionKind::AccumulatorAsA, _)) => {
                match self.fragments(inst, mma, Operand::A, lhs, a_shape)? {
                    Fragments::Registers(regs) => Some(regs),
                    Fragments::Shared { .. } => {
                        return Err(CodegenError::internal(
                            Stage::Thread,
                            "an accumulator operand in shared memory",
                        ));
                    }
                }
            }
            Some((ConversionKind::Ldmatrix { .. }, to)) => Some(self.resident_a(inst, lhs, &to)?),
            Some((ConversionKind::Hoisted, _)) => Some(self.regs(lhs)?),
            Some((ConversionKind::Descriptor { .. }, _)) => None,
            _ => {
                return Err(CodegenError::internal(
                    Stage::Thread,
                    "a wgmma's A operand without its conversion",
                ));
            }
        };
        let a_descriptors = match a_registers {
            Some(_) => None,
            None => Some(self.descriptors(inst, lhs, true, rows_per_rep)?),
        };
        let b_descriptors = self.descriptors(inst, rhs, false, rows_per_rep)?;
        // Threads' writes to a tile it reads land first (TMA's are the `mbarrier`s' to order).
        let reads_staged = [(lhs, a_descriptors.is_some()), (rhs, true)]
            .iter()
            .any(|&(v, shared)| shared && self.staged_by_threads.contains(&v));
        if self.pending.writes && reads_staged {
            self.barrier();
        }
        self.pending.reads = true;

        if turn {
            self.take_turn();
        }
        // Everything the wgmmas read from registers is written before the fence.
        self.emit_effect(Op::WgmmaFence);
        let a_passed = a_registers.unwrap_or_default();
        let elem = b_descriptors.tile.elem;
        self.packed_type(inst, elem)?;
        for rep_m in 0..reps_m {
            let mut steps = Vec::with_capacity(reps_k);
            for rep_k in 0..reps_k {
                let a = match &a_descriptors {
                    Some(descriptors) => WgmmaA::Descriptor {
                        desc: self.descriptor(
                            inst,
                            descriptors,
                            [rep_m * rows_per_rep, rep_k * WGMMA_K],
                        )?,
                        trans: descriptors.major == Major::MN,
                    },
                    None => {
                        let first = (rep_m * reps_k + rep_k) * A_REGS_PER_MMA;
                        WgmmaA::Registers(a_passed[first..first + A_REGS_PER_MMA].to_vec())
                    }
                };
                let b = self.descriptor(inst, &b_descriptors, [rep_k * WGMMA_K, 0])?;
                steps.push(WgmmaStep { a, b });
            }
            let chunk = rep_m * per_rep..(rep_m + 1) * per_rep;
            let d = self.emit_multi(
                Op::Wgmma {
                    steps,
                    trans_b: b_descriptors.major == Major::MN,
                    acc: acc_regs[chunk.clone()].to_vec(),
                    accumulate,
                    elem,
                },
                &vec![Type::F32; per_rep],
            );
            acc_regs[chunk].copy_from_slice(&d);
        }
        self.emit_effect(Op::WgmmaCommit);
        self.in_flight.committed += 1;
        let group = self.in_flight.committed;
        self.in_flight.dots.push((inst.results[0], group));
        Ok(acc_regs)
    }

    /// A `dot` one warpgroup computes and the TMA reduction after it, its one use
    /// ([`crate::layout::LayoutAssignment::one_warpgroup_dot`]): the warpgroup whose index is
    /// the enclosing loop's iteration count modulo the warpgroups (the owner) issues its
    /// `wgmma`s (one warpgroup's, A's rows from 0), waits for them and adds the tile, in a
    /// branch the others skip. Before it the owner waits for the others, each of which arrived
    /// once its issuing lanes had waited for their last reductions' reads: the staged operands
    /// are written, and the tile is free whichever warpgroup wrote it last. The value is bound
    /// to no register: nothing else reads it.
    ///
    /// ```text
    /// wgmma.wait_group 0                      // the groups in flight
    /// [cp.async.bulk.wait_group.read 0; fence.proxy.async; @other bar.arrive]  // or earlier
    /// @owner bar.sync                         // a barrier of the iteration's parity
    /// if owner:
    ///     wgmma.fence; wgmma.mma_async ..; wgmma.commit_group; wgmma.wait_group 0
    ///     the tile into shared memory; fence.proxy.async; bar.sync (its own warps)
    ///     its first warp: cp.reduce.async.bulk.tensor .add, a slab each
    /// ```
    pub(super) fn one_warpgroup_dot(
        &mut self,
        inst: &TileInst,
        operands: [Value; 3],
        ptr: Value,
    ) -> Result<Vec<Reg>> {
        let Some(reduction) = self
            .layouts
            .tma_store_at(self.current_inst + 1)
            .filter(|r| r.by_one_warpgroup)
            .cloned()
        else {
            return Err(CodegenError::internal(
                Stage::Thread,
                "a dot of one warpgroup without its TMA reduction",
            ));
        };
        // The groups in flight end first: their accumulators and register operands beside this
        // one's would leave ptxas too few registers, and it would serialise every `wgmma`.
        self.wait_for_all();
        // The others arrived when its last staged operand was written, or do now; with more
        // than two warpgroups the block meets.
        let arrived = std::mem::take(&mut self.arrived_for_owner) || self.arrive_for_the_owner();
        let [turn, own] = self.iteration_warpgroup();
        let owner = self.icmp(IntCmp::Eq, own, turn);
        if arrived {
            self.fence_for_the_owner();
            self.owner_barrier(turn, true, owner);
        } else {
            self.emit_effect(Op::BulkWaitRead);
            self.barrier();
        }
        let outer = self.in_flight.enter();
        self.blocks.push(Vec::new());
        let lowered = self
            .wgmma_dot(inst, MmaV2::new(WARPS_PER_WARPGROUP, 1), operands, false)
            .and_then(|regs| {
                self.bind(inst.results[0], regs);
                self.wait_for_all();
                self.store_block_by_tma(inst, ptr, &reduction)
            });
        let mut insts = self.blocks.pop().unwrap_or_default();
        self.in_flight.leave(outer);
        lowered?;
        let yield_nothing = || Inst {
            results: Vec::new(),
            op: Op::Yield(Vec::new()),
            loc: self.loc,
        };
        insts.push(yield_nothing());
        let skipped = vec![yield_nothing()];
        self.push(Inst {
            results: Vec::new(),
            op: Op::If {
                cond: owner,
                then_block: Block { insts },
                else_block: Block { insts: skipped },
            },
            loc: self.loc,
        });
        // The owners' barriers alternate only where each iteration of a loop meets on them
        // once: a warpgroup that arrived may not arrive on the same barrier again before the
        // owner has waited there, and only its own turn in between (its wait on the other
        // barrier, which the owner arrives on after its own wait) keeps it from that. After
        // the loop, or after such a `dot` anywhere else, the block meets.
        if self.owner_barrier_pairs() {
            if self.owner_turns_body == Some(self.blocks.len()) {
                self.owner_turns_open = true;
            } else {
                self.barrier();
            }
        }
        Ok(Vec::new())
    }

    /// For a `dot` of one warpgroup, with two warpgroups: the one whose turn it is not arrives
    /// on a barrier of the iteration's parity, once its issuing lanes waited for their last
    /// reductions' reads and its staged writes are fenced, and goes on; the owner waits there
    /// before its `wgmma`s, so that neither waits for the other every iteration. Called where
    /// the `dot`'s last operand that threads stage is written, in the `dot`'s region
    /// ([`crate::layout::LayoutAssignment::arrives_when_staged`]), else at the `dot`. Two
    /// barriers by turns: a warpgroup that arrived goes on to the next iteration's, which it
    /// owns and waits at, and can come back to this one only once the other has passed it.
    /// Whether it arrived: not with more warpgroups, whose block meets at the `dot` instead.
    pub(super) fn arrive_for_the_owner(&mut self) -> bool {
        if !self.owner_barrier_pairs() {
            return false;
        }
        self.emit_effect(Op::BulkWaitRead);
        let [turn, own] = self.iteration_warpgroup();
        let other = self.icmp(IntCmp::Ne, own, turn);
        self.fence_for_the_owner();
        self.owner_barrier(turn, false, other);
        true
    }

    /// Whether the owner of a `dot` of one warpgroup and the other warpgroup meet on a pair
    /// of barriers, one arriving and one waiting: with two warpgroups.
    fn owner_barrier_pairs(&self) -> bool {
        self.layouts.num_warps / WARPS_PER_WARPGROUP == 2
    }

    /// Before the others arrive for the owner, or it waits: staged writes fenced for its
    /// `wgmma`s (the owner's warps' too, which its wait orders among them).
    fn fence_for_the_owner(&mut self) {
        self.pass_turn();
        if self.pending.writes {
            self.emit_effect(Op::FenceProxyAsync);
        }
        // What the other warpgroup reads of staged tiles may still be read.
        self.pending = Pending {
            reads: true,
            writes: false,
        };
    }

    /// The owner's barrier of the iteration `turn`: the others arrive (`wait` false), the
    /// owner waits, each where `pred` holds.
    fn owner_barrier(&mut self, turn: Reg, wait: bool, pred: Reg) {
        let first = self.i32_const(OWNER_BARRIERS);
        let id = self.int(IntOp::Add, first, turn);
        self.emit_effect(Op::NamedBarrier {
            id,
            threads: self.threads,
            wait,
            pred: Some(pred),
        });
    }

    /// Whose turn this iteration of the innermost loop is (its count modulo the warpgroups;
    /// warpgroup 0's outside loops), and this thread's warpgroup. Any choice the warpgroups
    /// agree on would be correct; taking turns shares the work.
    fn iteration_warpgroup(&mut self) -> [Reg; 2] {
        let warpgroups = (self.layouts.num_warps / WARPS_PER_WARPGROUP) as i64;
        let turn = match self.loop_counter {
            Some([iv, lower, step]) => {
                let done = self.int(IntOp::Sub, iv, lower);
                let count = self.int(IntOp::SDiv, done, step);
                let warpgroups = self.int_const(self.ty(count), warpgroups);
                let turn = self.int(IntOp::SRem, count, warpgroups);
                match self.ty(turn) {
                    Type::I32 => turn,
                    _ => self.emit(Op::Cast(Cast::Trunc, turn), Type::I32),
                }
            }
            None => self.i32_const(0),
        };
        let own = if self.uniform_descriptors {
            self.uniform_warpgroup()
        } else {
            self.warpgroup()
        };
        [turn, own]
    }

    /// Whether `inst` is a `dot` every warpgroup issues on `wgmma` (not one of one warpgroup,
    /// which is issued in a branch: no copies are held back for it, and it takes no turn).
    pub(super) fn issues_wgmma(&self, inst: &TileInst) -> bool {
        matches!(inst.op, TileOp::Dot { .. })
            && matches!(
                self.layouts.layout(inst.results[0]),
                Some(Layout::Mma(mma)) if mma.version == MmaVersion::V3
            )
            && !self.layouts.computed_by_one_warpgroup(inst.results[0])
    }

    /// Before `inst`: waits for the `dot`s in flight whose results it (or a conversion of its
    /// operands, or an op of its branches) reads, and for every one before a loop or the end
    /// of a region. A result waited for is the wait's from then on, so the wait for a value an
    /// `if` uses goes before the `if`, not into a branch.
    pub(super) fn wait_for_operands(&mut self, inst: &TileInst) {
        if self.in_flight.dots.is_empty() {
            return;
        }
        if matches!(inst.op, TileOp::For { .. } | TileOp::Yield { .. }) {
            return self.wait_for_all();
        }
        let used = self.values_read(inst);
        let needed = self
            .in_flight
            .dots
            .iter()
            .filter(|(value, _)| used.contains(value))
            .map(|&(_, group)| group)
            .max();
        if let Some(group) = needed {
            self.wait_for(group);
        }
    }

    /// The warpgroup's index, `tid / 128`, as lane 0 of the warp has it (`shfl.sync.idx`), for
    /// [`crate::CompileOptions::uniform_warpgroup`]: ptxas then knows it is the same in every
    /// lane and keeps the `wgmma` descriptors of a warpgroup's rows of A in uniform registers
    /// (from `tid / 128` it computes them in vector registers and moves each, `R2UR`, before
    /// every use).
    pub(super) fn uniform_warpgroup(&mut self) -> Reg {
        if let Some(reg) = self.uniform_warpgroup {
            return reg;
        }
        let seven = self.emit_prelude(
            Op::Const(Constant::Int(WARPGROUP_THREADS.trailing_zeros() as i64)),
            Type::I32,
        );
        let own = self.emit_prelude(Op::Int(IntOp::LShr, self.tid, seven), Type::I32);
        let lane_0 = self.emit_prelude(Op::Const(Constant::Int(0)), Type::I32);
        let reg = self.emit_prelude(
            Op::Shuffle {
                mode: ShuffleMode::Idx,
                value: own,
                lane: lane_0,
            },
            Type::I32,
        );
        self.uniform_warpgroup = Some(reg);
        reg
    }

    /// Waits for every `dot` in flight.
    pub(super) fn wait_for_all(&mut self) {
        self.wait_for(self.in_flight.committed);
    }

    /// `wgmma.wait_group` until `group` is complete (groups complete in order): the results
    /// of it and the groups before it are the wait's, passed through.
    fn wait_for(&mut self, group: u32) {
        self.after_opening_wgmmas();
        let (done, left): (Vec<_>, Vec<_>) = std::mem::take(&mut self.in_flight.dots)
            .into_iter()
            .partition(|&(_, g)| g <= group);
        self.in_flight.dots = left;
        if done.is_empty() {
            return;
        }
        let regs: Vec<Vec<Reg>> = done
            .iter()
            .map(|&(value, _)| self.values[value.index()].clone().unwrap_or_default())
            .collect();
        let all: Vec<Reg> = regs.concat();
        let types: Vec<Type> = all.iter().map(|&r| self.ty(r)).collect();
        let mut waited = self
            .emit_multi(
                Op::WgmmaWait {
                    pending: self.in_flight.committed - group,
                    values: all,
                },
                &types,
            )
            .into_iter();
        for (&(value, _), regs) in done.iter().zip(&regs) {
            let passed = waited.by_ref().take(regs.len()).collect();
            self.bind(value, passed);
        }
        let done: Vec<Value> = done.iter().map(|&(value, _)| value).collect();
        self.release_waited(&done);
    }

    /// The staged tile of dot operand `value`.
    fn operand_tile(&self, value: Value) -> Result<SharedTile> {
        self.shared_tiles.get(&value).copied().ok_or_else(|| {
            CodegenError::internal(
                Stage::Thread,
                format!("wgmma operand %{} is not in shared memory", value.0),
            )
        })
    }

    /// The descriptor bits every instruction of operand `value` shares, but for the start
    /// address: the tile's own start (and for A, its warpgroup's rows: warpgroup `g` of a
    /// block multiplies rows `64 g ..` of each `rows_per_rep`).
    fn descriptors(
        &mut self,
        inst: &TileInst,
        value: Value,
        is_a: bool,
        rows_per_rep: usize,
    ) -> Result<Descriptors> {
        let tile = self.operand_tile(value)?;
        let elem_bytes = tile.elem.bytes() as usize;
        let (major, at_origin) = self.layout_descriptor(inst, &tile, is_a, [0, 0])?;
        let warpgroups = rows_per_rep / WGMMA_M;
        let index = if is_a && warpgroups > 1 {
            let (_, next) = self.layout_descriptor(inst, &tile, is_a, [WGMMA_M, 0])?;
            let stride = (next.start - at_origin.start) as usize / elem_bytes;
            let warpgroup = if self.uniform_descriptors {
                let all = self.uniform_warpgroup();
                let mask = self.i32_const(warpgroups as i64 - 1);
                self.int(IntOp::And, all, mask)
            } else {
                self.field(IdField {
                    id: Id::Warp,
                    shift: WARPS_PER_WARPGROUP.trailing_zeros(),
                    bits: warpgroups.trailing_zeros(),
                })
            };
            let stride = self.i32_const(stride as i64);
            self.int(IntOp::Mul, warpgroup, stride)
        } else {
            self.i32_const(0)
        };
        let start = self.tile_slot(&tile, index);
        let address = self.emit(Op::Cast(Cast::PtrToInt, start), Type::I64);
        let four = self.int_const(Type::I64, 4);
        let units = self.int(IntOp::LShr, address, four);
        let mask = self.int_const(Type::I64, 0x3fff);
        let field = self.int(IntOp::And, units, mask);
        let rest = Descriptor {
            start: 0,
            ..at_origin
        };
        let rest = self.int_const(Type::I64, rest.encode() as i64);
        let base = self.int(IntOp::Or, field, rest);
        Ok(Descriptors {
            tile,
            is_a,
            base,
            major,
        })
    }

    /// The descriptor of the instruction that reads the operand from logical `origin` (its
    /// warpgroup's rows added for A, in `descriptors.base`): the base and the offset, which
    /// the `wgmma` statement adds with [`crate::CompileOptions::descriptors_at_issue`] and an
    /// LLVM addition before it otherwise.
    fn descriptor(
        &mut self,
        inst: &TileInst,
        descriptors: &Descriptors,
        origin: [usize; 2],
    ) -> Result<WgmmaDesc> {
        let (_, at) = self.layout_descriptor(inst, &descriptors.tile, descriptors.is_a, origin)?;
        let offset = at.start >> 4;
        if self.descriptors_at_issue || offset == 0 {
            return Ok(WgmmaDesc {
                base: descriptors.base,
                offset,
            });
        }
        let units = self.int_const(Type::I64, offset as i64);
        Ok(WgmmaDesc {
            base: self.int(IntOp::Add, descriptors.base, units),
            offset: 0,
        })
    }

    /// [`operand_descriptor`] for `tile` at byte 0, or an error if `wgmma` cannot read it.
    fn layout_descriptor(
        &self,
        inst: &TileInst,
        tile: &SharedTile,
        is_a: bool,
        origin: [usize; 2],
    ) -> Result<(Major, Descriptor)> {
        operand_descriptor(&tile.layout, tile.elem.bytes() as usize, is_a, 0, origin).ok_or_else(
            || {
                unsupported(
                    inst,
                    format!("wgmma cannot read a tile in {:?}", tile.layout),
                )
            },
        )
    }
}
