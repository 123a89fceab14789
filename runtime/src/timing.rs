//! GPU-side timing: events recorded on a [`Device`]'s stream, and the time between two of them.

use cudarc::driver::{CudaEvent, sys};

use crate::{Device, RuntimeError};

type Result<T> = std::result::Result<T, RuntimeError>;

/// A point in a device's stream: when the GPU reached it is known once it has.
#[derive(Debug)]
pub struct Event {
    event: CudaEvent,
}

impl Device {
    /// Records an event after everything queued so far on this device's stream.
    pub fn record_event(&self) -> Result<Event> {
        let event = self
            .stream
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| RuntimeError::driver("recording an event", e))?;
        Ok(Event { event })
    }
}

impl Event {
    /// Milliseconds of GPU time from `self` to `end` (waiting for both to complete); the
    /// driver's resolution is about half a microsecond.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.event
            .elapsed_ms(&end.event)
            .map_err(|e| RuntimeError::driver("reading the time between two events", e))
    }
}
