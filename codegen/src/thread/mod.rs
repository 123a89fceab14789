//! The thread stage: the lowered program, what one thread of a block runs.
//!
//! A small SSA IR with structured control flow, between the layout stage and LLVM: the layout
//! decisions are already made here (a tile value became the registers this thread owns under its
//! layout, positions are arithmetic on thread ids, conversions and reductions are shared-memory
//! stores, barriers and shuffles), and nothing is left to decide after it. Two consumers run it:
//! [`crate::llvm`] translates it op for op into LLVM NVVM IR, and [`crate::emulate`] runs it on
//! the CPU for every thread of a grid. A layout, conversion or reduction bug is therefore a bug of
//! this program, which the emulator catches in CI.
//!
//! Rules every consumer may rely on:
//! - SSA: every [`Reg`] is defined once (a kernel parameter, an instruction result or a region
//!   parameter) before its uses; a register defined in a region is not used outside it.
//! - Types are exact: float arithmetic is f32 only (f16/bf16 values are widened with
//!   [`Cast::FpExt`] and rounded back with [`Cast::FpTrunc`], round to nearest even); an integer
//!   op's operands and result share one type; a bool is `i1` in registers and `i8` in memory.
//! - Control flow is uniform: `for` bounds and `if` conditions are the same in every thread of a
//!   block, so no thread diverges (masks are predicates on loads and stores, never branches).
//! - Shared memory is one block-wide array of [`Program::shared_bytes`]. Tiles staged for `dot`
//!   come first, one region each, live as long as the kernel; above them, the scratch of layout
//!   conversions and cross-warp reductions, each of which stores, waits at a barrier, loads, and
//!   waits again. Writes to a staged tile wait at a barrier for the reads before them, and reads
//!   for the writes (the lowering tracks both, conservatively across loops and branches).
//! - `ldmatrix` and `mma.sync` are warp-wide: every lane of the warp runs them together, as
//!   every instruction here (control flow is uniform).
//!
//! - A pipelined loop's buffers are written only by `cp.async` copies, which land at a
//!   `cp.async.wait_group` of their thread; the loop's own wait and barrier at the top of each
//!   iteration order them with the reads ([`mod@lower`]'s `pipeline` module), not the tracking above.

mod ir;
pub mod lower;
mod text;

pub use ir::{
    Block, Cast, Constant, FloatCmp, FloatOp, Inst, IntCmp, IntOp, MAX_STATIC_SHARED_BYTES, Math,
    Op, Param, Program, Reg, ShuffleMode, Space, Special, TmaCopy, Type, WgmmaA, WgmmaDesc,
    WgmmaStep, grid_control_ptx,
};
pub use lower::lower;
