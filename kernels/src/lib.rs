//! kiln-kernels: kiln's kernels, written in its tile DSL, and what runs and checks them.
//!
//! Where it sits: the kernels here are `#[kernel]` functions (kiln-macros) that build kiln-dsl IR;
//! today they run on kiln-dsl's CPU interpreter, and kiln-codegen will lower the same IR to PTX.
//!
//! - [`attention`]: FlashAttention forward and the split backward (preprocess, dQ, dK/dV), their
//!   block-size table, call validation and the interpreter launches.
//! - [`general`]: tile kernels that are not attention (GEMM + bias + GELU, row softmax, layernorm,
//!   column sums, transpose), proof that the DSL is a general tile language.
//! - [`reference`]: f64 references, the seeded random source and the per-row error metric.

pub mod attention;
pub mod general;
pub mod reference;
pub mod registry;
