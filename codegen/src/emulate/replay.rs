//! The block's waits replayed warp by warp. Lockstep cannot show whether warps that wait on
//! different things could all go on: warpgroups taking turns each wait on a named barrier of
//! their own, which the other arrives on, and warp 0 waits for a buffer's `empty` barrier
//! that every thread arrives on. So in a program with named barriers or plain `mbarrier`
//! arrivals every warp's barrier and `mbarrier` operations are logged in its order, and at the
//! block's end replayed with the GPU's rules, each warp running until it waits for a phase
//! that is not complete: a deadlock, a named barrier whose warps count its threads
//! differently, one left with arrivals of a phase nobody completed, or an `mbarrier` used
//! where none is initialised, is an error. The replay is one schedule (the lowest warp first,
//! each until it waits), not every one the GPU may take.
//!
//! TMA copies are taken to land as soon as they are issued: nothing but their own issue
//! delays them, and a copy waited for before it was issued is the lockstep run's error.

use std::collections::HashMap;

use crate::layout::THREADS_PER_WARP;

/// A warp's use of an `mbarrier` at shared byte `bar` that is not initialised by then (or
/// invalidated already) once warps run apart.
fn no_mbarrier(warp: usize, bar: u64) -> String {
    format!(
        "once warps run apart, warp {warp} uses the mbarrier at shared byte {bar} where it is \
         not initialised"
    )
}

/// One warp's barrier or `mbarrier` operation.
#[derive(Clone, Copy, Debug)]
pub(super) enum Event {
    /// `bar.sync id, threads` (`wait`) or `bar.arrive id, threads`; `bar.sync 0` is barrier 0
    /// counting every thread of the block.
    Named {
        id: u32,
        threads: u32,
        wait: bool,
    },
    MbarrierInit {
        bar: u64,
        count: u32,
    },
    /// One lane's arrival on the current phase.
    MbarrierArrive {
        bar: u64,
    },
    MbarrierWait {
        bar: u64,
        parity: u32,
    },
    MbarrierInval {
        bar: u64,
    },
}

/// Every warp's events, in its order.
pub(super) struct Log {
    warps: Vec<Vec<Event>>,
}

/// A named barrier's current phase: its arrivals so far, and how many phases completed.
#[derive(Default)]
struct NamedPhase {
    threads: u32,
    arrived: u32,
    completed: u64,
}

/// An `mbarrier`: arrivals each phase, those still pending, the current phase's parity.
struct Mbarrier {
    count: u32,
    pending: u32,
    parity: u32,
}

/// What a warp waits for.
#[derive(Clone, Copy, Debug)]
enum Waiting {
    /// Named barrier `id` to complete phase number `phase`.
    Named { id: u32, phase: u64 },
    /// The phase of parity `parity` of the `mbarrier` at `bar`.
    Mbarrier { bar: u64, parity: u32 },
}

impl Log {
    pub fn new(warps: usize) -> Log {
        Log {
            warps: vec![Vec::new(); warps],
        }
    }

    pub fn record(&mut self, warp: usize, event: Event) {
        self.warps[warp].push(event);
    }

    /// Runs each warp's events until it waits on a phase not complete, round after round,
    /// until all are done or none can go on.
    pub fn replay(&self) -> Result<(), String> {
        let mut next = vec![0; self.warps.len()];
        let mut waiting: Vec<Option<Waiting>> = vec![None; self.warps.len()];
        let mut named: HashMap<u32, NamedPhase> = HashMap::new();
        let mut mbarriers: HashMap<u64, Mbarrier> = HashMap::new();
        loop {
            let mut moved = false;
            for warp in 0..self.warps.len() {
                if let Some(wait) = waiting[warp] {
                    let done = match wait {
                        Waiting::Named { id, phase } => named[&id].completed > phase,
                        Waiting::Mbarrier { bar, parity } => match mbarriers.get(&bar) {
                            Some(b) => b.parity != parity,
                            None => return Err(no_mbarrier(warp, bar)),
                        },
                    };
                    if !done {
                        continue;
                    }
                    waiting[warp] = None;
                }
                while waiting[warp].is_none() && next[warp] < self.warps[warp].len() {
                    let event = self.warps[warp][next[warp]];
                    next[warp] += 1;
                    moved = true;
                    waiting[warp] = match event {
                        Event::Named { id, threads, wait } => {
                            let phase = named.entry(id).or_default();
                            if phase.arrived == 0 {
                                phase.threads = threads;
                            } else if phase.threads != threads {
                                return Err(format!(
                                    "warp {warp} counts {threads} threads on named barrier {id}, \
                                     whose phase counts {}",
                                    phase.threads
                                ));
                            }
                            let waits_for = phase.completed;
                            phase.arrived += THREADS_PER_WARP;
                            if phase.arrived >= phase.threads {
                                phase.arrived = 0;
                                phase.completed += 1;
                            }
                            wait.then_some(Waiting::Named {
                                id,
                                phase: waits_for,
                            })
                        }
                        Event::MbarrierInit { bar, count } => {
                            let (pending, parity) = (count, 0);
                            mbarriers.insert(
                                bar,
                                Mbarrier {
                                    count,
                                    pending,
                                    parity,
                                },
                            );
                            None
                        }
                        Event::MbarrierArrive { bar } => {
                            let b = mbarriers
                                .get_mut(&bar)
                                .ok_or_else(|| no_mbarrier(warp, bar))?;
                            b.pending = b.pending.saturating_sub(1);
                            if b.pending == 0 {
                                b.parity ^= 1;
                                b.pending = b.count;
                            }
                            None
                        }
                        Event::MbarrierWait { bar, parity } => {
                            Some(Waiting::Mbarrier { bar, parity })
                        }
                        Event::MbarrierInval { bar } => {
                            mbarriers.remove(&bar);
                            None
                        }
                    };
                }
            }
            if !moved {
                break;
            }
        }
        let stuck: Vec<String> = (0..self.warps.len())
            .filter_map(|warp| {
                let wait = waiting[warp]?;
                Some(match wait {
                    Waiting::Named { id, .. } => {
                        let phase = &named[&id];
                        format!(
                            "warp {warp} on named barrier {id} ({} of {} threads arrived)",
                            phase.arrived, phase.threads
                        )
                    }
                    Waiting::Mbarrier { bar, parity } => format!(
                        "warp {warp} on the phase of parity {parity} of the mbarrier at shared byte {bar}"
                    ),
                })
            })
            .collect();
        if !stuck.is_empty() {
            return Err(format!(
                "deadlock once warps run apart: {}",
                stuck.join("; ")
            ));
        }
        let mut left: Vec<_> = named.iter().filter(|(_, p)| p.arrived > 0).collect();
        left.sort_by_key(|(id, _)| **id);
        if let Some((id, phase)) = left.first() {
            return Err(format!(
                "the kernel ends with named barrier {id} at {} of {} threads arrived",
                phase.arrived, phase.threads
            ));
        }
        Ok(())
    }
}
