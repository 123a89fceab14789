//! The emulator: runs a thread program ([`crate::thread`]) for a whole grid on the CPU, on the
//! interpreter's [`HostBuffer`](kiln_dsl::HostBuffer)s, the way the GPU runs the PTX translated from it. No LLVM is
//! involved: what it runs is the program the llir stage translates op for op.
//!
//! How it models the GPU:
//! - **Threads**: every thread of a block has its own registers; the block runs in lockstep, one
//!   instruction for all its threads at a time (control flow is uniform, which it checks), but
//!   where a branch splits it by whole warps: warps that skip a branch wait while the others
//!   run it, and where both sides run code (a producer warpgroup and its consumers) each side
//!   runs in a context of its own, one at a time, passing the turn on where it waits on an
//!   `mbarrier` phase not yet complete; all of them waiting is a deadlock.
//! - **Warps**: threads `32 w .. 32 w + 31` form warp `w`; a shuffle reads the source lane's
//!   register from the same instruction, as `shfl.sync` over a full warp does.
//! - **Shared memory**: one byte array per block, of the program's size, initially unwritten.
//!   Barriers divide time into phases; within a phase a byte that one thread writes and another
//!   reads or writes is a race, reported as an error, and so is a read of a byte never written.
//!   A missing barrier fails here even though lockstep execution would have hidden it.
//! - **Global memory**: each buffer argument gets its own range of addresses; an access outside
//!   a buffer, misaligned, or of another element size is an error naming the buffer.
//! - **Numbers**: f32 arithmetic is IEEE (as `add.rn.f32` and friends, no fma contraction);
//!   casts round to nearest even; `ex2.approx.ftz`, `lg2.approx.ftz` and `tanh.approx` are
//!   Rust's f32 `exp2`, `log2` and `tanh` with subnormals flushed as `.ftz` does. The GPU's
//!   approximations differ from those by at most 2 ulp (`ex2`), 2^-22 absolute (`lg2`) and
//!   2^-11 relative (`tanh`): results that go through them agree with the GPU within that, all
//!   others exactly.
//! - **`cp.async`**: a copy reads global memory when issued and lands in shared memory when a
//!   `cp.async.wait_group` of its thread retires its group; until then its bytes are in flight
//!   and any access to them is an error (a read before the wait), as is a kernel that ends with
//!   copies in flight. Landing is a write by the issuing thread: other threads see it after the
//!   next barrier.
//! - **Tensor cores**: `ldmatrix` and `mma.sync` move and multiply exactly the elements the
//!   fragment maps of [`crate::layout::mma`] name. An mma's 16 products are exact; the emulator
//!   sums them in f64 with the accumulator and rounds once to f32, while the GPU adds them in an
//!   order and with intermediate truncation of its own: a `dot` agrees with the GPU (and with the
//!   interpreter, which adds one product at a time in f32) to a few f32 ulp of the magnitudes it
//!   sums, not bit for bit.
//!
//! Blocks run in parallel (they share only global memory, as on the GPU).

mod apart;
mod block;
mod memory;
mod replay;
mod tma;

use std::fmt;

use kiln_dsl::{Grid, KernelArg, Loc};
use rayon::prelude::*;

use crate::thread::Program;
use memory::Global;

/// Why an emulated launch failed: what, where in the DSL source, and in which thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmulationError {
    pub message: String,
    /// The tile op the failing instruction came from.
    pub loc: Option<Loc>,
    pub block: [u32; 3],
    pub thread: Option<u32>,
}

impl fmt::Display for EmulationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [x, y, z] = self.block;
        write!(f, "emulator: {} in block ({x}, {y}, {z})", self.message)?;
        if let Some(thread) = self.thread {
            write!(f, ", thread {thread}")?;
        }
        if let Some(loc) = self.loc {
            write!(f, "\n  --> {loc}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EmulationError {}

/// Runs `program` once per block of `grid` on `args` (the kernel's arguments, in order), as the
/// GPU would run its PTX. Buffers are written in place.
pub fn run(program: &Program, grid: Grid, args: &[KernelArg<'_>]) -> Result<(), EmulationError> {
    let launch_error = |message: String| EmulationError {
        message,
        loc: None,
        block: [0; 3],
        thread: None,
    };
    if args.len() != program.params.len() {
        return Err(launch_error(format!(
            "expected {} arguments, got {}",
            program.params.len(),
            args.len()
        )));
    }
    // What the compile assumed of the arguments: a launch that breaks it would misalign vectors.
    for &(index, n) in &program.assumptions {
        // Buffers start at multiples of 2^40 here.
        let Some(value) = args.get(index).and_then(KernelArg::int) else {
            continue;
        };
        if value % n as i64 != 0 {
            return Err(launch_error(format!(
                "argument `{}` is {value}, but the kernel was compiled assuming a multiple of {n}",
                program.params[index].name
            )));
        }
    }
    let global = Global::new(&program.params, args);
    let params = global.param_values(args);
    // The tensor maps the launch would encode, from the same arguments.
    let maps = program
        .tensor_maps
        .iter()
        .map(|spec| {
            let int = |i: usize| args.get(i).and_then(KernelArg::int);
            spec.resolve(params[spec.base], int).map_err(launch_error)
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(message) = grid.refusal() {
        return Err(launch_error(message));
    }
    let [gx, gy, gz] = grid.0;
    (0..grid.programs()).into_par_iter().try_for_each(|linear| {
        let ctaid = [
            (linear % gx as usize) as u32,
            ((linear / gx as usize) % gy as usize) as u32,
            (linear / (gx as usize * gy as usize)) as u32,
        ];
        block::run_block(program, &global, &params, &maps, ctaid, [gx, gy, gz])
    })
}
