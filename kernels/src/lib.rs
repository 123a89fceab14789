//! kiln-kernels: kiln's kernels, written in its tile DSL, and what runs and checks them.
//!
//! Where it sits: the kernels here are `#[kernel]` functions (kiln-macros) that build kiln-dsl IR,
//! which kiln-dsl's CPU interpreter runs and kiln-codegen lowers to PTX. The attention kernels'
//! PTX ships inside this crate (`kernels/ptx/`, made by kiln-codegen's tests), so that linking it
//! needs no LLVM: only the NVIDIA driver, through kiln-runtime, at run time.
//!
//! - [`attention`]: FlashAttention forward and backward (split: dQ with the row statistics, then
//!   dK/dV; fused: preprocessing, dK/dV adding dQ, dQ conversion), their configuration table per
//!   target, call validation, the interpreter launches, the prebuilt PTX
//!   and the GPU API ([`attention::gpu`]).
//! - [`mod@bench`]: the GPU benchmark at the FlashAttention setup, with a check against f64.
//! - [`tune`]: the configuration search behind `kiln tune`: candidates compiled by the caller,
//!   checked against f64 and timed on the GPU.
//! - [`capi`]: the C interface (`libkiln_kernels.so` / `.a`, header `kernels/include/kiln.h`).
//! - [`general`]: tile kernels that are not attention (GEMM + bias + GELU, row softmax, layernorm,
//!   column sums, transpose), proof that the DSL is a general tile language.
//! - [`mod@reference`]: f64 references, the seeded random source and the per-row error metric.

pub mod attention;
pub mod bench;
#[allow(
    non_camel_case_types,
    reason = "the C interface's type names are fixed by ../shared/c-abi.md"
)]
pub mod capi;
pub mod general;
pub mod reference;
pub mod registry;
pub mod tune;
