//! Divisibility of scalars and block pointers (a small form of Triton's `AxisInfo`): the
//! largest power of two known to divide each scalar integer, each scalar pointer's address (in
//! bytes), and the fields of each block pointer. It starts from constants and from what the
//! launcher guarantees ([`CompileOptions::divisibility`]) and is what decides whether a block
//! access may move 16 bytes per vector ([`Divisibility::vector_elems`]): the `cp.async` of a
//! pipelined load, a vectorised `ld.global`/`st.global`.

use std::collections::{BTreeMap, BTreeSet};

use kiln_dsl::ir::{BinaryOp, Constant, Inst, Kernel, Op, Region, Value};
use kiln_dsl::types::{Elem, Type};

use super::assign::nested_regions;
use super::{ACCESS_BYTES, ThreadMap};
use crate::{CodegenError, CompileOptions};

/// Divisors are kept below this (a zero is divisible by anything).
const CAP: u64 = 1 << 16;

/// What is known of a block pointer, field by field (elements; the base in bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
struct BlockInfo {
    base: u64,
    shape: Vec<u64>,
    strides: Vec<u64>,
    offsets: Vec<u64>,
    /// Dimensions whose stride is the constant 1.
    unit: Vec<bool>,
}

impl BlockInfo {
    fn meet(&self, other: &BlockInfo) -> BlockInfo {
        let min = |a: &[u64], b: &[u64]| a.iter().zip(b).map(|(x, y)| *x.min(y)).collect();
        BlockInfo {
            base: self.base.min(other.base),
            shape: min(&self.shape, &other.shape),
            strides: min(&self.strides, &other.strides),
            offsets: min(&self.offsets, &other.offsets),
            unit: self
                .unit
                .iter()
                .zip(&other.unit)
                .map(|(a, b)| *a && *b)
                .collect(),
        }
    }
}

/// The analysis' result for one kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Divisibility {
    /// By value: the divisor of a scalar (1 where nothing is known, and for tiles).
    scalars: Vec<u64>,
    blocks: BTreeMap<Value, BlockInfo>,
    /// The launch's guarantees, by parameter index.
    pub assumptions: Vec<(usize, u64)>,
}

fn of_constant(c: i64) -> u64 {
    match c {
        0 => CAP,
        c => (1u64 << c.unsigned_abs().trailing_zeros()).min(CAP),
    }
}

/// The constant integer `value` is, through casts.
pub(crate) fn constant_int(
    kernel: &Kernel,
    definitions: &[Option<&Inst>],
    value: Value,
) -> Option<i64> {
    match &definitions[value.index()]?.op {
        Op::Constant(Constant::Int(c)) => Some(*c),
        Op::Cast { value } if kernel.ty(*value).dtype().is_some_and(|d| !d.is_float()) => {
            constant_int(kernel, definitions, *value)
        }
        _ => None,
    }
}

/// The defining instruction of every value (none for arguments and region parameters).
pub(crate) fn definitions(kernel: &Kernel) -> Vec<Option<&Inst>> {
    fn walk<'k>(region: &'k Region, out: &mut Vec<Option<&'k Inst>>) {
        for inst in &region.insts {
            for &r in &inst.results {
                out[r.index()] = Some(inst);
            }
            for nested in nested_regions(&inst.op) {
                walk(nested, out);
            }
        }
    }
    let mut out = vec![None; kernel.values.len()];
    walk(&kernel.body, &mut out);
    out
}

impl Divisibility {
    /// Analyses `kernel` under `options`' guarantees; an unknown argument name is an error.
    pub fn analyse(
        kernel: &Kernel,
        options: &CompileOptions,
    ) -> Result<Divisibility, CodegenError> {
        let mut scalars = vec![1u64; kernel.values.len()];
        let mut assumptions = Vec::new();
        for (name, n) in &options.divisibility {
            let Some(index) = kernel.signature.args.iter().position(|a| a.name == name) else {
                return Err(CodegenError::Options {
                    message: format!("`{name}` is not an argument of `{}`", kernel.name()),
                });
            };
            let value = kernel.args[index];
            scalars[value.index()] = scalars[value.index()].max((*n).min(CAP));
            assumptions.push((index, *n));
        }
        assumptions.sort_unstable();
        assumptions.dedup();
        let mut analysis = Divisibility {
            scalars,
            blocks: BTreeMap::new(),
            assumptions,
        };
        let definitions = definitions(kernel);
        analysis.region(kernel, &definitions, &kernel.body);
        Ok(analysis)
    }

    /// What is known to divide the scalar `value` (a pointer's address in bytes, an integer's
    /// value): a power of two, 1 if nothing is.
    pub fn divisor(&self, value: Value) -> u64 {
        self.scalars[value.index()]
    }

    fn region(&mut self, kernel: &Kernel, definitions: &[Option<&Inst>], region: &Region) {
        for inst in &region.insts {
            self.inst(kernel, definitions, inst);
        }
    }

    fn inst(&mut self, kernel: &Kernel, definitions: &[Option<&Inst>], inst: &Inst) {
        let scalar = |v: Value| kernel.ty(v).shape().is_empty();
        let divisor = match &inst.op {
            Op::Constant(Constant::Int(c)) => of_constant(*c),
            Op::Cast { value } if kernel.ty(*value).dtype().is_some_and(|d| !d.is_float()) => {
                self.divisor(*value)
            }
            Op::Binary { op, lhs, rhs } if scalar(*lhs) && scalar(*rhs) => {
                let (a, b) = (self.divisor(*lhs), self.divisor(*rhs));
                match op {
                    BinaryOp::Add | BinaryOp::Sub | BinaryOp::Max | BinaryOp::Min => a.min(b),
                    BinaryOp::Mul => (a * b).min(CAP),
                    BinaryOp::Shl => match constant_int(kernel, definitions, *rhs) {
                        Some(k) if (0..16).contains(&k) => (a << k).min(CAP),
                        _ => 1,
                    },
                    _ => 1,
                }
            }
            Op::Select {
                if_true, if_false, ..
            } => self.divisor(*if_true).min(self.divisor(*if_false)),
            Op::AddPtr { ptr, offset } if scalar(*ptr) => {
                let bytes = match kernel.ty(*ptr).elem() {
                    Some(Elem::Ptr(pointee)) => pointee.size_bytes() as u64,
                    _ => 1,
                };
                self.divisor(*ptr).min(self.divisor(*offset) * bytes)
            }
            Op::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                order,
            } => {
                let fields = |values: &[Value]| values.iter().map(|&v| self.divisor(v)).collect();
                // Indexed leading dimensions move the base by `offset * stride` elements.
                let lead = shape.len() - order.len();
                let bytes = match kernel.ty(*base).elem() {
                    Some(Elem::Ptr(pointee)) => pointee.size_bytes() as u64,
                    _ => 1,
                };
                let base = (0..lead).fold(self.divisor(*base), |b, d| {
                    b.min((self.divisor(offsets[d]) * self.divisor(strides[d]) * bytes).min(CAP))
                });
                let info = BlockInfo {
                    base,
                    shape: fields(&shape[lead..]),
                    strides: fields(&strides[lead..]),
                    offsets: fields(&offsets[lead..]),
                    unit: strides[lead..]
                        .iter()
                        .map(|&s| constant_int(kernel, definitions, s) == Some(1))
                        .collect(),
                };
                self.blocks.insert(inst.results[0], info);
                1
            }
            Op::Advance { ptr, offsets } => {
                if let Some(mut info) = self.blocks.get(ptr).cloned() {
                    for (o, &delta) in info.offsets.iter_mut().zip(offsets) {
                        *o = (*o).min(self.divisor(delta));
                    }
                    self.blocks.insert(inst.results[0], info);
                }
                1
            }
            Op::For {
                lower,
                step,
                init,
                body,
                ..
            } => {
                self.scalars[body.params[0].index()] =
                    self.divisor(*lower).min(self.divisor(*step));
                // A carried block pointer advanced by the same amounts every iteration keeps
                // what its start and the amounts have in common; other carried values, nothing.
                let advanced = advanced_params(body);
                for (i, &start) in init.iter().enumerate() {
                    let param = body.params[i + 1];
                    let Some(deltas) = advanced.get(&param) else {
                        continue;
                    };
                    if let Some(mut info) = self.blocks.get(&start).cloned() {
                        for (o, delta) in info.offsets.iter_mut().zip(deltas) {
                            let d = match constant_int(kernel, definitions, *delta) {
                                Some(c) => of_constant(c),
                                None if defined_in(body).contains(delta) => 1,
                                None => self.divisor(*delta),
                            };
                            *o = (*o).min(d);
                        }
                        self.blocks.insert(param, info);
                    }
                }
                self.region(kernel, definitions, body);
                for (i, &result) in inst.results.iter().enumerate() {
                    let (start, param) = (init[i], body.params[i + 1]);
                    if let (Some(a), Some(b)) = (self.blocks.get(&start), self.blocks.get(&param)) {
                        let info = a.meet(b);
                        self.blocks.insert(result, info);
                    }
                }
                1
            }
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                self.region(kernel, definitions, then_region);
                self.region(kernel, definitions, else_region);
                let (then_values, else_values) = (yielded(then_region), yielded(else_region));
                for (i, &result) in inst.results.iter().enumerate() {
                    let (a, b) = (then_values[i], else_values[i]);
                    self.scalars[result.index()] = self.divisor(a).min(self.divisor(b));
                    if let (Some(x), Some(y)) = (self.blocks.get(&a), self.blocks.get(&b)) {
                        let info = x.meet(y);
                        self.blocks.insert(result, info);
                    }
                }
                return;
            }
            _ => 1,
        };
        if let [result] = inst.results[..]
            && scalar(result)
            && !matches!(kernel.ty(result), Type::BlockPtr { .. })
        {
            self.scalars[result.index()] = divisor;
        }
    }

    /// How many elements one vector access of block pointer `ptr` may move for a tile held as
    /// `map` describes: a run of the map along a dimension, 16 bytes at most, that
    /// [`Self::vector_elems`] proves aligned (the widest over the dimensions; 1: scalars).
    pub fn widest_vector(
        &self,
        ptr: Value,
        map: &ThreadMap,
        boundary_check: &[usize],
        elem_bytes: usize,
    ) -> usize {
        (0..map.rank())
            .map(|d| {
                let run = map.run_along(d, ACCESS_BYTES / elem_bytes);
                self.vector_elems(ptr, d, boundary_check, elem_bytes, run)
            })
            .max()
            .unwrap_or(1)
    }

    /// How many elements along dimension `dim` one vector access of block pointer `ptr` may
    /// move, at most `wanted` and 16 bytes of `elem_bytes`-byte elements: a power of two `v` such
    /// that `dim` has stride 1, every vector's first address is a multiple of `v` elements (base,
    /// other strides, offset along `dim`), and, where `dim` is bounds-checked, the shape along
    /// it is a multiple of `v` (a vector is all inside or all outside).
    pub fn vector_elems(
        &self,
        ptr: Value,
        dim: usize,
        boundary_check: &[usize],
        elem_bytes: usize,
        wanted: usize,
    ) -> usize {
        let Some(info) = self.blocks.get(&ptr) else {
            return 1;
        };
        if !info.unit[dim] {
            return 1;
        }
        let elem_bytes = elem_bytes as u64;
        let mut v = (16 / elem_bytes).min(wanted as u64).max(1);
        while v > 1 {
            let aligned = info.base.is_multiple_of(v * elem_bytes)
                && info.offsets[dim].is_multiple_of(v)
                && (!boundary_check.contains(&dim) || info.shape[dim].is_multiple_of(v))
                && (0..info.strides.len())
                    .filter(|&d| d != dim)
                    .all(|d| info.strides[d].is_multiple_of(v));
            if aligned {
                return v as usize;
            }
            v /= 2;
        }
        1
    }
}

/// The values a region's closing `yield` names.
fn yielded(region: &Region) -> &[Value] {
    match region.insts.last().map(|i| &i.op) {
        Some(Op::Yield { values }) => values,
        _ => &[],
    }
}

/// The carried parameters of a loop body that it yields advanced by some amounts
/// (`yield advance(param, amounts)`), with those amounts.
pub(crate) fn advanced_params(body: &Region) -> BTreeMap<Value, Vec<Value>> {
    let mut out = BTreeMap::new();
    for (i, &value) in yielded(body).iter().enumerate() {
        let param = body.params[i + 1];
        let advance = body
            .insts
            .iter()
            .find(|inst| inst.results.first() == Some(&value));
        if let Some(Inst {
            op: Op::Advance { ptr, offsets },
            ..
        }) = advance
            && *ptr == param
        {
            out.insert(param, offsets.clone());
        }
    }
    out
}

/// Every value a region defines, its nested regions' included.
pub(crate) fn defined_in(region: &Region) -> BTreeSet<Value> {
    let mut out: BTreeSet<Value> = region.params.iter().copied().collect();
    for inst in &region.insts {
        out.extend(inst.results.iter().copied());
        for nested in nested_regions(&inst.op) {
            out.extend(defined_in(nested));
        }
    }
    out
}
