//! A persistent kernel's per-tile loads: a load that only `dot`s read, in the body of the
//! kernel's loop over its tiles ([`OnceLoad::refills`]), is one TMA copy an iteration into a
//! tile of its own, which the producer warpgroup issues as soon as the consumers freed the
//! previous iteration's, so that it runs ahead into the next tile:
//!
//! ```text
//! producer, where the load stands:            consumers:
//!   wait empty(r), parity(iteration) ^ 1        where the tile is first read: wait full(r), parity
//!   arrive.expect_tx full(r); copy by slabs     after its last reader (its `wgmma`s waited for):
//!                                                 arrive empty(r)
//! ```
//!
//! The parity is the loop's iteration count's, `((iv - lower) / step) & 1`: each iteration
//! completes one phase of each barrier. Refilled tiles lie at the bottom of shared memory, at
//! offsets both roles compute alike ([`super::dot::SharedPlan`]).

use kiln_dsl::ir::{Inst as TileInst, Value};

use super::dot::aligned_tile_bytes;
use super::{Lowering, Result, unsupported};
use crate::layout::OnceLoad;
use crate::thread::ir::{IntOp, Op, Reg};

impl Lowering<'_> {
    /// The shared offset of refilled load `rank`'s tile: the refilled tiles before it, in
    /// program order, from 0.
    fn refilled_tile(&self, rank: usize) -> u32 {
        self.layouts
            .tma_once_loads()
            .take(rank)
            .filter(|l| l.refills())
            .map(|l| aligned_tile_bytes(self.kernel, self.layouts, l.value))
            .sum()
    }

    /// The `full` and `empty` barriers of once-load `rank` (the `empty` ones after every
    /// `full` one).
    fn refill_barriers(&mut self, rank: usize) -> [Reg; 2] {
        let loads = self.layouts.tma_once_loads().count();
        [rank, loads + rank].map(|slot| {
            let slot = self.i32_const(slot as i64);
            self.barrier_of(self.once_barriers, slot)
        })
    }

    /// Sets up every refilled load's barriers (thread 0), before the roles split: `full` ones
    /// that the producer's arrival and its copies complete, `empty` ones that every consumer
    /// thread arrives on.
    pub(super) fn init_refill_barriers(&mut self, issuer: Reg) {
        let refilled: Vec<usize> = self
            .layouts
            .tma_once_loads()
            .enumerate()
            .filter(|(_, l)| l.refills())
            .map(|(rank, _)| rank)
            .collect();
        for rank in refilled {
            let [full, empty] = self.refill_barriers(rank);
            for (bar, count) in [(full, 1), (empty, self.threads)] {
                self.emit_effect(Op::MbarrierInit {
                    bar,
                    count,
                    pred: issuer,
                });
            }
        }
    }

    /// The parity of the enclosing loop's iteration, `((iv - lower) / step) & 1`.
    fn iteration_parity(&mut self, inst: &TileInst) -> Result<Reg> {
        let Some([iv, lower, step]) = self.loop_counter else {
            return Err(unsupported(inst, "expected a load refilled in a loop"));
        };
        let count = self.int(IntOp::Sub, iv, lower);
        let count = self.int(IntOp::SDiv, count, step);
        let one = self.i32_const(1);
        Ok(self.int(IntOp::And, count, one))
    }

    /// The producer's copy of refilled load `rank` (the first warp of its warpgroup runs it):
    /// waits until the consumers freed the tile, then copies this iteration's into it.
    pub(super) fn produce_refill(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        rank: usize,
        load: &OnceLoad,
    ) -> Result<()> {
        let parity = self.iteration_parity(inst)?;
        let one = self.i32_const(1);
        // A fresh barrier's phase before the first counts as complete.
        let empty_parity = self.int(IntOp::Xor, parity, one);
        let [full, empty] = self.refill_barriers(rank);
        self.emit_effect(Op::MbarrierWait {
            bar: empty,
            parity: empty_parity,
            warps: None,
        });
        let offset = self.refilled_tile(rank);
        self.copy_whole_tile(inst, ptr, load, offset, full)
    }

    /// The consumers' side of refilled load `rank`: its tile is there once this iteration's
    /// phase of its `full` barrier completes, waited for where it is first read
    /// ([`Self::wait_for_once_loads`]).
    pub(super) fn consume_refill(
        &mut self,
        inst: &TileInst,
        rank: usize,
        load: &OnceLoad,
    ) -> Result<()> {
        let offset = self.refilled_tile(rank);
        self.place_once_tile(inst, load, offset)?;
        let parity = self.iteration_parity(inst)?;
        let [full, _] = self.refill_barriers(rank);
        self.once_loads.push((load.value, Some((full, parity))));
        Ok(())
    }

    /// After the consumers lowered the instruction at pre-order index `index`: frees each
    /// refilled tile it last reads, now, or where the `wgmma` that reads it is waited for.
    pub(super) fn release_refills(&mut self, index: usize, inst: &TileInst) {
        let released: Vec<usize> = self
            .layouts
            .tma_once_loads()
            .enumerate()
            .filter(|(_, l)| l.released_after == Some(index))
            .map(|(rank, _)| rank)
            .collect();
        for rank in released {
            let [_, empty] = self.refill_barriers(rank);
            match inst.results.first() {
                Some(&dot) if self.in_flight.holds(dot) => self.releases.push((dot, empty)),
                _ => self.emit_effect(Op::MbarrierArrive { bar: empty }),
            }
        }
    }

    /// After a `wgmma` wait that completed the `dot`s `done`: frees the refilled tiles they read.
    pub(super) fn release_waited(&mut self, done: &[Value]) {
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.releases)
            .into_iter()
            .partition(|(dot, _)| done.contains(dot));
        self.releases = later;
        for (_, bar) in now {
            self.emit_effect(Op::MbarrierArrive { bar });
        }
    }
}
