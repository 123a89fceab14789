//! `dot` on Hopper's warpgroup tensor cores: each warpgroup issues one
//! `wgmma.mma_async.m64nNk16` per 64 rows of its M and k step, B (and A, unless it is an
//! earlier `dot`'s accumulator in registers) read from the staged tile through a matrix
//! descriptor ([`crate::layout::wgmma`]), then waits for them all before anything reads the
//! accumulators.
//!
//! ```text
//! [fence.proxy.async; bar.sync, if staged tiles were written]
//! wgmma.fence acc.., a..                 // their writes land before the wgmmas read them
//! for rep_m, k step: wgmma.mma_async acc[rep_m], a(rep_m, k), b(k)
//! wgmma.commit_group; wgmma.wait_group 0 acc..
//! ```

use kiln_dsl::ir::{Inst as TileInst, Value};

use super::dot::{Fragments, SharedTile};
use super::{Lowering, Result, unsupported};
use crate::layout::mma::{A_REGS_PER_MMA, ACC_REGS_PER_MMA, MMA_M, MMA_N, MmaV2, Operand};
use crate::layout::wgmma::{
    Descriptor, Major, WARPS_PER_WARPGROUP, WGMMA_K, WGMMA_M, operand_descriptor,
};
use crate::layout::{ConversionKind, Id, IdField};
use crate::thread::ir::{Cast, IntOp, Op, Reg, Type, WgmmaA};
use crate::{CodegenError, Stage};

/// A shared operand's descriptors: the warpgroup's own (an i64 register) plus a constant per
/// instruction.
struct Descriptors {
    base: Reg,
    major: Major,
}

impl Lowering<'_> {
    /// `lhs [M, K] @ rhs [K, N] + acc` with the accumulator in `mma`'s fragments (every warp
    /// along M).
    pub(super) fn wgmma_dot(
        &mut self,
        inst: &TileInst,
        mma: MmaV2,
        [lhs, rhs, acc]: [Value; 3],
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
        let in_registers = self
            .layouts
            .dot_operand(self.current_inst, lhs)
            .is_some_and(|c| c.kind == ConversionKind::AccumulatorAsA);
        let a_registers = match in_registers {
            true => match self.fragments(inst, mma, Operand::A, lhs, a_shape)? {
                Fragments::Registers(regs) => Some(regs),
                Fragments::Shared { .. } => {
                    return Err(CodegenError::internal(
                        Stage::Thread,
                        "an accumulator operand in shared memory",
                    ));
                }
            },
            false => None,
        };
        let a_descriptors = match a_registers {
            Some(_) => None,
            None => Some(self.descriptors(inst, lhs, true, rows_per_rep)?),
        };
        let b_descriptors = self.descriptors(inst, rhs, false, rows_per_rep)?;
        if self.pending.writes {
            self.barrier();
        }
        self.pending.reads = true;

        // Everything the wgmmas read from registers is written before the fence.
        let mut fenced = acc_regs.clone();
        fenced.extend(a_registers.iter().flatten());
        let types: Vec<Type> = fenced.iter().map(|&r| self.ty(r)).collect();
        let passed = self.emit_multi(Op::WgmmaFence(fenced), &types);
        let (acc_passed, a_passed) = passed.split_at(acc_regs.len());
        acc_regs.copy_from_slice(acc_passed);
        let elem = self.operand_elem(inst, rhs)?;
        for rep_m in 0..reps_m {
            for rep_k in 0..reps_k {
                let a = match &a_descriptors {
                    Some(descriptors) => WgmmaA::Descriptor {
                        desc: self.descriptor(
                            inst,
                            lhs,
                            descriptors,
                            true,
                            [rep_m * rows_per_rep, rep_k * WGMMA_K],
                        )?,
                        trans: descriptors.major == Major::MN,
                    },
                    None => {
                        let first = (rep_m * reps_k + rep_k) * A_REGS_PER_MMA;
                        WgmmaA::Registers(a_passed[first..first + A_REGS_PER_MMA].to_vec())
                    }
                };
                let b = self.descriptor(inst, rhs, &b_descriptors, false, [rep_k * WGMMA_K, 0])?;
                let chunk = rep_m * per_rep..(rep_m + 1) * per_rep;
                let d = self.emit_multi(
                    Op::Wgmma {
                        a,
                        b,
                        trans_b: b_descriptors.major == Major::MN,
                        acc: acc_regs[chunk.clone()].to_vec(),
                        elem,
                    },
                    &vec![Type::F32; per_rep],
                );
                acc_regs[chunk].copy_from_slice(&d);
            }
        }
        self.emit_effect(Op::WgmmaCommit);
        Ok(self.emit_multi(
            Op::WgmmaWait {
                pending: 0,
                values: acc_regs,
            },
            &vec![Type::F32; per_rep * reps_m],
        ))
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

    fn operand_elem(&self, inst: &TileInst, value: Value) -> Result<Type> {
        match self.operand_tile(value)?.elem {
            elem @ (Type::F16 | Type::BF16) => Ok(elem),
            other => Err(unsupported(
                inst,
                format!("expected f16 or bf16 wgmma operands, got {}", other.name()),
            )),
        }
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
            let warpgroup = self.field(IdField {
                id: Id::Warp,
                shift: WARPS_PER_WARPGROUP.trailing_zeros(),
                bits: warpgroups.trailing_zeros(),
            });
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
        Ok(Descriptors { base, major })
    }

    /// The descriptor of the instruction that reads operand `value` from logical `origin`
    /// (its warpgroup's rows added for A, in `descriptors.base`).
    fn descriptor(
        &mut self,
        inst: &TileInst,
        value: Value,
        descriptors: &Descriptors,
        is_a: bool,
        origin: [usize; 2],
    ) -> Result<Reg> {
        let tile = self.operand_tile(value)?;
        let (_, at) = self.layout_descriptor(inst, &tile, is_a, origin)?;
        if at.start == 0 {
            return Ok(descriptors.base);
        }
        let units = self.int_const(Type::I64, (at.start >> 4) as i64);
        Ok(self.int(IntOp::Add, descriptors.base, units))
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
