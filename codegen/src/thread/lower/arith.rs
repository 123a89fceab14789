//! Constants, casts and elementwise arithmetic, one register at a time, with the interpreter's
//! semantics: f16/bf16 compute in f32 and round to nearest even after every op (f32 holds every
//! f16/bf16 sum, product and quotient well enough that the double rounding is exact); integers
//! wrap; integer division by zero and shifts past the width give defined values.

use kiln_dsl::ir::{BinaryOp, CmpOp, Constant as TileConstant, Inst as TileInst, UnaryOp, Value};
use kiln_dsl::passes::{round_float, wrap_int};
use kiln_dsl::types::DType;

use super::{Lowering, Result, register_type, unsupported};
use crate::thread::ir::{Cast, Constant, FloatCmp, FloatOp, IntCmp, IntOp, Math, Op, Reg, Type};

impl Lowering<'_> {
    pub(super) fn constant(&mut self, c: TileConstant, dtype: DType) -> Reg {
        let ty = register_type(dtype);
        let constant = match (c, dtype.is_float()) {
            (TileConstant::Float(v), true) => Constant::Float(round_float(v, dtype)),
            (TileConstant::Int(v), true) => Constant::Float(round_float(v as f64, dtype)),
            (TileConstant::Bool(v), true) => Constant::Float(v as u8 as f64),
            (c, false) => Constant::Int(wrap_int(
                match c {
                    TileConstant::Int(v) => v,
                    TileConstant::Float(v) => v as i64,
                    TileConstant::Bool(v) => v as i64,
                },
                dtype,
            )),
        };
        self.emit(Op::Const(constant), ty)
    }

    pub(super) fn f32_const(&mut self, value: f64) -> Reg {
        self.emit(Op::Const(Constant::Float(value)), Type::F32)
    }

    /// A float register widened to f32 (exact from f16 and bf16).
    pub(super) fn widen(&mut self, value: Reg) -> Reg {
        match self.ty(value) {
            Type::F32 => value,
            _ => self.emit(Op::Cast(Cast::FpExt, value), Type::F32),
        }
    }

    /// An f32 register rounded to nearest even in `dtype`.
    pub(super) fn narrow(&mut self, value: Reg, dtype: DType) -> Reg {
        match dtype {
            DType::F32 => value,
            _ => {
                let narrow = self.emit(Op::Cast(Cast::FpTrunc, value), register_type(dtype));
                self.narrowed.insert(narrow, value);
                narrow
            }
        }
    }

    pub(super) fn float(&mut self, op: FloatOp, a: Reg, b: Reg) -> Reg {
        self.emit(Op::Float(op, a, b), Type::F32)
    }

    fn math(&mut self, math: Math, x: Reg) -> Reg {
        self.emit(Op::Math(math, x), Type::F32)
    }

    pub(super) fn cast(&mut self, inst: &TileInst, value: Value) -> Result<Vec<Reg>> {
        let from = self.dtype(value);
        let to = self.result_dtype(inst)?;
        self.regs(value)?
            .into_iter()
            .map(|r| Ok(self.cast_register(r, from, to)))
            .collect()
    }

    pub(super) fn cast_register(&mut self, value: Reg, from: DType, to: DType) -> Reg {
        if from == to {
            return value;
        }
        let to_type = register_type(to);
        match (from, to) {
            (f, t) if f.is_float() && t.is_float() => {
                let wide = self.widen(value);
                self.narrow(wide, t)
            }
            // Saturating, NaN to zero: Rust's `as`, which the interpreter uses.
            (f, t) if f.is_float() && t.is_int() => {
                let wide = self.widen(value);
                self.emit(Op::Cast(Cast::FpToSiSat, wide), to_type)
            }
            (f, DType::I1) if f.is_float() => {
                let wide = self.widen(value);
                let zero = self.f32_const(0.0);
                self.emit(Op::FloatCmp(FloatCmp::Une, wide, zero), Type::I1)
            }
            // Through f32, as the interpreter converts (`v as f32`, then rounding to f16/bf16).
            (f, t) if f.is_int() && t.is_float() => {
                let wide = self.emit(Op::Cast(Cast::SiToFp, value), Type::F32);
                self.narrow(wide, t)
            }
            (DType::I1, t) if t.is_float() => {
                let wide = self.emit(Op::Cast(Cast::UiToFp, value), Type::F32);
                self.narrow(wide, t)
            }
            (f, DType::I1) if f.is_int() => {
                let zero = self.int_const(register_type(f), 0);
                self.icmp(IntCmp::Ne, value, zero)
            }
            (DType::I1, _) => self.emit(Op::Cast(Cast::ZExt, value), to_type),
            (DType::I32, DType::I64) => self.emit(Op::Cast(Cast::SExt, value), to_type),
            _ => self.emit(Op::Cast(Cast::Trunc, value), to_type),
        }
    }

    pub(super) fn unary(&mut self, inst: &TileInst, op: UnaryOp, value: Value) -> Result<Vec<Reg>> {
        let dtype = self.result_dtype(inst)?;
        self.regs(value)?
            .into_iter()
            .map(|r| {
                if dtype.is_float() {
                    let x = self.widen(r);
                    let y = self.float_unary(inst, op, x)?;
                    Ok(self.narrow(y, dtype))
                } else {
                    self.int_unary(inst, op, r, dtype)
                }
            })
            .collect()
    }

    /// One f32 math function. `exp2`, `log2` and their kin use the GPU's approximate
    /// instructions: they agree with the interpreter within a few ulp, not exactly.
    fn float_unary(&mut self, inst: &TileInst, op: UnaryOp, x: Reg) -> Result<Reg> {
        Ok(match op {
            UnaryOp::Neg => self.math(Math::Neg, x),
            UnaryOp::Abs => self.math(Math::Abs, x),
            UnaryOp::Sqrt => self.math(Math::Sqrt, x),
            UnaryOp::Rsqrt => {
                let root = self.math(Math::Sqrt, x);
                let one = self.f32_const(1.0);
                self.float(FloatOp::Div, one, root)
            }
            UnaryOp::Exp2 => self.math(Math::Ex2Approx, x),
            UnaryOp::Exp => {
                let log2e = self.f32_const(std::f32::consts::LOG2_E as f64);
                let scaled = self.float(FloatOp::Mul, x, log2e);
                self.math(Math::Ex2Approx, scaled)
            }
            UnaryOp::Log2 => self.math(Math::Lg2Approx, x),
            UnaryOp::Log => {
                let log2 = self.math(Math::Lg2Approx, x);
                let ln2 = self.f32_const(std::f32::consts::LN_2 as f64);
                self.float(FloatOp::Mul, log2, ln2)
            }
            UnaryOp::Tanh => self.math(Math::TanhApprox, x),
            UnaryOp::Not => {
                return Err(unsupported(
                    inst,
                    "expected an integer or bool operand, got a float",
                ));
            }
        })
    }

    fn int_unary(&mut self, inst: &TileInst, op: UnaryOp, x: Reg, dtype: DType) -> Result<Reg> {
        let ty = register_type(dtype);
        Ok(match op {
            UnaryOp::Neg => {
                let zero = self.int_const(ty, 0);
                self.int(IntOp::Sub, zero, x)
            }
            UnaryOp::Not => {
                let ones = self.int_const(ty, -1);
                self.int(IntOp::Xor, x, ones)
            }
            UnaryOp::Abs if dtype != DType::I1 => self.emit(Op::IntAbs(x), ty),
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
        &mut self,
        inst: &TileInst,
        op: BinaryOp,
        lhs: Value,
        rhs: Value,
    ) -> Result<Vec<Reg>> {
        let dtype = self.result_dtype(inst)?;
        let (lhs, rhs) = (self.regs(lhs)?, self.regs(rhs)?);
        lhs.into_iter()
            .zip(rhs)
            .map(|(x, y)| {
                if dtype.is_float() {
                    let (x, y) = (self.widen(x), self.widen(y));
                    let z = self.float_binary(inst, op, x, y)?;
                    Ok(self.narrow(z, dtype))
                } else if dtype == DType::I1 {
                    self.bool_binary(inst, op, x, y)
                } else {
                    Ok(self.int_binary(op, x, y))
                }
            })
            .collect()
    }

    fn float_binary(&mut self, inst: &TileInst, op: BinaryOp, x: Reg, y: Reg) -> Result<Reg> {
        let op = match op {
            BinaryOp::Add => FloatOp::Add,
            BinaryOp::Sub => FloatOp::Sub,
            BinaryOp::Mul => FloatOp::Mul,
            BinaryOp::Div => FloatOp::Div,
            BinaryOp::Max => FloatOp::Max,
            BinaryOp::Min => FloatOp::Min,
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
        };
        Ok(self.float(op, x, y))
    }

    fn bool_binary(&mut self, inst: &TileInst, op: BinaryOp, x: Reg, y: Reg) -> Result<Reg> {
        let op = match op {
            BinaryOp::And | BinaryOp::Min => IntOp::And,
            BinaryOp::Or | BinaryOp::Max => IntOp::Or,
            BinaryOp::Xor => IntOp::Xor,
            _ => {
                return Err(unsupported(
                    inst,
                    "expected numbers for arithmetic, got bools",
                ));
            }
        };
        Ok(self.int(op, x, y))
    }

    fn int_binary(&mut self, op: BinaryOp, x: Reg, y: Reg) -> Reg {
        let ty = self.ty(x);
        let bits = ty.bits() as i64;
        match op {
            BinaryOp::Add => self.int(IntOp::Add, x, y),
            BinaryOp::Sub => self.int(IntOp::Sub, x, y),
            BinaryOp::Mul => self.int(IntOp::Mul, x, y),
            BinaryOp::Div | BinaryOp::Rem => self.int_div_rem(op, x, y),
            BinaryOp::Max => self.int(IntOp::SMax, x, y),
            BinaryOp::Min => self.int(IntOp::SMin, x, y),
            BinaryOp::And => self.int(IntOp::And, x, y),
            BinaryOp::Or => self.int(IntOp::Or, x, y),
            BinaryOp::Xor => self.int(IntOp::Xor, x, y),
            // A shift by the width or more (or a negative one) gives 0 (left) or the sign
            // (right), as the interpreter says; the amount is clamped into range first.
            BinaryOp::Shl => {
                let width = self.int_const(ty, bits);
                let in_range = self.icmp(IntCmp::Ult, y, width);
                let zero = self.int_const(ty, 0);
                let amount = self.select_reg(in_range, y, zero);
                let shifted = self.int(IntOp::Shl, x, amount);
                self.select_reg(in_range, shifted, zero)
            }
            BinaryOp::Shr => {
                let width = self.int_const(ty, bits);
                let in_range = self.icmp(IntCmp::Ult, y, width);
                let last = self.int_const(ty, bits - 1);
                let amount = self.select_reg(in_range, y, last);
                self.int(IntOp::AShr, x, amount)
            }
        }
    }

    /// Truncating division and its remainder, wrapping (`MIN / -1 = MIN`). A zero divisor, which
    /// the interpreter reports as a fault, gives an unspecified value here instead of undefined
    /// behaviour: the divisor is replaced by 1.
    fn int_div_rem(&mut self, op: BinaryOp, x: Reg, y: Reg) -> Reg {
        let ty = self.ty(x);
        let minus_one_const = self.int_const(ty, -1);
        let zero = self.int_const(ty, 0);
        let one = self.int_const(ty, 1);
        let minus_one = self.icmp(IntCmp::Eq, y, minus_one_const);
        let is_zero = self.icmp(IntCmp::Eq, y, zero);
        let unsafe_divisor = self.int(IntOp::Or, minus_one, is_zero);
        let divisor = self.select_reg(unsafe_divisor, one, y);
        if op == BinaryOp::Div {
            let quotient = self.int(IntOp::SDiv, x, divisor);
            let negated = self.int(IntOp::Sub, zero, x);
            self.select_reg(minus_one, negated, quotient)
        } else {
            let remainder = self.int(IntOp::SRem, x, divisor);
            self.select_reg(minus_one, zero, remainder)
        }
    }

    pub(super) fn compare(&mut self, op: CmpOp, lhs: Value, rhs: Value) -> Result<Vec<Reg>> {
        let dtype = self.dtype(lhs);
        let (lhs, rhs) = (self.regs(lhs)?, self.regs(rhs)?);
        Ok(lhs
            .into_iter()
            .zip(rhs)
            .map(|(x, y)| {
                if dtype.is_float() {
                    let cmp = match op {
                        CmpOp::Lt => FloatCmp::Olt,
                        CmpOp::Le => FloatCmp::Ole,
                        CmpOp::Gt => FloatCmp::Ogt,
                        CmpOp::Ge => FloatCmp::Oge,
                        CmpOp::Eq => FloatCmp::Oeq,
                        CmpOp::Ne => FloatCmp::Une,
                    };
                    let (x, y) = (self.widen(x), self.widen(y));
                    self.emit(Op::FloatCmp(cmp, x, y), Type::I1)
                } else {
                    // Integers are signed; bools order false < true (unsigned).
                    let signed = dtype != DType::I1;
                    let cmp = match (op, signed) {
                        (CmpOp::Lt, true) => IntCmp::Slt,
                        (CmpOp::Le, true) => IntCmp::Sle,
                        (CmpOp::Gt, true) => IntCmp::Sgt,
                        (CmpOp::Ge, true) => IntCmp::Sge,
                        (CmpOp::Lt, false) => IntCmp::Ult,
                        (CmpOp::Le, false) => IntCmp::Ule,
                        (CmpOp::Gt, false) => IntCmp::Ugt,
                        (CmpOp::Ge, false) => IntCmp::Uge,
                        (CmpOp::Eq, _) => IntCmp::Eq,
                        (CmpOp::Ne, _) => IntCmp::Ne,
                    };
                    self.icmp(cmp, x, y)
                }
            })
            .collect())
    }

    pub(super) fn select_reg(&mut self, cond: Reg, if_true: Reg, if_false: Reg) -> Reg {
        let ty = self.ty(if_true);
        self.emit(
            Op::Select {
                cond,
                if_true,
                if_false,
            },
            ty,
        )
    }

    pub(super) fn fma(&mut self, a: Value, b: Value, c: Value) -> Result<Vec<Reg>> {
        let (a, b, c) = (self.regs(a)?, self.regs(b)?, self.regs(c)?);
        Ok(a.into_iter()
            .zip(b.into_iter().zip(c))
            .map(|(a, (b, c))| self.emit(Op::Fma { a, b, c }, Type::F32))
            .collect())
    }

    pub(super) fn select(
        &mut self,
        cond: Value,
        if_true: Value,
        if_false: Value,
    ) -> Result<Vec<Reg>> {
        let (cond, if_true, if_false) =
            (self.regs(cond)?, self.regs(if_true)?, self.regs(if_false)?);
        Ok(cond
            .into_iter()
            .zip(if_true.into_iter().zip(if_false))
            .map(|(c, (t, f))| self.select_reg(c, t, f))
            .collect())
    }
}
