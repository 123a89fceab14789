//! The DSL's operations, one builder method each. The doc of each method is the DSL reference
//! for the construct the macro maps to it.

use super::Builder;
use super::semantic::is_pow2;
use crate::error::{Error, Loc, Result};
use crate::ir::{BinaryOp, CmpOp, Constant, GridControl, Op, ReduceOp, UnaryOp, Value};
use crate::passes::{fold_binary, fold_compare};
use crate::types::{DType, Elem, ShapeDisplay, Type};

impl Builder {
    /// `program_id(axis)`: this program's index along grid axis 0, 1 or 2, as i32.
    pub fn program_id(&mut self, axis: Value, loc: Loc) -> Result<Value> {
        let axis = self.grid_axis(axis, "program_id", loc)?;
        Ok(self.push1(Op::ProgramId { axis }, Type::scalar(DType::I32), loc))
    }

    /// `num_programs(axis)`: the grid's size along axis 0, 1 or 2, as i32.
    pub fn num_programs(&mut self, axis: Value, loc: Loc) -> Result<Value> {
        let axis = self.grid_axis(axis, "num_programs", loc)?;
        Ok(self.push1(Op::NumPrograms { axis }, Type::scalar(DType::I32), loc))
    }

    fn grid_axis(&self, axis: Value, what: &str, loc: Loc) -> Result<u8> {
        match self.const_int(axis, &format!("the axis of `{what}`"), loc)? {
            a @ 0..=2 => Ok(a as u8),
            a => Err(Error::semantic(
                loc,
                format!("`{what}` expects grid axis 0, 1 or 2, got {a}"),
            )),
        }
    }

    /// `arange(start, end)`: the i32 tile `[start, .., end - 1]`; its length must be a power of two.
    pub fn arange(&mut self, start: Value, end: Value, loc: Loc) -> Result<Value> {
        let start = self.const_int(start, "the start of `arange`", loc)?;
        let end = self.const_int(end, "the end of `arange`", loc)?;
        // An i32 tile: its bounds are i32 values.
        for (which, bound) in [("start", start), ("end", end)] {
            if i32::try_from(bound).is_err() {
                return Err(Error::semantic(
                    loc,
                    format!("the {which} of `arange({start}, {end})` must fit in i32, got {bound}"),
                ));
            }
        }
        let len = end - start;
        if len <= 0 || !is_pow2(len as usize) {
            return Err(Error::semantic(
                loc,
                format!("`arange({start}, {end})` must have a power-of-two length, got {len}"),
            ));
        }
        self.check_tile_size(&[len as usize], &format!("`arange({start}, {end})`"), loc)?;
        Ok(self.push1(
            Op::Arange { start, end },
            Type::tile(DType::I32, vec![len as usize]),
            loc,
        ))
    }

    /// `zeros([d0, d1, ..], dtype)`: a tile of zeros.
    pub fn zeros(&mut self, shape: &[Value], dtype: DType, loc: Loc) -> Result<Value> {
        let zero = match dtype {
            DType::I1 => Constant::Bool(false),
            d if d.is_int() => Constant::Int(0),
            _ => Constant::Float(0.0),
        };
        let zero = self.typed_constant(zero, dtype, loc);
        self.fill(shape, zero, loc)
    }

    /// `full([d0, d1, ..], value, dtype)`: a tile filled with a scalar, converted to `dtype`.
    pub fn full(&mut self, shape: &[Value], value: Value, dtype: DType, loc: Loc) -> Result<Value> {
        if !self.ty(value).is_scalar() {
            return Err(Error::semantic(
                loc,
                format!("`full` expects a scalar fill value, got {}", self.ty(value)),
            ));
        }
        let value = self.cast(value, dtype, loc)?;
        self.fill(shape, value, loc)
    }

    fn fill(&mut self, shape: &[Value], value: Value, loc: Loc) -> Result<Value> {
        let shape = self.const_dims(shape, "a tile shape", loc)?;
        self.check_tile_shape(&shape, "tile", loc)?;
        self.broadcast_value(value, &shape, loc)
    }

    /// `-x`, `!x`, `exp2(x)`, `exp(x)`, `log2(x)`, `log(x)`, `tanh(x)`, `sqrt(x)`, `rsqrt(x)`,
    /// `abs(x)`: elementwise. The math functions take floats; `!` takes bools or integers.
    pub fn unary(&mut self, op: UnaryOp, value: Value, loc: Loc) -> Result<Value> {
        let what = format!("`{}`", Op::Unary { op, value }.name());
        let dtype = self.number_dtype(value, &what, loc)?;
        let ok = match op {
            UnaryOp::Neg => dtype != DType::I1,
            UnaryOp::Not => !dtype.is_float(),
            UnaryOp::Abs => dtype != DType::I1,
            _ => dtype.is_float(),
        };
        if !ok {
            let expected = match op {
                UnaryOp::Not => "a bool or integer",
                UnaryOp::Neg | UnaryOp::Abs => "a number",
                _ => "a float",
            };
            return Err(Error::semantic(
                loc,
                format!("{what} expects {expected} operand, got {}", self.ty(value)),
            ));
        }
        if let (Some(c), true) = (self.constant(value), self.ty(value).is_scalar()) {
            let folded = match (op, c) {
                (UnaryOp::Neg, Constant::Int(v)) => Some(Constant::Int(v.wrapping_neg())),
                (UnaryOp::Not, Constant::Bool(v)) => Some(Constant::Bool(!v)),
                (UnaryOp::Abs, Constant::Int(v)) => Some(Constant::Int(v.wrapping_abs())),
                (_, Constant::Float(v)) => Some(Constant::Float(crate::passes::round_float(
                    crate::passes::fold_float_unary(op, v),
                    dtype,
                ))),
                _ => None,
            };
            if let Some(folded) = folded {
                return Ok(self.fold_result(folded, dtype, &[value], loc));
            }
        }
        let ty = self.ty(value).clone();
        Ok(self.push1(Op::Unary { op, value }, ty, loc))
    }

    /// `a + b`, `a - b`, `a * b`, `a / b`, `a % b`, `a & b`, `a | b`, `a ^ b`, `a << b`, `a >> b`,
    /// `a && b`, `a || b`, `maximum(a, b)`, `minimum(a, b)`: elementwise with broadcasting and
    /// promotion. `ptr + offsets` and `ptr - offsets` are pointer arithmetic in elements.
    pub fn binary(&mut self, op: BinaryOp, lhs: Value, rhs: Value, loc: Loc) -> Result<Value> {
        self.check_visible(lhs, loc)?;
        self.check_visible(rhs, loc)?;
        let is_ptr = |b: &Self, v: Value| matches!(b.ty(v).elem(), Some(Elem::Ptr(_)));
        match (op, is_ptr(self, lhs), is_ptr(self, rhs)) {
            (BinaryOp::Add, true, false) => return self.add_ptr(lhs, rhs, loc),
            (BinaryOp::Add, false, true) => return self.add_ptr(rhs, lhs, loc),
            (BinaryOp::Sub, true, false) => {
                let negated = self.unary(UnaryOp::Neg, rhs, loc)?;
                return self.add_ptr(lhs, negated, loc);
            }
            (_, false, false) => {}
            _ => {
                return Err(Error::semantic(
                    loc,
                    format!(
                        "`{}` is not defined on {} and {}; pointers only add integer offsets",
                        Op::Binary { op, lhs, rhs }.name(),
                        self.ty(lhs),
                        self.ty(rhs)
                    ),
                ));
            }
        }
        let what = format!("`{}`", Op::Binary { op, lhs, rhs }.name());
        let (lhs, rhs, dtype) = self.unify(lhs, rhs, &what, loc)?;
        let bitwise = matches!(
            op,
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Shl | BinaryOp::Shr
        );
        if bitwise && dtype.is_float() {
            return Err(Error::semantic(
                loc,
                format!(
                    "{what} expects bool or integer operands, got {}",
                    self.ty(lhs)
                ),
            ));
        }
        if matches!(op, BinaryOp::Shl | BinaryOp::Shr) && dtype == DType::I1 {
            return Err(Error::semantic(
                loc,
                format!("{what} expects integer operands, got bools (i1)"),
            ));
        }
        if !bitwise && dtype == DType::I1 && !matches!(op, BinaryOp::Max | BinaryOp::Min) {
            return Err(Error::semantic(
                loc,
                format!("{what} expects number operands, got bools (i1)"),
            ));
        }
        if self.ty(lhs).is_scalar()
            && let (Some(a), Some(b)) = (self.constant(lhs), self.constant(rhs))
            && let Some(folded) = fold_binary(op, a, b, dtype)
        {
            return Ok(self.fold_result(folded, dtype, &[lhs, rhs], loc));
        }
        let ty = self.ty(lhs).clone();
        Ok(self.push1(Op::Binary { op, lhs, rhs }, ty, loc))
    }

    /// `cdiv(a, b)`: `(a + b - 1) / b` for non-negative integers, the number of blocks of `b` in `a`.
    pub fn cdiv(&mut self, a: Value, b: Value, loc: Loc) -> Result<Value> {
        let one = self.int(1, loc);
        let sum = self.binary(BinaryOp::Add, a, b, loc)?;
        let sum = self.binary(BinaryOp::Sub, sum, one, loc)?;
        self.binary(BinaryOp::Div, sum, b, loc)
    }

    /// `a < b`, `<=`, `>`, `>=`, `==`, `!=`: elementwise, giving bools (i1).
    pub fn compare(&mut self, op: CmpOp, lhs: Value, rhs: Value, loc: Loc) -> Result<Value> {
        let what = format!("`{}`", Op::Compare { op, lhs, rhs }.name());
        let (lhs, rhs, _) = self.unify(lhs, rhs, &what, loc)?;
        if self.ty(lhs).is_scalar()
            && let (Some(a), Some(b)) = (self.constant(lhs), self.constant(rhs))
            && let Some(folded) = fold_compare(op, a, b)
        {
            return Ok(self.fold_result(folded, DType::I1, &[lhs, rhs], loc));
        }
        let shape = self.ty(lhs).shape().to_vec();
        Ok(self.push1(
            Op::Compare { op, lhs, rhs },
            Type::tile(DType::I1, shape),
            loc,
        ))
    }

    /// `where_(cond, a, b)`: `a` where `cond` holds, else `b` (Triton's `where`), broadcasting all three.
    pub fn select(
        &mut self,
        cond: Value,
        if_true: Value,
        if_false: Value,
        loc: Loc,
    ) -> Result<Value> {
        if self.number_dtype(cond, "`where_`", loc)? != DType::I1 {
            return Err(Error::semantic(
                loc,
                format!(
                    "`where_` expects a bool (i1) condition, got {}",
                    self.ty(cond)
                ),
            ));
        }
        let shape = self.common_shape(&[cond, if_true, if_false], "`where_`", loc)?;
        let (if_true, if_false, _) = self.unify(if_true, if_false, "`where_`", loc)?;
        let cond = self.broadcast_value(cond, &shape, loc)?;
        let if_true = self.broadcast_value(if_true, &shape, loc)?;
        let if_false = self.broadcast_value(if_false, &shape, loc)?;
        if let Some(c) = self.static_bool(cond) {
            return Ok(if c { if_true } else { if_false });
        }
        let ty = self.ty(if_true).clone();
        Ok(self.push1(
            Op::Select {
                cond,
                if_true,
                if_false,
            },
            ty,
            loc,
        ))
    }

    /// `fma(a, b, c)`: `a * b + c` on f32 with one rounding, as `fma.rn.f32` (where `a * b + c`
    /// rounds twice), broadcasting all three.
    pub fn fma(&mut self, a: Value, b: Value, c: Value, loc: Loc) -> Result<Value> {
        for v in [a, b, c] {
            if self.number_dtype(v, "`fma`", loc)? != DType::F32 {
                return Err(Error::semantic(
                    loc,
                    format!("`fma` expects f32 operands, got {}", self.ty(v)),
                ));
            }
        }
        let shape = self.common_shape(&[a, b, c], "`fma`", loc)?;
        let [a, b, c] = [a, b, c].map(|v| self.broadcast_value(v, &shape, loc));
        let (a, b, c) = (a?, b?, c?);
        let ty = self.ty(a).clone();
        Ok(self.push1(Op::Fma { a, b, c }, ty, loc))
    }

    /// `expand_dims(x, axis)`, `x.expand_dims(axis)`: inserts a size-1 dimension; Triton's
    /// `x[:, None]` is `x.expand_dims(1)` and `x[None, :]` is `x.expand_dims(0)`.
    pub fn expand_dims(&mut self, value: Value, axis: Value, loc: Loc) -> Result<Value> {
        let axis = self.const_int(axis, "the axis of `expand_dims`", loc)?;
        let ty = self.ty(value).clone();
        let elem = self.tensor_elem(value, "`expand_dims`", loc)?;
        let mut shape = ty.shape().to_vec();
        if axis < 0 || axis as usize > shape.len() {
            return Err(Error::semantic(
                loc,
                format!(
                    "`expand_dims` on a rank-{} tile expects an axis in 0..={}, got {axis}",
                    shape.len(),
                    shape.len()
                ),
            ));
        }
        shape.insert(axis as usize, 1);
        Ok(self.push1(
            Op::ExpandDims {
                value,
                axis: axis as usize,
            },
            Type::Tensor { elem, shape },
            loc,
        ))
    }

    /// `broadcast_to(x, [d0, ..])`, `x.broadcast_to([..])`: explicit broadcasting.
    pub fn broadcast_to(&mut self, value: Value, shape: &[Value], loc: Loc) -> Result<Value> {
        let shape = self.const_dims(shape, "a tile shape", loc)?;
        self.check_tile_shape(&shape, "tile", loc)?;
        self.tensor_elem(value, "`broadcast_to`", loc)?;
        self.broadcast_value(value, &shape, loc)
    }

    /// `trans(x)`, `x.trans()`: the transpose of a 2-D tile.
    pub fn trans(&mut self, value: Value, loc: Loc) -> Result<Value> {
        let elem = self.tensor_elem(value, "`trans`", loc)?;
        let shape = self.ty(value).shape().to_vec();
        if shape.len() != 2 {
            return Err(Error::semantic(
                loc,
                format!("`trans` expects a 2-D tile, got {}", self.ty(value)),
            ));
        }
        Ok(self.push1(
            Op::Trans { value },
            Type::Tensor {
                elem,
                shape: vec![shape[1], shape[0]],
            },
            loc,
        ))
    }

    fn tensor_elem(&self, value: Value, what: &str, loc: Loc) -> Result<Elem> {
        self.check_visible(value, loc)?;
        self.ty(value).elem().ok_or_else(|| {
            Error::semantic(
                loc,
                format!("{what} expects a tile, got {}", self.ty(value)),
            )
        })
    }

    /// `sum(x, axis)`, `max(x, axis)`, `min(x, axis)` (and `x.sum(axis)`, ..): reduces `axis` away.
    /// Float sums accumulate in f32 and return the input dtype.
    pub fn reduce(&mut self, op: ReduceOp, value: Value, axis: Value, loc: Loc) -> Result<Value> {
        let what = format!("`{}`", Op::Reduce { op, value, axis: 0 }.name());
        let dtype = self.number_dtype(value, &what, loc)?;
        let axis = self.const_int(axis, &format!("the axis of {what}"), loc)?;
        let mut shape = self.ty(value).shape().to_vec();
        if axis < 0 || axis as usize >= shape.len() {
            return Err(Error::semantic(
                loc,
                format!(
                    "{what} on a {} expects an axis in 0..{}, got {axis}",
                    self.ty(value),
                    shape.len()
                ),
            ));
        }
        if op == ReduceOp::Sum && dtype == DType::I1 {
            return Err(Error::semantic(
                loc,
                format!("{what} expects numbers, got bools (cast them to i32 first)"),
            ));
        }
        shape.remove(axis as usize);
        Ok(self.push1(
            Op::Reduce {
                op,
                value,
                axis: axis as usize,
            },
            Type::tile(dtype, shape),
            loc,
        ))
    }

    /// `dot(a, b)`, `dot(a, b, acc)`: `a [M, K] @ b [K, N] (+ acc [M, N])` with f32 products and
    /// sums and an f32 result. `a` and `b` share a dtype (f16, bf16 or f32); M, N and K are powers
    /// of two of at least 16 (the tensor-core shape).
    pub fn dot(&mut self, lhs: Value, rhs: Value, acc: Option<Value>, loc: Loc) -> Result<Value> {
        let da = self.number_dtype(lhs, "`dot`", loc)?;
        let db = self.number_dtype(rhs, "`dot`", loc)?;
        let (sa, sb) = (self.ty(lhs).shape().to_vec(), self.ty(rhs).shape().to_vec());
        if sa.len() != 2 || sb.len() != 2 || sa[1] != sb[0] {
            return Err(Error::semantic(
                loc,
                format!(
                    "`dot` expects [M, K] x [K, N] but got {} x {}",
                    ShapeDisplay(&sa),
                    ShapeDisplay(&sb)
                ),
            ));
        }
        if da != db || !da.is_float() {
            return Err(Error::semantic(
                loc,
                format!("`dot` expects two f16, two bf16 or two f32 operands, got {da} and {db}"),
            ));
        }
        let (m, k, n) = (sa[0], sa[1], sb[1]);
        for (name, d) in [("M", m), ("N", n), ("K", k)] {
            if d < 16 || !is_pow2(d) {
                return Err(Error::semantic(
                    loc,
                    format!(
                        "`dot` needs {name} to be a power of two of at least 16, got {} x {} ({name} = {d})",
                        ShapeDisplay(&sa),
                        ShapeDisplay(&sb)
                    ),
                ));
            }
        }
        self.check_tile_size(&[m, n], "the result of `dot`", loc)?;
        let out = Type::tile(DType::F32, vec![m, n]);
        let acc = match acc {
            Some(acc) => {
                self.check_visible(acc, loc)?;
                if self.ty(acc) != &out {
                    return Err(Error::semantic(
                        loc,
                        format!(
                            "`dot` of {} x {} accumulates into {out}, got an accumulator {}",
                            ShapeDisplay(&sa),
                            ShapeDisplay(&sb),
                            self.ty(acc)
                        ),
                    ));
                }
                acc
            }
            None => {
                let zero = self.typed_constant(Constant::Float(0.0), DType::F32, loc);
                self.broadcast_value(zero, &[m, n], loc)?
            }
        };
        Ok(self.push1(Op::Dot { lhs, rhs, acc }, out, loc))
    }

    fn add_ptr(&mut self, ptr: Value, offset: Value, loc: Loc) -> Result<Value> {
        let dtype = self.number_dtype(offset, "pointer arithmetic", loc)?;
        if !dtype.is_int() {
            return Err(Error::semantic(
                loc,
                format!(
                    "pointer arithmetic expects integer offsets, got {}",
                    self.ty(offset)
                ),
            ));
        }
        let Some(Elem::Ptr(pointee)) = self.ty(ptr).elem() else {
            unreachable!("the caller checked for a pointer")
        };
        let shape = self.common_shape(&[ptr, offset], "pointer arithmetic", loc)?;
        let ptr = self.broadcast_value(ptr, &shape, loc)?;
        let offset = self.broadcast_value(offset, &shape, loc)?;
        Ok(self.push1(Op::AddPtr { ptr, offset }, Type::ptr(pointee, shape), loc))
    }

    fn pointee(&self, ptr: Value, what: &str, loc: Loc) -> Result<DType> {
        self.check_visible(ptr, loc)?;
        match self.ty(ptr) {
            Type::Tensor {
                elem: Elem::Ptr(pointee),
                ..
            } => Ok(*pointee),
            other => Err(Error::semantic(
                loc,
                format!("{what} expects a pointer or a tile of pointers, got {other}"),
            )),
        }
    }

    /// A mask broadcast to the pointers' shape.
    fn mask_for(&mut self, mask: Value, shape: &[usize], what: &str, loc: Loc) -> Result<Value> {
        if self.number_dtype(mask, what, loc)? != DType::I1 {
            return Err(Error::semantic(
                loc,
                format!("{what} expects a bool (i1) mask, got {}", self.ty(mask)),
            ));
        }
        self.broadcast_value(mask, shape, loc)
    }

    /// `load(ptrs)`, `load(ptrs, mask)`, `load(ptrs, mask, other)`: reads through a tile of
    /// pointers; lanes where `mask` is false read `other` (zero without it) and touch no memory.
    /// `load(block_ptr)` reads a block without bounds checks (see [`Builder::load_block`]).
    pub fn load(
        &mut self,
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
        loc: Loc,
    ) -> Result<Value> {
        self.check_visible(ptr, loc)?;
        if matches!(self.ty(ptr), Type::BlockPtr { .. }) && mask.is_none() && other.is_none() {
            return self.load_block(ptr, &[], loc);
        }
        let pointee = self.pointee(ptr, "`load`", loc)?;
        let shape = self.ty(ptr).shape().to_vec();
        let mask = match mask {
            Some(m) => Some(self.mask_for(m, &shape, "`load`", loc)?),
            None => None,
        };
        let other = match other {
            Some(o) => {
                if mask.is_none() {
                    return Err(Error::semantic(
                        loc,
                        "`load` takes `other` only with a mask",
                    ));
                }
                let o = self.cast(o, pointee, loc)?;
                Some(self.broadcast_value(o, &shape, loc)?)
            }
            None => None,
        };
        Ok(self.push1(
            Op::Load { ptr, mask, other },
            Type::tile(pointee, shape),
            loc,
        ))
    }

    /// `store(ptrs, value)`, `store(ptrs, value, mask)`: writes through a tile of pointers,
    /// converting `value` to the pointee dtype; lanes where `mask` is false write nothing.
    /// `store(block_ptr, value)` writes a block without bounds checks.
    pub fn store(&mut self, ptr: Value, value: Value, mask: Option<Value>, loc: Loc) -> Result<()> {
        self.write(ptr, value, mask, false, loc)
    }

    /// `atomic_add(ptrs, value)`, `atomic_add(ptrs, value, mask)`: adds `value` (converted to
    /// f32) to the f32 elements at `ptrs`, each addition atomic, so programs may add into the same
    /// elements; lanes where `mask` is false add nothing. The sum's order between programs is not
    /// fixed, so results may differ in the last bits from run to run. Returns nothing.
    pub fn atomic_add(
        &mut self,
        ptr: Value,
        value: Value,
        mask: Option<Value>,
        loc: Loc,
    ) -> Result<()> {
        self.write(ptr, value, mask, true, loc)
    }

    /// `atomic_arrive(counter)`: adds 1 to the i32 at the scalar pointer `counter` once for the
    /// program and gives the value before. Every write the program made before is visible
    /// GPU-wide before the addition, and the writes other programs made before their arrivals
    /// are visible after it: of `n` programs arriving at one counter, the one that reads `n - 1`
    /// is the last, and may read what all the others wrote (a split reduction's last program
    /// adding up the parts). The counter is the caller's to zero.
    pub fn atomic_arrive(&mut self, counter: Value, loc: Loc) -> Result<Value> {
        let pointee = self.pointee(counter, "`atomic_arrive`", loc)?;
        if pointee != DType::I32 || !self.ty(counter).is_scalar() {
            return Err(Error::semantic(
                loc,
                format!(
                    "`atomic_arrive` counts in one i32: it expects a scalar pointer to i32, got \
                     {}",
                    self.ty(counter)
                ),
            ));
        }
        Ok(self.push1(
            Op::AtomicArrive { ptr: counter },
            Type::scalar(DType::I32),
            loc,
        ))
    }

    /// A store through pointers, or with `accumulate` an atomic add; through a block pointer
    /// without a mask, the block form of either.
    fn write(
        &mut self,
        ptr: Value,
        value: Value,
        mask: Option<Value>,
        accumulate: bool,
        loc: Loc,
    ) -> Result<()> {
        self.check_visible(ptr, loc)?;
        if matches!(self.ty(ptr), Type::BlockPtr { .. }) && mask.is_none() {
            return self.write_block(ptr, value, &[], accumulate, loc);
        }
        let what = write_name(accumulate);
        let pointee = self.pointee(ptr, what, loc)?;
        check_writable(pointee, accumulate, loc)?;
        let shape = self.ty(ptr).shape().to_vec();
        let value = self.cast(value, pointee, loc)?;
        let value = self.broadcast_value(value, &shape, loc)?;
        let mask = match mask {
            Some(m) => Some(self.mask_for(m, &shape, what, loc)?),
            None => None,
        };
        let op = if accumulate {
            Op::AtomicAdd { ptr, value, mask }
        } else {
            Op::Store { ptr, value, mask }
        };
        self.push(op, Vec::new(), loc);
        Ok(())
    }

    /// `make_block_ptr(base, [shape..], [strides..], [offsets..], [block_shape..], [order..])`:
    /// a `block_shape` window at `offsets` of the array at `base` with `shape` and `strides` (in
    /// elements). `block_shape` and `order` are constants; the rest may be runtime integers.
    ///
    /// The array may have more dimensions than the block: the block covers its last ones and
    /// the leading offsets index the others (`x[b, h, s0.., 0..]` of a `[B, H, S, D]` array is a
    /// rank-2 block at offsets `[b, h, s0, 0]`), which must lie inside the shape. Described whole,
    /// the array is what a Hopper tensor map can copy from when its base, shape and strides are
    /// kernel arguments or constants.
    pub fn make_block_ptr(
        &mut self,
        base: Value,
        shape: &[Value],
        strides: &[Value],
        offsets: &[Value],
        block_shape: &[Value],
        order: &[Value],
        loc: Loc,
    ) -> Result<Value> {
        let pointee = self.pointee(base, "`make_block_ptr`", loc)?;
        if !self.ty(base).is_scalar() {
            return Err(Error::semantic(
                loc,
                format!(
                    "`make_block_ptr` expects a scalar base pointer, got {}",
                    self.ty(base)
                ),
            ));
        }
        let block_shape = self.const_dims(block_shape, "a block shape", loc)?;
        let order = self.const_dims(order, "a block order", loc)?;
        let rank = block_shape.len();
        let array_rank = shape.len();
        if array_rank < rank {
            return Err(Error::semantic(
                loc,
                format!(
                    "`make_block_ptr` has a rank-{rank} block shape {} but a rank-{array_rank} \
                     array shape",
                    ShapeDisplay(&block_shape)
                ),
            ));
        }
        for (what, n, want) in [
            ("strides", strides.len(), array_rank),
            ("offsets", offsets.len(), array_rank),
            ("order", order.len(), rank),
        ] {
            if n != want {
                return Err(Error::semantic(
                    loc,
                    format!(
                        "`make_block_ptr` has a rank-{array_rank} array shape and a rank-{rank} \
                         block shape {} but {n} {what}",
                        ShapeDisplay(&block_shape)
                    ),
                ));
            }
        }
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted != (0..rank).collect::<Vec<_>>() {
            return Err(Error::semantic(
                loc,
                format!(
                    "`make_block_ptr` expects `order` to be a permutation of 0..{rank}, got {order:?}"
                ),
            ));
        }
        self.check_tile_shape(&block_shape, "block", loc)?;
        let shape = self.i64_scalars(shape, "a block pointer's shape", loc)?;
        let strides = self.i64_scalars(strides, "a block pointer's strides", loc)?;
        let offsets = self.i64_scalars(offsets, "a block pointer's offsets", loc)?;
        Ok(self.push1(
            Op::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                order,
            },
            Type::BlockPtr {
                pointee,
                block_shape,
            },
            loc,
        ))
    }

    fn i64_scalars(&mut self, values: &[Value], what: &str, loc: Loc) -> Result<Vec<Value>> {
        values
            .iter()
            .map(|&v| {
                self.int_scalar(v, what, loc)?;
                self.cast(v, DType::I64, loc)
            })
            .collect()
    }

    fn block_ptr(&self, ptr: Value, what: &str, loc: Loc) -> Result<(DType, Vec<usize>)> {
        self.check_visible(ptr, loc)?;
        match self.ty(ptr) {
            Type::BlockPtr {
                pointee,
                block_shape,
            } => Ok((*pointee, block_shape.clone())),
            other => Err(Error::semantic(
                loc,
                format!("{what} expects a block pointer, got {other}"),
            )),
        }
    }

    /// `advance(block_ptr, [d0, d1, ..])`: the same block pointer moved by the given offsets.
    pub fn advance(&mut self, ptr: Value, offsets: &[Value], loc: Loc) -> Result<Value> {
        let (_, block_shape) = self.block_ptr(ptr, "`advance`", loc)?;
        if offsets.len() != block_shape.len() {
            return Err(Error::semantic(
                loc,
                format!(
                    "`advance` of a rank-{} block pointer expects {} offsets, got {}",
                    block_shape.len(),
                    block_shape.len(),
                    offsets.len()
                ),
            ));
        }
        let offsets = self.i64_scalars(offsets, "the offsets of `advance`", loc)?;
        let ty = self.ty(ptr).clone();
        Ok(self.push1(Op::Advance { ptr, offsets }, ty, loc))
    }

    fn boundary_axes(&self, axes: &[Value], rank: usize, loc: Loc) -> Result<Vec<usize>> {
        let axes = self.const_dims(axes, "a boundary-check axis", loc)?;
        if let Some(bad) = axes.iter().find(|&&a| a >= rank) {
            return Err(Error::semantic(
                loc,
                format!("boundary check of a rank-{rank} block names axis {bad}"),
            ));
        }
        let mut axes = axes;
        axes.sort_unstable();
        axes.dedup();
        Ok(axes)
    }

    /// `load(block_ptr, [axes..])`: reads a block; along the listed axes, elements outside the
    /// array's shape read zero (Triton's `boundary_check` with zero padding).
    pub fn load_block(&mut self, ptr: Value, boundary_check: &[Value], loc: Loc) -> Result<Value> {
        let (pointee, block_shape) = self.block_ptr(ptr, "`load`", loc)?;
        let boundary_check = self.boundary_axes(boundary_check, block_shape.len(), loc)?;
        Ok(self.push1(
            Op::LoadBlock {
                ptr,
                boundary_check,
            },
            Type::tile(pointee, block_shape),
            loc,
        ))
    }

    /// `store(block_ptr, value, [axes..])`: writes a block, converting `value` to the pointee dtype;
    /// along the listed axes, elements outside the array's shape are not written.
    pub fn store_block(
        &mut self,
        ptr: Value,
        value: Value,
        boundary_check: &[Value],
        loc: Loc,
    ) -> Result<()> {
        self.write_block(ptr, value, boundary_check, false, loc)
    }

    /// `atomic_add(block_ptr, value, [axes..])`: [`Builder::atomic_add`] into a block of f32;
    /// along the listed axes, elements outside the array's shape add nothing.
    pub fn atomic_add_block(
        &mut self,
        ptr: Value,
        value: Value,
        boundary_check: &[Value],
        loc: Loc,
    ) -> Result<()> {
        self.write_block(ptr, value, boundary_check, true, loc)
    }

    /// A block store, or with `accumulate` a block atomic add.
    fn write_block(
        &mut self,
        ptr: Value,
        value: Value,
        boundary_check: &[Value],
        accumulate: bool,
        loc: Loc,
    ) -> Result<()> {
        let what = write_name(accumulate);
        let (pointee, block_shape) = self.block_ptr(ptr, what, loc)?;
        check_writable(pointee, accumulate, loc)?;
        let boundary_check = self.boundary_axes(boundary_check, block_shape.len(), loc)?;
        self.number_dtype(value, what, loc)?;
        let value = self.cast(value, pointee, loc)?;
        if self.ty(value).shape() != block_shape && !self.ty(value).is_scalar() {
            return Err(Error::semantic(
                loc,
                format!(
                    "{what} to a block of {} got a value of {}",
                    ShapeDisplay(&block_shape),
                    self.ty(value)
                ),
            ));
        }
        let value = self.broadcast_value(value, &block_shape, loc)?;
        let op = if accumulate {
            Op::AtomicAddBlock {
                ptr,
                value,
                boundary_check,
            }
        } else {
            Op::StoreBlock {
                ptr,
                value,
                boundary_check,
            }
        };
        self.push(op, Vec::new(), loc);
        Ok(())
    }

    /// `wait_for_prior_grids()`, `launch_dependent_grids()`: programmatic dependent launch
    /// ([`GridControl`]). Both belong in the kernel body, before any memory access and any loop
    /// or branch: kiln-codegen makes them the program's first instructions.
    pub fn grid_control(&mut self, control: GridControl, loc: Loc) -> Result<()> {
        let name = Op::GridControl(control).name();
        if self.open.len() > 1 {
            return Err(Error::semantic(
                loc,
                format!("`{name}()` must be in the kernel body, not inside a loop or branch"),
            ));
        }
        if let Some(before) = self.open[0].region.insts.iter().find(|inst| {
            inst.op.accesses_memory() || matches!(inst.op, Op::For { .. } | Op::If { .. })
        }) {
            return Err(Error::semantic(
                loc,
                format!(
                    "`{name}()` must come before any memory access, loop or branch (it is the \
                     program's first instruction), but follows a `{}` at {}",
                    before.op.name(),
                    before.loc
                ),
            ));
        }
        self.push(Op::GridControl(control), Vec::new(), loc);
        Ok(())
    }

    /// `static_assert(cond)`, `static_assert(cond, "message")`: fails the build of a
    /// specialisation where the constant `cond` is false.
    pub fn static_assert(&mut self, cond: Value, message: Option<&str>, loc: Loc) -> Result<()> {
        match self.static_bool(cond) {
            Some(true) => Ok(()),
            Some(false) => Err(Error::semantic(
                loc,
                format!(
                    "static assertion failed{}",
                    message.map(|m| format!(": {m}")).unwrap_or_default()
                ),
            )),
            None => Err(Error::semantic(
                loc,
                format!(
                    "`static_assert` expects a compile-time bool, got a runtime {}",
                    self.ty(cond)
                ),
            )),
        }
    }

    /// Checks loop bounds and brings them to one integer type.
    pub(crate) fn loop_bounds(
        &mut self,
        lower: Value,
        upper: Value,
        step: Value,
        loc: Loc,
    ) -> Result<(Value, Value, Value)> {
        let dl = self.int_scalar(lower, "a `for` range's start", loc)?;
        let du = self.int_scalar(upper, "a `for` range's end", loc)?;
        let ds = self.int_scalar(step, "a `for` step", loc)?;
        let dtype = super::semantic::promote(
            super::semantic::promote(dl, self.is_weak(lower), du, self.is_weak(upper)),
            self.is_weak(lower) && self.is_weak(upper),
            ds,
            self.is_weak(step),
        );
        if let Some(Constant::Int(s)) = self.constant(step)
            && s <= 0
        {
            return Err(Error::semantic(
                loc,
                format!("a `for` step must be positive, got {s}"),
            ));
        }
        Ok((
            self.cast(lower, dtype, loc)?,
            self.cast(upper, dtype, loc)?,
            self.cast(step, dtype, loc)?,
        ))
    }
}

/// The DSL function a write is: `store`, or with `accumulate` `atomic_add`.
fn write_name(accumulate: bool) -> &'static str {
    if accumulate {
        "`atomic_add`"
    } else {
        "`store`"
    }
}

/// Refuses an `atomic_add` into anything but f32, the one dtype kiln adds atomically (a store
/// takes any).
fn check_writable(pointee: DType, accumulate: bool, loc: Loc) -> Result<()> {
    if !accumulate || pointee == DType::F32 {
        return Ok(());
    }
    Err(Error::semantic(
        loc,
        format!("`atomic_add` adds into f32 only, got pointers to {pointee}"),
    ))
}
