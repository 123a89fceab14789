//! Calls of `#[kernel_fn]`s: DSL functions inlined where they are called.
//!
//! `#[kiln::kernel_fn] fn f<..>(..) -> .. { .. }` expands to `mod f { pub fn call(builder,
//! generics, args, loc) }`, which checks the values its caller passes against its declaration
//! ([`Builder::fn_const`], [`Builder::fn_value`]), then builds its body into the caller's open
//! region inside [`Builder::call_fn`]. Its ops keep their own locations, in the function's body; a
//! semantic error there also names the call. A call site takes what `call` gives through
//! [`FnResult`], which turns a mismatch in the number of values into a clear compile error.

use std::fmt;

use super::Builder;
use crate::error::{Error, Loc, Result};
use crate::ir::{Constant, Value};
use crate::signature::SpecKind;
use crate::types::{DType, Elem, Type};

/// How deep calls of `#[kernel_fn]`s may nest: a function that calls itself must stop on a
/// constant condition, and this turns one that does not into an error instead of a stack overflow.
pub const MAX_CALL_DEPTH: usize = 64;

/// How many `#[kernel_fn]` calls one kernel may inline in all (the attention kernels inline a
/// few hundred): a function that calls itself twice a level stays within [`MAX_CALL_DEPTH`] and
/// still doubles its calls with each, and this turns that into an error instead of a build
/// that never ends.
pub const MAX_CALLS: usize = 1 << 16;

/// What a `#[kernel_fn]` declares one of its arguments or results to be, resolved at the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FnType {
    /// `i32`, `f16`, `bool`, `T`..: a scalar of this dtype; a literal converts to it.
    Scalar(DType),
    /// `Ptr<D>`: a pointer to `D`, or a tile of them.
    Ptr(DType),
    /// `BlockPtr<D>`: a block pointer to `D`.
    BlockPtr(DType),
    /// `Tile`, `Tile<D>`: a tile of numbers (a scalar too), of `D` if given; a literal converts to
    /// a scalar `D`.
    Tile(Option<DType>),
    /// `_`: any value.
    Any,
}

/// A dtype as the DSL spells it (`bool`, not the IR's `i1`).
fn dsl_name(dtype: DType) -> &'static str {
    match dtype {
        DType::I1 => "bool",
        other => other.name(),
    }
}

impl fmt::Display for FnType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            FnType::Scalar(dtype) => f.write_str(dsl_name(dtype)),
            FnType::Ptr(dtype) => write!(f, "Ptr<{}>", dsl_name(dtype)),
            FnType::BlockPtr(dtype) => write!(f, "BlockPtr<{}>", dsl_name(dtype)),
            FnType::Tile(None) => f.write_str("Tile"),
            FnType::Tile(Some(dtype)) => write!(f, "Tile<{}>", dsl_name(dtype)),
            FnType::Any => f.write_str("_"),
        }
    }
}

/// How a call site takes what a `#[kernel_fn]`'s `call` gives: a call statement `f(..);` takes
/// `()`, a call used as a value takes one [`Value`], `let (a, b) = f(..);` a tuple of as many.
#[diagnostic::on_unimplemented(
    message = "this call takes `{Taken}` from a `#[kernel_fn]` that gives `{Self}`",
    label = "this `#[kernel_fn]` gives a different number of values",
    note = "a `#[kernel_fn]` without `-> ..` is called as a statement, `f(..);`; one with `-> T` \
            gives one value; one with `-> (A, B)` gives a tuple: bind it with `let (a, b) = f(..);`"
)]
pub trait FnResult<Taken> {
    fn take(self) -> Taken;
}

/// What the stub `call` of a `#[kernel_fn]` that failed to expand gives (it never returns), so that
/// its callers add no errors to the function's own.
impl<Taken> FnResult<Taken> for std::convert::Infallible {
    fn take(self) -> Taken {
        match self {}
    }
}

impl FnResult<()> for () {
    fn take(self) {}
}

impl FnResult<Value> for Value {
    fn take(self) -> Value {
        self
    }
}

impl FnResult<(Value, Value)> for (Value, Value) {
    fn take(self) -> (Value, Value) {
        self
    }
}

impl FnResult<(Value, Value, Value)> for (Value, Value, Value) {
    fn take(self) -> (Value, Value, Value) {
        self
    }
}

impl FnResult<(Value, Value, Value, Value)> for (Value, Value, Value, Value) {
    fn take(self) -> (Value, Value, Value, Value) {
        self
    }
}

impl FnResult<(Value, Value, Value, Value, Value)> for (Value, Value, Value, Value, Value) {
    fn take(self) -> (Value, Value, Value, Value, Value) {
        self
    }
}

impl FnResult<(Value, Value, Value, Value, Value, Value)>
    for (Value, Value, Value, Value, Value, Value)
{
    fn take(self) -> (Value, Value, Value, Value, Value, Value) {
        self
    }
}

impl FnResult<(Value, Value, Value, Value, Value, Value, Value)>
    for (Value, Value, Value, Value, Value, Value, Value)
{
    fn take(self) -> (Value, Value, Value, Value, Value, Value, Value) {
        self
    }
}

impl FnResult<(Value, Value, Value, Value, Value, Value, Value, Value)>
    for (Value, Value, Value, Value, Value, Value, Value, Value)
{
    fn take(self) -> (Value, Value, Value, Value, Value, Value, Value, Value) {
        self
    }
}

impl Builder {
    /// The value of `const` parameter `param` of `#[kernel_fn]` `function`, passed by the call at
    /// `loc`: an integer or bool constant (a literal, a specialisation parameter, a folded
    /// expression of them), as `kind` says.
    pub fn fn_const(
        &self,
        value: Value,
        kind: SpecKind,
        function: &str,
        param: &str,
        loc: Loc,
    ) -> Result<Value> {
        self.check_visible(value, loc)?;
        let expected = match kind {
            SpecKind::Int => "an integer constant",
            SpecKind::Bool => "a bool constant",
            SpecKind::DType => unreachable!("a dtype parameter is passed as a `DType`"),
        };
        let got = match (kind, self.constant(value)) {
            (SpecKind::Int, Some(Constant::Int(_))) | (SpecKind::Bool, Some(Constant::Bool(_))) => {
                return Ok(value);
            }
            (_, Some(_)) => format!("a constant {}", self.ty(value)),
            (_, None) => format!("a runtime {}", self.ty(value)),
        };
        Err(Error::semantic(
            loc,
            format!(
                "`const` parameter `{param}` of `{function}` takes {expected} (a literal or a \
                 specialisation parameter), got {got}"
            ),
        ))
    }

    /// `value` as `what` (``argument `x` ``, `the result`) of `#[kernel_fn]` `function`, declared
    /// `ty`: checked, and converted where it is a literal and `ty` a scalar dtype it fits.
    pub fn fn_value(
        &mut self,
        value: Value,
        ty: FnType,
        what: &str,
        function: &str,
        loc: Loc,
    ) -> Result<Value> {
        self.check_visible(value, loc)?;
        let got = self.ty(value).clone();
        let fits = match (ty, &got) {
            (FnType::Any, _) => true,
            (FnType::Scalar(dtype), _) => got == Type::scalar(dtype),
            (FnType::Ptr(dtype), Type::Tensor { elem, .. }) => *elem == Elem::Ptr(dtype),
            (FnType::BlockPtr(dtype), Type::BlockPtr { pointee, .. }) => *pointee == dtype,
            (FnType::Tile(None), _) => got.dtype().is_some(),
            (FnType::Tile(Some(dtype)), _) => got.dtype() == Some(dtype),
            (FnType::Ptr(_) | FnType::BlockPtr(_), _) => false,
        };
        if fits {
            return Ok(value);
        }
        if let FnType::Scalar(dtype) | FnType::Tile(Some(dtype)) = ty {
            let scalar = Type::scalar(dtype);
            if self.literal_fits(value, &scalar) {
                return self.convert_literal(value, &scalar, loc);
            }
        }
        Err(Error::semantic(
            loc,
            format!("{what} of `{function}` is declared `{ty}`, got {got}"),
        ))
    }

    /// Builds the body of `#[kernel_fn]` `function`, called at `call`, into the innermost open
    /// region: a semantic error inside it also says where it was called from.
    pub fn call_fn<R>(
        &mut self,
        function: &str,
        call: Loc,
        body: impl FnOnce(&mut Builder) -> Result<R>,
    ) -> Result<R> {
        if self.call_depth == MAX_CALL_DEPTH {
            return Err(Error::semantic(
                call,
                format!(
                    "`{function}` is called {MAX_CALL_DEPTH} calls deep: a `#[kernel_fn]` is \
                     inlined where it is called, so one that calls itself must stop on a \
                     constant condition"
                ),
            ));
        }
        if self.calls == MAX_CALLS {
            return Err(Error::semantic(
                call,
                format!(
                    "`{function}` would be the kernel's call number {}: a `#[kernel_fn]` is \
                     inlined where it is called, so one that calls itself twice a level \
                     doubles its calls with each",
                    MAX_CALLS + 1
                ),
            ));
        }
        self.calls += 1;
        let depth = self.open.len();
        self.call_depth += 1;
        let result = body(self);
        self.call_depth -= 1;
        match result {
            Ok(results) => {
                assert_eq!(
                    self.open.len(),
                    depth,
                    "a function closes the regions it opens"
                );
                Ok(results)
            }
            Err(error) => Err(error.called_from(function, call)),
        }
    }
}
