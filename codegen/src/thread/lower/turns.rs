//! Warpgroups taking turns at the tensor cores (FlashAttention-3's ping-pong). In a program of
//! several warpgroups, each runs a TMA loop's body on its own rows; left alone, they issue
//! their `wgmma`s at once, wait for them together, and leave the tensor cores idle while all
//! of them compute on the results. Taking turns, warpgroup w issues an iteration's opening
//! `wgmma`s only once warpgroup w - 1 has issued its own, so that one warpgroup's products run
//! while the others compute. Warpgroup w's turn is named barrier 1 + w, of two warpgroups'
//! threads (the one taking the turn and the one passing it):
//!
//! ```text
//! bar.arrive 1, 256 (the last warpgroup)      // warpgroup 0 goes first
//! for ...:
//!     ... the body up to its first wgmma ...
//!     bar.sync 1 + w, 256                     // w's turn: w - 1 has issued
//!     ... the body's opening wgmmas ...
//!     bar.arrive 1 + (w + 1) % n, 256         // w + 1's turn
//!     ... the rest of the body ...
//! bar.sync 1, 256 (warpgroup 0)               // the last turn passed, taken back
//! bar.sync 0                                  // the loop's end (pipeline_drain)
//! ```
//!
//! Between its `bar.sync` and `bar.arrive` a warpgroup waits for nothing else (a `bar.sync 0`
//! the lowering would put there passes the turn first), so a turn it takes is always passed
//! on; the last one is taken back before the loop's closing `bar.sync` so that the next loop
//! finds the barriers at rest. The turns order no memory: the TMA loop's `full` and `empty`
//! barriers do ([`super::pipeline`]). The emulator replays every warp's waits apart, one
//! schedule per emulated launch, and reports a deadlock ([`crate::emulate`]).
//!
//! Consumers of a producer ([`super::producer`]) that stage no tile among its buffers (a TMA
//! store's tile of its own aside, which each warpgroup meets its own warps for) meet at no
//! barrier of them all: the producer's `full` and `empty` barriers order every buffer they read, so
//! their turns run through the whole program instead (FlashAttention-3's across tiles). The
//! last warpgroup arrives once at the program's top, every group of `wgmma`s a warpgroup
//! issues, at any depth, takes a turn and passes it, and warpgroup 0 takes the last one back
//! at the end: a warpgroup ahead runs on into what follows a loop (a persistent kernel's next
//! tile) while the others finish it. The warpgroups walk the same control flow (a branch's
//! condition is a scalar, the same in every thread), so their groups pair up in order.

use super::{Lowering, Result};
use crate::layout::THREADS_PER_WARP;
use crate::layout::wgmma::WARPS_PER_WARPGROUP;
use crate::thread::ir::{IntCmp, IntOp, Op, Reg, Type};
use crate::{CodegenError, Stage};

/// Threads of a warpgroup.
pub(super) const WARPGROUP_THREADS: u32 = WARPS_PER_WARPGROUP * THREADS_PER_WARP;

/// Named barrier of warpgroup 0's turn (0 is `bar.sync 0`'s); warpgroup w's is this + w.
/// Those after the last warpgroup's are free for other uses.
pub(super) const FIRST_TURN: i64 = 1;

/// The first of the two named barriers, by iteration parity, where the owner of a `dot` of one
/// warpgroup meets the other (`wgmma.rs`): after two warpgroups' turns and their bands' (a TMA
/// store's, `FIRST_TURN + 2 + w`).
pub(super) const OWNER_BARRIERS: i64 = FIRST_TURN + 4;

/// One pipelined loop's turns while its body is lowered, or the whole program's.
pub(super) struct Turns {
    /// The named barrier of this warpgroup's turn, and of the next one's.
    own: Reg,
    next: Reg,
    /// The depth of the body's block: only its own opening `wgmma`s take the turn; `None`
    /// where the turns run through the program and every group of `wgmma`s takes one.
    depth: Option<usize>,
    turn: Turn,
}

/// Where the body being lowered is in its turn.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Turn {
    Waiting,
    Holding,
    Passed,
}

impl Lowering<'_> {
    /// Before a TMA loop whose body issues `wgmma`s: where warpgroups take turns, and no
    /// enclosing loop's body is taking them, gives warpgroup 0 the first turn. Returns whether
    /// the loop takes turns ([`Self::end_turns`] after it).
    pub(super) fn begin_turns(&mut self) -> bool {
        if !self.layouts.warpgroups_take_turns() || self.turns.is_some() {
            return false;
        }
        self.start_turns(Some(self.blocks.len() + 1));
        true
    }

    /// At the consumers' top: where their warpgroups take turns and stage no tile among the
    /// buffers ([`crate::layout::LayoutAssignment::stages_tiles`]), starts turns that run
    /// through their program ([`Self::end_turns`] at its end). Returns whether it did.
    pub(super) fn begin_program_turns(&mut self) -> bool {
        if !self.layouts.warpgroups_take_turns() || self.layouts.stages_tiles() {
            return false;
        }
        self.start_turns(None);
        true
    }

    /// Whether the consumers run apart through the whole program: they meet at no barrier
    /// after a TMA loop or before one ([`super::pipeline`]).
    pub(super) fn consumers_run_apart(&self) -> bool {
        self.turns.as_ref().is_some_and(|t| t.depth.is_none())
    }

    /// This thread's warpgroup, `tid / 128` (a consumer's, from 0, under a producer).
    pub(super) fn warpgroup(&mut self) -> Reg {
        let shift = self.i32_const(WARPGROUP_THREADS.trailing_zeros() as i64);
        self.int(IntOp::LShr, self.tid, shift)
    }

    /// Gives warpgroup 0 the first turn: the last warpgroup arrives on its barrier.
    fn start_turns(&mut self, depth: Option<usize>) {
        let warpgroups = (self.threads / WARPGROUP_THREADS) as i64;
        let warpgroup = self.warpgroup();
        let first = self.i32_const(FIRST_TURN);
        let own = self.int(IntOp::Add, warpgroup, first);
        let last = self.i32_const(warpgroups - 1);
        let is_last = self.icmp(IntCmp::Eq, warpgroup, last);
        let one = self.i32_const(1);
        let after = self.int(IntOp::Add, own, one);
        let next = self.emit(
            Op::Select {
                cond: is_last,
                if_true: first,
                if_false: after,
            },
            Type::I32,
        );
        self.emit_effect(Op::NamedBarrier {
            id: first,
            threads: 2 * WARPGROUP_THREADS,
            wait: false,
            pred: Some(is_last),
        });
        self.turns = Some(Turns {
            own,
            next,
            depth,
            turn: Turn::Waiting,
        });
    }

    /// Before the first `wgmma` of the body taking turns: waits for this warpgroup's.
    pub(super) fn take_turn(&mut self) {
        self.move_turn(Turn::Waiting);
    }

    /// After the body's opening `wgmma`s (where its held-back copies go): passes the turn on.
    pub(super) fn pass_turn(&mut self) {
        self.move_turn(Turn::Holding);
    }

    /// Moves the turn of the body being lowered on from `from`, in the body's own block:
    /// waiting, it waits on this warpgroup's barrier; holding, it arrives on the next one's
    /// (and waits for the next turn where the turns run through the program).
    fn move_turn(&mut self, from: Turn) {
        let depth = self.blocks.len();
        let Some(turns) = self.turns.as_mut() else {
            return;
        };
        if turns.depth.is_some_and(|d| d != depth) || turns.turn != from {
            return;
        }
        let (to, id, wait) = match (from, turns.depth) {
            (Turn::Waiting, _) => (Turn::Holding, turns.own, true),
            (_, Some(_)) => (Turn::Passed, turns.next, false),
            (_, None) => (Turn::Waiting, turns.next, false),
        };
        turns.turn = to;
        self.emit_effect(Op::NamedBarrier {
            id,
            threads: 2 * WARPGROUP_THREADS,
            wait,
            pred: None,
        });
    }

    /// At the end of the body: its opening `wgmma`s took the turn and passed it on (a loop
    /// takes turns only where its body issues `wgmma`s at its top), so that every iteration
    /// takes one.
    pub(super) fn close_turn(&self) -> Result<()> {
        match self.turns.as_ref().map(|t| t.turn) {
            None | Some(Turn::Passed) => Ok(()),
            Some(_) => Err(CodegenError::internal(
                Stage::Thread,
                "a loop body that takes turns ends without having taken and passed one",
            )),
        }
    }

    /// After the loop, before its closing `bar.sync` (or at the end of a program its turns run
    /// through): warpgroup 0 takes back the turn the last warpgroup passed it last.
    pub(super) fn end_turns(&mut self) {
        if self.turns.take().is_none() {
            return;
        }
        let size = self.i32_const(WARPGROUP_THREADS as i64);
        let is_first = self.icmp(IntCmp::Ult, self.tid, size);
        let first = self.i32_const(FIRST_TURN);
        self.emit_effect(Op::NamedBarrier {
            id: first,
            threads: 2 * WARPGROUP_THREADS,
            wait: true,
            pred: Some(is_first),
        });
    }
}
