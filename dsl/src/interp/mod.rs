//! The CPU interpreter: runs a checked [`Kernel`] over a grid of programs on [`HostBuffer`]s, with
//! the GPU's semantics (f16/bf16 rounding at casts, loads, stores and arithmetic; f32 `dot`;
//! IEEE infinities; wrapping i32). It defines what a kernel means: codegen must agree with it.
//!
//! Each op runs as a native loop over its whole tile; programs run in parallel. An unmasked access
//! outside a buffer is an [`Error::Runtime`] naming the op and its DSL source line.

mod memory;
mod program;
mod tile;

use rayon::prelude::*;

pub use memory::HostBuffer;

use crate::error::{Error, Result};
use crate::ir::Kernel;
use crate::types::{DType, Elem, Type};

/// The number of programs along each grid axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grid(pub [u32; 3]);

impl Grid {
    pub fn new(x: u32, y: u32, z: u32) -> Grid {
        Grid([x, y, z])
    }

    pub fn programs(self) -> usize {
        self.0.iter().map(|&n| n as usize).product()
    }

    /// Why a GPU could not launch this grid, if it could not: at most 2^31 - 1 programs along x
    /// and 65535 along y and z (CUDA's limits, which the interpreter and the emulator keep too).
    pub fn refusal(self) -> Option<String> {
        let [x, y, z] = self.0;
        (x > i32::MAX as u32 || y > 65535 || z > 65535).then(|| {
            format!(
                "a grid of {x} x {y} x {z} programs is past CUDA's limits (2^31 - 1 along x, \
                 65535 along y and z)"
            )
        })
    }
}

/// One argument of an interpreter launch, matching the kernel's signature in order.
pub type KernelArg<'a> = crate::launch::Arg<'a, HostBuffer>;

/// Runs `kernel` once per program of `grid`, in parallel; the first fault stops the launch.
pub fn run(kernel: &Kernel, grid: Grid, args: &[KernelArg<'_>]) -> Result<()> {
    if let Some(message) = grid.refusal() {
        return Err(Error::Launch {
            kernel: kernel.name().to_string(),
            message,
        });
    }
    let launch = program::Launch::new(kernel, grid, check_args(kernel, args)?);
    (0..grid.programs())
        .into_par_iter()
        .try_for_each(|linear| launch.run_program(linear))
}

/// Matches `args` against the kernel's arguments: count, pointers to the right dtype, scalars of
/// the right type.
fn check_args<'a>(kernel: &Kernel, args: &[KernelArg<'a>]) -> Result<Vec<KernelArg<'a>>> {
    let error = |message: String| Error::Launch {
        kernel: kernel.name().to_string(),
        message,
    };
    if args.len() != kernel.args.len() {
        return Err(error(format!(
            "it takes {} arguments, got {}",
            kernel.args.len(),
            args.len()
        )));
    }
    for ((arg, &value), decl) in args.iter().zip(&kernel.args).zip(kernel.signature.args) {
        let ty = kernel.ty(value);
        let ok = match (arg, ty) {
            (
                KernelArg::Buffer(buffer),
                Type::Tensor {
                    elem: Elem::Ptr(pointee),
                    ..
                },
            ) => buffer.dtype() == *pointee,
            (KernelArg::I32(_), t) => t == &Type::scalar(DType::I32),
            (KernelArg::I64(_), t) => t == &Type::scalar(DType::I64),
            (KernelArg::F32(_), t) => t == &Type::scalar(DType::F32),
            _ => false,
        };
        if !ok {
            let got = match arg {
                KernelArg::Buffer(buffer) => format!("a buffer of {}", buffer.dtype()),
                KernelArg::I32(v) => format!("i32 {v}"),
                KernelArg::I64(v) => format!("i64 {v}"),
                KernelArg::F32(v) => format!("f32 {v}"),
            };
            return Err(error(format!(
                "argument `{}` is {ty}, got {got}",
                decl.name
            )));
        }
    }
    Ok(args.to_vec())
}
