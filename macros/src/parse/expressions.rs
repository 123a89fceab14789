//! Expressions: literals, names, operators, casts; calls are in `functions`, `if`s used as values
//! in `statements`. Everything else Rust can write is refused here, with a hint at what to write
//! instead.

use syn::spanned::Spanned;
use syn::{BinOp, Ident, Lit, UnOp};

use super::BodyParser;
use super::model::{BinaryOp, CmpOp, DType, DTypeRef, Expr, ExprKind, UnaryOp};
use super::scope::BindingKind;

impl BodyParser {
    pub(super) fn parse_expr(&mut self, expr: &syn::Expr) -> syn::Result<Expr> {
        let kind = match expr {
            syn::Expr::Lit(literal) => parse_literal(&literal.lit)?,
            syn::Expr::Path(path) => self.parse_path(path)?,
            syn::Expr::Paren(paren) => return self.parse_expr(&paren.expr),
            syn::Expr::Group(group) => return self.parse_expr(&group.expr),
            syn::Expr::Unary(unary) => {
                let op = match unary.op {
                    UnOp::Neg(_) => UnaryOp::Neg,
                    UnOp::Not(_) => UnaryOp::Not,
                    _ => {
                        return Err(syn::Error::new_spanned(
                            unary,
                            "dereferencing is not supported in a kernel; read memory with `load(ptr)`",
                        ));
                    }
                };
                ExprKind::Unary(op, self.parse_boxed(&unary.expr)?)
            }
            syn::Expr::Binary(binary) => {
                let lhs = self.parse_boxed(&binary.left)?;
                let rhs = self.parse_boxed(&binary.right)?;
                match binary_operator(&binary.op) {
                    Some(Operator::Binary(op)) => ExprKind::Binary(op, lhs, rhs),
                    Some(Operator::Compare(op)) => ExprKind::Compare(op, lhs, rhs),
                    None => {
                        return Err(syn::Error::new_spanned(
                            binary,
                            "a compound assignment is a statement, not a value",
                        ));
                    }
                }
            }
            syn::Expr::Cast(cast) => ExprKind::Cast(
                self.parse_boxed(&cast.expr)?,
                self.parse_dtype_type(&cast.ty)?,
            ),
            syn::Expr::Call(call) => self.parse_call(call)?,
            syn::Expr::MethodCall(call) => return self.parse_method_call(call),
            syn::Expr::If(expr_if) => ExprKind::If(Box::new(self.parse_if_value(expr_if)?)),
            unsupported => return Err(unsupported_expression(unsupported)),
        };
        Ok(Expr {
            kind,
            span: expr.span(),
        })
    }

    pub(super) fn parse_boxed(&mut self, expr: &syn::Expr) -> syn::Result<Box<Expr>> {
        self.parse_expr(expr).map(Box::new)
    }

    /// A name, or a float constant of Rust's `f32`/`f64` such as `f32::NEG_INFINITY`.
    fn parse_path(&self, expr_path: &syn::ExprPath) -> syn::Result<ExprKind> {
        if let Some(attribute) = expr_path.attrs.first() {
            return Err(syn::Error::new_spanned(
                attribute,
                "attributes are not supported in a kernel",
            ));
        }
        let path = &expr_path.path;
        if expr_path.qself.is_none() {
            if let Some(name) = path.get_ident() {
                return self.resolve_variable(name).map(ExprKind::Variable);
            }
            if let Some(constant) = float_constant(path) {
                return Ok(ExprKind::FloatConstant(constant));
            }
        }
        Err(syn::Error::new_spanned(
            expr_path,
            "paths are not supported in a kernel, except float constants such as `f32::INFINITY` \
             or `f32::consts::LOG2_E`",
        ))
    }

    fn resolve_variable(&self, name: &Ident) -> syn::Result<Ident> {
        match self.scopes.lookup(name) {
            Some(BindingKind::DTypeParam) => Err(syn::Error::new_spanned(
                name,
                format!(
                    "`{name}` is a dtype parameter, not a value; use it where a dtype is expected, \
                     such as `x.to::<{name}>()`"
                ),
            )),
            Some(_) => Ok(name.clone()),
            None => Err(self.not_found(name)),
        }
    }

    /// A dtype written as a type, as after `as` or in `x.to::<D>()`.
    pub(super) fn parse_dtype_type(&self, ty: &syn::Type) -> syn::Result<DTypeRef> {
        let name = match ty {
            syn::Type::Path(type_path) if type_path.qself.is_none() => type_path.path.get_ident(),
            _ => None,
        };
        name.and_then(|name| self.resolve_dtype(name))
            .ok_or_else(|| dtype_expected(ty))
    }

    /// A dtype written as an expression, as in `zeros([BLOCK], f32)`.
    pub(super) fn parse_dtype_expr(&self, expr: &syn::Expr) -> syn::Result<DTypeRef> {
        let name = match expr {
            syn::Expr::Path(path) if path.qself.is_none() => path.path.get_ident(),
            _ => None,
        };
        name.and_then(|name| self.resolve_dtype(name))
            .ok_or_else(|| dtype_expected(expr))
    }

    fn resolve_dtype(&self, name: &Ident) -> Option<DTypeRef> {
        match self.scopes.lookup(name) {
            Some(BindingKind::DTypeParam) => Some(DTypeRef::Param(name.clone())),
            Some(_) => None,
            None => DType::from_name(&name.to_string()).map(DTypeRef::Fixed),
        }
    }
}

fn dtype_expected(tokens: impl quote::ToTokens) -> syn::Error {
    syn::Error::new_spanned(
        tokens,
        format!(
            "expected a dtype: {} or a type parameter of the kernel",
            DType::NAMES
        ),
    )
}

fn parse_literal(literal: &Lit) -> syn::Result<ExprKind> {
    match literal {
        Lit::Int(int) => {
            if !int.suffix().is_empty() {
                return Err(syn::Error::new_spanned(
                    int,
                    "integer literals in a kernel take no suffix; convert with `as i64` if needed",
                ));
            }
            Ok(ExprKind::Int(int.base10_parse::<i64>()?))
        }
        Lit::Float(float) => {
            if !float.suffix().is_empty() {
                return Err(syn::Error::new_spanned(
                    float,
                    "float literals in a kernel take no suffix; convert with `as f16` if needed",
                ));
            }
            let value = float.base10_parse::<f64>()?;
            if !value.is_finite() {
                return Err(syn::Error::new_spanned(
                    float,
                    "this float literal overflows; write `f32::INFINITY` for infinity",
                ));
            }
            Ok(ExprKind::Float(value))
        }
        Lit::Bool(boolean) => Ok(ExprKind::Bool(boolean.value)),
        Lit::Str(string) => Err(syn::Error::new_spanned(
            string,
            "a string is only allowed as the message of `static_assert`",
        )),
        other => Err(syn::Error::new_spanned(
            other,
            "this literal is not supported in a kernel; write an integer, float or bool",
        )),
    }
}

/// The Rust path of a float constant: `f32::X` and `f64::X` as written, the `consts` modules
/// (`f32::consts::LOG2_E`, which Rust spells `core::f32::consts::LOG2_E`) under `::core`, and
/// `core::f32::..`/`std::f64::..` as written. `None` for any other path.
fn float_constant(path: &syn::Path) -> Option<syn::Path> {
    if path
        .segments
        .iter()
        .any(|segment| !segment.arguments.is_none())
    {
        return None;
    }
    let names: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
    let float_module = |name: &str| name == "f32" || name == "f64";
    match names.as_slice() {
        [first, _] if float_module(first) => Some(path.clone()),
        [first, _, _, ..] if float_module(first) && path.leading_colon.is_none() => {
            Some(syn::parse_quote!(::core::#path))
        }
        [root, module, _, ..] if (root == "core" || root == "std") && float_module(module) => {
            Some(path.clone())
        }
        _ => None,
    }
}

enum Operator {
    Binary(BinaryOp),
    Compare(CmpOp),
}

/// The DSL operator of a Rust binary operator; `None` for compound assignments.
fn binary_operator(op: &BinOp) -> Option<Operator> {
    Some(match op {
        BinOp::Add(_) => Operator::Binary(BinaryOp::Add),
        BinOp::Sub(_) => Operator::Binary(BinaryOp::Sub),
        BinOp::Mul(_) => Operator::Binary(BinaryOp::Mul),
        BinOp::Div(_) => Operator::Binary(BinaryOp::Div),
        BinOp::Rem(_) => Operator::Binary(BinaryOp::Rem),
        BinOp::And(_) | BinOp::BitAnd(_) => Operator::Binary(BinaryOp::And),
        BinOp::Or(_) | BinOp::BitOr(_) => Operator::Binary(BinaryOp::Or),
        BinOp::BitXor(_) => Operator::Binary(BinaryOp::Xor),
        BinOp::Shl(_) => Operator::Binary(BinaryOp::Shl),
        BinOp::Shr(_) => Operator::Binary(BinaryOp::Shr),
        BinOp::Lt(_) => Operator::Compare(CmpOp::Lt),
        BinOp::Le(_) => Operator::Compare(CmpOp::Le),
        BinOp::Gt(_) => Operator::Compare(CmpOp::Gt),
        BinOp::Ge(_) => Operator::Compare(CmpOp::Ge),
        BinOp::Eq(_) => Operator::Compare(CmpOp::Eq),
        BinOp::Ne(_) => Operator::Compare(CmpOp::Ne),
        _ => return None,
    })
}

/// The error for Rust syntax the DSL does not have, saying what to write instead.
fn unsupported_expression(expr: &syn::Expr) -> syn::Error {
    let message = match expr {
        syn::Expr::Index(_) => {
            "indexing is not supported in a kernel; write `x.expand_dims(1)` for Triton's \
             `x[:, None]`, and `load(ptr + offsets)` to read memory"
        }
        syn::Expr::Closure(_) => "closures are not supported in a kernel",
        syn::Expr::Macro(_) => "macros are not supported in a kernel",
        syn::Expr::Struct(_) => "struct literals are not supported in a kernel",
        syn::Expr::Tuple(_) => {
            "tuples are not supported in a kernel, except as what a `#[kernel_fn]` ends with \
             (`-> (A, B)`, ending `(a, b)`) and binds with `let (a, b) = f(..);`"
        }
        syn::Expr::Field(_) => "field access is not supported in a kernel",
        syn::Expr::Reference(_) => "references are not supported in a kernel; use the value itself",
        syn::Expr::Range(_) => {
            "a range is only allowed in a `for` loop; `arange(start, end)` makes a tile of indices"
        }
        syn::Expr::Array(_) | syn::Expr::Repeat(_) => {
            "an array literal is only allowed as a shape, offsets or axes argument, such as \
             `zeros([BLOCK_M, BLOCK_N], f32)`"
        }
        syn::Expr::Block(_) | syn::Expr::Unsafe(_) | syn::Expr::Const(_) => {
            "a block is not a value in a kernel; compute the value with `let` statements before"
        }
        syn::Expr::Match(_) => "`match` is not supported in a kernel; use `if` and `else if`",
        syn::Expr::While(_) | syn::Expr::Loop(_) => {
            "`while` and `loop` are not supported in a kernel; write `for i in start..end`"
        }
        syn::Expr::ForLoop(_) => "a `for` loop is not a value; write it as a statement",
        syn::Expr::Return(_) => {
            "`return` is not supported in a kernel; put the rest of the body in an `if`"
        }
        syn::Expr::Break(_) | syn::Expr::Continue(_) => {
            "`break` and `continue` are not supported in a kernel; loops run their whole range"
        }
        syn::Expr::Assign(_) => "an assignment is a statement, not a value",
        syn::Expr::Let(_) => "`let` is a statement in a kernel, not a value",
        syn::Expr::Try(_) => "`?` is not supported in a kernel",
        syn::Expr::Async(_) | syn::Expr::Await(_) => "`async` is not supported in a kernel",
        _ => "this expression is not supported in a kernel",
    };
    syn::Error::new_spanned(expr, message)
}
