//! Launching a kernel: its arguments, and the [`Launcher`] trait behind the typed `launch`
//! function `#[kiln::kernel]` generates for every kernel. The CPU [`Interpreter`] is one
//! launcher (host buffers); kiln-runtime's JIT is another (device buffers), so the same typed
//! call runs a kernel on either.

use std::fmt;

use crate::error::Result;
use crate::interp::{Grid, HostBuffer, run};
use crate::ir::Kernel;
use crate::signature::{KernelSignature, Spec};

/// One argument of a launch, in the order of the kernel's signature: a buffer of the
/// launcher's kind, or a scalar.
pub enum Arg<'a, B> {
    Buffer(&'a B),
    I32(i32),
    I64(i64),
    F32(f32),
}

// By hand: a derive would ask `B: Clone`, but only the reference is copied.
impl<B> Clone for Arg<'_, B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Arg<'_, B> {}

impl<B: fmt::Debug> fmt::Debug for Arg<'_, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arg::Buffer(b) => f.debug_tuple("Buffer").field(b).finish(),
            Arg::I32(v) => f.debug_tuple("I32").field(v).finish(),
            Arg::I64(v) => f.debug_tuple("I64").field(v).finish(),
            Arg::F32(v) => f.debug_tuple("F32").field(v).finish(),
        }
    }
}

impl<B> Arg<'_, B> {
    /// The value of an integer argument (`None` for a buffer or a float).
    pub fn int(&self) -> Option<i64> {
        match *self {
            Arg::I32(v) => Some(v as i64),
            Arg::I64(v) => Some(v),
            Arg::Buffer(_) | Arg::F32(_) => None,
        }
    }
}

impl<B> From<i32> for Arg<'_, B> {
    fn from(v: i32) -> Self {
        Arg::I32(v)
    }
}

impl<B> From<i64> for Arg<'_, B> {
    fn from(v: i64) -> Self {
        Arg::I64(v)
    }
}

impl<B> From<f32> for Arg<'_, B> {
    fn from(v: f32) -> Self {
        Arg::F32(v)
    }
}

/// A kernel as launchers take it: its signature and its builder (`#[kiln::kernel]` generates
/// `KERNEL` for each kernel).
#[derive(Debug)]
pub struct KernelDef {
    pub signature: &'static KernelSignature,
    pub build: fn(&Spec) -> Result<Kernel>,
}

/// Something that runs kernels on buffers of its kind.
pub trait Launcher {
    type Buffer;
    type Error: From<crate::Error>;

    /// Builds `kernel` at `spec` (or finds it built) and runs it over `grid` on `args`, which
    /// must match the kernel's arguments (checked here).
    fn launch(
        &self,
        kernel: &KernelDef,
        spec: &Spec,
        grid: Grid,
        args: &[Arg<'_, Self::Buffer>],
    ) -> std::result::Result<(), Self::Error>;
}

/// The CPU interpreter as a launcher: builds the kernel at each launch and runs it on host
/// buffers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interpreter;

impl Launcher for Interpreter {
    type Buffer = HostBuffer;
    type Error = crate::Error;

    fn launch(
        &self,
        kernel: &KernelDef,
        spec: &Spec,
        grid: Grid,
        args: &[Arg<'_, HostBuffer>],
    ) -> Result<()> {
        run(&(kernel.build)(spec)?, grid, args)
    }
}
