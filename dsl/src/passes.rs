//! Small IR-level utilities shared by the builder and the interpreter: constant folding with the
//! GPU's integer semantics, and dead-code removal.

use std::collections::HashSet;

use crate::ir::{BinaryOp, CmpOp, Constant, Op, Region, UnaryOp, Value};
use crate::types::DType;

/// Wraps an integer to the width of `dtype`, as the GPU's registers do.
pub fn wrap_int(v: i64, dtype: DType) -> i64 {
    match dtype {
        DType::I32 => v as i32 as i64,
        DType::I1 => v & 1,
        _ => v,
    }
}

/// `x` shifted left (or arithmetically right) by `y` in `dtype`'s width, before [`wrap_int`]: by
/// the width or more, or by a negative amount, 0 to the left and the sign to the right, as PTX
/// clamps the amount. The interpreter and constant folding both shift here.
pub(crate) fn shift(left: bool, x: i64, y: i64, dtype: DType) -> i64 {
    let bits = if dtype == DType::I32 { 32 } else { 64 };
    match (left, (0..bits).contains(&y)) {
        (true, true) => x << y,
        (true, false) => 0,
        (false, true) => x >> y,
        (false, false) => x >> (bits - 1),
    }
}

/// Rounds a float to `dtype`: f16 and bf16 to nearest even, as the GPU's `cvt.rn`.
pub fn round_float(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F16 => half::f16::from_f64(v).to_f64(),
        DType::BF16 => half::bf16::from_f64(v).to_f64(),
        DType::F32 => v as f32 as f64,
        _ => v,
    }
}

/// A float math function of a constant, exactly (in f64) before rounding to the result dtype.
pub(crate) fn fold_float_unary(op: UnaryOp, v: f64) -> f64 {
    match op {
        UnaryOp::Neg => -v,
        UnaryOp::Exp => v.exp(),
        UnaryOp::Exp2 => v.exp2(),
        UnaryOp::Log => v.ln(),
        UnaryOp::Log2 => v.log2(),
        UnaryOp::Tanh => v.tanh(),
        UnaryOp::Sqrt => v.sqrt(),
        UnaryOp::Rsqrt => 1.0 / v.sqrt(),
        UnaryOp::Abs => v.abs(),
        UnaryOp::Not => unreachable!("the builder refuses `!` on floats"),
    }
}

pub(crate) fn fold_cast(c: Constant, to: DType) -> Option<Constant> {
    Some(match (c, to) {
        (Constant::Int(v), d) if d.is_int() => Constant::Int(wrap_int(v, d)),
        (Constant::Int(v), d) if d.is_float() => Constant::Float(round_float(v as f64, d)),
        (Constant::Int(v), DType::I1) => Constant::Bool(v != 0),
        (Constant::Float(v), d) if d.is_float() => Constant::Float(round_float(v, d)),
        (Constant::Float(v), d) if d.is_int() => Constant::Int(wrap_int(v as i64, d)),
        (Constant::Bool(v), d) if d.is_int() => Constant::Int(v as i64),
        (Constant::Bool(v), d) if d.is_float() => Constant::Float(v as i64 as f64),
        (Constant::Bool(v), DType::I1) => Constant::Bool(v),
        _ => return None,
    })
}

/// Folds a scalar binary op on constants of `dtype`; `None` where folding would hide a fault
/// (division by zero) or is not an integer/bool op.
pub(crate) fn fold_binary(
    op: BinaryOp,
    a: Constant,
    b: Constant,
    dtype: DType,
) -> Option<Constant> {
    use BinaryOp::*;
    match (a, b) {
        (Constant::Int(x), Constant::Int(y)) => {
            let v = match op {
                Add => x.wrapping_add(y),
                Sub => x.wrapping_sub(y),
                Mul => x.wrapping_mul(y),
                Div if y != 0 => x.wrapping_div(y),
                Rem if y != 0 => x.wrapping_rem(y),
                Max => x.max(y),
                Min => x.min(y),
                And => x & y,
                Or => x | y,
                Xor => x ^ y,
                Shl => shift(true, x, y, dtype),
                Shr => shift(false, x, y, dtype),
                _ => return None,
            };
            Some(Constant::Int(wrap_int(v, dtype)))
        }
        (Constant::Bool(x), Constant::Bool(y)) => Some(Constant::Bool(match op {
            And | Min => x & y,
            Or | Max => x | y,
            Xor => x ^ y,
            _ => return None,
        })),
        (Constant::Float(x), Constant::Float(y)) => {
            let v = match op {
                Add => x + y,
                Sub => x - y,
                Mul => x * y,
                Div => x / y,
                Max => x.max(y),
                Min => x.min(y),
                _ => return None,
            };
            Some(Constant::Float(round_float(v, dtype)))
        }
        _ => None,
    }
}

pub(crate) fn fold_compare(op: CmpOp, a: Constant, b: Constant) -> Option<Constant> {
    let ord = match (a, b) {
        (Constant::Int(x), Constant::Int(y)) => x.partial_cmp(&y),
        (Constant::Float(x), Constant::Float(y)) => x.partial_cmp(&y),
        (Constant::Bool(x), Constant::Bool(y)) => x.partial_cmp(&y),
        _ => return None,
    };
    use std::cmp::Ordering::*;
    Some(Constant::Bool(match op {
        CmpOp::Lt => ord == Some(Less),
        CmpOp::Le => matches!(ord, Some(Less | Equal)),
        CmpOp::Gt => ord == Some(Greater),
        CmpOp::Ge => matches!(ord, Some(Greater | Equal)),
        CmpOp::Eq => ord == Some(Equal),
        CmpOp::Ne => ord != Some(Equal),
    }))
}

/// Calls `f` on every value an op reads (not those of its nested regions).
pub fn for_each_operand(op: &Op, mut f: impl FnMut(Value)) {
    match op {
        Op::Constant(_) | Op::ProgramId { .. } | Op::NumPrograms { .. } | Op::Arange { .. } => {}
        Op::Splat { value }
        | Op::Broadcast { value }
        | Op::ExpandDims { value, .. }
        | Op::Trans { value }
        | Op::Cast { value }
        | Op::Unary { value, .. }
        | Op::Reduce { value, .. } => f(*value),
        Op::Binary { lhs, rhs, .. } | Op::Compare { lhs, rhs, .. } => {
            f(*lhs);
            f(*rhs);
        }
        Op::Select {
            cond,
            if_true,
            if_false,
        } => {
            f(*cond);
            f(*if_true);
            f(*if_false);
        }
        Op::Fma { a, b, c } => {
            f(*a);
            f(*b);
            f(*c);
        }
        Op::Dot { lhs, rhs, acc } => {
            f(*lhs);
            f(*rhs);
            f(*acc);
        }
        Op::AddPtr { ptr, offset } => {
            f(*ptr);
            f(*offset);
        }
        Op::Load { ptr, mask, other } => {
            f(*ptr);
            mask.iter().chain(other).copied().for_each(f);
        }
        Op::Store { ptr, value, mask } | Op::AtomicAdd { ptr, value, mask } => {
            f(*ptr);
            f(*value);
            mask.iter().copied().for_each(f);
        }
        Op::MakeBlockPtr {
            base,
            shape,
            strides,
            offsets,
            ..
        } => {
            f(*base);
            shape
                .iter()
                .chain(strides)
                .chain(offsets)
                .copied()
                .for_each(f);
        }
        Op::Advance { ptr, offsets } => {
            f(*ptr);
            offsets.iter().copied().for_each(f);
        }
        Op::LoadBlock { ptr, .. } | Op::AtomicArrive { ptr } => f(*ptr),
        Op::StoreBlock { ptr, value, .. } | Op::AtomicAddBlock { ptr, value, .. } => {
            f(*ptr);
            f(*value);
        }
        Op::For {
            lower,
            upper,
            step,
            init,
            ..
        } => {
            f(*lower);
            f(*upper);
            f(*step);
            init.iter().copied().for_each(f);
        }
        Op::If { cond, .. } => f(*cond),
        Op::Yield { values } => values.iter().copied().for_each(f),
        Op::GridControl(_) => {}
    }
}

fn has_effects(op: &Op) -> bool {
    op.writes_memory()
        || matches!(
            op,
            Op::For { .. } | Op::If { .. } | Op::Yield { .. } | Op::GridControl(_)
        )
}

fn collect_uses(region: &Region, used: &mut HashSet<Value>) {
    for inst in &region.insts {
        for_each_operand(&inst.op, |v| {
            used.insert(v);
        });
        match &inst.op {
            Op::For { body, .. } => collect_uses(body, used),
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                collect_uses(then_region, used);
                collect_uses(else_region, used);
            }
            _ => {}
        }
    }
}

fn remove_unused(region: &mut Region, used: &HashSet<Value>) -> bool {
    let before = region.insts.len();
    region
        .insts
        .retain(|inst| has_effects(&inst.op) || inst.results.iter().any(|r| used.contains(r)));
    let mut changed = region.insts.len() != before;
    for inst in &mut region.insts {
        match &mut inst.op {
            Op::For { body, .. } => changed |= remove_unused(body, used),
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                changed |= remove_unused(then_region, used);
                changed |= remove_unused(else_region, used);
            }
            _ => {}
        }
    }
    changed
}

/// Removes instructions without side effects whose results nothing reads (the constants that
/// folding left behind, a `dot`'s unused zero accumulator).
pub fn remove_dead_code(body: &mut Region) {
    loop {
        let mut used = HashSet::new();
        collect_uses(body, &mut used);
        if !remove_unused(body, &used) {
            break;
        }
    }
}
