//! The tile IR: what a specialised kernel is once built and checked.
//!
//! Rules the builder guarantees and every consumer (printer, interpreter, codegen) may rely on:
//! - SSA: every [`Value`] is defined once, by a kernel argument, a region parameter or an
//!   instruction result, before its uses; values defined in a region are not used outside it.
//! - Types are explicit and exact: operands of elementwise ops already have the result's shape
//!   and dtype (the builder inserts `splat`, `broadcast` and `cast`), so no op promotes or
//!   broadcasts implicitly.
//! - Shapes are static and every tile dimension is a power of two.
//! - Control flow is structured: `for` and `if` own regions that end in `yield`, whose operands
//!   become the op's results (a `for` body's parameters are the induction variable followed by the
//!   loop-carried values).
//! - Specialisation parameters are gone: they were folded into constants and types.

use crate::error::Loc;
use crate::signature::{KernelSignature, Spec};
use crate::types::{DType, Type};

/// An SSA value: an index into [`Kernel::values`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Value(pub u32);

impl Value {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A scalar constant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Constant {
    Int(i64),
    Float(f64),
    Bool(bool),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    /// Logical not on i1, bitwise not on integers.
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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    /// True division on floats; truncating division on integers (Rust's `/`).
    Div,
    /// The remainder of truncating division (Rust's `%`).
    Rem,
    /// Elementwise maximum; on floats a NaN operand loses (IEEE maxNum), as on the GPU.
    Max,
    Min,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmpOp {
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// One operation. Results are listed in the [`Inst`] that holds it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Constant(Constant),
    /// The index of this program along grid axis 0, 1 or 2 (i32).
    ProgramId {
        axis: u8,
    },
    NumPrograms {
        axis: u8,
    },
    /// `[start, start + 1, ..., end - 1]` as i32.
    Arange {
        start: i64,
        end: i64,
    },
    /// A tile of the result shape filled with a scalar.
    Splat {
        value: Value,
    },
    /// Repeats the size-1 dimensions of a tile of the same rank up to the result shape.
    Broadcast {
        value: Value,
    },
    /// Inserts a size-1 dimension at `axis` (Triton's `x[:, None]` is `axis = 1`).
    ExpandDims {
        value: Value,
        axis: usize,
    },
    /// Swaps the two dimensions of a 2-D tile.
    Trans {
        value: Value,
    },
    /// Converts to the result dtype: float rounding is to nearest even, float to int truncates.
    Cast {
        value: Value,
    },
    Unary {
        op: UnaryOp,
        value: Value,
    },
    Binary {
        op: BinaryOp,
        lhs: Value,
        rhs: Value,
    },
    Compare {
        op: CmpOp,
        lhs: Value,
        rhs: Value,
    },
    Select {
        cond: Value,
        if_true: Value,
        if_false: Value,
    },
    /// `a * b + c` on f32, rounded once (`fma.rn.f32`).
    Fma {
        a: Value,
        b: Value,
        c: Value,
    },
    /// Reduces `axis` away; floats accumulate in f32.
    Reduce {
        op: ReduceOp,
        value: Value,
        axis: usize,
    },
    /// `lhs [M, K] @ rhs [K, N] + acc [M, N]`, products and sums in f32.
    Dot {
        lhs: Value,
        rhs: Value,
        acc: Value,
    },
    /// Pointer arithmetic: `ptr + offset` elements.
    AddPtr {
        ptr: Value,
        offset: Value,
    },
    /// Reads through a tile of pointers; masked-off lanes read `other` (zero when absent).
    Load {
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
    },
    Store {
        ptr: Value,
        value: Value,
        mask: Option<Value>,
    },
    /// Adds `value` to the f32 elements at `ptr`, each addition atomic (a `red.global.add.f32`);
    /// lanes where `mask` is false add nothing. Gives no result, so no old value is read back.
    AtomicAdd {
        ptr: Value,
        value: Value,
        mask: Option<Value>,
    },
    /// Adds 1 to the i32 at the scalar `ptr` once for the program, after every write the program
    /// made before it is visible GPU-wide, and gives the value before (a scalar i32), after
    /// which the writes other programs made before their arrivals are visible to it: the program
    /// that reads `n - 1` is the last of `n` to arrive.
    AtomicArrive {
        ptr: Value,
    },
    /// A window of `block_shape` at `offsets` into an array of `shape` with `strides` (all i64).
    /// The array may have more dimensions than the block (`shape`, `strides` and `offsets` one
    /// per array dimension, `order` one per block dimension): the block covers the last ones,
    /// and the leading offsets, inside the shape, index the others.
    MakeBlockPtr {
        base: Value,
        shape: Vec<Value>,
        strides: Vec<Value>,
        offsets: Vec<Value>,
        order: Vec<usize>,
    },
    /// Moves a block pointer's window by `offsets` (i64).
    Advance {
        ptr: Value,
        offsets: Vec<Value>,
    },
    /// Reads a block; dimensions in `boundary_check` are bounds-checked and pad with zero.
    LoadBlock {
        ptr: Value,
        boundary_check: Vec<usize>,
    },
    StoreBlock {
        ptr: Value,
        value: Value,
        boundary_check: Vec<usize>,
    },
    /// [`Op::AtomicAdd`] through a block pointer: along the axes in `boundary_check`, elements
    /// outside the array add nothing.
    AtomicAddBlock {
        ptr: Value,
        value: Value,
        boundary_check: Vec<usize>,
    },
    /// `for iv in (lower..upper).step_by(step)`, carrying `init` through the body's yield.
    For {
        lower: Value,
        upper: Value,
        step: Value,
        init: Vec<Value>,
        body: Region,
    },
    If {
        cond: Value,
        then_region: Region,
        else_region: Region,
    },
    /// Ends a region; its operands are the region's results.
    Yield {
        values: Vec<Value>,
    },
    /// Programmatic dependent launch (sm_90), in the kernel body before any memory access
    /// (the builder refuses it elsewhere); kiln-codegen makes it the program's first
    /// instruction.
    GridControl(GridControl),
}

/// What a program says to the launches around it on its stream, where the runtime launches a
/// kernel that waits ([`GridControl::WaitForPriorGrids`]) as a programmatic dependent of the one
/// before (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`): such a kernel's programs may
/// start while the kernel before is still running, so that its launch and start overlap that
/// kernel's end. Below sm_90 both are nothing, and launches are serialized as usual.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GridControl {
    /// `griddepcontrol.wait`: waits until the kernels this one depends on have completed and
    /// their memory writes are visible.
    WaitForPriorGrids,
    /// `griddepcontrol.launch_dependents`: once every program of this kernel has said so (or
    /// exited), a dependent kernel may start its programs; they still wait for this one's end
    /// before reading what it wrote.
    LaunchDependentGrids,
}

impl Op {
    /// Whether the op writes global memory: a store or an atomic.
    pub fn writes_memory(&self) -> bool {
        matches!(
            self,
            Op::Store { .. }
                | Op::AtomicAdd { .. }
                | Op::AtomicArrive { .. }
                | Op::StoreBlock { .. }
                | Op::AtomicAddBlock { .. }
        )
    }

    /// Whether the op reads or writes global memory.
    pub fn accesses_memory(&self) -> bool {
        self.writes_memory() || matches!(self, Op::Load { .. } | Op::LoadBlock { .. })
    }

    /// The op's name as the printer spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Constant(_) => "const",
            Op::ProgramId { .. } => "program_id",
            Op::NumPrograms { .. } => "num_programs",
            Op::Arange { .. } => "arange",
            Op::Splat { .. } => "splat",
            Op::Broadcast { .. } => "broadcast",
            Op::ExpandDims { .. } => "expand_dims",
            Op::Trans { .. } => "trans",
            Op::Cast { .. } => "cast",
            Op::Unary { op, .. } => match op {
                UnaryOp::Neg => "neg",
                UnaryOp::Not => "not",
                UnaryOp::Exp => "exp",
                UnaryOp::Exp2 => "exp2",
                UnaryOp::Log => "log",
                UnaryOp::Log2 => "log2",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Rsqrt => "rsqrt",
                UnaryOp::Abs => "abs",
            },
            Op::Binary { op, .. } => match op {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Rem => "rem",
                BinaryOp::Max => "max",
                BinaryOp::Min => "min",
                BinaryOp::And => "and",
                BinaryOp::Or => "or",
                BinaryOp::Xor => "xor",
                BinaryOp::Shl => "shl",
                BinaryOp::Shr => "shr",
            },
            Op::Compare { op, .. } => match op {
                CmpOp::Lt => "cmp_lt",
                CmpOp::Le => "cmp_le",
                CmpOp::Gt => "cmp_gt",
                CmpOp::Ge => "cmp_ge",
                CmpOp::Eq => "cmp_eq",
                CmpOp::Ne => "cmp_ne",
            },
            Op::Select { .. } => "select",
            Op::Fma { .. } => "fma",
            Op::Reduce { op, .. } => match op {
                ReduceOp::Sum => "reduce_sum",
                ReduceOp::Max => "reduce_max",
                ReduceOp::Min => "reduce_min",
            },
            Op::Dot { .. } => "dot",
            Op::AddPtr { .. } => "add_ptr",
            Op::Load { .. } => "load",
            Op::Store { .. } => "store",
            Op::AtomicAdd { .. } => "atomic_add",
            Op::AtomicArrive { .. } => "atomic_arrive",
            Op::MakeBlockPtr { .. } => "make_block_ptr",
            Op::Advance { .. } => "advance",
            Op::LoadBlock { .. } => "load_block",
            Op::StoreBlock { .. } => "store_block",
            Op::AtomicAddBlock { .. } => "atomic_add_block",
            Op::For { .. } => "for",
            Op::If { .. } => "if",
            Op::Yield { .. } => "yield",
            Op::GridControl(GridControl::WaitForPriorGrids) => "wait_for_prior_grids",
            Op::GridControl(GridControl::LaunchDependentGrids) => "launch_dependent_grids",
        }
    }
}

/// An op with its results and the DSL source position it came from.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub op: Op,
    pub results: Vec<Value>,
    pub loc: Loc,
}

/// A straight-line list of instructions with parameters; nested regions give structured control flow.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Region {
    pub params: Vec<Value>,
    pub insts: Vec<Inst>,
}

/// What is known of a value: its type and, when the DSL bound it with `let`, its name.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    pub ty: Type,
    pub name: Option<String>,
}

/// A specialised, checked kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Kernel {
    pub signature: &'static KernelSignature,
    pub spec: Spec,
    /// One value per signature argument, in order.
    pub args: Vec<Value>,
    pub body: Region,
    pub values: Vec<ValueInfo>,
}

impl Kernel {
    pub fn name(&self) -> &'static str {
        self.signature.name
    }

    pub fn ty(&self, value: Value) -> &Type {
        &self.values[value.index()].ty
    }

    /// The dtype of a tensor of numbers (panics on pointers: the builder never asks that of them).
    pub fn dtype(&self, value: Value) -> DType {
        self.ty(value)
            .dtype()
            .expect("the builder only asks the dtype of number tensors")
    }
}
