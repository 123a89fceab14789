//! Ops that move elements between positions: `arange`, `broadcast`, `expand_dims` and `trans`
//! (register renaming, since the layout stage put their operands in matching layouts), layout
//! conversions (through shared memory), and reductions (in-thread, then butterfly shuffles
//! within the warp, then across warps through shared memory).

use std::collections::HashMap;

use super::{Lowering, Result, unsupported};
use crate::layout::{Layout, ThreadMap};
use crate::thread::ir::{Cast, FloatOp, IntCmp, IntOp, Op, Reg, ShuffleMode, Space, Type};
use crate::{CodegenError, Stage};
use kiln_dsl::ir::{Inst as TileInst, ReduceOp, Value};

/// For each register of `to`, the register of `from` that holds its element, found by register
/// offsets (`key` rewrites a `to` offset into a `from` one).
fn gather(
    from: &ThreadMap,
    to: &ThreadMap,
    key: impl Fn(&[usize]) -> Vec<usize>,
) -> std::result::Result<Vec<usize>, CodegenError> {
    let index: HashMap<&[usize], usize> = from
        .registers
        .iter()
        .enumerate()
        .map(|(i, r)| (r.as_slice(), i))
        .collect();
    to.registers
        .iter()
        .map(|r| {
            let wanted = key(r);
            index.get(wanted.as_slice()).copied().ok_or_else(|| {
                CodegenError::internal(
                    Stage::Thread,
                    format!("no register at offsets {wanted:?} to move from"),
                )
            })
        })
        .collect()
}

impl Lowering<'_> {
    pub(super) fn arange(&mut self, inst: &TileInst, start: i64) -> Result<Vec<Reg>> {
        let map = self
            .value_map(inst, inst.results[0])?
            .ok_or_else(|| unsupported(inst, "expected a 1-D tile"))?;
        let start = self.i32_const(start);
        let positions = self.positions(&map);
        Ok(positions
            .into_iter()
            .map(|p| self.int(IntOp::Add, start, p.coords[0]))
            .collect())
    }

    /// Both tiles are in one layout: each result register repeats the operand's register at the
    /// same offsets, offset 0 along the broadcast (size-1) dimensions.
    pub(super) fn broadcast(&mut self, inst: &TileInst, value: Value) -> Result<Vec<Reg>> {
        let regs = self.regs(value)?;
        let (Some(from), Some(to)) = (
            self.value_map(inst, value)?,
            self.value_map(inst, inst.results[0])?,
        ) else {
            return Err(unsupported(inst, "expected tiles on both sides"));
        };
        let sources = gather(&from, &to, |r| {
            r.iter()
                .zip(&from.shape)
                .map(|(&o, &s)| if s == 1 { 0 } else { o })
                .collect()
        })?;
        Ok(sources.into_iter().map(|i| regs[i]).collect())
    }

    /// The operand is in the slice of the result's layout along `axis`: each result register is
    /// the slice register at its offsets without `axis`.
    pub(super) fn expand_dims(
        &mut self,
        inst: &TileInst,
        value: Value,
        axis: usize,
    ) -> Result<Vec<Reg>> {
        let regs = self.regs(value)?;
        let to = self
            .value_map(inst, inst.results[0])?
            .ok_or_else(|| unsupported(inst, "expected a tile result"))?;
        let Some(from) = self.value_map(inst, value)? else {
            return Ok(vec![regs[0]; to.registers.len()]);
        };
        let sources = gather(&from, &to, |r| {
            let mut r = r.to_vec();
            r.remove(axis);
            r
        })?;
        Ok(sources.into_iter().map(|i| regs[i]).collect())
    }

    /// The operand is in the transpose of the result's layout: registers are renamed.
    pub(super) fn trans(&mut self, inst: &TileInst, value: Value) -> Result<Vec<Reg>> {
        let regs = self.regs(value)?;
        let (Some(from), Some(to)) = (
            self.value_map(inst, value)?,
            self.value_map(inst, inst.results[0])?,
        ) else {
            return Err(unsupported(inst, "expected 2-D tiles"));
        };
        let sources = gather(&from, &to, |r| r.iter().rev().copied().collect())?;
        Ok(sources.into_iter().map(|i| regs[i]).collect())
    }

    /// A register type's shared-memory element: booleans as bytes.
    fn shared_elem(&self, inst: &TileInst, ty: Type) -> Result<Type> {
        match ty {
            Type::Ptr(_) => Err(unsupported(
                inst,
                "converting a tile of pointers between layouts is not lowered yet",
            )),
            Type::I1 => Ok(Type::I8),
            other => Ok(other),
        }
    }

    /// A pointer to element `index` (i32) of `elem`s from byte `base` of shared memory.
    pub(super) fn shared_slot(&mut self, base: u32, index: Reg, elem: Type) -> Reg {
        let start = self.emit(Op::SharedAddress { offset: base }, Type::Ptr(Space::Shared));
        self.emit(
            Op::PtrAdd {
                ptr: start,
                offset: index,
                elem,
            },
            Type::Ptr(Space::Shared),
        )
    }

    /// The row-major index (i32) of a position's coordinates in `shape`.
    pub(super) fn linear_index(&mut self, coords: &[Reg], shape: &[usize]) -> Reg {
        let mut linear = self.i32_const(0);
        let mut stride = 1i64;
        for d in (0..shape.len()).rev() {
            let scale = self.i32_const(stride);
            let term = self.int(IntOp::Mul, coords[d], scale);
            linear = self.int(IntOp::Add, linear, term);
            stride *= shape[d] as i64;
        }
        linear
    }

    fn shared_store(&mut self, slot: Reg, value: Reg, pred: Option<Reg>) {
        let value = match self.ty(value) {
            Type::I1 => self.emit(Op::Cast(Cast::ZExt, value), Type::I8),
            _ => value,
        };
        self.emit_effect(Op::Store {
            ptr: slot,
            value,
            pred,
        });
    }

    fn shared_load(&mut self, slot: Reg, ty: Type) -> Reg {
        if ty != Type::I1 {
            return self.emit(
                Op::Load {
                    ptr: slot,
                    pred: None,
                    other: None,
                },
                ty,
            );
        }
        let byte = self.emit(
            Op::Load {
                ptr: slot,
                pred: None,
                other: None,
            },
            Type::I8,
        );
        let zero = self.int_const(Type::I8, 0);
        self.icmp(IntCmp::Ne, byte, zero)
    }

    /// `value` in layout `to`, through shared memory: each owner stores its elements row-major,
    /// a barrier, every thread loads the elements `to` gives it, a barrier before the next use.
    pub(super) fn convert(
        &mut self,
        inst: &TileInst,
        value: Value,
        to: &Layout,
    ) -> Result<Vec<Reg>> {
        let regs = self.regs(value)?;
        let shape = self.shape(value);
        let from_layout = self
            .layouts
            .layout(value)
            .cloned()
            .ok_or_else(|| CodegenError::internal(Stage::Thread, "a conversion of a scalar"))?;
        let from = self.map(inst, &from_layout, &shape)?;
        let to = self.map(inst, to, &shape)?;
        let ty = self.ty(regs[0]);
        let elem = self.shared_elem(inst, ty)?;
        let count: usize = shape.iter().product();
        self.reserve_shared(inst, count as u32 * elem.bytes())?;
        for (position, &reg) in self.positions(&from).into_iter().zip(&regs) {
            let index = self.linear_index(&position.coords, &shape);
            let slot = self.shared_slot(self.scratch_base(), index, elem);
            self.shared_store(slot, reg, position.owner);
        }
        self.barrier();
        let mut out = Vec::new();
        for position in self.positions(&to) {
            let index = self.linear_index(&position.coords, &shape);
            let slot = self.shared_slot(self.scratch_base(), index, elem);
            out.push(self.shared_load(slot, ty));
        }
        self.barrier();
        Ok(out)
    }

    pub(super) fn combine(&mut self, op: ReduceOp, ty: Type, a: Reg, b: Reg) -> Reg {
        match (ty, op) {
            (Type::F32, ReduceOp::Sum) => self.float(FloatOp::Add, a, b),
            (Type::F32, ReduceOp::Max) => self.float(FloatOp::Max, a, b),
            (Type::F32, ReduceOp::Min) => self.float(FloatOp::Min, a, b),
            // The interpreter's bool reductions: `max` is any, `sum` and `min` are all.
            (Type::I1, ReduceOp::Max) => self.int(IntOp::Or, a, b),
            (Type::I1, _) => self.int(IntOp::And, a, b),
            (_, ReduceOp::Sum) => self.int(IntOp::Add, a, b),
            (_, ReduceOp::Max) => self.int(IntOp::SMax, a, b),
            (_, ReduceOp::Min) => self.int(IntOp::SMin, a, b),
        }
    }

    /// `shfl.sync.bfly` of any register: 32-bit halves for i64, a widened i1.
    pub(super) fn shuffle_xor(&mut self, value: Reg, lane_mask: u32) -> Reg {
        let mask = self.i32_const(lane_mask as i64);
        let shuffle = |this: &mut Self, v: Reg| {
            let ty = this.ty(v);
            this.emit(
                Op::Shuffle {
                    mode: ShuffleMode::Bfly,
                    value: v,
                    lane: mask,
                },
                ty,
            )
        };
        match self.ty(value) {
            Type::I64 => {
                let thirty_two = self.int_const(Type::I64, 32);
                let low = self.emit(Op::Cast(Cast::Trunc, value), Type::I32);
                let high_wide = self.int(IntOp::LShr, value, thirty_two);
                let high = self.emit(Op::Cast(Cast::Trunc, high_wide), Type::I32);
                let (low, high) = (shuffle(self, low), shuffle(self, high));
                let low = self.emit(Op::Cast(Cast::ZExt, low), Type::I64);
                let high = self.emit(Op::Cast(Cast::ZExt, high), Type::I64);
                let high = self.int(IntOp::Shl, high, thirty_two);
                self.int(IntOp::Or, low, high)
            }
            Type::I1 => {
                let wide = self.emit(Op::Cast(Cast::ZExt, value), Type::I32);
                let shuffled = shuffle(self, wide);
                self.emit(Op::Cast(Cast::Trunc, shuffled), Type::I1)
            }
            _ => shuffle(self, value),
        }
    }

    /// `terms` combined by `op` as a balanced tree, not a chain: a row's 32 scores take 5
    /// dependent steps instead of 31, which two warps per scheduler cannot hide.
    fn combine_all(&mut self, op: ReduceOp, mut terms: Vec<Reg>) -> Option<Reg> {
        while terms.len() > 1 {
            let ty = self.ty(terms[0]);
            terms = terms
                .chunks(2)
                .map(|pair| match *pair {
                    [a, b] => self.combine(op, ty, a, b),
                    [a] => a,
                    _ => unreachable!("chunks of two"),
                })
                .collect();
        }
        terms.pop()
    }

    /// Reduces `axis` of `value` into the slice of its layout (or a scalar every thread holds).
    pub(super) fn reduce(
        &mut self,
        inst: &TileInst,
        op: ReduceOp,
        value: Value,
        axis: usize,
    ) -> Result<Vec<Reg>> {
        let dtype = self.result_dtype(inst)?;
        let regs = self.regs(value)?;
        let parent = self
            .layout_of(value)
            .cloned()
            .ok_or_else(|| unsupported(inst, "expected a tile to reduce"))?;
        let shape = self.shape(value);
        let map = self.map(inst, &parent, &shape)?;
        let mut slice_shape = shape.clone();
        slice_shape.remove(axis);
        let slice = self.map(inst, &parent.slice(axis), &slice_shape)?;
        let extent = shape[axis];

        // In-thread: the registers at each slice position, without the in-thread copies of a
        // tile narrower than the thread's chunk.
        let mut partials = Vec::new();
        for offsets in &slice.registers {
            let mut terms = Vec::new();
            for (r, parent_offsets) in map.registers.iter().enumerate() {
                let mut rest = parent_offsets.clone();
                let along = rest.remove(axis);
                if rest != *offsets || along >= extent {
                    continue;
                }
                terms.push(if dtype.is_float() {
                    self.widen(regs[r])
                } else {
                    regs[r]
                });
            }
            partials.push(self.combine_all(op, terms).ok_or_else(|| {
                CodegenError::internal(Stage::Thread, "a slice position without registers")
            })?);
        }
        let ty = self.ty(partials[0]);

        // Across lanes: one butterfly step per lane bit that tells distinct elements apart
        // (higher bits hold copies, which reach the same total), unless the sum keeps its
        // lanes' partial sums ([`super::partial_sums`]).
        let (lane_masks, warp_terms) = map.butterfly(axis, extent);
        if !self.partial_sums.keeps(inst.results[0]) {
            for lane_mask in lane_masks {
                for partial in partials.iter_mut() {
                    let other = self.shuffle_xor(*partial, lane_mask);
                    *partial = self.combine(op, ty, *partial, other);
                }
            }
        }

        // Across warps: lane 0 of each (along `axis`) writes its partials to a slot per warp, a
        // barrier, every thread combines the slots of the distinct warps.
        for (field, distinct) in warp_terms {
            let elem = self.shared_elem(inst, ty)?;
            let elements: usize = slice_shape.iter().product();
            let slots = 1usize << field.bits;
            self.reserve_shared(inst, (slots * elements) as u32 * elem.bytes())?;
            let mut writers = slice.clone();
            writers.replicas.retain(|f| *f != field);
            let warp = self.field(field);
            let per_slot = self.i32_const(elements as i64);
            let slot_start = self.int(IntOp::Mul, warp, per_slot);
            let positions = self.positions(&writers);
            let mut indices = Vec::new();
            for (position, &partial) in positions.iter().zip(&partials) {
                let index = self.linear_index(&position.coords, &slice_shape);
                let at = self.int(IntOp::Add, slot_start, index);
                let slot = self.shared_slot(self.scratch_base(), at, elem);
                self.shared_store(slot, partial, position.owner);
                indices.push(index);
            }
            self.barrier();
            for (partial, &index) in partials.iter_mut().zip(&indices) {
                let mut terms = Vec::new();
                for w in 0..distinct {
                    let start = self.i32_const((w * elements) as i64);
                    let at = self.int(IntOp::Add, start, index);
                    let slot = self.shared_slot(self.scratch_base(), at, elem);
                    terms.push(self.shared_load(slot, ty));
                }
                *partial = self.combine_all(op, terms).unwrap_or(*partial);
            }
            self.barrier();
        }

        Ok(partials
            .into_iter()
            .map(|p| {
                if dtype.is_float() {
                    self.narrow(p, dtype)
                } else {
                    p
                }
            })
            .collect())
    }
}
