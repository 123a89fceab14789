//! Global memory (the launch's buffers, each at its own address range) and a block's shared
//! memory with its race detector.

use std::collections::HashMap;

use half::{bf16, f16};
use kiln_dsl::{DType, HostBuffer, KernelArg};

use crate::thread::{Param, Type};

/// Buffer `i` starts at address `(i + 1) << BUFFER_SHIFT`: an address names its buffer.
const BUFFER_SHIFT: u32 = 40;

/// The buffers of a launch, by pointer argument.
pub(super) struct Global<'a> {
    buffers: Vec<(&'a HostBuffer, &'static str)>,
}

impl<'a> Global<'a> {
    pub fn new(params: &[Param], args: &[KernelArg<'a>]) -> Global<'a> {
        let buffers = params
            .iter()
            .zip(args)
            .filter_map(|(param, arg)| match arg {
                KernelArg::Buffer(buffer) => Some((*buffer, param.name)),
                _ => None,
            })
            .collect();
        Global { buffers }
    }

    /// The register value of each argument: a buffer's base address, or a scalar's bits.
    pub fn param_values(&self, args: &[KernelArg<'_>]) -> Vec<u64> {
        let mut buffer = 0u64;
        args.iter()
            .map(|arg| match *arg {
                KernelArg::Buffer(_) => {
                    buffer += 1;
                    buffer << BUFFER_SHIFT
                }
                KernelArg::I32(v) => v as u32 as u64,
                KernelArg::I64(v) => v as u64,
                KernelArg::F32(v) => v.to_bits() as u64,
            })
            .collect()
    }

    /// The buffer and element index an access of `ty` at `address` reaches, or why it is wrong.
    fn locate(&self, address: u64, ty: Type) -> Result<(&'a HostBuffer, usize), String> {
        let slot = (address >> BUFFER_SHIFT) as usize;
        let Some(&(buffer, name)) = slot.checked_sub(1).and_then(|i| self.buffers.get(i)) else {
            return Err(format!("access to {address:#x}, which is in no buffer"));
        };
        let size = buffer.dtype().size_bytes() as u64;
        let byte = address - ((slot as u64) << BUFFER_SHIFT);
        if ty.bytes() as u64 != size {
            return Err(format!(
                "{}-byte access to `{name}`, a buffer of {}",
                ty.bytes(),
                buffer.dtype()
            ));
        }
        if !byte.is_multiple_of(size) || byte / size >= buffer.len() as u64 {
            return Err(format!(
                "out-of-bounds access to byte {byte} of `{name}`, which has {} elements",
                buffer.len()
            ));
        }
        Ok((buffer, (byte / size) as usize))
    }

    pub fn read(&self, address: u64, ty: Type) -> Result<u64, String> {
        let (buffer, index) = self.locate(address, ty)?;
        Ok(match buffer.dtype() {
            DType::F16 => f16::from_f32(buffer.read_float(index)).to_bits() as u64,
            DType::BF16 => bf16::from_f32(buffer.read_float(index)).to_bits() as u64,
            DType::F32 => buffer.read_float(index).to_bits() as u64,
            DType::I32 | DType::I64 | DType::I1 => buffer.read_int(index) as u64,
        })
    }

    /// The `len` bytes at `address` (a multiple of `len`, whole elements of one buffer), as a
    /// `cp.async` reads them.
    pub fn read_bytes(&self, address: u64, len: usize) -> Result<Vec<u8>, String> {
        if !address.is_multiple_of(len as u64) {
            return Err(format!("{len}-byte copy from {address:#x}, misaligned"));
        }
        let slot = (address >> BUFFER_SHIFT) as usize;
        let Some(&(buffer, _)) = slot.checked_sub(1).and_then(|i| self.buffers.get(i)) else {
            return Err(format!("access to {address:#x}, which is in no buffer"));
        };
        let ty = match buffer.dtype() {
            DType::F16 => Type::F16,
            DType::BF16 => Type::BF16,
            DType::F32 => Type::F32,
            DType::I32 => Type::I32,
            DType::I64 => Type::I64,
            DType::I1 => Type::I8,
        };
        let size = ty.bytes() as usize;
        let mut bytes = Vec::with_capacity(len);
        for element in 0..len / size {
            let bits = self.read(address + (element * size) as u64, ty)?;
            bytes.extend((0..size).map(|i| (bits >> (8 * i)) as u8));
        }
        Ok(bytes)
    }

    pub fn write(&self, address: u64, ty: Type, bits: u64) -> Result<(), String> {
        let (buffer, index) = self.locate(address, ty)?;
        match buffer.dtype() {
            // Exact: every f16/bf16 is an f32, and the buffer rounds it back to itself.
            DType::F16 => buffer.write_float(index, f16::from_bits(bits as u16).to_f32()),
            DType::BF16 => buffer.write_float(index, bf16::from_bits(bits as u16).to_f32()),
            DType::F32 => buffer.write_float(index, f32::from_bits(bits as u32)),
            DType::I32 => buffer.write_int(index, bits as u32 as i32 as i64),
            DType::I64 => buffer.write_int(index, bits as i64),
            DType::I1 => buffer.write_int(index, (bits & 0xff != 0) as i64),
        }
        Ok(())
    }

    /// `atom.add.u32` of 1 at `address` of an i32 buffer: the value before.
    pub fn arrive(&self, address: u64) -> Result<u64, String> {
        let (buffer, index) = self.locate(address, Type::I32)?;
        if buffer.dtype() != DType::I32 {
            return Err(format!(
                "an arrival at a {} buffer at {address:#x}",
                buffer.dtype()
            ));
        }
        Ok(buffer.arrive_i32(index) as u32 as u64)
    }

    /// `red.global.add.f32`: adds the f32 `bits` to an element of an f32 buffer.
    pub fn add_f32(&self, address: u64, bits: u64) -> Result<(), String> {
        let (buffer, index) = self.locate(address, Type::F32)?;
        if buffer.dtype() != DType::F32 {
            return Err(format!(
                "an f32 atomic add into a {} buffer at {address:#x}",
                buffer.dtype()
            ));
        }
        buffer.atomic_add_f32(index, f32::from_bits(bits as u32));
        Ok(())
    }
}

/// Who last touched a byte of shared memory, in which phase (barriers count phases), and when
/// (the block's clock: an `mbarrier` wait orders what its arrivals did before a time).
#[derive(Clone, Copy, Default)]
struct Access {
    phase: u32,
    /// The thread, or `MANY` for a read by several.
    thread: u32,
    /// The lowest and highest of the threads that read it, where several did.
    lo: u32,
    hi: u32,
    touched: bool,
    time: u64,
    /// For a read, the last `wgmma` group (1-based) among its readers, 0 for none: such a read
    /// ends only when its group is waited for.
    group: u32,
}

const MANY: u32 = u32::MAX;

/// The writer of bytes a TMA copy landed: seen by every thread that waited on its barrier.
pub(super) const ASYNC_COPY: u32 = u32::MAX - 1;

/// A block's shared memory: bytes, for each the last write and read, to find races, the bytes
/// a `cp.async` is still writing, which nobody may touch, and those a `wgmma` may still read,
/// which nobody may write.
pub(super) struct Shared {
    bytes: Vec<u8>,
    writes: Vec<Access>,
    reads: Vec<Access>,
    in_flight: Vec<bool>,
    phase: u32,
    /// Per byte, the last `wgmma` group (1-based) that reads it; 0 for none.
    async_reads: Vec<u32>,
    /// Per byte, the thread whose TMA store may still read it (until that thread's
    /// `cp.async.bulk.wait_group.read`).
    store_reads: Vec<Option<u32>>,
    /// Per thread, the time of its last `fence.proxy.async`: a TMA store reads only what its
    /// writer wrote before fencing.
    fenced: Vec<u64>,
    /// The group `wgmma`s join now: the groups before it are committed.
    open_group: u32,
    /// Every group up to this one is complete.
    retired_group: u32,
    /// By group, when it was waited for (index 0 unused).
    retire_times: Vec<u64>,
    /// The block's threads, and its clock: one tick per access.
    threads: u32,
    clock: u64,
    /// By (waiting thread, arriving thread): up to when what the arriving thread did comes
    /// before what the waiting one does next (it arrived on an `mbarrier` phase the other
    /// waited for); by waiting thread, the same for every thread of the block at once.
    acquired: HashMap<(u32, u32), u64>,
    /// Per thread, the ranges of threads whose every member arrived on what it waited for, and
    /// until when: their reads together (`MANY`) come before what it does next.
    acquired_all: HashMap<u32, Vec<(u32, u32, u64)>>,
}

impl Shared {
    pub fn new(size: u32, threads: u32) -> Shared {
        Shared {
            threads,
            clock: 0,
            acquired: HashMap::new(),
            acquired_all: HashMap::new(),
            bytes: vec![0; size as usize],
            writes: vec![Access::default(); size as usize],
            reads: vec![Access::default(); size as usize],
            in_flight: vec![false; size as usize],
            phase: 0,
            async_reads: vec![0; size as usize],
            store_reads: vec![None; size as usize],
            fenced: vec![0; threads as usize],
            open_group: 1,
            retired_group: 0,
            retire_times: vec![0],
        }
    }

    /// A `wgmma`'s read of an operand element: a read by `thread` (the warpgroup's first), whose
    /// bytes stay read until its group is waited for.
    pub fn read_async(&mut self, offset: u64, ty: Type, thread: u32) -> Result<u64, String> {
        for at in self.range(offset, ty)? {
            self.check_fenced(at, "a wgmma")?;
        }
        let bits = self.read(offset, ty, thread)?;
        for at in self.range(offset, ty)? {
            self.async_reads[at] = self.open_group;
            self.reads[at].group = self.open_group;
        }
        Ok(bits)
    }

    /// That shared byte `at`, if a thread wrote it (not a TMA copy), was fenced by its writer
    /// (`fence.proxy.async`) before `reader`, of the async proxy, reads it.
    fn check_fenced(&self, at: usize, reader: &str) -> Result<(), String> {
        let write = self.writes[at];
        let fenced = self.fenced.get(write.thread as usize);
        if write.touched && fenced.is_some_and(|&f| f < write.time) {
            return Err(format!(
                "shared byte {at} written by thread {} without a fence.proxy.async before {reader} \
                 reads it",
                write.thread
            ));
        }
        Ok(())
    }

    /// `wgmma.commit_group`.
    pub fn commit_async(&mut self) {
        self.open_group += 1;
    }

    /// `wgmma.wait_group pending`: all but the last `pending` committed groups are complete.
    pub fn wait_async(&mut self, pending: u32) {
        let committed = self.open_group - 1;
        let retired = self.retired_group.max(committed.saturating_sub(pending));
        let time = self.tick();
        self.retire_times.resize(retired as usize + 1, time);
        self.retired_group = retired;
    }

    /// Whether a committed `wgmma` group was never waited for.
    pub fn async_pending(&self) -> bool {
        self.open_group - 1 > self.retired_group
    }

    fn check_not_read_async(&self, range: std::ops::Range<usize>) -> Result<(), String> {
        if let Some(at) = range
            .clone()
            .find(|&at| self.async_reads[at] > self.retired_group)
        {
            return Err(format!(
                "race: shared byte {at} written while a wgmma may still read it (before its wait_group)"
            ));
        }
        match range.into_iter().find(|&at| self.store_reads[at].is_some()) {
            Some(at) => Err(format!(
                "race: shared byte {at} written while a TMA store of thread {} may still read it \
                 (before its cp.async.bulk.wait_group.read)",
                self.store_reads[at].unwrap_or_default()
            )),
            None => Ok(()),
        }
    }

    /// A TMA store's read of `len` bytes at `offset` by `thread`: a read now, as far as races
    /// go, whose bytes nobody may write until [`Self::wait_store_reads`].
    pub fn read_for_store(
        &mut self,
        offset: u64,
        len: usize,
        thread: u32,
    ) -> Result<Vec<u8>, String> {
        let mut bytes = Vec::with_capacity(len);
        for at in offset..offset + len as u64 {
            self.check_fenced(at as usize, "a TMA store")?;
            bytes.push(self.read(at, Type::I8, thread)? as u8);
            self.store_reads[at as usize] = Some(thread);
        }
        Ok(bytes)
    }

    /// `fence.proxy.async` in `thread`: what it wrote so far is visible to the async proxy.
    pub fn fence_async(&mut self, thread: u32) {
        let time = self.tick();
        self.fenced[thread as usize] = time;
    }

    /// `cp.async.bulk.wait_group.read 0` in the `waiting` threads: their TMA stores have read
    /// their bytes.
    pub fn wait_store_reads(&mut self, waiting: std::ops::Range<u32>) {
        for read in &mut self.store_reads {
            if read.is_some_and(|thread| waiting.contains(&thread)) {
                *read = None;
            }
        }
    }

    /// A thread whose TMA store may still read shared memory.
    pub fn store_reading(&self) -> Option<u32> {
        self.store_reads.iter().find_map(|&r| r)
    }

    /// A barrier: what was written before it may be read by anyone after it.
    pub fn barrier(&mut self) {
        self.phase += 1;
    }

    /// The clock, ticked: the time of an access or an arrival.
    pub fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The `waiters` waited for an `mbarrier` phase whose arrivals were `(thread, time)`: what
    /// each did before it arrived comes before what the waiters do from now on.
    pub fn acquire(&mut self, waiters: &[u32], arrivals: &[(u32, u64)]) {
        // Where every thread of a range arrived (the block's, or a warpgroup-aligned part
        // running apart), the earliest of them orders all their accesses before.
        let mut every = vec![None; self.threads as usize];
        for &(from, time) in arrivals {
            if let Some(slot) = every.get_mut(from as usize) {
                *slot = Some(time);
            }
        }
        let arrived: Vec<usize> = (0..every.len()).filter(|&t| every[t].is_some()).collect();
        let all = match (arrived.first(), arrived.last()) {
            (Some(&lo), Some(&hi)) if hi - lo + 1 == arrived.len() => {
                let time = arrived.iter().filter_map(|&t| every[t]).min();
                time.map(|time| (lo as u32, hi as u32, time))
            }
            _ => None,
        };
        for &thread in waiters {
            for &(from, time) in arrivals {
                let known = self.acquired.entry((thread, from)).or_default();
                *known = (*known).max(time);
            }
            if let Some((lo, hi, time)) = all {
                let known = self.acquired_all.entry(thread).or_default();
                match known.iter_mut().find(|(l, h, _)| (*l, *h) == (lo, hi)) {
                    Some(entry) => entry.2 = entry.2.max(time),
                    None => known.push((lo, hi, time)),
                }
            }
        }
    }

    /// Whether `access` comes before what `thread` does now: an earlier phase, its own, or
    /// one an `mbarrier` it waited for ordered.
    fn ordered(&self, access: Access, thread: u32) -> bool {
        // A `wgmma`'s read ends when its group is waited for: only what follows that orders it.
        let ended = match access.group {
            0 => Some(access.time),
            group => self
                .retire_times
                .get(group as usize)
                .map(|&retired| retired.max(access.time)),
        };
        let acquired = ended.is_some_and(|ended| match access.thread {
            MANY => self.acquired_all.get(&thread).is_some_and(|ranges| {
                ranges
                    .iter()
                    .any(|&(lo, hi, time)| lo <= access.lo && access.hi <= hi && ended <= time)
            }),
            from => self
                .acquired
                .get(&(thread, from))
                .is_some_and(|&time| ended <= time),
        });
        !access.touched || access.phase != self.phase || access.thread == thread || acquired
    }

    fn range(&self, offset: u64, ty: Type) -> Result<std::ops::Range<usize>, String> {
        let (start, len) = (offset as usize, ty.bytes() as usize);
        if !offset.is_multiple_of(ty.bytes() as u64) || start + len > self.bytes.len() {
            return Err(format!(
                "out-of-bounds or misaligned shared access of {len} bytes at byte {offset} of {}",
                self.bytes.len()
            ));
        }
        Ok(start..start + len)
    }

    fn check_settled(&self, range: std::ops::Range<usize>) -> Result<(), String> {
        match range.into_iter().find(|&at| self.in_flight[at]) {
            Some(at) => Err(format!(
                "shared byte {at} accessed while an async copy writes it (before its wait)"
            )),
            None => Ok(()),
        }
    }

    /// The start of a 16-byte `cp.async` by `thread` into `offset`: a write, as far as races
    /// with the reads and writes of this phase go, whose bytes land only at [`Self::land`].
    pub fn start_copy(&mut self, offset: u64, len: usize, thread: u32) -> Result<(), String> {
        let (start, end) = (offset as usize, offset as usize + len);
        if !offset.is_multiple_of(len as u64) || end > self.bytes.len() {
            return Err(format!(
                "out-of-bounds or misaligned {len}-byte copy to byte {offset} of {}",
                self.bytes.len()
            ));
        }
        self.check_settled(start..end)?;
        self.check_not_read_async(start..end)?;
        for at in start..end {
            let (write, read) = (self.writes[at], self.reads[at]);
            // Bytes a TMA copy landed (settled, checked above) are written again in order: what
            // must come first is every read of them, which the copier's wait orders (the
            // readers waited for the landing before they read and arrived).
            let written_before = write.thread == ASYNC_COPY || self.ordered(write, thread);
            if !written_before || !self.ordered(read, thread) {
                return Err(format!(
                    "race: shared byte {at} accessed by another thread, then copied into without a barrier between"
                ));
            }
            self.in_flight[at] = true;
        }
        Ok(())
    }

    /// A copy's bytes land (its group was waited for): a write by `thread` in this phase.
    pub fn land(&mut self, offset: u64, bytes: &[u8], thread: u32) {
        let time = self.tick();
        for (i, &byte) in bytes.iter().enumerate() {
            let at = offset as usize + i;
            self.in_flight[at] = false;
            self.bytes[at] = byte;
            self.writes[at] = Access {
                phase: self.phase,
                thread,
                lo: thread,
                hi: thread,
                touched: true,
                time,
                group: 0,
            };
        }
    }

    /// A TMA copy's bytes land (its barrier's phase completed): readable by every thread that
    /// waited for that phase, which every thread that reads them does.
    pub fn land_async(&mut self, offset: u64, bytes: &[u8]) {
        self.land(offset, bytes, ASYNC_COPY);
    }

    pub fn read(&mut self, offset: u64, ty: Type, thread: u32) -> Result<u64, String> {
        let range = self.range(offset, ty)?;
        self.check_settled(range.clone())?;
        let mut bits = 0u64;
        let time = self.tick();
        for (i, at) in range.enumerate() {
            let write = self.writes[at];
            if !write.touched {
                return Err(format!("read of shared byte {at}, which nothing wrote"));
            }
            if write.thread != ASYNC_COPY && !self.ordered(write, thread) {
                return Err(format!(
                    "race: shared byte {at} written by thread {} and read without a barrier between",
                    write.thread
                ));
            }
            let read = &mut self.reads[at];
            let shared_read = read.touched && read.phase == self.phase && read.thread != thread;
            let (lo, hi) = if shared_read {
                (read.lo.min(thread), read.hi.max(thread))
            } else {
                (thread, thread)
            };
            *read = Access {
                phase: self.phase,
                thread: if shared_read { MANY } else { thread },
                lo,
                hi,
                touched: true,
                time,
                group: if shared_read { read.group } else { 0 },
            };
            bits |= (self.bytes[at] as u64) << (8 * i);
        }
        Ok(bits)
    }

    pub fn write(&mut self, offset: u64, ty: Type, bits: u64, thread: u32) -> Result<(), String> {
        let range = self.range(offset, ty)?;
        self.check_settled(range.clone())?;
        self.check_not_read_async(range.clone())?;
        let time = self.tick();
        for (i, at) in range.enumerate() {
            let (write, read) = (self.writes[at], self.reads[at]);
            if !self.ordered(write, thread) {
                return Err(format!(
                    "race: shared byte {at} written by threads {} and {thread} without a barrier between",
                    write.thread
                ));
            }
            if !self.ordered(read, thread) {
                return Err(format!(
                    "race: shared byte {at} read by another thread, then written without a barrier between"
                ));
            }
            self.writes[at] = Access {
                phase: self.phase,
                thread,
                lo: thread,
                hi: thread,
                touched: true,
                time,
                group: 0,
            };
            self.bytes[at] = (bits >> (8 * i)) as u8;
        }
        Ok(())
    }
}
