//! The Tensor Memory Accelerator as the emulator runs it: a `cp.async.bulk.tensor` reads its
//! box through the launch's tensor map when it is issued, and its bytes land, visible to every
//! thread, when a wait finds the phase of its `mbarrier` complete (every arrival made and every
//! expected byte copied); until then nobody may touch them. A wait for a phase that nothing
//! can complete is a deadlock on the GPU and an error here. A wait also orders, for the race
//! checks, what each arriving thread did before it arrived (and the copies' landing) before
//! what the waiting thread does next: a pipeline buffer's `empty` barrier, which every thread
//! arrives on once done reading it, is what lets warp 0 copy into it again. A TMA store reads
//! its shared box when it is issued (a read by the issuing thread: the writers must have met it
//! at a barrier) and writes the array at once; nobody may write those bytes again before the
//! issuer's `cp.async.bulk.wait_group.read`, nor may the block end before it.
//!
//! The swizzle is TMA's own (CUDA's `CU_TENSOR_MAP_SWIZZLE_{32,64,128}B`, on shared byte
//! addresses: the 16-byte chunk index within each span XORed with the span's row bits), not
//! kiln's layout code, so that a shared layout TMA cannot write fails here.

use std::collections::HashMap;

use kiln_dsl::{DType, TensorMapParams};

use super::memory::{ASYNC_COPY, Global, Shared};
use crate::thread::Type;

/// Shared memory's alignment for a TMA destination or source.
const DST_ALIGN: u64 = 128;

/// One `mbarrier` object: its arrival count and the state of its current phase.
#[derive(Debug)]
pub(super) struct Mbarrier {
    count: u32,
    /// Arrivals the current phase still waits for.
    pending: u32,
    /// Transaction bytes the arrivals announced, and those the copies have delivered.
    expected: u64,
    delivered: u64,
    /// The current phase's parity.
    parity: u32,
    /// Copies of the current phase: where their bytes land, and the bytes.
    copies: Vec<(u64, Vec<u8>)>,
    /// The current phase's arrivals (thread, time), and those of the last completed phase of
    /// each parity (with the time its copies landed, as [`ASYNC_COPY`]'s).
    arrivals: Vec<(u32, u64)>,
    completed: [Vec<(u32, u64)>; 2],
}

impl Mbarrier {
    /// A wait for the current phase (of parity `parity`, at shared byte `bar`): completes it
    /// where every arrival is made and every expected byte copied (the copies land), else
    /// reports the deadlock.
    fn try_complete(&mut self, shared: &mut Shared, bar: u64, parity: u32) -> Result<(), String> {
        if self.pending > 0 || self.delivered != self.expected {
            return Err(format!(
                "deadlock: waiting for phase parity {parity} of the mbarrier at shared byte {bar}, \
                 which {} more arrival(s) and {} of {} transaction bytes would complete",
                self.pending, self.delivered, self.expected
            ));
        }
        for (dst, bytes) in self.copies.drain(..) {
            shared.land_async(dst, &bytes);
        }
        self.arrivals.push((ASYNC_COPY, shared.tick()));
        self.complete();
        Ok(())
    }

    /// The current phase completes: its arrivals are what a wait for it orders.
    fn complete(&mut self) {
        self.completed[self.parity as usize] = std::mem::take(&mut self.arrivals);
        self.parity ^= 1;
        self.pending = self.count;
        self.expected = 0;
        self.delivered = 0;
    }
}

/// Every `mbarrier` of a block, by shared address.
#[derive(Debug, Default)]
pub(super) struct Mbarriers(HashMap<u64, Mbarrier>);

impl Mbarriers {
    pub fn init(&mut self, bar: u64, count: u32) -> Result<(), String> {
        if !bar.is_multiple_of(8) {
            return Err(format!("mbarrier at shared byte {bar}, not 8-byte aligned"));
        }
        if self.0.contains_key(&bar) {
            return Err(format!(
                "mbarrier at shared byte {bar} initialised again without mbarrier.inval"
            ));
        }
        self.0.insert(
            bar,
            Mbarrier {
                count,
                pending: count,
                expected: 0,
                delivered: 0,
                parity: 0,
                copies: Vec::new(),
                arrivals: Vec::new(),
                completed: [Vec::new(), Vec::new()],
            },
        );
        Ok(())
    }

    fn get(&mut self, bar: u64) -> Result<&mut Mbarrier, String> {
        self.0
            .get_mut(&bar)
            .ok_or_else(|| format!("no mbarrier initialised at shared byte {bar}"))
    }

    /// An arrival of `thread` at `time` that also expects `bytes` of copies.
    pub fn arrive_expect_tx(
        &mut self,
        bar: u64,
        bytes: u32,
        thread: u32,
        time: u64,
    ) -> Result<(), String> {
        let barrier = self.get(bar)?;
        barrier.arrivals.push((thread, time));
        if barrier.pending == 0 {
            return Err(format!(
                "arrival on the mbarrier at shared byte {bar}, whose phase has all its arrivals"
            ));
        }
        barrier.pending -= 1;
        barrier.expected += bytes as u64;
        Ok(())
    }

    /// A plain arrival of `thread` at `time` (no transaction bytes): the phase completes with
    /// the last one.
    pub fn arrive(&mut self, bar: u64, thread: u32, time: u64) -> Result<(), String> {
        let barrier = self.get(bar)?;
        if barrier.pending == 0 {
            return Err(format!(
                "arrival on the mbarrier at shared byte {bar}, whose phase has all its arrivals"
            ));
        }
        barrier.pending -= 1;
        barrier.arrivals.push((thread, time));
        if barrier.pending == 0 && barrier.expected == 0 && barrier.copies.is_empty() {
            barrier.complete();
        }
        Ok(())
    }

    /// A TMA copy into `dst` through `map` at `coords` (innermost first), completing its bytes on
    /// `bar`: read now, landing when the phase completes.
    pub fn copy(
        &mut self,
        shared: &mut Shared,
        global: &Global<'_>,
        map: &TensorMapParams,
        dst: u64,
        coords: &[i64],
        bar: u64,
        thread: u32,
    ) -> Result<(), String> {
        let (ty, boxed) = box_elements(map, dst, coords, "copy to")?;
        let elem = ty.bytes() as usize;
        let mut bytes = vec![0u8; boxed.len() * elem];
        for (at, address) in boxed.into_iter().enumerate() {
            // Outside the array: zeros.
            let Some(address) = address else { continue };
            let bits = global.read(address, ty)?;
            let at = (swizzled(dst + (at * elem) as u64, map.swizzle_bytes) - dst) as usize;
            bytes[at..at + elem].copy_from_slice(&bits.to_le_bytes()[..elem]);
        }
        for chunk in (0..bytes.len()).step_by(16) {
            shared.start_copy(dst + chunk as u64, 16, thread)?;
        }
        let barrier = self.get(bar)?;
        barrier.delivered += bytes.len() as u64;
        barrier.copies.push((dst, bytes));
        Ok(())
    }

    /// The `waiters` wait for the phase of parity `parity` of `bar`: at once if it completed,
    /// completing it (its copies land) if it can, else the deadlock is reported. What the
    /// phase's arrivals did before arriving comes before what the waiters do next.
    pub fn wait(
        &mut self,
        shared: &mut Shared,
        bar: u64,
        parity: u32,
        waiters: &[u32],
    ) -> Result<(), String> {
        let barrier = self.get(bar)?;
        if barrier.parity == parity & 1 {
            barrier.try_complete(shared, bar, parity)?;
        }
        shared.acquire(waiters, &barrier.completed[(parity & 1) as usize]);
        Ok(())
    }

    /// Whether a wait for the phase of parity `parity` of `bar` would pass: the phase
    /// completed, or has every arrival and byte it waits for.
    pub fn ready(&mut self, bar: u64, parity: u32) -> Result<bool, String> {
        let barrier = self.get(bar)?;
        Ok(barrier.parity != parity & 1
            || (barrier.pending == 0 && barrier.delivered == barrier.expected))
    }

    pub fn inval(&mut self, bar: u64) -> Result<(), String> {
        let barrier = self.get(bar)?;
        if !barrier.copies.is_empty() {
            return Err(format!(
                "mbarrier at shared byte {bar} invalidated with copies in flight"
            ));
        }
        self.0.remove(&bar);
        Ok(())
    }

    /// A barrier whose copies never landed, at the kernel's end.
    pub fn in_flight(&self) -> Option<u64> {
        self.0
            .iter()
            .find(|(_, b)| !b.copies.is_empty())
            .map(|(&bar, _)| bar)
    }
}

/// A TMA store of shared `src` through `map` at `coords` (innermost first) by `thread`: it
/// reads `src` now (a read by the thread, which the writers must have met at a barrier), and
/// its bytes stay read until the thread's `cp.async.bulk.wait_group.read`; what lies outside
/// the array is not written. With `add` (a reduction, f32 only), it adds what it stores.
pub(super) fn store(
    shared: &mut Shared,
    global: &Global<'_>,
    map: &TensorMapParams,
    src: u64,
    coords: &[i64],
    thread: u32,
    add: bool,
) -> Result<(), String> {
    let (ty, boxed) = box_elements(map, src, coords, "store from")?;
    if add && ty != Type::F32 {
        return Err(format!("a TMA reduction adds f32, not {ty:?}"));
    }
    let elem = ty.bytes() as usize;
    let bytes = shared.read_for_store(src, boxed.len() * elem, thread)?;
    for (at, address) in boxed.into_iter().enumerate() {
        let Some(address) = address else { continue };
        let at = (swizzled(src + (at * elem) as u64, map.swizzle_bytes) - src) as usize;
        let mut bits = [0u8; 8];
        bits[..elem].copy_from_slice(&bytes[at..at + elem]);
        let bits = u64::from_le_bytes(bits);
        if add {
            global.add_f32(address, bits)?;
        } else {
            global.write(address, ty, bits)?;
        }
    }
    Ok(())
}

/// The element type of a TMA transfer between shared byte `shared` and the box of `map` at
/// `coords`, and each box element's global address, innermost first (`None` outside the
/// array), once the transfer is checked to be one kiln emits (`what`: "copy to", "store from").
fn box_elements(
    map: &TensorMapParams,
    shared: u64,
    coords: &[i64],
    what: &str,
) -> Result<(Type, Vec<Option<u64>>), String> {
    if !shared.is_multiple_of(DST_ALIGN) {
        return Err(format!(
            "TMA {what} shared byte {shared}, not {DST_ALIGN}-byte aligned"
        ));
    }
    if coords.len() != map.dims.len() {
        return Err(format!(
            "TMA {what} shared memory with {} coordinates through a rank-{} tensor map",
            coords.len(),
            map.dims.len()
        ));
    }
    let ty = match map.dtype {
        DType::F16 => Type::F16,
        DType::BF16 => Type::BF16,
        DType::F32 => Type::F32,
        other => return Err(format!("TMA transfer of {other}, which kiln never emits")),
    };
    let elem = ty.bytes() as u64;
    let inner = map.box_dims[0] as u64 * elem;
    let rows_fit = match map.swizzle_bytes {
        // Unswizzled, a box row is any multiple of 16 bytes.
        0 => inner.is_multiple_of(16),
        span => inner == span as u64,
    };
    if !rows_fit || map.box_dims.iter().any(|&d| d > 256) {
        return Err(format!(
            "TMA box rows of {inner} bytes with a {}-byte swizzle, box {:?}",
            map.swizzle_bytes, map.box_dims
        ));
    }
    let elements: u64 = map.box_dims.iter().map(|&b| b as u64).product();
    let boxed = (0..elements)
        .map(|e| {
            let mut rest = e;
            let mut address = map.address as i64;
            let mut inside = true;
            for (d, &size) in map.box_dims.iter().enumerate() {
                let at = coords[d] + (rest % size as u64) as i64;
                rest /= size as u64;
                inside &= (0..map.dims[d] as i64).contains(&at);
                let stride = if d == 0 {
                    elem
                } else {
                    map.byte_strides[d - 1]
                };
                address += at * stride as i64;
            }
            inside.then_some(address as u64)
        })
        .collect();
    Ok((ty, boxed))
}

/// TMA's swizzle of a shared byte address: bits `[4, 4 + log2(span / 16))` XOR the bits
/// `[7, ..)` above them (16-byte chunks within each 128-byte line, by line); none at span 0.
fn swizzled(address: u64, span: u32) -> u64 {
    if span == 0 {
        return address;
    }
    let chunks = (span / 16) as u64 - 1;
    address ^ (((address >> 7) & chunks) << 4)
}
