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
//! Where shared memory allows ([`super::dot::SharedPlan`]'s `refill_buffers`), each such load
//! takes two tiles by turns, so that the producer copies the next iteration's while the
//! consumers still read this one's: iteration `i` (counted `(iv - lower) / step`) uses tile and
//! barriers `i % buffers`, and waits for their phase `(i / buffers) & 1`, each use completing one
//! phase of each. Refilled tiles lie at the bottom of shared memory, at offsets both roles
//! compute alike.
//!
//! Refilled loads that fill one slot of the ring the loop's TMA loops stream through
//! ([`OnceLoad::ring`], the persistent forward's first K and last V tiles) take that slot
//! instead: the producer waits for the slot's `empty` phase and arrives on its `full` barrier
//! expecting all of them at the first, copies each into its buffer of the slot, and moves the
//! ring on after the last; the consumers wait on the slot's `full` barrier where one is first
//! read and arrive on its `empty` one once the last of them is freed. Their tiles need no
//! shared memory of their own, and the ring runs on from one tile into the next.

use kiln_dsl::ir::{Inst as TileInst, Value};

use super::dot::{SharedBase, SharedTile, aligned_tile_bytes, refilled_bytes, tile_bytes};
use super::pipeline::MBARRIER_BYTES;
use super::{Lowering, Result, memory_type, unsupported};
use crate::layout::{OnceLoad, THREADS_PER_WARP};
use crate::thread::ir::{IntCmp, IntOp, Op, Reg};
use crate::{CodegenError, Stage};

/// The ring where a tile's top takes its slot: each of its loads' first buffer and bytes, its
/// stages, its first `full` and `empty` barriers, and the slot and phase it stands at.
struct RingHere {
    buffers: Vec<(u32, u32)>,
    stages: u32,
    full: u32,
    empty: u32,
    slot: Reg,
    phase: Reg,
}

/// The ring's slot the refilled loads of a tile's top share, while the consumers free it: its
/// `full` and `empty` barriers, and how many of those loads are still to be freed.
#[derive(Clone, Copy)]
pub(super) struct RingSlot {
    full: Reg,
    empty: Reg,
    left: usize,
}

impl Lowering<'_> {
    /// The shared offset of refilled load `rank`'s first tile: the refilled tiles before it,
    /// in program order, from 0.
    fn refilled_tile(&self, rank: usize) -> u32 {
        refilled_bytes(self.kernel, self.layouts, self.refill_buffers, rank)
    }

    /// The `mbarrier` of once-load barrier `index` (a load's rank; an `empty` one's after every
    /// `full` one), for its tile `slot` (an i32 register).
    pub(super) fn once_barrier(&mut self, index: usize, slot: Reg) -> Reg {
        let first = self.once_barriers + index as u32 * self.refill_buffers * MBARRIER_BYTES;
        self.barrier_of(first, slot)
    }

    /// The `full` and `empty` barriers of once-load `rank`'s tile `slot`.
    fn refill_barriers(&mut self, rank: usize, slot: Reg) -> [Reg; 2] {
        let loads = self.layouts.tma_once_loads().count();
        [rank, loads + rank].map(|index| self.once_barrier(index, slot))
    }

    /// Sets up every refilled load's barriers (thread 0), before the roles split: `full` ones
    /// that the producer's arrival and its copies complete, `empty` ones that every consumer
    /// thread arrives on.
    pub(super) fn init_refill_barriers(&mut self, issuer: Reg) {
        let refilled: Vec<usize> = self
            .layouts
            .tma_once_loads()
            .enumerate()
            .filter(|(_, l)| l.refills() && l.has_tile())
            .map(|(rank, _)| rank)
            .collect();
        for rank in refilled {
            for slot in 0..self.refill_buffers {
                let slot = self.i32_const(slot as i64);
                let [full, empty] = self.refill_barriers(rank, slot);
                for (bar, count) in [(full, 1), (empty, self.threads)] {
                    self.emit_effect(Op::MbarrierInit {
                        bar,
                        count,
                        pred: issuer,
                    });
                }
            }
        }
    }

    /// The tile a refilled load of the enclosing loop's iteration `i = (iv - lower) / step`
    /// takes, and the parity of the phase its barriers complete: `i % buffers` and
    /// `(i / buffers) & 1`.
    fn iteration_slot(&mut self, inst: &TileInst) -> Result<[Reg; 2]> {
        let Some([iv, lower, step]) = self.loop_counter else {
            return Err(unsupported(inst, "expected a load refilled in a loop"));
        };
        let count = self.int(IntOp::Sub, iv, lower);
        let count = self.int(IntOp::SDiv, count, step);
        let one = self.i32_const(1);
        if self.refill_buffers == 1 {
            let slot = self.i32_const(0);
            return Ok([slot, self.int(IntOp::And, count, one)]);
        }
        let buffers = self.i32_const(self.refill_buffers as i64);
        let slot = self.int(IntOp::SRem, count, buffers);
        let round = self.int(IntOp::SDiv, count, buffers);
        Ok([slot, self.int(IntOp::And, round, one)])
    }

    /// The producer's copy of refilled load `rank` (the first warp of its warpgroup runs it):
    /// waits until the consumers freed this iteration's tile, then copies into it.
    pub(super) fn produce_refill(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        rank: usize,
        load: &OnceLoad,
    ) -> Result<()> {
        if let Some(index) = load.ring {
            return self.produce_into_ring(inst, ptr, index, load);
        }
        let [slot, parity] = self.iteration_slot(inst)?;
        let one = self.i32_const(1);
        // A fresh barrier's phase before the first counts as complete.
        let empty_parity = self.int(IntOp::Xor, parity, one);
        let [full, empty] = self.refill_barriers(rank, slot);
        self.emit_effect(Op::MbarrierWait {
            bar: empty,
            parity: empty_parity,
            warps: None,
        });
        let first = self.refilled_tile(rank);
        let bytes = aligned_tile_bytes(self.kernel, self.layouts, load.value);
        let tile = self.buffer_of(first, bytes, slot);
        self.copy_whole_tile(inst, ptr, load, tile, full)
    }

    /// The consumers' side of refilled load `rank`: this iteration's tile is there once its
    /// `full` barrier's phase completes, waited for where it is first read
    /// ([`Self::wait_for_once_loads`]).
    pub(super) fn consume_refill(
        &mut self,
        inst: &TileInst,
        rank: usize,
        load: &OnceLoad,
    ) -> Result<()> {
        if let Some(index) = load.ring {
            return self.consume_from_ring(inst, index, load);
        }
        let first = self.refilled_tile(rank);
        let [slot, parity] = self.iteration_slot(inst)?;
        let base = if self.refill_buffers == 1 {
            SharedBase::Fixed(first)
        } else {
            SharedBase::Slot {
                buffers: first,
                bytes: aligned_tile_bytes(self.kernel, self.layouts, load.value),
                slot,
            }
        };
        self.place_once_tile(inst, load, base)?;
        let [full, _] = self.refill_barriers(rank, slot);
        self.once_loads.push((load.value, Some((full, parity))));
        Ok(())
    }

    /// After the consumers lowered the instruction at pre-order index `index`: frees each
    /// refilled tile it last reads, now, or where the `wgmma` that reads it is waited for.
    pub(super) fn release_refills(&mut self, index: usize, inst: &TileInst) -> Result<()> {
        let released: Vec<(usize, bool)> = self
            .layouts
            .tma_once_loads()
            .enumerate()
            .filter(|(_, l)| l.released_after == Some(index))
            .map(|(rank, l)| (rank, l.has_tile()))
            .collect();
        for (rank, own_tile) in released {
            // A tile of the ring's slot frees the slot's barrier, once all of them are freed.
            let empty = match (own_tile, self.ring_slot) {
                (true, _) => {
                    let [slot, _] = self.iteration_slot(inst)?;
                    self.refill_barriers(rank, slot)[1]
                }
                (false, Some(slot)) => slot.empty,
                (false, None) => {
                    return Err(CodegenError::internal(
                        Stage::Thread,
                        "a tile of the ring's slot freed with no slot taken",
                    ));
                }
            };
            match inst.results.first() {
                Some(&dot) if self.in_flight.holds(dot) => self.releases.push((dot, empty)),
                _ => self.free_refilled(empty),
            }
        }
        Ok(())
    }

    /// After a `wgmma` wait that completed the `dot`s `done`: frees the refilled tiles they read.
    pub(super) fn release_waited(&mut self, done: &[Value]) {
        let (now, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.releases)
            .into_iter()
            .partition(|(dot, _)| done.contains(dot));
        self.releases = later;
        for (_, bar) in now {
            self.free_refilled(bar);
        }
    }

    /// Frees a refilled tile whose `empty` barrier is `bar`: arrives on it, or for a tile of the
    /// ring's slot, once the slot's last tile is freed.
    fn free_refilled(&mut self, bar: Reg) {
        if let Some(slot) = self.ring_slot.as_mut()
            && slot.empty == bar
        {
            slot.left -= 1;
            if slot.left > 0 {
                return;
            }
            self.ring_slot = None;
        }
        self.emit_effect(Op::MbarrierArrive { bar });
    }

    /// The ring where the next TMA loop takes it (what that loop's prologue will reserve,
    /// [`Self::pipeline_prologue`]: at a tile loop's top no loop's buffers are reserved yet, the
    /// tile loop being no pipelined loop, and every TMA loop's are the same), at the slot and
    /// phase where the last one left it.
    fn ring_here(&self, inst: &TileInst) -> Result<RingHere> {
        let Some((_, ring)) = self.layouts.pipelines().find(|(_, p)| p.uses_tma()) else {
            return Err(unsupported(inst, "expected a ring of TMA buffers"));
        };
        let Some([slot, phase]) = self.ring else {
            return Err(unsupported(inst, "expected a loop carrying the ring"));
        };
        let buffers = self.loop_buffers(ring);
        let full = self.next_barrier;
        Ok(RingHere {
            buffers,
            stages: ring.stages,
            full,
            empty: full + ring.stages * MBARRIER_BYTES,
            slot,
            phase,
        })
    }

    /// After the slot's load `index`: the last of them moves the ring on to its next slot.
    fn leave_slot(&mut self, ring: &RingHere, index: usize) {
        if index + 1 == ring.buffers.len() {
            let next = self.advance_ring(ring.stages, &[ring.slot, ring.phase], None);
            self.ring = Some([next[0], next[1]]);
        }
    }

    /// The producer's copy of ring-refilled load `load` (the buffer of the ring's load `index`)
    /// into the ring's current slot; the first of the slot's loads waits for the slot to be
    /// freed and arrives expecting all of them, the last moves the ring on.
    fn produce_into_ring(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        index: usize,
        load: &OnceLoad,
    ) -> Result<()> {
        let ring = self.ring_here(inst)?;
        let (slot, phase) = (ring.slot, ring.phase);
        let zero = self.i32_const(0);
        let issuer = self.icmp(IntCmp::Eq, self.tid, zero);
        let warp_size = self.i32_const(THREADS_PER_WARP as i64);
        let issuing_warp = self.icmp(IntCmp::Ult, self.tid, warp_size);
        let full_bar = self.barrier_of(ring.full, slot);
        if index == 0 {
            let one = self.i32_const(1);
            // A fresh barrier's phase before the first counts as complete.
            let parity = self.int(IntOp::Xor, phase, one);
            let empty_bar = self.barrier_of(ring.empty, slot);
            self.emit_effect(Op::MbarrierWait {
                bar: empty_bar,
                parity,
                warps: Some(issuing_warp),
            });
            let bytes = self
                .layouts
                .tma_once_loads()
                .filter(|l| !l.has_tile())
                .map(|l| tile_bytes(self.kernel, l.value))
                .sum();
            self.emit_effect(Op::MbarrierArriveExpectTx {
                bar: full_bar,
                bytes,
                pred: issuer,
            });
        }
        let (first, bytes) = ring.buffers[index];
        let tile = self.buffer_of(first, bytes, slot);
        let block = super::memory::BlockRegs::from_regs(&self.regs(ptr)?);
        let crate::layout::TmaLoad { map, leading } = &load.tma;
        let copies = self.tma_copies(inst, tile, &block, *map, leading, load.value)?;
        self.emit_tma_loads(copies, full_bar, issuing_warp);
        self.leave_slot(&ring, index);
        Ok(())
    }

    /// The consumers' side of ring-refilled load `load`: its tile is the ring's current slot's
    /// buffer of load `index`, there once the slot's `full` phase completes (waited for where it
    /// is first read); the first of the slot's loads sets up its freeing, the last moves the
    /// ring on.
    fn consume_from_ring(&mut self, inst: &TileInst, index: usize, load: &OnceLoad) -> Result<()> {
        let ring = self.ring_here(inst)?;
        let value = load.value;
        let [rows, cols] = <[usize; 2]>::try_from(self.shape(value))
            .map_err(|_| unsupported(inst, "expected a 2-D tile to copy with TMA"))?;
        let (first, bytes) = ring.buffers[index];
        self.shared_tiles.insert(
            value,
            SharedTile {
                base: SharedBase::Slot {
                    buffers: first,
                    bytes,
                    slot: ring.slot,
                },
                layout: load.shared.swizzled([rows, cols]),
                elem: memory_type(self.dtype(value)),
            },
        );
        if index == 0 {
            let full = self.barrier_of(ring.full, ring.slot);
            let empty = self.barrier_of(ring.empty, ring.slot);
            self.ring_slot = Some(RingSlot {
                full,
                empty,
                left: ring.buffers.len(),
            });
        }
        let Some(RingSlot { full, .. }) = self.ring_slot else {
            return Err(unsupported(
                inst,
                "expected the ring's slot taken by its first load",
            ));
        };
        self.once_loads.push((value, Some((full, ring.phase))));
        self.leave_slot(&ring, index);
        Ok(())
    }
}
