//! Constants, casts and elementwise arithmetic, one register at a time, with the interpreter's
//! semantics: f16/bf16 compute in f32 and round to nearest even; integers wrap; integer division
//! by zero and shifts past the width give defined values (never LLVM poison).

use inkwell::values::{BasicValueEnum, FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use kiln_dsl::ir::{BinaryOp, CmpOp, Constant, Inst, UnaryOp, Value};
use kiln_dsl::passes::{round_float, wrap_int};
use kiln_dsl::types::DType;

use super::{Lowering, Regs, register_type, unsupported};
use crate::CodegenError;

type Result<T> = std::result::Result<T, CodegenError>;

impl<'ctx> Lowering<'_, 'ctx> {
    pub(super) fn constant(&self, c: Constant, dtype: DType) -> BasicValueEnum<'ctx> {
        let ty = register_type(self.context, dtype);
        match (c, dtype.is_float()) {
            (Constant::Float(v), true) => ty
                .into_float_type()
                .const_float(round_float(v, dtype))
                .into(),
            (Constant::Int(v), true) => ty
                .into_float_type()
                .const_float(round_float(v as f64, dtype))
                .into(),
            (Constant::Bool(v), true) => ty.into_float_type().const_float(v as u8 as f64).into(),
            (c, false) => {
                let v = match c {
                    Constant::Int(v) => v,
                    Constant::Float(v) => v as i64,
                    Constant::Bool(v) => v as i64,
                };
                ty.into_int_type()
                    .const_int(wrap_int(v, dtype) as u64, true)
                    .into()
            }
        }
    }

    fn f32_type(&self) -> inkwell::types::FloatType<'ctx> {
        self.context.f32_type()
    }

    /// A float register widened to f32 (exact from f16 and bf16).
    fn widen(&self, value: BasicValueEnum<'ctx>, dtype: DType) -> Result<FloatValue<'ctx>> {
        let value = value.into_float_value();
        Ok(match dtype {
            DType::F32 => value,
            _ => self.builder.build_float_ext(value, self.f32_type(), "")?,
        })
    }

    /// An f32 value rounded to nearest even in `dtype` (`cvt.rn`).
    fn narrow(&self, value: FloatValue<'ctx>, dtype: DType) -> Result<BasicValueEnum<'ctx>> {
        Ok(match dtype {
            DType::F32 => value.into(),
            _ => {
                let ty = register_type(self.context, dtype).into_float_type();
                self.builder.build_float_trunc(value, ty, "")?.into()
            }
        })
    }

    fn int_const(&self, like: IntValue<'ctx>, value: i64) -> IntValue<'ctx> {
        like.get_type().const_int(value as u64, true)
    }

    pub(super) fn cast(&self, inst: &Inst, value: Value) -> Result<Regs<'ctx>> {
        let from = self.dtype(value);
        let to = self.result_dtype(inst)?;
        self.regs(value)?
            .iter()
            .map(|&r| self.cast_register(r, from, to))
            .collect()
    }

    fn cast_register(
        &self,
        value: BasicValueEnum<'ctx>,
        from: DType,
        to: DType,
    ) -> Result<BasicValueEnum<'ctx>> {
        let b = &self.builder;
        if from == to {
            return Ok(value);
        }
        let to_type = register_type(self.context, to);
        Ok(match (from, to) {
            (f, t) if f.is_float() && t.is_float() => self.narrow(self.widen(value, f)?, t)?,
            // Saturating, NaN to zero: Rust's `as`, which the interpreter uses, and PTX's `cvt.rzi`.
            (f, t) if f.is_float() && t.is_int() => {
                let wide = self.widen(value, f)?;
                self.call_intrinsic(
                    "llvm.fptosi.sat",
                    &[to_type, wide.get_type().into()],
                    &[wide.into()],
                )?
            }
            (f, DType::I1) if f.is_float() => {
                let wide = self.widen(value, f)?;
                let zero = self.f32_type().const_zero();
                b.build_float_compare(FloatPredicate::UNE, wide, zero, "")?
                    .into()
            }
            // Through f32, as the interpreter converts (`v as f32`, then rounding to f16/bf16).
            (f, t) if f.is_int() && t.is_float() => {
                let wide =
                    b.build_signed_int_to_float(value.into_int_value(), self.f32_type(), "")?;
                self.narrow(wide, t)?
            }
            (DType::I1, t) if t.is_float() => {
                let wide =
                    b.build_unsigned_int_to_float(value.into_int_value(), self.f32_type(), "")?;
                self.narrow(wide, t)?
            }
            (f, DType::I1) if f.is_int() => {
                let value = value.into_int_value();
                b.build_int_compare(IntPredicate::NE, value, self.int_const(value, 0), "")?
                    .into()
            }
            (DType::I1, _) => b
                .build_int_z_extend(value.into_int_value(), to_type.into_int_type(), "")?
                .into(),
            (DType::I32, DType::I64) => b
                .build_int_s_extend(value.into_int_value(), to_type.into_int_type(), "")?
                .into(),
            _ => b
                .build_int_truncate(value.into_int_value(), to_type.into_int_type(), "")?
                .into(),
        })
    }

    pub(super) fn unary(&self, inst: &Inst, op: UnaryOp, value: Value) -> Result<Regs<'ctx>> {
        let dtype = self.result_dtype(inst)?;
        self.regs(value)?
            .iter()
            .map(|&r| {
                if dtype.is_float() {
                    let x = self.widen(r, dtype)?;
                    let y = self.float_unary(inst, op, x)?;
                    self.narrow(y, dtype)
                } else {
                    self.int_unary(inst, op, r.into_int_value(), dtype)
                        .map(Into::into)
                }
            })
            .collect()
    }

    /// One f32 math function. `exp2`, `log2` and their kin use the GPU's approximate
    /// instructions (`ex2.approx.ftz`, `lg2.approx.ftz`, `tanh.approx`): they agree with the
    /// interpreter within a few ulp, not exactly.
    fn float_unary(
        &self,
        inst: &Inst,
        op: UnaryOp,
        x: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let b = &self.builder;
        let f32_type = self.f32_type();
        let call =
            |name: &str, overloaded: bool, x: FloatValue<'ctx>| -> Result<FloatValue<'ctx>> {
                let types = if overloaded {
                    vec![f32_type.into()]
                } else {
                    Vec::new()
                };
                Ok(self
                    .call_intrinsic(name, &types, &[x.into()])?
                    .into_float_value())
            };
        Ok(match op {
            UnaryOp::Neg => b.build_float_neg(x, "")?,
            UnaryOp::Abs => call("llvm.fabs", true, x)?,
            // `sqrt.rn.f32`: correctly rounded, as the interpreter's.
            UnaryOp::Sqrt => call("llvm.sqrt", true, x)?,
            UnaryOp::Rsqrt => {
                let root = call("llvm.sqrt", true, x)?;
                b.build_float_div(f32_type.const_float(1.0), root, "")?
            }
            UnaryOp::Exp2 => call("llvm.nvvm.ex2.approx.ftz.f", false, x)?,
            UnaryOp::Exp => {
                let scaled =
                    b.build_float_mul(x, f32_type.const_float(std::f64::consts::LOG2_E), "")?;
                call("llvm.nvvm.ex2.approx.ftz.f", false, scaled)?
            }
            UnaryOp::Log2 => call("llvm.nvvm.lg2.approx.ftz.f", false, x)?,
            UnaryOp::Log => {
                let log2 = call("llvm.nvvm.lg2.approx.ftz.f", false, x)?;
                b.build_float_mul(log2, f32_type.const_float(std::f64::consts::LN_2), "")?
            }
            UnaryOp::Tanh => self.tanh_approx(x)?,
            UnaryOp::Not => {
                return Err(unsupported(
                    inst,
                    "expected an integer or bool operand, got a float",
                ));
            }
        })
    }

    /// `tanh.approx.f32` (sm_75+), which LLVM 19 has no intrinsic for.
    fn tanh_approx(&self, x: FloatValue<'ctx>) -> Result<FloatValue<'ctx>> {
        let f32_type = self.f32_type();
        let asm_type = f32_type.fn_type(&[f32_type.into()], false);
        let asm = self.context.create_inline_asm(
            asm_type,
            "tanh.approx.f32 $0, $1;".to_string(),
            "=f,f".to_string(),
            false,
            false,
            None,
            false,
        );
        let call = self
            .builder
            .build_indirect_call(asm_type, asm, &[x.into()], "tanh")?;
        call.try_as_basic_value()
            .basic()
            .map(|v| v.into_float_value())
            .ok_or_else(|| CodegenError::internal(crate::Stage::Llir, "tanh asm returns nothing"))
    }

    fn int_unary(
        &self,
        inst: &Inst,
        op: UnaryOp,
        x: IntValue<'ctx>,
        dtype: DType,
    ) -> Result<IntValue<'ctx>> {
        let b = &self.builder;
        Ok(match op {
            UnaryOp::Neg => b.build_int_sub(self.int_const(x, 0), x, "")?,
            UnaryOp::Not => b.build_not(x, "")?,
            // `is_int_min_poison = false`: the minimum stays itself, as `wrapping_abs`.
            UnaryOp::Abs if dtype != DType::I1 => {
                let no_poison = self.context.bool_type().const_zero();
                self.call_intrinsic(
                    "llvm.abs",
                    &[x.get_type().into()],
                    &[x.into(), no_poison.into()],
                )?
                .into_int_value()
            }
            _ => {
                return Err(unsupported(
                    inst,
                    format!(
                        "expected a float operand for `{}`, got {dtype}",
                        inst.op.name()
                    ),
                ));
            }
        })
    }

    pub(super) fn binary(
        &self,
        inst: &Inst,
        op: BinaryOp,
        lhs: Value,
        rhs: Value,
    ) -> Result<Regs<'ctx>> {
        let dtype = self.result_dtype(inst)?;
        let (lhs, rhs) = (self.regs(lhs)?, self.regs(rhs)?);
        lhs.iter()
            .zip(rhs)
            .map(|(&x, &y)| {
                if dtype.is_float() {
                    let (x, y) = (self.widen(x, dtype)?, self.widen(y, dtype)?);
                    let z = self.float_binary(inst, op, x, y)?;
                    self.narrow(z, dtype)
                } else if dtype == DType::I1 {
                    self.bool_binary(inst, op, x.into_int_value(), y.into_int_value())
                        .map(Into::into)
                } else {
                    self.int_binary(op, x.into_int_value(), y.into_int_value())
                        .map(Into::into)
                }
            })
            .collect()
    }

    fn float_binary(
        &self,
        inst: &Inst,
        op: BinaryOp,
        x: FloatValue<'ctx>,
        y: FloatValue<'ctx>,
    ) -> Result<FloatValue<'ctx>> {
        let b = &self.builder;
        let minmax = |name: &str| -> Result<FloatValue<'ctx>> {
            Ok(self
                .call_intrinsic(name, &[x.get_type().into()], &[x.into(), y.into()])?
                .into_float_value())
        };
        // No fast-math flags: LLVM keeps each op correctly rounded (`add.rn`, `div.rn`) and never
        // contracts a multiply and an add into an fma, which would round once instead of twice.
        Ok(match op {
            BinaryOp::Add => b.build_float_add(x, y, "")?,
            BinaryOp::Sub => b.build_float_sub(x, y, "")?,
            BinaryOp::Mul => b.build_float_mul(x, y, "")?,
            BinaryOp::Div => b.build_float_div(x, y, "")?,
            // `max.f32`/`min.f32`: a NaN operand loses, as IEEE maxNum and the interpreter's.
            BinaryOp::Max => minmax("llvm.maxnum")?,
            BinaryOp::Min => minmax("llvm.minnum")?,
            BinaryOp::Rem => {
                return Err(unsupported(
                    inst,
                    "float remainder is not lowered yet (NVPTX's `frem` is not exact)",
                ));
            }
            _ => {
                return Err(unsupported(
                    inst,
                    "expected integer or bool operands for a bitwise op, got floats",
                ));
            }
        })
    }

    fn bool_binary(
        &self,
        inst: &Inst,
        op: BinaryOp,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let b = &self.builder;
        Ok(match op {
            BinaryOp::And | BinaryOp::Min => b.build_and(x, y, "")?,
            BinaryOp::Or | BinaryOp::Max => b.build_or(x, y, "")?,
            BinaryOp::Xor => b.build_xor(x, y, "")?,
            _ => {
                return Err(unsupported(
                    inst,
                    "expected numbers for arithmetic, got bools",
                ));
            }
        })
    }

    fn int_binary(
        &self,
        op: BinaryOp,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let b = &self.builder;
        let bits = x.get_type().get_bit_width() as i64;
        let minmax = |name: &str| -> Result<IntValue<'ctx>> {
            Ok(self
                .call_intrinsic(name, &[x.get_type().into()], &[x.into(), y.into()])?
                .into_int_value())
        };
        Ok(match op {
            BinaryOp::Add => b.build_int_add(x, y, "")?,
            BinaryOp::Sub => b.build_int_sub(x, y, "")?,
            BinaryOp::Mul => b.build_int_mul(x, y, "")?,
            BinaryOp::Div | BinaryOp::Rem => self.int_div_rem(op, x, y)?,
            BinaryOp::Max => minmax("llvm.smax")?,
            BinaryOp::Min => minmax("llvm.smin")?,
            BinaryOp::And => b.build_and(x, y, "")?,
            BinaryOp::Or => b.build_or(x, y, "")?,
            BinaryOp::Xor => b.build_xor(x, y, "")?,
            // A shift by the width or more gives 0 (left) or the sign (right), as the
            // interpreter says and PTX's `shl`/`shr` clamp; LLVM would make it poison.
            BinaryOp::Shl => {
                let in_range =
                    b.build_int_compare(IntPredicate::ULT, y, self.int_const(y, bits), "")?;
                let shifted = b.build_left_shift(x, y, "")?;
                b.build_select(in_range, shifted, self.int_const(x, 0), "")?
                    .into_int_value()
            }
            BinaryOp::Shr => {
                let in_range =
                    b.build_int_compare(IntPredicate::ULT, y, self.int_const(y, bits), "")?;
                let amount = b
                    .build_select(in_range, y, self.int_const(y, bits - 1), "")?
                    .into_int_value();
                b.build_right_shift(x, amount, true, "")?
            }
        })
    }

    /// Truncating division and its remainder, wrapping (`MIN / -1 = MIN`). A zero divisor, which
    /// the interpreter reports as a fault, gives an unspecified value here instead of LLVM's
    /// undefined behaviour: the divisor is replaced by 1.
    fn int_div_rem(
        &self,
        op: BinaryOp,
        x: IntValue<'ctx>,
        y: IntValue<'ctx>,
    ) -> Result<IntValue<'ctx>> {
        let b = &self.builder;
        let minus_one = b.build_int_compare(IntPredicate::EQ, y, self.int_const(y, -1), "")?;
        let zero = b.build_int_compare(IntPredicate::EQ, y, self.int_const(y, 0), "")?;
        let unsafe_divisor = b.build_or(minus_one, zero, "")?;
        let divisor = b
            .build_select(unsafe_divisor, self.int_const(y, 1), y, "")?
            .into_int_value();
        Ok(if op == BinaryOp::Div {
            let quotient = b.build_int_signed_div(x, divisor, "")?;
            let negated = b.build_int_sub(self.int_const(x, 0), x, "")?;
            b.build_select(minus_one, negated, quotient, "")?
                .into_int_value()
        } else {
            let remainder = b.build_int_signed_rem(x, divisor, "")?;
            b.build_select(minus_one, self.int_const(x, 0), remainder, "")?
                .into_int_value()
        })
    }

    pub(super) fn compare(&self, op: CmpOp, lhs: Value, rhs: Value) -> Result<Regs<'ctx>> {
        let dtype = self.dtype(lhs);
        let (lhs, rhs) = (self.regs(lhs)?, self.regs(rhs)?);
        let b = &self.builder;
        lhs.iter()
            .zip(rhs)
            .map(|(&x, &y)| {
                Ok(if dtype.is_float() {
                    // Ordered compares are false on NaN; `!=` is true on NaN, as in Rust.
                    let predicate = match op {
                        CmpOp::Lt => FloatPredicate::OLT,
                        CmpOp::Le => FloatPredicate::OLE,
                        CmpOp::Gt => FloatPredicate::OGT,
                        CmpOp::Ge => FloatPredicate::OGE,
                        CmpOp::Eq => FloatPredicate::OEQ,
                        CmpOp::Ne => FloatPredicate::UNE,
                    };
                    let (x, y) = (self.widen(x, dtype)?, self.widen(y, dtype)?);
                    b.build_float_compare(predicate, x, y, "")?.into()
                } else {
                    // Integers are signed; bools order false < true (unsigned).
                    let signed = dtype != DType::I1;
                    let predicate = match (op, signed) {
                        (CmpOp::Lt, true) => IntPredicate::SLT,
                        (CmpOp::Le, true) => IntPredicate::SLE,
                        (CmpOp::Gt, true) => IntPredicate::SGT,
                        (CmpOp::Ge, true) => IntPredicate::SGE,
                        (CmpOp::Lt, false) => IntPredicate::ULT,
                        (CmpOp::Le, false) => IntPredicate::ULE,
                        (CmpOp::Gt, false) => IntPredicate::UGT,
                        (CmpOp::Ge, false) => IntPredicate::UGE,
                        (CmpOp::Eq, _) => IntPredicate::EQ,
                        (CmpOp::Ne, _) => IntPredicate::NE,
                    };
                    b.build_int_compare(predicate, x.into_int_value(), y.into_int_value(), "")?
                        .into()
                })
            })
            .collect()
    }

    pub(super) fn select(
        &self,
        cond: Value,
        if_true: Value,
        if_false: Value,
    ) -> Result<Regs<'ctx>> {
        let (cond, if_true, if_false) =
            (self.regs(cond)?, self.regs(if_true)?, self.regs(if_false)?);
        cond.iter()
            .zip(if_true.iter().zip(if_false))
            .map(|(&c, (&t, &f))| Ok(self.builder.build_select(c.into_int_value(), t, f, "")?))
            .collect()
    }
}
