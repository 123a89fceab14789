//! kiln-dsl: the tile IR and everything about it that needs no GPU.
//!
//! Where it sits: `#[kiln::kernel]` (kiln-macros) turns a Rust `fn` into calls of this crate's
//! [`Builder`], and `#[kiln::kernel_fn]` one into a function a kernel's calls inline (see
//! [`Builder::call_fn`]); building at a [`Spec`] gives a checked [`Kernel`] (the IR in [`ir`]),
//! which the CPU [`interp`]reter runs and kiln-codegen lowers to PTX. The interpreter defines what
//! a kernel means; the GPU agrees with it within rounding.
//!
//! - [`types`]: dtypes and value types; [`ir`]: ops, instructions, regions, the IR's rules.
//! - [`builder`]: one method per DSL construct; all shape/type checks live in its `semantic` module.
//! - [`printer`]: the text form (`Display for Kernel`); [`passes`]: folding and dead-code removal.
//! - [`interp`]: runs a kernel over a grid on host buffers with the GPU's rounding.
//! - [`launch`]: arguments and the [`Launcher`] trait of the typed `launch` functions.
//! - [`target`]: the GPU architectures, which kernels' specialisations are chosen per.

// The macro's generated code names `::kiln_dsl`, inside this crate too.
#[allow(
    unused_extern_crates,
    reason = "the macro names ::kiln_dsl in this crate's tests too"
)]
extern crate self as kiln_dsl;

pub mod builder;
pub mod error;
pub mod interp;

pub mod ir;
pub mod launch;
pub mod passes;
pub mod printer;
pub mod signature;
pub mod target;
pub mod tensor_map;
pub mod types;

pub use builder::{Builder, FnResult, FnType, ForScope, IfScope};
pub use error::{Error, Loc, Result};
pub use interp::{Grid, HostBuffer, KernelArg, run};
pub use launch::{Arg, Interpreter, KernelDef, Launcher};

pub use ir::{BinaryOp, CmpOp, GridControl, Kernel, ReduceOp, UnaryOp, Value};
pub use kiln_macros::{kernel, kernel_fn};
pub use signature::{
    ArgDecl, ArgType, DTypeRef, KernelSignature, Spec, SpecKind, SpecParam, SpecValue,
};
pub use target::{Target, UnknownTarget};
pub use tensor_map::{MapScalar, TensorMapParams, TensorMapSpec};
pub use types::DType;

/// What a kernel author's host code imports: the attributes, specs and dtypes.
pub mod prelude {
    pub use crate::types::DType::{BF16, F16, F32, I1, I32, I64};
    pub use crate::{DType, Spec, Target};
    pub use crate::{kernel, kernel_fn};
}
