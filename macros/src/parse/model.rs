//! The typed model of a kernel or `#[kernel_fn]` that parsing produces and generation consumes:
//! its signature, and its body as DSL statements and expressions. Everything here has been
//! validated; every node keeps the span its `Loc` and any error will point at.

use proc_macro2::Span;
use syn::{Attribute, Ident, LitStr, Path, Visibility};

/// A kernel: a `fn` with `#[kiln::kernel]`, parsed.
pub(crate) struct KernelDef {
    pub(crate) name: Ident,
    pub(crate) visibility: Visibility,
    /// Doc comments and `#[cfg]`s, moved onto the generated module.
    pub(crate) kept_attributes: Vec<Attribute>,
    pub(crate) params: Vec<SpecParamDef>,
    pub(crate) args: Vec<ArgDef>,
    pub(crate) body: Block,
}

/// A `#[kernel_fn]`: a DSL function, inlined into the kernel that calls it when that is built.
pub(crate) struct FnDef {
    pub(crate) name: Ident,
    pub(crate) visibility: Visibility,
    /// Doc comments and `#[cfg]`s, moved onto the generated module.
    pub(crate) kept_attributes: Vec<Attribute>,
    /// Its generic parameters: passed by the call's turbofish (as a kernel's are by the `Spec`).
    pub(crate) params: Vec<SpecParamDef>,
    pub(crate) args: Vec<FnArgDef>,
    pub(crate) body: Block,
    pub(crate) results: FnResults,
}

/// An argument of a `#[kernel_fn]`.
pub(crate) struct FnArgDef {
    pub(crate) name: Ident,
    /// `mut x: ..`: the body may assign the argument (its own variable, not the caller's).
    pub(crate) mutable: bool,
    pub(crate) ty: FnType,
}

/// What a `#[kernel_fn]` declares an argument or result to be; checked when a call is built.
pub(crate) enum FnType {
    /// `i32`, `f16`, `bool`, `T`..: a scalar of this dtype.
    Scalar(DTypeRef),
    /// `Ptr<D>`: a pointer or a tile of pointers.
    Ptr(DTypeRef),
    /// `BlockPtr<D>`.
    BlockPtr(DTypeRef),
    /// `Tile`, `Tile<D>`: a tile (or scalar) of numbers.
    Tile(Option<DTypeRef>),
    /// `_`: anything.
    Any,
}

/// What a `#[kernel_fn]` gives: its declared result types with the values its body ends with.
pub(crate) enum FnResults {
    /// No `-> ..`.
    Nothing,
    /// `-> T`, and the body's tail expression.
    One(FnType, Expr),
    /// `-> (A, B, ..)`, and the body's tail tuple `(a, b, ..)`.
    Tuple(Vec<(FnType, Expr)>),
}

/// A call of a `#[kernel_fn]` from a kernel or another `#[kernel_fn]`.
pub(crate) struct FnCall {
    /// The function's path as written, without its generic arguments; resolved from the module
    /// that holds the caller.
    pub(crate) path: Path,
    /// The turbofish's values, in order.
    pub(crate) generics: Vec<GenericValue>,
    pub(crate) args: Vec<Expr>,
    /// The call (its first token).
    pub(crate) span: Span,
}

/// A generic argument of a call: a dtype for a type parameter, a constant for a `const` one.
pub(crate) enum GenericValue {
    /// A dtype name or the caller's type parameter, and where it is written.
    DType(DTypeRef, Span),
    Const(Expr),
}

/// A generic parameter of the kernel's `fn`.
pub(crate) struct SpecParamDef {
    pub(crate) name: Ident,
    pub(crate) kind: SpecKind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpecKind {
    DType,
    Int,
    Bool,
}

/// An argument of the kernel's `fn`.
pub(crate) struct ArgDef {
    pub(crate) name: Ident,
    /// `mut x: ..`: the body may assign the argument.
    pub(crate) mutable: bool,
    pub(crate) ty: ArgType,
}

pub(crate) enum ArgType {
    Ptr(DTypeRef),
    Scalar(DTypeRef),
}

/// A dtype as written in the kernel: a fixed one, or a type parameter of the `fn`.
#[derive(Clone)]
pub(crate) enum DTypeRef {
    Fixed(DType),
    Param(Ident),
}

/// The dtypes the DSL spells, by their DSL names (`bool` is the IR's `i1`).
#[derive(Clone, Copy)]
pub(crate) enum DType {
    F16,
    BF16,
    F32,
    I32,
    I64,
    Bool,
}

impl DType {
    pub(crate) const NAMES: &'static str = "f16, bf16, f32, i32, i64, bool";

    pub(crate) fn from_name(name: &str) -> Option<DType> {
        Some(match name {
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "f32" => DType::F32,
            "i32" => DType::I32,
            "i64" => DType::I64,
            "bool" => DType::Bool,
            _ => return None,
        })
    }
}

/// A sequence of statements with its own scope.
pub(crate) struct Block {
    pub(crate) stmts: Vec<Stmt>,
}

pub(crate) enum Stmt {
    /// `let x = value;` and `let mut x = value;`
    Let {
        name: Ident,
        value: Expr,
    },
    /// `x = value;`, and `x op= e;` with `value` as `x op e`.
    Assign {
        name: Ident,
        value: Expr,
    },
    /// `store(ptr, value)`, `store(ptr, value, mask)`.
    Store {
        ptr: Expr,
        value: Expr,
        mask: Option<Expr>,
        span: Span,
    },
    /// `atomic_add(ptr, value)`, `atomic_add(ptr, value, mask)`.
    AtomicAdd {
        ptr: Expr,
        value: Expr,
        mask: Option<Expr>,
        span: Span,
    },
    /// `atomic_add(block_ptr, value, [axes])`.
    AtomicAddBlock {
        ptr: Expr,
        value: Expr,
        boundary_check: Vec<Expr>,
        span: Span,
    },
    /// `store(block_ptr, value, [axes])`.
    StoreBlock {
        ptr: Expr,
        value: Expr,
        boundary_check: Vec<Expr>,
        span: Span,
    },
    /// `static_assert(cond)`, `static_assert(cond, "message")`.
    StaticAssert {
        cond: Expr,
        message: Option<LitStr>,
        span: Span,
    },
    /// `wait_for_prior_grids()` (`wait`) or `launch_dependent_grids()`.
    GridControl {
        wait: bool,
        span: Span,
    },
    For(ForLoop),
    If(IfElse),
    /// `f(..);`: a call of a `#[kernel_fn]` that gives nothing.
    Call(FnCall),
    /// `let (a, b) = f(..);`: the values of a `#[kernel_fn]` that gives a tuple; `None` for `_`.
    LetTuple {
        names: Vec<Option<Ident>>,
        call: FnCall,
    },
}

/// `for i in lower..upper { body }` or `for i in (lower..upper).step_by(step) { body }`.
pub(crate) struct ForLoop {
    /// `None` for `for _ in ..`.
    pub(crate) induction: Option<Ident>,
    pub(crate) lower: Expr,
    pub(crate) upper: Expr,
    pub(crate) step: Option<Expr>,
    /// Variables declared before the loop that its body assigns, in order of first assignment.
    pub(crate) carried: Vec<Ident>,
    pub(crate) body: Block,
    /// The `for` keyword.
    pub(crate) span: Span,
}

/// `if cond { .. }`, `if cond { .. } else { .. }`; an `else if` is an else block holding one `if`.
pub(crate) struct IfElse {
    pub(crate) cond: Expr,
    pub(crate) then_block: Block,
    pub(crate) else_block: Option<Block>,
    /// Variables declared before the `if` that either branch assigns, in order of first assignment.
    pub(crate) carried: Vec<Ident>,
    /// The `if` keyword.
    pub(crate) span: Span,
}

/// `if cond { ..; a } else { ..; b }` used as a value (a `let` value, an operand, an argument); an
/// `else if` is an else branch whose value is another `IfValue`.
pub(crate) struct IfValue {
    pub(crate) cond: Expr,
    pub(crate) then_branch: ValueBlock,
    pub(crate) else_branch: ValueBlock,
    /// Variables declared before the `if` that either branch assigns, in order of first assignment.
    pub(crate) carried: Vec<Ident>,
    /// The `if` keyword.
    pub(crate) span: Span,
}

/// A branch of an `if` used as a value: its statements, then the expression it ends with.
pub(crate) struct ValueBlock {
    pub(crate) block: Block,
    pub(crate) value: Expr,
}

/// An expression: it evaluates to one IR value.
pub(crate) struct Expr {
    pub(crate) kind: ExprKind,
    /// Where the expression starts (for a method call, the method's name).
    pub(crate) span: Span,
}

pub(crate) enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    /// The Rust path of a float constant such as `f32::NEG_INFINITY`, evaluated by Rust.
    FloatConstant(Path),
    /// A kernel argument, specialisation constant, `let` binding or loop variable.
    Variable(Ident),
    Unary(UnaryOp, Box<Expr>),
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    Compare(CmpOp, Box<Expr>, Box<Expr>),
    /// `x as D`, `cast(x, D)`, `x.to::<D>()`.
    Cast(Box<Expr>, DTypeRef),
    ProgramId(Box<Expr>),
    NumPrograms(Box<Expr>),
    Arange(Box<Expr>, Box<Expr>),
    Zeros {
        shape: Vec<Expr>,
        dtype: DTypeRef,
    },
    Full {
        shape: Vec<Expr>,
        value: Box<Expr>,
        dtype: DTypeRef,
    },
    Load {
        ptr: Box<Expr>,
        mask: Option<Box<Expr>>,
        other: Option<Box<Expr>>,
    },
    LoadBlock {
        ptr: Box<Expr>,
        boundary_check: Vec<Expr>,
    },
    MakeBlockPtr {
        base: Box<Expr>,
        shape: Vec<Expr>,
        strides: Vec<Expr>,
        offsets: Vec<Expr>,
        block_shape: Vec<Expr>,
        order: Vec<Expr>,
    },
    Advance {
        ptr: Box<Expr>,
        offsets: Vec<Expr>,
    },
    Dot {
        lhs: Box<Expr>,
        rhs: Box<Expr>,
        acc: Option<Box<Expr>>,
    },
    Trans(Box<Expr>),
    /// `atomic_arrive(counter)`.
    AtomicArrive(Box<Expr>),
    ExpandDims(Box<Expr>, Box<Expr>),
    BroadcastTo(Box<Expr>, Vec<Expr>),
    Reduce(ReduceOp, Box<Expr>, Box<Expr>),
    /// `where_(cond, if_true, if_false)`.
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// `fma(a, b, c)`.
    Fma(Box<Expr>, Box<Expr>, Box<Expr>),
    Cdiv(Box<Expr>, Box<Expr>),
    If(Box<IfValue>),
    /// A call of a `#[kernel_fn]` that gives one value.
    Call(Box<FnCall>),
}

impl Expr {
    /// The variables declared outside this expression that evaluating it assigns (in the branches
    /// of an `if` used as a value), so that an operand read before it is read before they change.
    pub(crate) fn assigned(&self) -> Vec<&Ident> {
        let mut assigned = Vec::new();
        self.collect_assigned(&mut assigned);
        assigned
    }

    fn collect_assigned<'a>(&'a self, assigned: &mut Vec<&'a Ident>) {
        // An `if` carries every outer variable its branches assign, nested `if`s included.
        if let ExprKind::If(if_value) = &self.kind {
            if_value.cond.collect_assigned(assigned);
            assigned.extend(&if_value.carried);
            return;
        }
        for operand in self.kind.operands() {
            operand.collect_assigned(assigned);
        }
    }
}

impl ExprKind {
    /// The expressions this one evaluates first, in order (an `if` evaluates only its condition
    /// before choosing a branch).
    fn operands(&self) -> Vec<&Expr> {
        match self {
            ExprKind::Int(_)
            | ExprKind::Float(_)
            | ExprKind::Bool(_)
            | ExprKind::FloatConstant(_)
            | ExprKind::Variable(_) => Vec::new(),
            ExprKind::Unary(_, value)
            | ExprKind::Cast(value, _)
            | ExprKind::ProgramId(value)
            | ExprKind::NumPrograms(value)
            | ExprKind::Trans(value)
            | ExprKind::AtomicArrive(value) => vec![&**value],
            ExprKind::Binary(_, lhs, rhs)
            | ExprKind::Compare(_, lhs, rhs)
            | ExprKind::Arange(lhs, rhs)
            | ExprKind::ExpandDims(lhs, rhs)
            | ExprKind::Reduce(_, lhs, rhs)
            | ExprKind::Cdiv(lhs, rhs) => vec![&**lhs, &**rhs],
            ExprKind::Zeros { shape, .. } => shape.iter().collect(),
            ExprKind::Full { shape, value, .. } => shape.iter().chain([&**value]).collect(),
            ExprKind::Load { ptr, mask, other } => [Some(ptr), mask.as_ref(), other.as_ref()]
                .into_iter()
                .flatten()
                .map(|expr| &**expr)
                .collect(),
            ExprKind::LoadBlock {
                ptr,
                boundary_check,
            } => [&**ptr].into_iter().chain(boundary_check).collect(),
            ExprKind::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                block_shape,
                order,
            } => [&**base]
                .into_iter()
                .chain(shape)
                .chain(strides)
                .chain(offsets)
                .chain(block_shape)
                .chain(order)
                .collect(),
            ExprKind::Advance { ptr, offsets } => [&**ptr].into_iter().chain(offsets).collect(),
            ExprKind::Dot { lhs, rhs, acc } => [Some(lhs), Some(rhs), acc.as_ref()]
                .into_iter()
                .flatten()
                .map(|expr| &**expr)
                .collect(),
            ExprKind::BroadcastTo(value, shape) => [&**value].into_iter().chain(shape).collect(),
            ExprKind::Select(cond, if_true, if_false) => vec![&**cond, &**if_true, &**if_false],
            ExprKind::Fma(a, b, c) => vec![&**a, &**b, &**c],
            ExprKind::If(if_value) => vec![&if_value.cond],
            ExprKind::Call(call) => call.operands(),
        }
    }
}

impl FnCall {
    /// The expressions a call evaluates, in order: its `const` generic values, then its arguments.
    /// (The function cannot assign its caller's variables: it has its own scope.)
    pub(crate) fn operands(&self) -> Vec<&Expr> {
        let generics = self.generics.iter().filter_map(|generic| match generic {
            GenericValue::Const(expr) => Some(expr),
            GenericValue::DType(..) => None,
        });
        generics.chain(&self.args).collect()
    }
}

/// Mirrors `kiln_dsl::UnaryOp` (this crate cannot depend on kiln-dsl, which depends on it).
#[derive(Clone, Copy)]
pub(crate) enum UnaryOp {
    Neg,
    Not,
    Exp,
    Exp2,
    Log,
    Log2,
    Tanh,
    Sqrt,
    Rsqrt,
    Abs,
}

/// Mirrors `kiln_dsl::BinaryOp`.
#[derive(Clone, Copy)]
pub(crate) enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Max,
    Min,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

/// Mirrors `kiln_dsl::CmpOp`.
#[derive(Clone, Copy)]
pub(crate) enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

/// Mirrors `kiln_dsl::ReduceOp`.
#[derive(Clone, Copy)]
pub(crate) enum ReduceOp {
    Sum,
    Max,
    Min,
}
