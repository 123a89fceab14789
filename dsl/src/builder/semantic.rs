//! All shape and type checking of the builder: promotion, broadcasting, and the rules each op
//! states about its operands. Messages say what was expected and what was found.

use super::Builder;
use crate::error::{Error, Loc, Result};
use crate::ir::{Constant, Op, Value};
use crate::types::{DType, Elem, ShapeDisplay, Type};

/// The dtype two operands meet at. A weak operand (a literal) takes the other's dtype when it
/// can represent the literal's kind (an int literal joins any number type, a float literal any float).
pub(crate) fn promote(a: DType, a_weak: bool, b: DType, b_weak: bool) -> DType {
    if a == b {
        return a;
    }
    if a_weak != b_weak {
        let (weak, strong) = if a_weak { (a, b) } else { (b, a) };
        return match (weak.is_float(), strong.is_float()) {
            (true, false) => DType::F32,
            (false, false) if strong == DType::I1 && weak != DType::I1 => DType::I32,
            _ => strong,
        };
    }
    match (a.is_float(), b.is_float()) {
        (true, false) => a,
        (false, true) => b,
        (true, true) => DType::F32, // f16 with bf16, or either with f32
        (false, false) => {
            if a == DType::I64 || b == DType::I64 {
                DType::I64
            } else {
                DType::I32
            }
        }
    }
}

/// The shape two operands broadcast to, numpy style (aligned at the right, size-1 dims stretch).
pub(crate) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        let pad = rank - s.len();
        if i < pad { 1 } else { s[i - pad] }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

pub(crate) fn is_pow2(n: usize) -> bool {
    n > 0 && n.is_power_of_two()
}

/// The most elements a tile may hold: far past what a program's registers and shared memory
/// take (2^15 in the largest attention tile), and short of what the interpreter could not
/// allocate.
pub const MAX_TILE_ELEMENTS: usize = 1 << 24;

impl Builder {
    /// Checks that every dimension of a new tile is a power of two (as Triton requires) and that
    /// it holds at most [`MAX_TILE_ELEMENTS`].
    pub(crate) fn check_tile_shape(&self, shape: &[usize], what: &str, loc: Loc) -> Result<()> {
        if let Some(&bad) = shape.iter().find(|&&d| !is_pow2(d)) {
            return Err(Error::semantic(
                loc,
                format!(
                    "{what} dimensions must be powers of two, got {} (dimension {bad})",
                    ShapeDisplay(shape)
                ),
            ));
        }
        self.check_tile_size(shape, &format!("a {what}"), loc)
    }

    /// Checks that `what`, a tile of `shape`, holds at most [`MAX_TILE_ELEMENTS`].
    pub(crate) fn check_tile_size(&self, shape: &[usize], what: &str, loc: Loc) -> Result<()> {
        let elements = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .filter(|&n| n <= MAX_TILE_ELEMENTS);
        if elements.is_none() {
            return Err(Error::semantic(
                loc,
                format!(
                    "{what} of shape {} would hold more than 2^24 elements",
                    ShapeDisplay(shape)
                ),
            ));
        }
        Ok(())
    }

    /// The dtype of a tensor of numbers, or an error saying `what` expects numbers.
    pub(crate) fn number_dtype(&self, value: Value, what: &str, loc: Loc) -> Result<DType> {
        self.check_visible(value, loc)?;
        self.ty(value).dtype().ok_or_else(|| {
            Error::semantic(
                loc,
                format!(
                    "{what} expects a number tile or scalar, got {}",
                    self.ty(value)
                ),
            )
        })
    }

    pub(crate) fn is_weak(&self, value: Value) -> bool {
        self.weak[value.index()]
    }

    /// `x.to::<T>()`, `cast(x, T)`, `x as T`: conversion to dtype `T` (float rounding to nearest
    /// even, float to int truncating); no instruction when `x` already is a `T`; constants fold.
    pub fn cast(&mut self, value: Value, dtype: DType, loc: Loc) -> Result<Value> {
        let from = self.number_dtype(value, "a cast", loc)?;
        if from == dtype {
            return Ok(value);
        }
        let shape = self.ty(value).shape().to_vec();
        if shape.is_empty()
            && let Some(constant) = self.constant(value)
            && let Some(folded) = crate::passes::fold_cast(constant, dtype)
        {
            let weak = self.is_weak(value);
            let v = self.constant_value(folded, dtype, weak, loc);
            return Ok(v);
        }
        Ok(self.push1(Op::Cast { value }, Type::tile(dtype, shape), loc))
    }

    /// Gives `value` the shape `shape` by splatting a scalar or broadcasting size-1 dims (after
    /// adding leading dims), or explains why it cannot.
    pub(crate) fn broadcast_value(
        &mut self,
        value: Value,
        shape: &[usize],
        loc: Loc,
    ) -> Result<Value> {
        let ty = self.ty(value).clone();
        let from = ty.shape().to_vec();
        if from == shape {
            return Ok(value);
        }
        let elem = ty.elem().ok_or_else(|| {
            Error::semantic(
                loc,
                format!("cannot broadcast a {ty} to {}", ShapeDisplay(shape)),
            )
        })?;
        let result = Type::Tensor {
            elem,
            shape: shape.to_vec(),
        };
        if from.is_empty() {
            return Ok(self.push1(Op::Splat { value }, result, loc));
        }
        if broadcast_shapes(&from, shape).as_deref() != Some(shape) {
            return Err(Error::semantic(
                loc,
                format!(
                    "cannot broadcast {} to {}",
                    ShapeDisplay(&from),
                    ShapeDisplay(shape)
                ),
            ));
        }
        let mut value = value;
        let mut current = from.clone();
        while current.len() < shape.len() {
            current.insert(0, 1);
            value = self.push1(
                Op::ExpandDims { value, axis: 0 },
                Type::Tensor {
                    elem,
                    shape: current.clone(),
                },
                loc,
            );
        }
        if current == shape {
            return Ok(value);
        }
        Ok(self.push1(Op::Broadcast { value }, result, loc))
    }

    /// Brings two number operands to one dtype and one shape, for elementwise ops.
    pub(crate) fn unify(
        &mut self,
        a: Value,
        b: Value,
        what: &str,
        loc: Loc,
    ) -> Result<(Value, Value, DType)> {
        let da = self.number_dtype(a, what, loc)?;
        let db = self.number_dtype(b, what, loc)?;
        let dtype = promote(da, self.is_weak(a), db, self.is_weak(b));
        let shape = self.common_shape(&[a, b], what, loc)?;
        let a = self.cast(a, dtype, loc)?;
        let b = self.cast(b, dtype, loc)?;
        let a = self.broadcast_value(a, &shape, loc)?;
        let b = self.broadcast_value(b, &shape, loc)?;
        Ok((a, b, dtype))
    }

    pub(crate) fn common_shape(
        &self,
        values: &[Value],
        what: &str,
        loc: Loc,
    ) -> Result<Vec<usize>> {
        let mut shape: Vec<usize> = Vec::new();
        for &v in values {
            let s = self.ty(v).shape();
            shape = broadcast_shapes(&shape, s).ok_or_else(|| {
                let shapes: Vec<String> = values
                    .iter()
                    .map(|&v| ShapeDisplay(self.ty(v).shape()).to_string())
                    .collect();
                Error::semantic(
                    loc,
                    format!(
                        "{what} operands have shapes that do not broadcast: {}",
                        shapes.join(" and ")
                    ),
                )
            })?;
        }
        self.check_tile_size(&shape, &format!("the result of {what}"), loc)?;
        Ok(shape)
    }

    /// The weak flag of a folded result: weak only when every input was.
    pub(crate) fn fold_result(
        &mut self,
        constant: Constant,
        dtype: DType,
        inputs: &[Value],
        loc: Loc,
    ) -> Value {
        let weak = inputs.iter().all(|&v| self.is_weak(v));
        self.constant_value(constant, dtype, weak, loc)
    }

    /// An integer (or bool) scalar, for loop bounds and block pointer fields.
    pub(crate) fn int_scalar(&self, value: Value, what: &str, loc: Loc) -> Result<DType> {
        self.check_visible(value, loc)?;
        match self.ty(value) {
            Type::Tensor {
                elem: Elem::Value(dtype),
                shape,
            } if shape.is_empty() && dtype.is_int() => Ok(*dtype),
            other => Err(Error::semantic(
                loc,
                format!("{what} must be an integer scalar (i32 or i64), got {other}"),
            )),
        }
    }
}
