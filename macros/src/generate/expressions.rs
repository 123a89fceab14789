//! Expressions -> Rust expressions of type `Value`. Each builder call evaluates its operands into
//! temporaries first: the builder is borrowed mutably by every call, so calls cannot nest.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};

use super::Generator;
use crate::parse::model::{BinaryOp, CmpOp, DTypeRef, Expr, ExprKind, ReduceOp, UnaryOp};

/// One argument of a builder call.
pub(super) enum Operand<'a> {
    /// A DSL expression, passed as its `Value`.
    Value(&'a Expr),
    /// `Some(value)` or `None`.
    Optional(Option<&'a Expr>),
    /// `&[value, ..]`.
    List(&'a [Expr]),
    /// Tokens passed as they are: an op, a dtype, a message.
    Tokens(TokenStream),
}

impl Operand<'_> {
    /// The DSL expressions of this operand.
    fn exprs(&self) -> impl Iterator<Item = &Expr> {
        let exprs: &[Expr] = match self {
            Operand::Value(expr) | Operand::Optional(Some(expr)) => std::slice::from_ref(*expr),
            Operand::List(exprs) => exprs,
            Operand::Optional(None) | Operand::Tokens(_) => &[],
        };
        exprs.iter()
    }
}

impl Generator {
    pub(super) fn expr(&self, expr: &Expr) -> TokenStream {
        use Operand::{List, Optional, Tokens, Value};
        let dsl = &self.dsl;
        let span = expr.span;
        match &expr.kind {
            ExprKind::Int(value) => {
                let loc = self.loc(span);
                quote_internal!(__kiln.int(#value, #loc))
            }
            ExprKind::Float(value) => {
                let loc = self.loc(span);
                quote_internal!(__kiln.float(#value, #loc))
            }
            ExprKind::Bool(value) => {
                let loc = self.loc(span);
                quote_internal!(__kiln.bool(#value, #loc))
            }
            ExprKind::FloatConstant(path) => {
                let loc = self.loc(span);
                quote_internal!(__kiln.float((#path) as f64, #loc))
            }
            ExprKind::Variable(name) => quote!(#name),
            ExprKind::Unary(op, value) => self.builder_call(
                "unary",
                vec![Tokens(self.unary_op(*op)), Value(value)],
                span,
            ),
            ExprKind::Binary(op, lhs, rhs) => self.builder_call(
                "binary",
                vec![Tokens(self.binary_op(*op)), Value(lhs), Value(rhs)],
                span,
            ),
            ExprKind::Compare(op, lhs, rhs) => self.builder_call(
                "compare",
                vec![Tokens(self.cmp_op(*op)), Value(lhs), Value(rhs)],
                span,
            ),
            ExprKind::Cast(value, dtype) => self.builder_call(
                "cast",
                vec![Value(value), Tokens(self.dtype_ref(dtype))],
                span,
            ),
            ExprKind::ProgramId(axis) => self.builder_call("program_id", vec![Value(axis)], span),
            ExprKind::NumPrograms(axis) => {
                self.builder_call("num_programs", vec![Value(axis)], span)
            }
            ExprKind::Arange(start, end) => {
                self.builder_call("arange", vec![Value(start), Value(end)], span)
            }
            ExprKind::Zeros { shape, dtype } => self.builder_call(
                "zeros",
                vec![List(shape), Tokens(self.dtype_ref(dtype))],
                span,
            ),
            ExprKind::Full {
                shape,
                value,
                dtype,
            } => self.builder_call(
                "full",
                vec![List(shape), Value(value), Tokens(self.dtype_ref(dtype))],
                span,
            ),
            ExprKind::Load { ptr, mask, other } => self.builder_call(
                "load",
                vec![
                    Value(ptr),
                    Optional(mask.as_deref()),
                    Optional(other.as_deref()),
                ],
                span,
            ),
            ExprKind::LoadBlock {
                ptr,
                boundary_check,
            } => self.builder_call("load_block", vec![Value(ptr), List(boundary_check)], span),
            ExprKind::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                block_shape,
                order,
            } => self.builder_call(
                "make_block_ptr",
                vec![
                    Value(base),
                    List(shape),
                    List(strides),
                    List(offsets),
                    List(block_shape),
                    List(order),
                ],
                span,
            ),
            ExprKind::Advance { ptr, offsets } => {
                self.builder_call("advance", vec![Value(ptr), List(offsets)], span)
            }
            ExprKind::Dot { lhs, rhs, acc } => self.builder_call(
                "dot",
                vec![Value(lhs), Value(rhs), Optional(acc.as_deref())],
                span,
            ),
            ExprKind::Trans(value) => self.builder_call("trans", vec![Value(value)], span),
            ExprKind::AtomicArrive(counter) => {
                self.builder_call("atomic_arrive", vec![Value(counter)], span)
            }
            ExprKind::ExpandDims(value, axis) => {
                self.builder_call("expand_dims", vec![Value(value), Value(axis)], span)
            }
            ExprKind::BroadcastTo(value, shape) => {
                self.builder_call("broadcast_to", vec![Value(value), List(shape)], span)
            }
            ExprKind::Reduce(op, value, axis) => self.builder_call(
                "reduce",
                vec![Tokens(self.reduce_op(*op)), Value(value), Value(axis)],
                span,
            ),
            ExprKind::Select(cond, if_true, if_false) => self.builder_call(
                "select",
                vec![Value(cond), Value(if_true), Value(if_false)],
                span,
            ),
            ExprKind::Fma(a, b, c) => {
                self.builder_call("fma", vec![Value(a), Value(b), Value(c)], span)
            }
            ExprKind::Cdiv(lhs, rhs) => {
                self.builder_call("cdiv", vec![Value(lhs), Value(rhs)], span)
            }
            ExprKind::If(if_value) => self.if_value(if_value),
            ExprKind::Call(call) => self.fn_call(call, quote!(#dsl::Value)),
        }
    }

    /// `{ let __kiln_operand_0 = ..; ..; __kiln.method(operands.., loc)? }`
    pub(super) fn builder_call(
        &self,
        method: &str,
        operands: Vec<Operand<'_>>,
        span: Span,
    ) -> TokenStream {
        let method = format_ident!("{method}");
        let (evaluations, arguments) = self.operands(operands);
        let loc = self.loc(span);
        quote_internal!({
            #(#evaluations)*
            __kiln.#method(#(#arguments,)* #loc)?
        })
    }

    /// The operands of a call: the statements that evaluate them into temporaries, in order, and
    /// the tokens of each as an argument.
    pub(super) fn operands(
        &self,
        operands: Vec<Operand<'_>>,
    ) -> (Vec<TokenStream>, Vec<TokenStream>) {
        // An operand that assigns variables (an `if` used as a value whose branches do) must not
        // change what an operand before it read: then variables are read into temporaries too,
        // in order, as Rust evaluates operands.
        let snapshot = operands
            .iter()
            .any(|operand| operand.exprs().any(|expr| !expr.assigned().is_empty()));
        let mut evaluations = Vec::new();
        let mut arguments = Vec::new();
        for operand in operands {
            let argument = match operand {
                Operand::Value(expr) => self.evaluate(expr, snapshot, &mut evaluations),
                Operand::Optional(Some(expr)) => {
                    let value = self.evaluate(expr, snapshot, &mut evaluations);
                    quote_internal!(::core::option::Option::Some(#value))
                }
                Operand::Optional(None) => quote_internal!(::core::option::Option::None),
                Operand::List(exprs) => {
                    let values: Vec<TokenStream> = exprs
                        .iter()
                        .map(|expr| self.evaluate(expr, snapshot, &mut evaluations))
                        .collect();
                    quote_internal!(&[#(#values),*])
                }
                Operand::Tokens(tokens) => tokens,
            };
            arguments.push(argument);
        }
        (evaluations, arguments)
    }

    /// The tokens of `expr`'s value as an argument: a variable as it is (unless `snapshot`),
    /// anything else bound to the next temporary first.
    fn evaluate(
        &self,
        expr: &Expr,
        snapshot: bool,
        evaluations: &mut Vec<TokenStream>,
    ) -> TokenStream {
        if let ExprKind::Variable(name) = &expr.kind
            && !snapshot
        {
            return quote!(#name);
        }
        let temporary = format_ident!(
            "__kiln_operand_{}",
            evaluations.len(),
            span = Span::mixed_site()
        );
        let value = self.expr(expr);
        evaluations.push(quote_internal!(let #temporary = #value;));
        quote!(#temporary)
    }

    /// A dtype in the body: a type parameter is the `DType` variable bound to it in `build`.
    pub(super) fn dtype_ref(&self, dtype: &DTypeRef) -> TokenStream {
        match dtype {
            DTypeRef::Fixed(dtype) => self.dtype(*dtype),
            DTypeRef::Param(name) => quote!(#name),
        }
    }

    fn unary_op(&self, op: UnaryOp) -> TokenStream {
        let dsl = &self.dsl;
        let variant = match op {
            UnaryOp::Neg => quote!(Neg),
            UnaryOp::Not => quote!(Not),
            UnaryOp::Exp => quote!(Exp),
            UnaryOp::Exp2 => quote!(Exp2),
            UnaryOp::Log => quote!(Log),
            UnaryOp::Log2 => quote!(Log2),
            UnaryOp::Tanh => quote!(Tanh),
            UnaryOp::Sqrt => quote!(Sqrt),
            UnaryOp::Rsqrt => quote!(Rsqrt),
            UnaryOp::Abs => quote!(Abs),
        };
        quote!(#dsl::UnaryOp::#variant)
    }

    fn binary_op(&self, op: BinaryOp) -> TokenStream {
        let dsl = &self.dsl;
        let variant = match op {
            BinaryOp::Add => quote!(Add),
            BinaryOp::Sub => quote!(Sub),
            BinaryOp::Mul => quote!(Mul),
            BinaryOp::Div => quote!(Div),
            BinaryOp::Rem => quote!(Rem),
            BinaryOp::Max => quote!(Max),
            BinaryOp::Min => quote!(Min),
            BinaryOp::And => quote!(And),
            BinaryOp::Or => quote!(Or),
            BinaryOp::Xor => quote!(Xor),
            BinaryOp::Shl => quote!(Shl),
            BinaryOp::Shr => quote!(Shr),
        };
        quote!(#dsl::BinaryOp::#variant)
    }

    fn cmp_op(&self, op: CmpOp) -> TokenStream {
        let dsl = &self.dsl;
        let variant = match op {
            CmpOp::Lt => quote!(Lt),
            CmpOp::Le => quote!(Le),
            CmpOp::Gt => quote!(Gt),
            CmpOp::Ge => quote!(Ge),
            CmpOp::Eq => quote!(Eq),
            CmpOp::Ne => quote!(Ne),
        };
        quote!(#dsl::CmpOp::#variant)
    }

    fn reduce_op(&self, op: ReduceOp) -> TokenStream {
        let dsl = &self.dsl;
        let variant = match op {
            ReduceOp::Sum => quote!(Sum),
            ReduceOp::Max => quote!(Max),
            ReduceOp::Min => quote!(Min),
        };
        quote!(#dsl::ReduceOp::#variant)
    }
}
