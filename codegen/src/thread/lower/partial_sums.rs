//! Sums kept as each lane's partial sum ([`crate::CompileOptions::partial_sums`]).
//!
//! A `reduce_sum` along an axis that spans lanes ends in a butterfly across them. Where its
//! result only accumulates — added to other such sums, multiplied by a value of its own layout
//! (which holds one value for all the lanes the sum spans: the reduced axis is sliced away),
//! carried around a loop — the butterfly can wait: each lane keeps its partial sum, and the
//! lanes' total is taken where anything else reads the value (a comparison, a division, a
//! store). The forward's row sum `l = l * alpha + sum(p, 1)` then costs its key loops no
//! shuffles; `store_rows` totals it once a block. Sums are linear, so the total is the same up
//! to the order of the additions.
//!
//! Which values qualify is an optimistic fixpoint over the tile IR: every candidate starts in,
//! and one whose rule fails (an operand that is not kept, another layout, other lanes) leaves,
//! until none does.

use std::collections::{HashMap, HashSet};

use kiln_dsl::ir::{BinaryOp, Inst as TileInst, Op as TileOp, ReduceOp, Region, Value};
use kiln_dsl::passes::for_each_operand;
use kiln_dsl::types::DType;

use super::{Lowering, Result};
use crate::layout::{is_zero_splat, nested_regions, walk_insts, yielded};
use crate::thread::ir::{Reg, Type};

/// The values kept as lanes' partial sums and where each is totalled.
#[derive(Default)]
pub(super) struct PartialSums {
    /// Each kept value's lane masks, one butterfly step each; none for a sum of zeros alone,
    /// which every lane holds whole.
    lanes: HashMap<Value, Vec<u32>>,
    /// The kept values an instruction (by pre-order index) reads whole, each totalled before
    /// it, or taken from the total before it that dominates it (`true`).
    totals_at: HashMap<usize, Vec<(Value, bool)>>,
}

impl PartialSums {
    /// Whether `value`, a `reduce_sum`'s result, keeps its lanes' partial sums.
    pub(super) fn keeps(&self, value: Value) -> bool {
        self.lanes.contains_key(&value)
    }
}

/// How a candidate stays a partial sum.
#[derive(Clone, Copy)]
enum Rule {
    /// A `reduce_sum` whose butterfly spans lanes and no warps.
    Reduce,
    /// Zero: the same in every lane, whole or partial.
    Zero,
    /// Both operands kept.
    Add(Value, Value),
    /// One operand kept, the other of the result's layout and not kept.
    Mul(Value, Value),
    /// A loop's carried value (or its result): its initial and yielded values kept.
    Carried { init: Value, next: Value },
}

/// What the fixpoint knows of a kept value's lanes: none yet (zeros so far), or its masks.
type Lanes = Option<Vec<u32>>;

impl Lowering<'_> {
    /// Finds the sums to keep as partial sums in the kernel and where each is totalled.
    pub(super) fn find_partial_sums(&self) -> PartialSums {
        let mut insts: Vec<(usize, &TileInst)> = Vec::new();
        walk_insts(&self.kernel.body, &mut 0, &mut |index, inst| {
            insts.push((index, inst))
        });
        // A value converted to another layout moves between lanes: it stays whole.
        let converted: HashSet<Value> = insts
            .iter()
            .flat_map(|&(index, _)| self.layouts.conversions_at(index))
            .map(|c| c.value)
            .collect();

        let mut rules: HashMap<Value, Rule> = HashMap::new();
        let mut reduce_lanes: HashMap<Value, Vec<u32>> = HashMap::new();
        for &(index, inst) in &insts {
            match &inst.op {
                TileOp::Reduce {
                    op: ReduceOp::Sum,
                    value,
                    axis,
                } if self.is_f32_tile(inst.results[0]) => {
                    if let Some(lanes) = self.butterfly_lanes(index, *value, *axis) {
                        reduce_lanes.insert(inst.results[0], lanes);
                        rules.insert(inst.results[0], Rule::Reduce);
                    }
                }
                TileOp::Splat { .. }
                    if is_zero_splat(inst.results[0], |v| {
                        self.definitions[v.index()].map(|i| &i.op)
                    }) =>
                {
                    rules.insert(inst.results[0], Rule::Zero);
                }
                TileOp::Binary { op, lhs, rhs } => match op {
                    BinaryOp::Add => {
                        rules.insert(inst.results[0], Rule::Add(*lhs, *rhs));
                    }
                    BinaryOp::Mul => {
                        rules.insert(inst.results[0], Rule::Mul(*lhs, *rhs));
                    }
                    _ => {}
                },
                TileOp::For { init, body, .. } => {
                    for (k, (&init, &next)) in init.iter().zip(yielded(body)).enumerate() {
                        let rule = Rule::Carried { init, next };
                        rules.insert(body.params[k + 1], rule);
                        rules.insert(inst.results[k], rule);
                    }
                }
                _ => {}
            }
        }
        rules.retain(|&v, _| self.is_f32_tile(v) && !converted.contains(&v));

        // The fixpoint: what is kept, with what lanes.
        let mut kept: HashMap<Value, Lanes> = rules.keys().map(|&v| (v, None)).collect();
        loop {
            let mut changed = false;
            let values: Vec<Value> = kept.keys().copied().collect();
            for value in values {
                let lanes = match rules[&value] {
                    Rule::Reduce => Some(Some(reduce_lanes[&value].clone())),
                    Rule::Zero => Some(None),
                    Rule::Add(a, b) => self
                        .same_layout(value, &[a, b])
                        .then(|| merge(kept.get(&a).cloned()?, kept.get(&b).cloned()?))
                        .flatten(),
                    Rule::Mul(a, b) => {
                        let (partial, factor) = match (kept.get(&a), kept.get(&b)) {
                            (Some(_), None) => (a, b),
                            (None, Some(_)) => (b, a),
                            _ => {
                                kept.remove(&value);
                                changed = true;
                                continue;
                            }
                        };
                        self.same_layout(value, &[partial, factor])
                            .then(|| kept[&partial].clone())
                    }
                    Rule::Carried { init, next } => self
                        .same_layout(value, &[init, next])
                        .then(|| merge(kept.get(&init).cloned()?, kept.get(&next).cloned()?))
                        .flatten(),
                };
                match lanes {
                    None => {
                        kept.remove(&value);
                        changed = true;
                    }
                    Some(lanes) if kept[&value] != lanes => {
                        kept.insert(value, lanes);
                        changed = true;
                    }
                    Some(_) => {}
                }
            }
            if !changed {
                break;
            }
        }

        // Where a kept value is read whole. A total serves the later reads its region holds
        // (it dominates them).
        let mut reads = Reads {
            kept: &kept,
            totals_at: HashMap::new(),
            scopes: vec![HashSet::new()],
            next: 0,
        };
        reads.region(&self.kernel.body, None);
        let totals_at = reads.totals_at;
        PartialSums {
            lanes: kept
                .into_iter()
                .map(|(v, lanes)| (v, lanes.unwrap_or_default()))
                .collect(),
            totals_at,
        }
    }

    /// The lane masks of the butterfly that `reduce_sum` of `value` along `axis` (instruction
    /// `index`) ends in, where it spans lanes but no warps; else `None`.
    fn butterfly_lanes(&self, index: usize, value: Value, axis: usize) -> Option<Vec<u32>> {
        let conversion = self
            .layouts
            .conversions_at(index)
            .iter()
            .find(|c| c.value == value)
            .map(|c| &c.to);
        let parent = conversion.or_else(|| self.layouts.layout(value))?;
        let shape = self.shape(value);
        let (lanes, warps) = parent.thread_map(&shape)?.butterfly(axis, shape[axis]);
        (warps.is_empty() && !lanes.is_empty()).then_some(lanes)
    }

    /// Whether `value` is an f32 tile (not a scalar: a scalar has no lanes to sum over).
    fn is_f32_tile(&self, value: Value) -> bool {
        let ty = self.kernel.ty(value);
        !ty.shape().is_empty() && ty.dtype() == Some(DType::F32)
    }

    /// Whether every one of `others` has `value`'s layout.
    fn same_layout(&self, value: Value, others: &[Value]) -> bool {
        let layout = self.layouts.layout(value);
        layout.is_some() && others.iter().all(|&v| self.layouts.layout(v) == layout)
    }

    /// Totals the kept values the instruction `index` reads whole: each goes to it as a
    /// conversion of its registers, the butterfly its `reduce_sum` left out.
    pub(super) fn total_partial_sums(&mut self, index: usize) -> Result<()> {
        let Some(values) = self.partial_sums.totals_at.get(&index).cloned() else {
            return Ok(());
        };
        for (value, totalled) in values {
            let regs = if totalled {
                self.partial_totals.get(&value).cloned().ok_or_else(|| {
                    crate::CodegenError::internal(
                        crate::Stage::Thread,
                        format!("partial sum %{} read before its total", value.0),
                    )
                })?
            } else {
                let lanes = self.partial_sums.lanes[&value].clone();
                let mut regs = self.regs(value)?;
                for &lane_mask in &lanes {
                    for reg in regs.iter_mut() {
                        *reg = self.butterfly_step(*reg, lane_mask);
                    }
                }
                self.partial_totals.insert(value, regs.clone());
                regs
            };
            let layout = self.layouts.layout(value).cloned().ok_or_else(|| {
                crate::CodegenError::internal(
                    crate::Stage::Thread,
                    format!("partial sum %{} has no layout", value.0),
                )
            })?;
            self.converted.push((value, layout, regs));
        }
        Ok(())
    }

    /// One step of a sum's butterfly: `reg` plus its value in the lane `lane_mask` away.
    fn butterfly_step(&mut self, reg: Reg, lane_mask: u32) -> Reg {
        let other = self.shuffle_xor(reg, lane_mask);
        self.combine(ReduceOp::Sum, Type::F32, reg, other)
    }
}

/// Merges two kept values' lanes: zeros take the other's; different lanes do not merge.
fn merge(a: Lanes, b: Lanes) -> Option<Lanes> {
    match (a, b) {
        (None, b) => Some(b),
        (a, None) => Some(a),
        (Some(a), Some(b)) => (a == b).then_some(Some(a)),
    }
}

/// The walk that finds where kept values are read whole, in [`walk_insts`]'s order.
struct Reads<'a> {
    kept: &'a HashMap<Value, Lanes>,
    totals_at: HashMap<usize, Vec<(Value, bool)>>,
    /// The values totalled in each region around the instruction, innermost last.
    scopes: Vec<HashSet<Value>>,
    next: usize,
}

impl Reads<'_> {
    fn region(&mut self, region: &Region, parent: Option<&TileInst>) {
        for inst in &region.insts {
            self.inst(inst, parent);
            self.next += 1;
            for nested in nested_regions(&inst.op) {
                self.scopes.push(HashSet::new());
                self.region(nested, Some(inst));
                self.scopes.pop();
            }
        }
    }

    /// A read keeps a value partial only as the operand of an add or multiply that is kept, or
    /// as what a loop carries into a kept value; any other is totalled there, or takes the
    /// total a region around it made.
    fn inst(&mut self, inst: &TileInst, parent: Option<&TileInst>) {
        let mut read = Vec::new();
        for_each_operand(&inst.op, |v| read.push(v));
        for (position, value) in read.into_iter().enumerate() {
            let Some(Some(_)) = self.kept.get(&value) else {
                continue;
            };
            let stays_partial = match &inst.op {
                TileOp::Binary {
                    op: BinaryOp::Add | BinaryOp::Mul,
                    ..
                } => self.kept.contains_key(&inst.results[0]),
                // `for_each_operand` reads a loop's bounds, then its initial values.
                TileOp::For { .. } => position >= 3 && self.carried_into(inst, position - 3),
                TileOp::Yield { .. } => parent.is_some_and(|p| self.carried_into(p, position)),
                _ => false,
            };
            if stays_partial {
                continue;
            }
            let totalled = self.scopes.iter().any(|scope| scope.contains(&value));
            let at = self.totals_at.entry(self.next).or_default();
            if at.iter().any(|&(v, _)| v == value) {
                continue;
            }
            at.push((value, totalled));
            if let Some(scope) = self.scopes.last_mut() {
                scope.insert(value);
            }
        }
    }

    /// Whether the `k`th value `loop_inst` carries is kept.
    fn carried_into(&self, loop_inst: &TileInst, k: usize) -> bool {
        match &loop_inst.op {
            TileOp::For { body, .. } => self.kept.contains_key(&body.params[k + 1]),
            _ => false,
        }
    }
}
