//! Warpgroups that run different code (a producer warpgroup and its consumers): each runs in
//! a context of its own, in lockstep within it, on a thread of the host; one context runs at a
//! time, holding what the block shares, until it waits on an `mbarrier` phase that is not
//! complete or ends. It then passes the baton to the next context that has not ended, in turn,
//! so a run is the same every time. Every context blocked with nothing changed since each of
//! them blocked is a deadlock.

use std::sync::{Condvar, Mutex, PoisonError};

use super::block::Common;

/// The contexts of one split and what they share, passed from one to the next.
pub(super) struct Baton {
    state: Mutex<BatonState>,
    turn_changed: Condvar,
}

struct BatonState {
    common: Option<Box<Common>>,
    /// The context whose turn it is.
    turn: usize,
    ended: Vec<bool>,
    /// Where a context waits: the block's progress when it found its phase incomplete.
    blocked_at: Vec<Option<u64>>,
}

impl Baton {
    /// `contexts` contexts, the first one's turn first.
    pub fn new(common: Box<Common>, contexts: usize) -> Baton {
        Baton {
            state: Mutex::new(BatonState {
                common: Some(common),
                turn: 0,
                ended: vec![false; contexts],
                blocked_at: vec![None; contexts],
            }),
            turn_changed: Condvar::new(),
        }
    }

    /// Waits for context `me`'s turn and takes what the block shares.
    pub fn take(&self, me: usize) -> Box<Common> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if state.turn == me
                && let Some(common) = state.common.take()
            {
                state.blocked_at[me] = None;
                return common;
            }
            state = self
                .turn_changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Context `me` waits: it passes the baton on, then takes it back in its turn. `Err` where
    /// every other context has ended or is blocked with nothing changed since (a deadlock).
    pub fn block(&self, me: usize, common: Box<Common>) -> Result<Box<Common>, Box<Common>> {
        let progress = common.progress;
        {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.blocked_at[me] = Some(progress);
            let stuck = (0..state.ended.len())
                .filter(|&c| c != me)
                .all(|c| state.ended[c] || state.blocked_at[c] == Some(progress));
            if stuck {
                return Err(common);
            }
            state.common = Some(common);
            state.turn = next(&state.ended, me);
            self.turn_changed.notify_all();
        }
        Ok(self.take(me))
    }

    /// Context `me` has ended: the next one takes over.
    pub fn end(&self, me: usize, common: Box<Common>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.ended[me] = true;
        state.common = Some(common);
        state.turn = next(&state.ended, me);
        self.turn_changed.notify_all();
    }

    /// What the block shares, once every context has ended.
    pub fn into_common(self) -> Option<Box<Common>> {
        self.state
            .into_inner()
            .unwrap_or_else(PoisonError::into_inner)
            .common
    }
}

/// The context after `me` that has not ended, in turn (`me` itself if none).
fn next(ended: &[bool], me: usize) -> usize {
    (1..=ended.len())
        .map(|step| (me + step) % ended.len())
        .find(|&c| !ended[c])
        .unwrap_or(me)
}
