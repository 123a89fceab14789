//! kiln: a Triton-style tile language embedded in Rust, compiled through LLVM to PTX, and the
//! FlashAttention kernels written in it.
//!
//! This facade is what users depend on: `#[kiln::kernel]` writes a kernel, `#[kiln::kernel_fn]` a
//! DSL function that kernels call (inlined when they are built), `use kiln::prelude::*`
//! brings what a kernel's host code names, [`dsl`] is the tile IR and its CPU interpreter,
//! [`kernels`] holds the attention kernels (prebuilt for the GPU) and their references, and
//! [`runtime`] the CUDA side (with the `jit` feature, user kernels compiled on first launch).
//!
//! ```
//! use kiln::prelude::*;
//!
//! #[kiln::kernel]
//! fn scale<T, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32, factor: f32) {
//!     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
//!     let mask = offs < n;
//!     store(out + offs, load(x + offs, mask) * factor, mask);
//! }
//!
//! let spec = Spec::new().dtype("T", F32).int("BLOCK", 16);
//! println!("{}", scale::build(&spec).unwrap()); // the tile IR
//! let x = HostBuffer::from_f32(F32, &[1.0, 2.0, 3.0]);
//! let out = HostBuffer::poisoned(F32, 3);
//! // Typed: `n` is an i32 and `factor` an f32; the buffers' dtypes are checked at launch.
//! scale::launch(&Interpreter, &spec, Grid::new(1, 1, 1), &x, &out, 3, 2.0).unwrap();
//! assert_eq!(out.to_f32(), [2.0, 4.0, 6.0]);
//! ```

pub use kiln_dsl as dsl;
pub use kiln_dsl::{kernel, kernel_fn};
pub use kiln_kernels as kernels;
/// Devices, buffers and launches; with the `jit` feature, `runtime::jit::Jit` compiles user
/// kernels for the GPU on first launch.
pub use kiln_runtime as runtime;

/// What host code that builds and runs kernels names.
pub mod prelude {
    pub use kiln_dsl::prelude::*;
    pub use kiln_dsl::{Grid, HostBuffer, Interpreter, KernelArg, Launcher};
}
