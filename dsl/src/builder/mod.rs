//! The builder: what `#[kiln::kernel]` expands a kernel body into.
//!
//! Each DSL construct is one builder call taking [`Value`] handles and the [`Loc`] of the DSL
//! expression; each call checks its operands (in `semantic`) and appends explicit, fully typed
//! instructions to the innermost open region. Specialisation parameters arrive as constants, and
//! scalar arithmetic on constants folds, so `BLOCK_M * 2` can size a tile.

mod functions;
mod ops;
mod semantic;

pub use functions::{FnResult, FnType, MAX_CALL_DEPTH, MAX_CALLS};
pub use semantic::MAX_TILE_ELEMENTS;

use crate::error::{Error, Loc, Result};
use crate::ir::{Constant, Inst, Kernel, Op, Region, Value, ValueInfo};
use crate::signature::{ArgType, KernelSignature, Spec, SpecValue};
use crate::types::{DType, Type};

/// Builds one specialisation of a kernel. See the module docs.
#[derive(Debug)]
pub struct Builder {
    signature: &'static KernelSignature,
    spec: Spec,
    values: Vec<ValueInfo>,
    /// Per value: its constant, for scalars whose value is known while building.
    constants: Vec<Option<Constant>>,
    /// Per value: whether it is a literal whose dtype yields to the other operand's (`x * 0.5`).
    weak: Vec<bool>,
    /// Per value: the region that defines it, to refuse uses outside it.
    defined_in: Vec<u32>,
    args: Vec<Value>,
    /// Open regions, innermost last; the first is the kernel body.
    open: Vec<OpenRegion>,
    next_region_id: u32,
    /// How many `#[kernel_fn]` calls are being built, one inside the other.
    call_depth: usize,
    /// `#[kernel_fn]` calls inlined so far ([`functions::MAX_CALLS`]).
    calls: usize,
}

#[derive(Debug)]
struct OpenRegion {
    id: u32,
    region: Region,
}

/// An open `for` loop: the body is being built. Close it with [`Builder::end_for`].
#[derive(Debug)]
pub struct ForScope {
    /// The induction variable.
    pub induction: Value,
    /// The loop-carried values as the body sees them, in the order they were given.
    pub carried: Vec<Value>,
    lower: Value,
    upper: Value,
    step: Value,
    init: Vec<Value>,
    names: Vec<String>,
    depth: usize,
    loc: Loc,
}

/// An open `if`: the then-branch is being built, then (after [`Builder::begin_else`] or
/// [`Builder::begin_else_with_value`]) the else-branch.
#[derive(Debug)]
pub struct IfScope {
    cond: Value,
    /// The values the branches may reassign, as they are before the `if`.
    init: Vec<Value>,
    names: Vec<String>,
    /// The id of the then-branch's region, to reopen it (see [`Builder::end_if_with_value`]).
    then_id: u32,
    then_region: Option<Region>,
    /// For an `if` used as a value, the then-branch's value (it follows the carried values in
    /// the then-region's `yield`).
    then_value: Option<Value>,
    depth: usize,
    loc: Loc,
}

impl Builder {
    /// Starts building `signature` at `spec`, which must give every specialisation parameter a value.
    pub fn new(signature: &'static KernelSignature, spec: &Spec) -> Result<Builder> {
        spec.validate(signature).map_err(|message| Error::Spec {
            kernel: signature.name.to_string(),
            message,
        })?;
        let mut builder = Builder {
            signature,
            spec: spec.clone(),
            values: Vec::new(),
            constants: Vec::new(),
            weak: Vec::new(),
            defined_in: Vec::new(),
            args: Vec::new(),
            open: vec![OpenRegion {
                id: 0,
                region: Region::default(),
            }],
            next_region_id: 1,
            call_depth: 0,
            calls: 0,
        };
        for arg in signature.args {
            let ty = match arg.ty {
                ArgType::Ptr(dtype) => Type::ptr(builder.resolve(dtype)?, Vec::new()),
                ArgType::Scalar(dtype) => Type::scalar(builder.resolve(dtype)?),
            };
            let value = builder.new_value(ty);
            builder.values[value.index()].name = Some(arg.name.to_string());
            builder.args.push(value);
        }
        Ok(builder)
    }

    fn resolve(&self, dtype: crate::signature::DTypeRef) -> Result<DType> {
        dtype.resolve(&self.spec).ok_or_else(|| Error::Spec {
            kernel: self.signature.name.to_string(),
            message: format!("no dtype is given for type parameter `{dtype:?}`"),
        })
    }

    /// The value of kernel argument `index` (in signature order).
    pub fn arg(&self, index: usize) -> Value {
        self.args[index]
    }

    /// The dtype bound to type parameter `name`.
    pub fn spec_dtype(&self, name: &str) -> Result<DType> {
        match self.spec.get(name) {
            Some(SpecValue::DType(dtype)) => Ok(dtype),
            _ => Err(self.spec_error(name, "a dtype")),
        }
    }

    /// An integer or bool specialisation parameter as a constant value.
    pub fn spec_const(&mut self, name: &str, loc: Loc) -> Result<Value> {
        let value = match self.spec.get(name) {
            Some(SpecValue::Int(v)) => self.int(v, loc),
            Some(SpecValue::Bool(v)) => self.bool(v, loc),
            _ => return Err(self.spec_error(name, "an integer or bool")),
        };
        self.name(value, name);
        Ok(value)
    }

    fn spec_error(&self, name: &str, expected: &str) -> Error {
        Error::Spec {
            kernel: self.signature.name.to_string(),
            message: format!("specialisation parameter `{name}` must be {expected}"),
        }
    }

    /// Names a value after the DSL variable bound to it (the printer shows it).
    pub fn name(&mut self, value: Value, name: &str) {
        let info = &mut self.values[value.index()];
        if info.name.is_none() {
            info.name = Some(name.to_string());
        }
    }

    /// Ends the build: every region must be closed.
    pub fn finish(mut self) -> Result<Kernel> {
        assert_eq!(self.open.len(), 1, "the macro closes every region it opens");
        let mut body = self.open.pop().expect("the kernel body").region;
        crate::passes::remove_dead_code(&mut body);
        Ok(Kernel {
            signature: self.signature,
            spec: self.spec,
            args: self.args,
            body,
            values: self.values,
        })
    }

    // ---- values -------------------------------------------------------------------------------

    pub(crate) fn ty(&self, value: Value) -> &Type {
        &self.values[value.index()].ty
    }

    pub(crate) fn constant(&self, value: Value) -> Option<Constant> {
        self.constants[value.index()]
    }

    fn new_value(&mut self, ty: Type) -> Value {
        let value = Value(self.values.len() as u32);
        self.values.push(ValueInfo { ty, name: None });
        self.constants.push(None);
        self.weak.push(false);
        self.defined_in
            .push(self.open.last().map_or(0, |region| region.id));
        value
    }

    /// Appends `op` to the innermost open region with results of `result_types`.
    pub(crate) fn push(&mut self, op: Op, result_types: Vec<Type>, loc: Loc) -> Vec<Value> {
        let results: Vec<Value> = result_types
            .into_iter()
            .map(|ty| self.new_value(ty))
            .collect();
        self.current().insts.push(Inst {
            op,
            results: results.clone(),
            loc,
        });
        results
    }

    pub(crate) fn push1(&mut self, op: Op, result_type: Type, loc: Loc) -> Value {
        self.push(op, vec![result_type], loc)[0]
    }

    fn current(&mut self) -> &mut Region {
        &mut self
            .open
            .last_mut()
            .expect("the kernel body is open")
            .region
    }

    /// Refuses a value defined in a region that is no longer open (it escaped a loop or branch).
    pub(crate) fn check_visible(&self, value: Value, loc: Loc) -> Result<()> {
        let region = self.defined_in[value.index()];
        if self.open.iter().any(|open| open.id == region) {
            Ok(())
        } else {
            let name = self.values[value.index()]
                .name
                .as_deref()
                .unwrap_or("a value");
            Err(Error::semantic(
                loc,
                format!(
                    "`{name}` is defined inside a loop or branch that has ended; \
                     assign it to a variable declared before the loop or branch"
                ),
            ))
        }
    }

    // ---- constants ----------------------------------------------------------------------------

    fn constant_value(&mut self, constant: Constant, dtype: DType, weak: bool, loc: Loc) -> Value {
        let value = self.push1(Op::Constant(constant), Type::scalar(dtype), loc);
        self.constants[value.index()] = Some(constant);
        self.weak[value.index()] = weak;
        value
    }

    /// An integer literal: i32 when it fits, else i64; its dtype yields to the other operand's.
    pub fn int(&mut self, v: i64, loc: Loc) -> Value {
        let dtype = if i32::try_from(v).is_ok() {
            DType::I32
        } else {
            DType::I64
        };
        self.constant_value(Constant::Int(v), dtype, true, loc)
    }

    /// A float literal (f32 unless the other operand is another float type).
    pub fn float(&mut self, v: f64, loc: Loc) -> Value {
        self.constant_value(Constant::Float(v), DType::F32, true, loc)
    }

    pub fn bool(&mut self, v: bool, loc: Loc) -> Value {
        self.constant_value(Constant::Bool(v), DType::I1, true, loc)
    }

    /// A constant of an exact dtype (not weak).
    pub(crate) fn typed_constant(&mut self, constant: Constant, dtype: DType, loc: Loc) -> Value {
        self.constant_value(constant, dtype, false, loc)
    }

    /// The value of a constant bool, for `if` on a specialisation flag: such an `if` builds only
    /// the branch taken.
    pub fn static_bool(&self, value: Value) -> Option<bool> {
        match (self.ty(value).dtype(), self.constant(value)) {
            (Some(DType::I1), Some(Constant::Bool(b))) if self.ty(value).is_scalar() => Some(b),
            _ => None,
        }
    }

    /// A constant integer operand (an axis, a shape entry), or an error naming `what`.
    pub(crate) fn const_int(&self, value: Value, what: &str, loc: Loc) -> Result<i64> {
        self.check_visible(value, loc)?;
        match self.constant(value) {
            Some(Constant::Int(v)) => Ok(v),
            _ => Err(Error::semantic(
                loc,
                format!(
                    "{what} must be a compile-time integer constant (a literal or a specialisation \
                     parameter), got a runtime {}",
                    self.ty(value)
                ),
            )),
        }
    }

    /// A list of non-negative integer constants: shapes, axes, orders.
    pub(crate) fn const_dims(&self, values: &[Value], what: &str, loc: Loc) -> Result<Vec<usize>> {
        values
            .iter()
            .map(|&v| {
                let n = self.const_int(v, what, loc)?;
                usize::try_from(n).map_err(|_| {
                    Error::semantic(loc, format!("{what} must not be negative, got {n}"))
                })
            })
            .collect()
    }

    // ---- structured control flow ----------------------------------------------------------------

    fn open_region(&mut self, params: Vec<Value>) {
        let id = self.next_region_id;
        self.next_region_id += 1;
        self.open.push(OpenRegion {
            id,
            region: Region {
                params,
                insts: Vec::new(),
            },
        });
    }

    fn close_region(&mut self, yields: &[Value], loc: Loc) -> Region {
        self.push(
            Op::Yield {
                values: yields.to_vec(),
            },
            Vec::new(),
            loc,
        );
        self.open.pop().expect("an open region").region
    }

    /// Opens `for iv in (lower..upper).step_by(step)` carrying `init` (named `names`) through the body.
    pub fn begin_for(
        &mut self,
        lower: Value,
        upper: Value,
        step: Value,
        init: &[Value],
        names: &[&str],
        loc: Loc,
    ) -> Result<ForScope> {
        let (lower, upper, step) = self.loop_bounds(lower, upper, step, loc)?;
        for &v in init {
            self.check_visible(v, loc)?;
        }
        let induction_type = self.ty(lower).clone();
        let depth = self.open.len();
        // Parameters belong to the body region: create them once it is open.
        self.open_region(Vec::new());
        let induction = self.new_value(induction_type);
        let carried: Vec<Value> = init
            .iter()
            .zip(names)
            .map(|(&v, name)| {
                let param = self.new_value(self.ty(v).clone());
                self.name(param, name);
                param
            })
            .collect();
        let region = self.current();
        region.params.push(induction);
        region.params.extend(&carried);
        Ok(ForScope {
            induction,
            carried,
            lower,
            upper,
            step,
            init: init.to_vec(),
            names: names.iter().map(|s| s.to_string()).collect(),
            depth,
            loc,
        })
    }

    /// Closes a `for` body whose carried values end as `yields`; returns their values after the loop.
    pub fn end_for(&mut self, scope: ForScope, yields: &[Value], loc: Loc) -> Result<Vec<Value>> {
        assert_eq!(self.open.len(), scope.depth + 1, "regions close in order");
        let yields = self.check_carried(&scope.init, yields, &scope.names, "loop", loc)?;
        let body = self.close_region(&yields, loc);
        let types = scope.init.iter().map(|&v| self.ty(v).clone()).collect();
        let results = self.push(
            Op::For {
                lower: scope.lower,
                upper: scope.upper,
                step: scope.step,
                init: scope.init,
                body,
            },
            types,
            scope.loc,
        );
        for (&result, name) in results.iter().zip(&scope.names) {
            self.name(result, name);
        }
        Ok(results)
    }

    /// Opens `if cond { .. }` on a runtime scalar bool; `init` are the variables a branch may reassign.
    pub fn begin_if(
        &mut self,
        cond: Value,
        init: &[Value],
        names: &[&str],
        loc: Loc,
    ) -> Result<IfScope> {
        self.check_visible(cond, loc)?;
        if self.ty(cond) != &Type::scalar(DType::I1) {
            return Err(Error::semantic(
                loc,
                format!(
                    "an `if` condition must be a scalar bool (i1), got {}",
                    self.ty(cond)
                ),
            ));
        }
        for &v in init {
            self.check_visible(v, loc)?;
        }
        let depth = self.open.len();
        self.open_region(Vec::new());
        Ok(IfScope {
            cond,
            init: init.to_vec(),
            names: names.iter().map(|s| s.to_string()).collect(),
            then_id: self.open.last().expect("just opened").id,
            then_region: None,
            then_value: None,
            depth,
            loc,
        })
    }

    /// Ends the then-branch (its variables end as `yields`) and opens the else-branch.
    pub fn begin_else(&mut self, scope: &mut IfScope, yields: &[Value], loc: Loc) -> Result<()> {
        self.end_then(scope, yields, None, loc)
    }

    /// For an `if` used as a value (`let s = if c { a } else { b };`): ends the then-branch,
    /// whose variables end as `yields` and whose value is `value`, and opens the else-branch.
    /// Close it with [`Builder::end_if_with_value`].
    pub fn begin_else_with_value(
        &mut self,
        scope: &mut IfScope,
        yields: &[Value],
        value: Value,
        loc: Loc,
    ) -> Result<()> {
        self.end_then(scope, yields, Some(value), loc)
    }

    fn end_then(
        &mut self,
        scope: &mut IfScope,
        yields: &[Value],
        value: Option<Value>,
        loc: Loc,
    ) -> Result<()> {
        assert_eq!(self.open.len(), scope.depth + 1, "regions close in order");
        assert!(scope.then_region.is_none(), "an `if` has one else-branch");
        let mut yields = self.check_carried(&scope.init, yields, &scope.names, "branch", loc)?;
        if let Some(value) = value {
            self.check_visible(value, loc)?;
            yields.push(value);
        }
        scope.then_region = Some(self.close_region(&yields, loc));
        scope.then_value = value;
        self.open_region(Vec::new());
        Ok(())
    }

    /// Ends the else-branch (opened or not) and returns the variables' values after the `if`.
    pub fn end_if(&mut self, mut scope: IfScope, yields: &[Value], loc: Loc) -> Result<Vec<Value>> {
        if scope.then_region.is_none() {
            // No else-branch was written: it leaves every variable as it was.
            self.begin_else(&mut scope, yields, loc)?;
            let init = scope.init.clone();
            return self.end_if(scope, &init, loc);
        }
        assert_eq!(self.open.len(), scope.depth + 1, "regions close in order");
        assert!(
            scope.then_value.is_none(),
            "an `if` whose then-branch gave a value ends with `end_if_with_value`"
        );
        let yields = self.check_carried(&scope.init, yields, &scope.names, "branch", loc)?;
        let else_region = self.close_region(&yields, loc);
        let types = scope.init.iter().map(|&v| self.ty(v).clone()).collect();
        Ok(self.push_if(scope, else_region, types))
    }

    /// Ends the else-branch of an `if` used as a value (opened with
    /// [`Builder::begin_else_with_value`]): its variables end as `yields` and its value is
    /// `value`. Returns the variables' values after the `if`, and the `if`'s value.
    ///
    /// Both values must have one type, which the `if`'s value takes; a literal scalar (`0.0`,
    /// `1`, `true`: a weak constant) in either branch is converted and broadcast to the other
    /// branch's type where it fits that dtype's kind (an integer literal any number, a float
    /// literal any float, a bool literal bools), so `if c { tile } else { 0.0 }` and
    /// `if c { 0.0 } else { tile }` both give `tile`'s type. The then-branch is closed by then:
    /// its literal is converted by reopening its region, before its `yield`. Anything else that
    /// differs is a semantic error at the `if`.
    pub fn end_if_with_value(
        &mut self,
        mut scope: IfScope,
        yields: &[Value],
        value: Value,
        loc: Loc,
    ) -> Result<(Vec<Value>, Value)> {
        assert_eq!(self.open.len(), scope.depth + 1, "regions close in order");
        let then_value = scope
            .then_value
            .expect("an `if` used as a value opens its else-branch with `begin_else_with_value`");
        let mut yields = self.check_carried(&scope.init, yields, &scope.names, "branch", loc)?;
        self.check_visible(value, loc)?;
        let (then_ty, else_ty) = (self.ty(then_value).clone(), self.ty(value).clone());
        let mut value = value;
        let mut convert_then = false;
        if then_ty != else_ty {
            if self.literal_fits(value, &then_ty) {
                value = self.convert_literal(value, &then_ty, loc)?;
            } else if self.literal_fits(then_value, &else_ty) {
                convert_then = true;
            } else {
                return Err(Error::semantic(
                    scope.loc,
                    format!(
                        "the branches of this `if` give different types: {then_ty} and {else_ty}{}",
                        branch_types_hint(&then_ty, &else_ty)
                    ),
                ));
            }
        }
        yields.push(value);
        let else_region = self.close_region(&yields, loc);
        if convert_then {
            self.reopen_then_to_convert(&mut scope, &else_ty, loc)?;
        }
        let value_ty = if convert_then { else_ty } else { then_ty };
        let types = scope
            .init
            .iter()
            .map(|&v| self.ty(v).clone())
            .chain([value_ty])
            .collect();
        let mut results = self.push_if(scope, else_region, types);
        let value = results.pop().expect("the `if`'s value is its last result");
        Ok((results, value))
    }

    /// Whether `value` is a literal scalar that converts to `ty` (see [`Builder::end_if_with_value`]).
    fn literal_fits(&self, value: Value, ty: &Type) -> bool {
        let (Some(from), Some(to)) = (self.ty(value).dtype(), ty.dtype()) else {
            return false;
        };
        let fits = match from {
            DType::I1 => to == DType::I1,
            _ if from.is_int() => to != DType::I1,
            _ => to.is_float(),
        };
        self.weak[value.index()] && self.ty(value).is_scalar() && fits
    }

    /// Converts a literal scalar that fits `ty` (see [`Builder::literal_fits`]) to it, in the
    /// innermost open region.
    fn convert_literal(&mut self, value: Value, ty: &Type, loc: Loc) -> Result<Value> {
        let dtype = ty
            .dtype()
            .expect("`literal_fits` checked that `ty` has a dtype");
        let value = self.cast(value, dtype, loc)?;
        self.broadcast_value(value, ty.shape(), loc)
    }

    /// Converts the then-branch's literal value to `ty` once the then-branch is closed: reopens its
    /// region (under its own id, so that visibility stays right), replaces its `yield`.
    fn reopen_then_to_convert(&mut self, scope: &mut IfScope, ty: &Type, loc: Loc) -> Result<()> {
        let mut region = scope.then_region.take().expect("the then-branch is closed");
        let Some(Inst {
            op: Op::Yield { values: mut yields },
            loc: yield_loc,
            ..
        }) = region.insts.pop()
        else {
            unreachable!("a closed region ends with its `yield`")
        };
        self.open.push(OpenRegion {
            id: scope.then_id,
            region,
        });
        let value = yields.pop().expect("the then-branch yields its value last");
        yields.push(self.convert_literal(value, ty, loc)?);
        scope.then_region = Some(self.close_region(&yields, yield_loc));
        Ok(())
    }

    /// Appends the `if` of `scope` (its then-branch closed) with `else_region`; names the results
    /// that carry variables.
    fn push_if(&mut self, scope: IfScope, else_region: Region, types: Vec<Type>) -> Vec<Value> {
        let results = self.push(
            Op::If {
                cond: scope.cond,
                then_region: scope.then_region.expect("the then-branch is closed"),
                else_region,
            },
            types,
            scope.loc,
        );
        for (&result, name) in results.iter().zip(&scope.names) {
            self.name(result, name);
        }
        results
    }

    /// A carried variable keeps its type through a loop or branch; a literal may be cast to it.
    fn check_carried(
        &mut self,
        init: &[Value],
        yields: &[Value],
        names: &[String],
        what: &str,
        loc: Loc,
    ) -> Result<Vec<Value>> {
        assert_eq!(
            init.len(),
            yields.len(),
            "the macro yields every carried variable"
        );
        init.iter()
            .zip(yields)
            .zip(names)
            .map(|((&before, &after), name)| {
                self.check_visible(after, loc)?;
                let (want, got) = (self.ty(before).clone(), self.ty(after).clone());
                if want == got {
                    return Ok(after);
                }
                if self.weak[after.index()]
                    && got.is_scalar()
                    && want.is_scalar()
                    && let Some(dtype) = want.dtype()
                {
                    return self.cast(after, dtype, loc);
                }
                Err(Error::semantic(
                    loc,
                    format!(
                        "`{name}` changes type in this {what}: {want} before, {got} at its end; \
                         a variable keeps its type (cast it with `.to::<T>()`)"
                    ),
                ))
            })
            .collect()
    }
}

/// What to write when the branches of an `if` used as a value differ in `a` and `b`.
fn branch_types_hint(a: &Type, b: &Type) -> &'static str {
    match (a.dtype(), b.dtype()) {
        (Some(_), Some(_)) if a.shape() == b.shape() => {
            "; convert one with `.to::<D>()` so that both give the same dtype"
        }
        (Some(x), Some(y)) if x == y => "; give both the same shape (`broadcast_to`)",
        _ => "",
    }
}
