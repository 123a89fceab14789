//! The DSL's free functions and methods: names and arities are checked here, argument kinds
//! (values, array literals, dtypes, a message) are told apart here; the builder checks the rest.
//! A call of any other name is a call of a `#[kernel_fn]`, whose turbofish and arguments are
//! parsed here; Rust resolves its path and checks its arity.

use syn::spanned::Spanned;
use syn::{GenericArgument, Lit, PathArguments};

use super::model::{
    BinaryOp, DType, DTypeRef, Expr, ExprKind, FnCall, GenericValue, ReduceOp, Stmt, UnaryOp,
};
use super::scope::BindingKind;
use super::{BodyParser, Item};

/// Every free function and how it is called, in the order error messages list them.
const FUNCTIONS: &[(&str, &str)] = &[
    ("program_id", "`program_id(axis)`"),
    ("num_programs", "`num_programs(axis)`"),
    ("arange", "`arange(start, end)`"),
    ("zeros", "`zeros([d0, ..], dtype)`"),
    ("full", "`full([d0, ..], value, dtype)`"),
    (
        "load",
        "`load(ptr)`, `load(ptr, mask)`, `load(ptr, mask, other)` or `load(block_ptr, [axes])`",
    ),
    (
        "store",
        "`store(ptr, value)`, `store(ptr, value, mask)` or `store(block_ptr, value, [axes])`",
    ),
    (
        "atomic_add",
        "`atomic_add(ptr, value)`, `atomic_add(ptr, value, mask)` or \
         `atomic_add(block_ptr, value, [axes])`",
    ),
    (
        "make_block_ptr",
        "`make_block_ptr(base, [shape], [strides], [offsets], [block_shape], [order])`",
    ),
    ("advance", "`advance(block_ptr, [offsets])`"),
    ("atomic_arrive", "`atomic_arrive(counter)`"),
    ("dot", "`dot(a, b)` or `dot(a, b, acc)`"),
    ("trans", "`trans(x)`"),
    ("expand_dims", "`expand_dims(x, axis)`"),
    ("broadcast_to", "`broadcast_to(x, [d0, ..])`"),
    ("sum", "`sum(x, axis)`"),
    ("max", "`max(x, axis)`"),
    ("min", "`min(x, axis)`"),
    ("maximum", "`maximum(a, b)`"),
    ("minimum", "`minimum(a, b)`"),
    ("where_", "`where_(cond, a, b)`"),
    ("fma", "`fma(a, b, c)`"),
    ("exp2", "`exp2(x)`"),
    ("exp", "`exp(x)`"),
    ("log2", "`log2(x)`"),
    ("log", "`log(x)`"),
    ("tanh", "`tanh(x)`"),
    ("sqrt", "`sqrt(x)`"),
    ("rsqrt", "`rsqrt(x)`"),
    ("abs", "`abs(x)`"),
    ("cdiv", "`cdiv(a, b)`"),
    ("cast", "`cast(x, dtype)`"),
    (
        "static_assert",
        "`static_assert(cond)` or `static_assert(cond, \"message\")`",
    ),
    ("wait_for_prior_grids", "`wait_for_prior_grids()`"),
    ("launch_dependent_grids", "`launch_dependent_grids()`"),
];

/// Every method and how it is called, in the order error messages list them.
const METHODS: &[(&str, &str)] = &[
    ("to", "`x.to::<dtype>()`"),
    ("trans", "`x.trans()`"),
    ("expand_dims", "`x.expand_dims(axis)`"),
    ("broadcast_to", "`x.broadcast_to([d0, ..])`"),
    ("sum", "`x.sum(axis)`"),
    ("max", "`x.max(axis)`"),
    ("min", "`x.min(axis)`"),
    ("exp2", "`x.exp2()`"),
    ("exp", "`x.exp()`"),
    ("log2", "`x.log2()`"),
    ("log", "`x.log()`"),
    ("tanh", "`x.tanh()`"),
    ("sqrt", "`x.sqrt()`"),
    ("rsqrt", "`x.rsqrt()`"),
    ("abs", "`x.abs()`"),
];

/// Whether `name` is one of the DSL's free functions (which a `#[kernel_fn]` cannot be named).
pub(super) fn is_builtin(name: &str) -> bool {
    FUNCTIONS.iter().any(|(function, _)| *function == name)
}

/// Whether `name` is one of the DSL's functions that give no value and are called as statements.
pub(super) fn is_effect(name: &str) -> bool {
    matches!(
        name,
        "store"
            | "atomic_add"
            | "static_assert"
            | "wait_for_prior_grids"
            | "launch_dependent_grids"
    )
}

/// What a call calls.
pub(super) enum Callee<'a> {
    /// One of the DSL's functions, by name.
    Builtin(String),
    /// A `#[kernel_fn]`, by its path (its last segment may carry a turbofish).
    Function(&'a syn::Path),
}

fn usage(table: &[(&str, &'static str)], name: &str) -> &'static str {
    table
        .iter()
        .find(|(entry, _)| *entry == name)
        .map(|(_, usage)| *usage)
        .expect("every DSL function and method has a usage")
}

fn names(table: &[(&str, &str)]) -> String {
    table
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The elementwise math functions, as functions (`exp2(x)`) and as methods (`x.exp2()`).
fn math_op(name: &str) -> Option<UnaryOp> {
    Some(match name {
        "exp2" => UnaryOp::Exp2,
        "exp" => UnaryOp::Exp,
        "log2" => UnaryOp::Log2,
        "log" => UnaryOp::Log,
        "tanh" => UnaryOp::Tanh,
        "sqrt" => UnaryOp::Sqrt,
        "rsqrt" => UnaryOp::Rsqrt,
        "abs" => UnaryOp::Abs,
        _ => return None,
    })
}

fn reduce_op(name: &str) -> Option<ReduceOp> {
    Some(match name {
        "sum" => ReduceOp::Sum,
        "max" => ReduceOp::Max,
        "min" => ReduceOp::Min,
        _ => return None,
    })
}

/// Refuses a call whose argument count is not one of `counts`, showing how to call it.
fn check_arity(
    call: &impl quote::ToTokens,
    what: &str,
    usage: &str,
    given: usize,
    counts: &[usize],
) -> syn::Result<()> {
    if counts.contains(&given) {
        Ok(())
    } else {
        Err(syn::Error::new_spanned(
            call,
            format!("wrong number of arguments to {what}: got {given}; write {usage}"),
        ))
    }
}

impl BodyParser {
    /// A call of a free function that gives a value: one of the DSL's, or a `#[kernel_fn]`.
    pub(super) fn parse_call(&mut self, call: &syn::ExprCall) -> syn::Result<ExprKind> {
        let name = match self.callee(call)? {
            Callee::Builtin(name) => name,
            Callee::Function(path) => {
                return Ok(ExprKind::Call(Box::new(self.parse_fn_call(call, path)?)));
            }
        };
        let args: Vec<&syn::Expr> = call.args.iter().collect();
        let arity = |counts: &[usize]| {
            check_arity(
                call,
                &format!("`{name}`"),
                usage(FUNCTIONS, &name),
                args.len(),
                counts,
            )
        };
        Ok(match name.as_str() {
            "program_id" => {
                arity(&[1])?;
                ExprKind::ProgramId(self.parse_boxed(args[0])?)
            }
            "num_programs" => {
                arity(&[1])?;
                ExprKind::NumPrograms(self.parse_boxed(args[0])?)
            }
            "arange" => {
                arity(&[2])?;
                ExprKind::Arange(self.parse_boxed(args[0])?, self.parse_boxed(args[1])?)
            }
            "zeros" => {
                arity(&[2])?;
                ExprKind::Zeros {
                    shape: self.parse_list(args[0], "zeros", "the shape")?,
                    dtype: self.parse_dtype_expr(args[1])?,
                }
            }
            "full" => {
                arity(&[3])?;
                ExprKind::Full {
                    shape: self.parse_list(args[0], "full", "the shape")?,
                    value: self.parse_boxed(args[1])?,
                    dtype: self.parse_dtype_expr(args[2])?,
                }
            }
            "load" => {
                arity(&[1, 2, 3])?;
                let ptr = self.parse_boxed(args[0])?;
                match args.as_slice() {
                    [_, syn::Expr::Array(axes)] => ExprKind::LoadBlock {
                        ptr,
                        boundary_check: self.parse_elements(axes)?,
                    },
                    _ => ExprKind::Load {
                        ptr,
                        mask: self.parse_optional(args.get(1))?,
                        other: self.parse_optional(args.get(2))?,
                    },
                }
            }
            "make_block_ptr" => {
                arity(&[6])?;
                ExprKind::MakeBlockPtr {
                    base: self.parse_boxed(args[0])?,
                    shape: self.parse_list(args[1], "make_block_ptr", "the shape")?,
                    strides: self.parse_list(args[2], "make_block_ptr", "the strides")?,
                    offsets: self.parse_list(args[3], "make_block_ptr", "the offsets")?,
                    block_shape: self.parse_list(args[4], "make_block_ptr", "the block shape")?,
                    order: self.parse_list(args[5], "make_block_ptr", "the order")?,
                }
            }
            "advance" => {
                arity(&[2])?;
                ExprKind::Advance {
                    ptr: self.parse_boxed(args[0])?,
                    offsets: self.parse_list(args[1], "advance", "the offsets")?,
                }
            }
            "dot" => {
                arity(&[2, 3])?;
                ExprKind::Dot {
                    lhs: self.parse_boxed(args[0])?,
                    rhs: self.parse_boxed(args[1])?,
                    acc: self.parse_optional(args.get(2))?,
                }
            }
            "trans" => {
                arity(&[1])?;
                ExprKind::Trans(self.parse_boxed(args[0])?)
            }
            "atomic_arrive" => {
                arity(&[1])?;
                ExprKind::AtomicArrive(self.parse_boxed(args[0])?)
            }
            "expand_dims" => {
                arity(&[2])?;
                ExprKind::ExpandDims(self.parse_boxed(args[0])?, self.parse_boxed(args[1])?)
            }
            "broadcast_to" => {
                arity(&[2])?;
                ExprKind::BroadcastTo(
                    self.parse_boxed(args[0])?,
                    self.parse_list(args[1], "broadcast_to", "the shape")?,
                )
            }
            "maximum" | "minimum" => {
                arity(&[2])?;
                let op = if name == "maximum" {
                    BinaryOp::Max
                } else {
                    BinaryOp::Min
                };
                ExprKind::Binary(op, self.parse_boxed(args[0])?, self.parse_boxed(args[1])?)
            }
            "where_" => {
                arity(&[3])?;
                ExprKind::Select(
                    self.parse_boxed(args[0])?,
                    self.parse_boxed(args[1])?,
                    self.parse_boxed(args[2])?,
                )
            }
            "fma" => {
                arity(&[3])?;
                ExprKind::Fma(
                    self.parse_boxed(args[0])?,
                    self.parse_boxed(args[1])?,
                    self.parse_boxed(args[2])?,
                )
            }
            "cdiv" => {
                arity(&[2])?;
                ExprKind::Cdiv(self.parse_boxed(args[0])?, self.parse_boxed(args[1])?)
            }
            "cast" => {
                arity(&[2])?;
                ExprKind::Cast(self.parse_boxed(args[0])?, self.parse_dtype_expr(args[1])?)
            }
            name if is_effect(name) => {
                return Err(syn::Error::new_spanned(
                    call,
                    format!("`{name}` gives no value; call it as a statement"),
                ));
            }
            other => {
                if let Some(op) = reduce_op(other) {
                    arity(&[2])?;
                    ExprKind::Reduce(op, self.parse_boxed(args[0])?, self.parse_boxed(args[1])?)
                } else if let Some(op) = math_op(other) {
                    arity(&[1])?;
                    ExprKind::Unary(op, self.parse_boxed(args[0])?)
                } else {
                    unreachable!("`callee` gives only the DSL's functions as builtins")
                }
            }
        })
    }

    /// A call of the DSL's `store`, `atomic_add`, `static_assert`, `wait_for_prior_grids` or
    /// `launch_dependent_grids` as a statement; `None` for any other.
    pub(super) fn parse_effect(
        &mut self,
        call: &syn::ExprCall,
        name: &str,
    ) -> syn::Result<Option<Stmt>> {
        let args: Vec<&syn::Expr> = call.args.iter().collect();
        let arity = |counts: &[usize]| {
            check_arity(
                call,
                &format!("`{name}`"),
                usage(FUNCTIONS, name),
                args.len(),
                counts,
            )
        };
        let span = call.span();
        Ok(Some(match name {
            "store" => {
                arity(&[2, 3])?;
                let ptr = self.parse_expr(args[0])?;
                let value = self.parse_expr(args[1])?;
                match args.get(2) {
                    Some(syn::Expr::Array(axes)) => Stmt::StoreBlock {
                        ptr,
                        value,
                        boundary_check: self.parse_elements(axes)?,
                        span,
                    },
                    mask => Stmt::Store {
                        ptr,
                        value,
                        mask: mask.map(|mask| self.parse_expr(mask)).transpose()?,
                        span,
                    },
                }
            }
            "atomic_add" => {
                arity(&[2, 3])?;
                let ptr = self.parse_expr(args[0])?;
                let value = self.parse_expr(args[1])?;
                match args.get(2) {
                    Some(syn::Expr::Array(axes)) => Stmt::AtomicAddBlock {
                        ptr,
                        value,
                        boundary_check: self.parse_elements(axes)?,
                        span,
                    },
                    mask => Stmt::AtomicAdd {
                        ptr,
                        value,
                        mask: mask.map(|mask| self.parse_expr(mask)).transpose()?,
                        span,
                    },
                }
            }
            "static_assert" => {
                arity(&[1, 2])?;
                let message = match args.get(1) {
                    None => None,
                    Some(syn::Expr::Lit(syn::ExprLit {
                        lit: Lit::Str(message),
                        ..
                    })) => Some(message.clone()),
                    Some(other) => {
                        return Err(syn::Error::new_spanned(
                            other,
                            "the message of `static_assert` must be a string literal",
                        ));
                    }
                };
                Stmt::StaticAssert {
                    cond: self.parse_expr(args[0])?,
                    message,
                    span,
                }
            }
            "wait_for_prior_grids" | "launch_dependent_grids" => {
                arity(&[0])?;
                Stmt::GridControl {
                    wait: name == "wait_for_prior_grids",
                    span,
                }
            }
            _ => return Ok(None),
        }))
    }

    /// A method call; its span is the method's name, so that a chain's calls are told apart.
    pub(super) fn parse_method_call(&mut self, call: &syn::ExprMethodCall) -> syn::Result<Expr> {
        let name = call.method.to_string();
        if name == "step_by" {
            return Err(syn::Error::new_spanned(
                &call.method,
                "`.step_by(..)` is only allowed on the range of a `for` loop",
            ));
        }
        if !METHODS.iter().any(|(method, _)| *method == name) {
            return Err(syn::Error::new_spanned(
                &call.method,
                format!(
                    "unknown method `{name}`; the DSL's methods are: {}",
                    names(METHODS)
                ),
            ));
        }
        let method_usage = usage(METHODS, &name);
        if name != "to"
            && let Some(turbofish) = &call.turbofish
        {
            return Err(syn::Error::new_spanned(
                turbofish,
                format!("`.{name}` takes no type arguments; write {method_usage}"),
            ));
        }
        let args: Vec<&syn::Expr> = call.args.iter().collect();
        let arity = |counts: &[usize]| {
            check_arity(
                call,
                &format!("`.{name}`"),
                method_usage,
                args.len(),
                counts,
            )
        };
        let receiver = self.parse_boxed(&call.receiver)?;
        let kind = match name.as_str() {
            "to" => {
                arity(&[0])?;
                let dtype = match call.turbofish.as_ref().map(|t| &t.args) {
                    Some(type_args) if type_args.len() == 1 => match &type_args[0] {
                        GenericArgument::Type(ty) => self.parse_dtype_type(ty)?,
                        other => {
                            return Err(syn::Error::new_spanned(
                                other,
                                format!("`.to` takes a dtype; write {method_usage}"),
                            ));
                        }
                    },
                    _ => {
                        return Err(syn::Error::new_spanned(
                            call,
                            format!("`.to` needs one dtype; write {method_usage}"),
                        ));
                    }
                };
                ExprKind::Cast(receiver, dtype)
            }
            "trans" => {
                arity(&[0])?;
                ExprKind::Trans(receiver)
            }
            "expand_dims" => {
                arity(&[1])?;
                ExprKind::ExpandDims(receiver, self.parse_boxed(args[0])?)
            }
            "broadcast_to" => {
                arity(&[1])?;
                ExprKind::BroadcastTo(
                    receiver,
                    self.parse_list(args[0], "broadcast_to", "the shape")?,
                )
            }
            other => {
                if let Some(op) = reduce_op(other) {
                    arity(&[1])?;
                    ExprKind::Reduce(op, receiver, self.parse_boxed(args[0])?)
                } else {
                    let op = math_op(other).expect("METHODS lists only known methods");
                    arity(&[0])?;
                    ExprKind::Unary(op, receiver)
                }
            }
        };
        Ok(Expr {
            kind,
            span: call.method.span(),
        })
    }

    fn parse_optional(&mut self, expr: Option<&&syn::Expr>) -> syn::Result<Option<Box<Expr>>> {
        expr.map(|expr| self.parse_boxed(expr)).transpose()
    }

    /// An array-literal argument: a shape, offsets, axes.
    fn parse_list(
        &mut self,
        expr: &syn::Expr,
        function: &str,
        what: &str,
    ) -> syn::Result<Vec<Expr>> {
        match expr {
            syn::Expr::Array(array) => self.parse_elements(array),
            _ => Err(syn::Error::new_spanned(
                expr,
                format!(
                    "`{function}` expects {what} as an array literal, such as `[BLOCK_M, BLOCK_N]`"
                ),
            )),
        }
    }

    fn parse_elements(&mut self, array: &syn::ExprArray) -> syn::Result<Vec<Expr>> {
        array
            .elems
            .iter()
            .map(|element| self.parse_expr(element))
            .collect()
    }
}

impl BodyParser {
    /// What `call` calls: a plain name of the DSL's functions is one of them; any other path is a
    /// `#[kernel_fn]`, resolved by Rust. What cannot be a function is refused here.
    pub(super) fn callee<'a>(&self, call: &'a syn::ExprCall) -> syn::Result<Callee<'a>> {
        let not_a_function = || {
            syn::Error::new_spanned(
                &call.func,
                format!(
                    "only functions can be called in {}: the DSL's ({}) and `#[kernel_fn]`s, by \
                     name or path",
                    self.item.noun(),
                    names(FUNCTIONS)
                ),
            )
        };
        let syn::Expr::Path(expr_path) = &*call.func else {
            return Err(not_a_function());
        };
        if let Some(attribute) = expr_path.attrs.first() {
            return Err(syn::Error::new_spanned(
                attribute,
                format!("attributes are not supported in {}", self.item.noun()),
            ));
        }
        if let Some(qself) = &expr_path.qself {
            return Err(syn::Error::new_spanned(
                &qself.ty,
                "a `#[kernel_fn]` is called by its path, such as `f(..)` or `module::f(..)`, \
                 without a `<T as Trait>` qualifier",
            ));
        }
        let path = &expr_path.path;
        let (last, leading) = {
            let mut segments = path.segments.iter().rev();
            let last = segments.next().ok_or_else(not_a_function)?;
            (last, segments)
        };
        for segment in leading {
            if !segment.arguments.is_none() {
                return Err(syn::Error::new_spanned(
                    &segment.arguments,
                    "generic arguments go on the function's name, as in \
                     `module::f::<T, BLOCK>(..)`",
                ));
            }
            if segment.ident == "Self" {
                return Err(syn::Error::new_spanned(
                    &segment.ident,
                    "`Self` has no functions here",
                ));
            }
        }
        if path.leading_colon.is_none() && path.segments.len() == 1 {
            let ident = &last.ident;
            let name = ident.to_string();
            if is_builtin(&name) {
                if !last.arguments.is_none() {
                    return Err(syn::Error::new_spanned(
                        &last.arguments,
                        format!(
                            "`{name}` takes no generic arguments; write {}",
                            usage(FUNCTIONS, &name)
                        ),
                    ));
                }
                return Ok(Callee::Builtin(name));
            }
            match self.scopes.lookup(ident) {
                None => {}
                Some(BindingKind::DTypeParam) => {
                    return Err(syn::Error::new_spanned(
                        ident,
                        format!(
                            "`{name}` is a dtype parameter, not a function; convert with \
                             `x.to::<{name}>()`"
                        ),
                    ));
                }
                Some(_) => {
                    return Err(syn::Error::new_spanned(
                        ident,
                        format!(
                            "`{name}` is a variable, not a function; only the DSL's functions \
                             and `#[kernel_fn]`s can be called"
                        ),
                    ));
                }
            }
        }
        if let PathArguments::Parenthesized(arguments) = &last.arguments {
            return Err(syn::Error::new_spanned(
                arguments,
                "expected a function's path",
            ));
        }
        Ok(Callee::Function(path))
    }

    /// A call of a `#[kernel_fn]`: its turbofish's values, then its arguments.
    pub(super) fn parse_fn_call(
        &mut self,
        call: &syn::ExprCall,
        path: &syn::Path,
    ) -> syn::Result<FnCall> {
        let mut bare = path.clone();
        let last = bare.segments.last_mut().expect("`callee` checked the path");
        let generics = match std::mem::replace(&mut last.arguments, PathArguments::None) {
            PathArguments::AngleBracketed(arguments) => arguments
                .args
                .iter()
                .map(|argument| self.parse_generic_value(argument))
                .collect::<syn::Result<_>>()?,
            _ => Vec::new(),
        };
        let args = call
            .args
            .iter()
            .map(|arg| self.parse_expr(arg))
            .collect::<syn::Result<_>>()?;
        Ok(FnCall {
            path: bare,
            generics,
            args,
            span: call.span(),
        })
    }

    /// A value of a call's turbofish: a dtype (a DSL dtype name or the caller's type parameter)
    /// for a type parameter, a constant (a name, a literal or `{ expr }`) for a `const` one.
    fn parse_generic_value(&mut self, argument: &GenericArgument) -> syn::Result<GenericValue> {
        let expected = || {
            syn::Error::new_spanned(
                argument,
                format!(
                    "a generic argument of a `#[kernel_fn]` call is a dtype ({} or a type \
                     parameter), a constant such as `BLOCK_M`, `64` or `true`, or `{{ expr }}`",
                    DType::NAMES
                ),
            )
        };
        match argument {
            GenericArgument::Type(syn::Type::Path(type_path)) if type_path.qself.is_none() => {
                let Some(name) = type_path.path.get_ident() else {
                    return Err(expected());
                };
                match self.scopes.lookup(name) {
                    Some(BindingKind::DTypeParam) => Ok(GenericValue::DType(
                        DTypeRef::Param(name.clone()),
                        name.span(),
                    )),
                    Some(_) => Ok(GenericValue::Const(Expr {
                        kind: ExprKind::Variable(name.clone()),
                        span: name.span(),
                    })),
                    None => match DType::from_name(&name.to_string()) {
                        Some(dtype) => Ok(GenericValue::DType(DTypeRef::Fixed(dtype), name.span())),
                        None => Err(self.not_found(name)),
                    },
                }
            }
            GenericArgument::Const(syn::Expr::Block(block)) => match block.block.stmts.as_slice() {
                [syn::Stmt::Expr(value, None)] => Ok(GenericValue::Const(self.parse_expr(value)?)),
                _ => Err(syn::Error::new_spanned(
                    block,
                    "a `{ .. }` generic argument holds one expression, such as `{ BLOCK_M * 2 }`",
                )),
            },
            GenericArgument::Const(value) => Ok(GenericValue::Const(self.parse_expr(value)?)),
            _ => Err(expected()),
        }
    }

    /// The error for a name that is not bound.
    pub(super) fn not_found(&self, name: &syn::Ident) -> syn::Error {
        let message = match self.item {
            Item::Kernel => format!("cannot find `{name}` in this kernel"),
            Item::Function => format!(
                "cannot find `{name}` in this function; a `#[kernel_fn]` sees only its own \
                 parameters, arguments and variables (pass it as an argument)"
            ),
        };
        syn::Error::new_spanned(name, message)
    }
}
