//! One block of threads running a thread program in lockstep, and the numbers of each op as
//! the GPU computes them. A register holds its value's bits in a `u64`, zero-extended.

use std::collections::{BTreeMap, VecDeque};

use half::{bf16, f16};
use kiln_dsl::TensorMapParams;

use super::EmulationError;
use super::apart::Baton;
use super::memory::{Global, Shared};
use super::replay::{Event, Log};
use super::tma::{self, Mbarriers};
use crate::layout::THREADS_PER_WARP;
use crate::layout::mma::{
    ACC_REGS_PER_MMA, K_WIDTH, MMA_K, MMA_M, MMA_N, a_fragment, a_fragment_inverse, acc_fragment,
    acc_fragment_inverse, b_fragment, ldmatrix_source,
};
use crate::layout::wgmma::{Descriptor, Major, WARPS_PER_WARPGROUP, WGMMA_K, WGMMA_M};
use crate::thread::{
    Block, Cast, Constant, FloatCmp, FloatOp, Inst, IntCmp, IntOp, Math, Op, Program, Reg,
    ShuffleMode, Space, Special, TmaCopy, Type, WgmmaA, WgmmaDesc, WgmmaStep, grid_control_ptx,
};

type Result<T> = std::result::Result<T, EmulationError>;

pub(super) fn run_block(
    program: &Program,
    global: &Global<'_>,
    params: &[u64],
    maps: &[TensorMapParams],
    ctaid: [u32; 3],
    nctaid: [u32; 3],
) -> Result<()> {
    let threads = program.threads_per_block as usize;
    let mut state = BlockState {
        program,
        global,
        ctaid,
        nctaid,
        threads,
        first: 0,
        regs: vec![Vec::new(); program.types.len()],
        common: Some(Box::new(Common {
            shared: Shared::new(program.shared_bytes, program.threads_per_block),
            mbarriers: Mbarriers::default(),
            log: runs_apart(&program.body).then(|| Log::new(threads.div_ceil(32))),
            progress: 0,
            registers: vec![crate::launch_registers(program.threads_per_block); threads],
            register_pool: 0,
            named_arrivals: BTreeMap::new(),
        })),
        context: None,
        open_copies: vec![Vec::new(); threads],
        groups: vec![VecDeque::new(); threads],
        maps,
    };
    for (param, &value) in program.params.iter().zip(params) {
        state.regs[param.reg.index()] = vec![value; threads];
    }
    state.block(&program.body)?;
    let common = state
        .common
        .take()
        .expect("the block's state holds what it shares");
    if let Some(log) = &common.log {
        log.replay().map_err(|message| EmulationError {
            message,
            loc: None,
            block: ctaid,
            thread: None,
        })?;
    }
    // A copy still in flight when the kernel ends would land in shared memory nobody owns.
    if let Some(thread) = (0..threads).find(|&t| {
        !state.open_copies[t].is_empty() || state.groups[t].iter().any(|g| !g.is_empty())
    }) {
        return Err(EmulationError {
            message: "the kernel ends with cp.async copies never waited for".to_string(),
            loc: None,
            block: ctaid,
            thread: Some(thread as u32),
        });
    }
    if let Some(bar) = common.mbarriers.in_flight() {
        return Err(EmulationError {
            message: format!(
                "the kernel ends with TMA copies on the mbarrier at shared byte {bar} never waited for"
            ),
            loc: None,
            block: ctaid,
            thread: None,
        });
    }
    if let Some(thread) = common.shared.store_reading() {
        return Err(EmulationError {
            message: "the kernel ends with a TMA store that may still read shared memory \
                      (no cp.async.bulk.wait_group.read after it)"
                .to_string(),
            loc: None,
            block: ctaid,
            thread: Some(thread),
        });
    }
    if common.shared.async_pending() {
        return Err(EmulationError {
            message: "the kernel ends with wgmma groups never waited for".to_string(),
            loc: None,
            block: ctaid,
            thread: None,
        });
    }
    Ok(())
}

/// What every thread of a block shares: shared memory, the `mbarrier`s with the TMA copies on
/// them, the warps' log, and a count of the barriers' changes (which tells a deadlock where
/// warpgroups run apart, [`super::apart`]).
pub(super) struct Common {
    pub shared: Shared,
    pub mbarriers: Mbarriers,
    /// Each warp's waits and arrivals, where warps may run apart ([`super::replay`]).
    pub log: Option<Log>,
    pub progress: u64,
    /// Each thread's registers (`setmaxnreg`), from what the block launches with
    /// ([`crate::launch_registers`]), and the block's pool of registers given back.
    pub registers: Vec<u32>,
    pub register_pool: u64,
    /// The arrivals on each named barrier in a phase not yet complete, `(thread, time)`.
    pub named_arrivals: BTreeMap<u64, Vec<(u32, u64)>>,
}

/// A lane that issues a TMA copy, and the copy's coordinates (innermost first).
type TmaLane = (usize, Vec<i64>);

/// A `cp.async` in flight: where its bytes land, and what it read.
#[derive(Clone, Debug)]
struct InFlight {
    offset: u64,
    bytes: Vec<u8>,
}

struct BlockState<'a, 'g> {
    program: &'a Program,
    global: &'a Global<'g>,
    ctaid: [u32; 3],
    nctaid: [u32; 3],
    threads: usize,
    /// The block's thread id of this state's thread 0: a state runs a warpgroup-aligned
    /// range of the block's threads where warpgroups run apart ([`Baton`]).
    first: usize,
    /// Per register, per thread.
    regs: Vec<Vec<u64>>,
    /// What every thread of the block shares, while this state runs.
    common: Option<Box<Common>>,
    /// Where warpgroups run apart: this state's context and the baton it runs with.
    context: Option<(usize, &'a Baton)>,
    /// Per thread: its copies since its last `cp.async.commit_group`, and its committed groups,
    /// oldest first.
    open_copies: Vec<Vec<InFlight>>,
    groups: Vec<VecDeque<Vec<InFlight>>>,
    /// The launch's tensor maps, and the block's `mbarrier`s with the TMA copies on them.
    maps: &'a [TensorMapParams],
}

/// Whether `block` (or a block nested in it) lets warps run apart: a named barrier, or a
/// plain `mbarrier` arrival (a buffer's `empty` barrier, in place of a `bar.sync`).
fn runs_apart(block: &Block) -> bool {
    block.insts.iter().any(|inst| {
        matches!(inst.op, Op::NamedBarrier { .. } | Op::MbarrierArrive { .. })
            || inst.op.nested_blocks().into_iter().any(runs_apart)
    })
}

/// The mask of a type's width.
fn mask(ty: Type) -> u64 {
    match ty.bits() {
        64 => u64::MAX,
        bits => (1u64 << bits) - 1,
    }
}

/// A register's bits as a signed integer of its width.
fn signed(bits: u64, ty: Type) -> i64 {
    let width = ty.bits();
    ((bits << (64 - width)) as i64) >> (64 - width)
}

fn f32_of(bits: u64) -> f32 {
    f32::from_bits(bits as u32)
}

fn bits_of(value: f32) -> u64 {
    value.to_bits() as u64
}

/// `.ftz`: a subnormal f32 is flushed to a zero of its sign.
fn flush(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

impl<'a, 'g> BlockState<'a, 'g> {
    fn error(&self, inst: &Inst, thread: Option<usize>, message: String) -> EmulationError {
        EmulationError {
            message: format!("`{}`: {message}", inst_name(&inst.op)),
            loc: inst.loc,
            block: self.ctaid,
            thread: thread.map(|t| (self.first + t) as u32),
        }
    }

    /// The block's id of this state's thread `t`: what memory and barriers know it by.
    fn id(&self, t: usize) -> u32 {
        (self.first + t) as u32
    }

    /// What the block's threads share; only the running state holds it.
    fn c(&mut self) -> &mut Common {
        self.common
            .as_mut()
            .expect("a running block state holds what the block shares")
    }

    fn get(&self, reg: Reg, thread: usize) -> u64 {
        self.regs[reg.index()][thread]
    }

    fn ty(&self, reg: Reg) -> Type {
        self.program.ty(reg)
    }

    /// The value of `reg`, which must be the same in every thread (a loop bound, a condition).
    fn uniform(&self, inst: &Inst, reg: Reg) -> Result<u64> {
        let values = &self.regs[reg.index()];
        let first = values[0];
        match values.iter().position(|&v| v != first) {
            None => Ok(first),
            Some(thread) => Err(self.error(
                inst,
                Some(thread),
                "divergent control flow: the value differs between threads".to_string(),
            )),
        }
    }

    /// Runs a block's instructions; returns the registers its `yield` names.
    fn block(&mut self, block: &Block) -> Result<Vec<Reg>> {
        for inst in &block.insts {
            if let Op::Yield(values) = &inst.op {
                return Ok(values.clone());
            }
            self.inst(inst)?;
        }
        Ok(Vec::new())
    }

    fn copy(&mut self, to: &[Reg], from: &[Reg]) {
        for (&t, &f) in to.iter().zip(from) {
            self.regs[t.index()] = self.regs[f.index()].clone();
        }
    }

    fn inst(&mut self, inst: &Inst) -> Result<()> {
        match &inst.op {
            Op::For {
                lower,
                upper,
                step,
                init,
                iv,
                params,
                body,
            } => {
                let ty = self.ty(*lower);
                let lo = signed(self.uniform(inst, *lower)?, ty);
                let hi = signed(self.uniform(inst, *upper)?, ty);
                let st = signed(self.uniform(inst, *step)?, ty);
                self.copy(params, init);
                let mut at = lo;
                let mut carried: Vec<Reg> = init.clone();
                if st > 0 && lo < hi {
                    loop {
                        self.regs[iv.index()] = vec![at as u64 & mask(ty); self.threads];
                        self.copy(params, &carried);
                        carried = self.block(body)?;
                        self.copy(params, &carried);
                        carried = params.clone();
                        let next = signed((at.wrapping_add(st)) as u64 & mask(ty), ty);
                        if next < lo || next >= hi {
                            break;
                        }
                        at = next;
                    }
                }
                self.copy(&inst.results, &carried);
                Ok(())
            }
            Op::If {
                cond,
                then_block,
                else_block,
            } => {
                let cond = match self.uniform(inst, *cond) {
                    Ok(cond) => cond,
                    Err(divergent) => {
                        return self.run_apart(inst, *cond, [then_block, else_block], divergent);
                    }
                };
                let taken = if cond & 1 != 0 {
                    then_block
                } else {
                    else_block
                };
                let yielded = self.block(taken)?;
                self.copy(&inst.results, &yielded);
                Ok(())
            }
            Op::Yield(_) => Err(self.error(inst, None, "a yield inside a block".to_string())),
            Op::Barrier => {
                if self.context.is_some() {
                    let message = "bar.sync 0 where warpgroups run apart: the threads of the \
                                   others never reach it"
                        .to_string();
                    return Err(self.error(inst, None, message));
                }
                self.c().shared.barrier();
                // Barrier 0, counting every thread of the block.
                let all = Event::Named {
                    id: 0,
                    threads: self.threads as u32,
                    wait: true,
                };
                for warp in 0..self.threads.div_ceil(THREADS_PER_WARP as usize) {
                    self.log(warp, all);
                }
                Ok(())
            }
            Op::NamedBarrier {
                id,
                threads,
                wait,
                pred,
            } => {
                // By barrier: the threads that meet at it here, and those that wait.
                let mut met: std::collections::BTreeMap<u64, (Vec<u32>, Vec<u32>)> =
                    Default::default();
                for lane in self.issuing_lanes(inst, *pred, &[*id])? {
                    let id = self.get(*id, lane);
                    let warp_end = (lane + THREADS_PER_WARP as usize).min(self.threads);
                    let (arriving, waiting) = met.entry(id).or_default();
                    arriving.extend((lane..warp_end).map(|t| self.id(t)));
                    if *wait {
                        waiting.extend((lane..warp_end).map(|t| self.id(t)));
                    }
                    if !(1..16).contains(&id) {
                        let message = format!("named barrier {id} (barriers 1 to 15 are named)");
                        return Err(self.error(inst, Some(lane), message));
                    }
                    let block_threads = self.program.threads_per_block;
                    if threads % THREADS_PER_WARP != 0 || *threads > block_threads {
                        let message = format!(
                            "named barrier {id} counts {threads} threads: not whole warps of the \
                             block's {block_threads}"
                        );
                        return Err(self.error(inst, Some(lane), message));
                    }
                    let (id, threads, wait) = (id as u32, *threads, *wait);
                    self.log(
                        lane / THREADS_PER_WARP as usize,
                        Event::Named { id, threads, wait },
                    );
                }
                // Once its count of threads arrived, here or at an earlier instruction
                // (`bar.arrive` releases), the barrier orders what each did before it before
                // what the ones waiting here do next. Arrivals after waits elsewhere (the
                // turns: a warpgroup waits before the other arrives, which in lockstep it
                // cannot) complete a phase no one waits at, which orders nothing.
                let time = self.c().shared.tick();
                for (id, (arriving, waiting)) in met {
                    let common = self.c();
                    let pending = common.named_arrivals.entry(id).or_default();
                    pending.extend(arriving.iter().map(|&t| (t, time)));
                    if pending.len() >= *threads as usize {
                        let arrivals = std::mem::take(pending);
                        common.shared.acquire(&waiting, &arrivals);
                    }
                }
                Ok(())
            }
            Op::Store { ptr, value, pred } => {
                let (space, ty) = (self.space(*ptr), self.ty(*value));
                for t in 0..self.threads {
                    if pred.is_some_and(|p| self.get(p, t) & 1 == 0) {
                        continue;
                    }
                    let (address, bits) = (self.get(*ptr, t), self.get(*value, t));
                    let written = match space {
                        Space::Global => self.global.write(address, ty, bits),
                        Space::Shared => {
                            let id = self.id(t);
                            self.c().shared.write(address, ty, bits, id)
                        }
                    };
                    written.map_err(|m| self.error(inst, Some(t), m))?;
                }
                Ok(())
            }
            Op::AtomicAdd { ptr, values, pred } => {
                if self.space(*ptr) == Space::Shared {
                    let message = "an atomic add into shared memory".to_string();
                    return Err(self.error(inst, None, message));
                }
                let bytes = 4 * values.len() as u64;
                for t in 0..self.threads {
                    if pred.is_some_and(|p| self.get(p, t) & 1 == 0) {
                        continue;
                    }
                    let address = self.get(*ptr, t);
                    if !address.is_multiple_of(bytes) {
                        let message =
                            format!("{bytes}-byte vector atomic add at {address}, misaligned");
                        return Err(self.error(inst, Some(t), message));
                    }
                    for (i, &value) in values.iter().enumerate() {
                        let at = address + 4 * i as u64;
                        let added = self.global.add_f32(at, self.get(value, t));
                        added.map_err(|m| self.error(inst, Some(t), m))?;
                    }
                }
                Ok(())
            }
            Op::StoreVector { ptr, values, pred } => {
                let ty = self.ty(values[0]);
                let bytes = (ty.bytes() as usize * values.len()) as u64;
                for t in 0..self.threads {
                    if pred.is_some_and(|p| self.get(p, t) & 1 == 0) {
                        continue;
                    }
                    let address = self.get(*ptr, t);
                    if !address.is_multiple_of(bytes) {
                        let message = format!("{bytes}-byte vector store at {address}, misaligned");
                        return Err(self.error(inst, Some(t), message));
                    }
                    for (i, &value) in values.iter().enumerate() {
                        let at = address + i as u64 * ty.bytes() as u64;
                        let bits = self.get(value, t);
                        let written = match self.space(*ptr) {
                            Space::Global => self.global.write(at, ty, bits),
                            Space::Shared => {
                                let id = self.id(t);
                                self.c().shared.write(at, ty, bits, id)
                            }
                        };
                        written.map_err(|m| self.error(inst, Some(t), m))?;
                    }
                }
                Ok(())
            }
            Op::LoadVector { ptr, pred } => {
                let ty = self.ty(inst.results[0]);
                let count = inst.results.len();
                let bytes = (ty.bytes() as usize * count) as u64;
                let mut out = vec![vec![0u64; self.threads]; count];
                for t in 0..self.threads {
                    if pred.is_some_and(|p| self.get(p, t) & 1 == 0) {
                        continue;
                    }
                    let address = self.get(*ptr, t);
                    if !address.is_multiple_of(bytes) {
                        let message = format!("{bytes}-byte vector load at {address}, misaligned");
                        return Err(self.error(inst, Some(t), message));
                    }
                    for (i, values) in out.iter_mut().enumerate() {
                        let at = address + i as u64 * ty.bytes() as u64;
                        let read = match self.space(*ptr) {
                            Space::Global => self.global.read(at, ty),
                            Space::Shared => {
                                let id = self.id(t);
                                self.c().shared.read(at, ty, id)
                            }
                        };
                        values[t] = read.map_err(|m| self.error(inst, Some(t), m))?;
                    }
                }
                for (&result, values) in inst.results.iter().zip(out) {
                    self.regs[result.index()] = values;
                }
                Ok(())
            }
            Op::CpAsync {
                dst,
                src,
                src_bytes,
            } => {
                const BYTES: usize = 16;
                for t in 0..self.threads {
                    let read = match self.get(*src_bytes, t) {
                        0 => Ok(vec![0; BYTES]),
                        16 => self.global.read_bytes(self.get(*src, t), BYTES),
                        other => Err(format!("src-size {other}, expected 0 or 16")),
                    };
                    let bytes = read.map_err(|m| self.error(inst, Some(t), m))?;
                    let offset = self.get(*dst, t);
                    {
                        let id = self.id(t);
                        self.c().shared.start_copy(offset, BYTES, id)
                    }
                    .map_err(|m| self.error(inst, Some(t), m))?;
                    self.open_copies[t].push(InFlight { offset, bytes });
                }
                Ok(())
            }
            Op::MbarrierInit { bar, count, pred } => {
                for t in self.predicated(*pred) {
                    let at = self.get(*bar, t);
                    let c = self.c();
                    c.progress += 1;
                    let init = c.mbarriers.init(at, *count);
                    init.map_err(|m| self.error(inst, Some(t), m))?;
                    let (bar, count) = (self.get(*bar, t), *count);
                    self.log_thread(t, Event::MbarrierInit { bar, count });
                }
                Ok(())
            }
            Op::FenceMbarrierInit => Ok(()),
            // One block runs at a time: no kernel runs before or beside it.
            Op::GridControl(_) => Ok(()),
            // Registers are not a resource the emulator counts.
            Op::SetMaxNreg { increase, regs } => self.set_max_nreg(inst, *increase, *regs),
            Op::MbarrierArriveExpectTx { bar, bytes, pred } => {
                for t in self.predicated(*pred) {
                    let (at, id) = (self.get(*bar, t), self.id(t));
                    let c = self.c();
                    c.progress += 1;
                    let time = c.shared.tick();
                    let arrive = c.mbarriers.arrive_expect_tx(at, *bytes, id, time);
                    arrive.map_err(|m| self.error(inst, Some(t), m))?;
                    let bar = self.get(*bar, t);
                    self.log_thread(t, Event::MbarrierArrive { bar });
                }
                Ok(())
            }
            Op::MbarrierArrive { bar } => {
                for t in 0..self.threads {
                    let (at, id) = (self.get(*bar, t), self.id(t));
                    let c = self.c();
                    c.progress += 1;
                    let time = c.shared.tick();
                    let arrive = c.mbarriers.arrive(at, id, time);
                    arrive.map_err(|m| self.error(inst, Some(t), m))?;
                    let bar = self.get(*bar, t);
                    self.log_thread(t, Event::MbarrierArrive { bar });
                }
                Ok(())
            }
            Op::MbarrierWait { bar, parity, warps } => {
                // In lockstep a wait is one event: it happens if any warp waits.
                let waiting = self.issuing_lanes(inst, *warps, &[*bar, *parity])?;
                if waiting.is_empty() {
                    return Ok(());
                }
                let (bar, parity) = (self.uniform(inst, *bar)?, self.uniform(inst, *parity)?);
                let parity = parity as u32;
                let mut waiters = Vec::new();
                for lane in waiting {
                    self.log_thread(lane, Event::MbarrierWait { bar, parity });
                    let warp_end = (lane + THREADS_PER_WARP as usize).min(self.threads);
                    waiters.extend((lane..warp_end).map(|t| self.id(t)));
                }
                self.wait_until_ready(inst, bar, parity)?;
                let c = self.c();
                let waited = c.mbarriers.wait(&mut c.shared, bar, parity, &waiters);
                waited.map_err(|m| self.error(inst, None, m))
            }
            Op::MbarrierInval { bar, pred } => {
                for t in self.predicated(*pred) {
                    let at = self.get(*bar, t);
                    let inval = self.c().mbarriers.inval(at);
                    inval.map_err(|m| self.error(inst, Some(t), m))?;
                    let bar = self.get(*bar, t);
                    self.log_thread(t, Event::MbarrierInval { bar });
                }
                Ok(())
            }
            Op::TmaLoad { copies, bar, warps } => {
                for TmaCopy { dst, map, coords } in copies {
                    let (params, lanes) =
                        self.tma_lanes(inst, *map, *warps, &[*dst, *bar], coords)?;
                    for (t, at) in lanes {
                        let (dst, bar) = (self.get(*dst, t), self.get(*bar, t));
                        let (global, id) = (self.global, self.id(t));
                        let c = self.c();
                        let copied =
                            c.mbarriers
                                .copy(&mut c.shared, global, params, dst, &at, bar, id);
                        c.progress += 1;
                        copied.map_err(|m| self.error(inst, Some(t), m))?;
                    }
                }
                Ok(())
            }
            Op::TmaStore {
                src,
                map,
                coords,
                warps,
                add,
            } => {
                let (params, lanes) = self.tma_lanes(inst, *map, *warps, &[*src], coords)?;
                for (t, at) in lanes {
                    let src = self.get(*src, t);
                    let (global, id) = (self.global, self.id(t));
                    let shared = &mut self.c().shared;
                    let stored = tma::store(shared, global, params, src, &at, id, *add);
                    stored.map_err(|m| self.error(inst, Some(t), m))?;
                }
                Ok(())
            }
            // Every thread of this part waits (the op has no predicate): its own stores' bytes
            // are read, not those of a part running apart.
            Op::BulkWaitRead => {
                let waiting = self.id(0)..self.id(self.threads);
                self.c().shared.wait_store_reads(waiting);
                Ok(())
            }
            Op::CpAsyncCommit => {
                for t in 0..self.threads {
                    let group = std::mem::take(&mut self.open_copies[t]);
                    self.groups[t].push_back(group);
                }
                Ok(())
            }
            Op::CpAsyncWait { pending } => {
                for t in 0..self.threads {
                    while self.groups[t].len() > *pending as usize {
                        for copy in self.groups[t].pop_front().unwrap_or_default() {
                            {
                                let id = self.id(t);
                                self.c().shared.land(copy.offset, &copy.bytes, id)
                            };
                        }
                    }
                }
                Ok(())
            }
            Op::Load { ptr, pred, other } => {
                let (space, ty) = (self.space(*ptr), self.ty(inst.results[0]));
                let mut out = Vec::with_capacity(self.threads);
                for t in 0..self.threads {
                    if pred.is_some_and(|p| self.get(p, t) & 1 == 0) {
                        out.push(other.map_or(0, |o| self.get(o, t)));
                        continue;
                    }
                    let address = self.get(*ptr, t);
                    let read = match space {
                        Space::Global => self.global.read(address, ty),
                        Space::Shared => {
                            let id = self.id(t);
                            self.c().shared.read(address, ty, id)
                        }
                    };
                    out.push(read.map_err(|m| self.error(inst, Some(t), m))?);
                }
                self.regs[inst.results[0].index()] = out;
                Ok(())
            }
            // Blocks run one after another here: the arrivals of the blocks before are counted.
            Op::AtomicArrive { ptr, pred } => {
                let mut out = Vec::with_capacity(self.threads);
                for t in 0..self.threads {
                    if self.get(*pred, t) & 1 == 0 {
                        out.push(0);
                        continue;
                    }
                    let before = self.global.arrive(self.get(*ptr, t));
                    out.push(before.map_err(|m| self.error(inst, Some(t), m))?);
                }
                self.regs[inst.results[0].index()] = out;
                Ok(())
            }
            // Blocks run one after another, each thread's accesses in order.
            Op::FenceGpu => Ok(()),
            Op::Ldmatrix { ptr, count, trans } => self.ldmatrix(inst, *ptr, *count, *trans),
            Op::Mma { a, b, c } => self.mma(inst, a, b, c),
            // Shared memory written before a barrier is the same to every proxy here, but for
            // TMA stores, which read only what their writers fenced.
            Op::FenceProxyAsync => {
                for t in 0..self.threads {
                    {
                        let id = self.id(t);
                        self.c().shared.fence_async(id)
                    };
                }
                Ok(())
            }
            Op::WgmmaCommit => {
                self.c().shared.commit_async();
                Ok(())
            }
            Op::WgmmaFence | Op::KeepLive(_) => Ok(()),
            // The products were computed at issue; what they read stays read until here.
            Op::WgmmaWait { pending, values } => {
                self.c().shared.wait_async(*pending);
                self.copy(&inst.results, values);
                Ok(())
            }
            Op::Wgmma {
                steps,
                trans_b,
                acc,
                accumulate,
                elem,
            } => {
                // Without `accumulate` the first step reads no accumulator: +0.0 in its place.
                let mut values: Vec<Vec<u64>> = acc
                    .iter()
                    .map(|r| match accumulate {
                        true => self.regs[r.index()].clone(),
                        false => vec![0; self.threads],
                    })
                    .collect();
                for step in steps {
                    values = self.wgmma(inst, step, *trans_b, &values, *elem)?;
                }
                for (&result, values) in inst.results.iter().zip(values) {
                    self.regs[result.index()] = values;
                }
                Ok(())
            }
            Op::Shuffle { mode, value, lane } => {
                let out = (0..self.threads)
                    .map(|t| {
                        let own = (t % THREADS_PER_WARP as usize) as u64;
                        let operand = self.get(*lane, t) & 0x1f;
                        let source = match mode {
                            ShuffleMode::Bfly => own ^ operand,
                            ShuffleMode::Idx => operand,
                        };
                        let warp_start = t - own as usize;
                        self.get(*value, warp_start + source as usize)
                    })
                    .collect();
                self.regs[inst.results[0].index()] = out;
                Ok(())
            }
            op => {
                let result = inst.results[0];
                let ty = self.ty(result);
                let out = (0..self.threads)
                    .map(|t| {
                        self.value_op(op, ty, t)
                            .map(|bits| bits & mask(ty))
                            .map_err(|m| self.error(inst, Some(t), m))
                    })
                    .collect::<Result<Vec<u64>>>()?;
                self.regs[result.index()] = out;
                Ok(())
            }
        }
    }

    /// `ldmatrix` over each warp: lane `l`'s register `j` gets, in each half, the element of
    /// matrix `j`'s row that `mma::ldmatrix_source` names, read from the row address its lane
    /// gave. Each row address must be 16-byte aligned; reads are checked for races as the
    /// receiving lane's.
    fn ldmatrix(&mut self, inst: &Inst, ptr: Reg, count: u8, trans: bool) -> Result<()> {
        let mut out = vec![vec![0u64; self.threads]; count as usize];
        for warp_start in (0..self.threads).step_by(THREADS_PER_WARP as usize) {
            let addresses: Vec<u64> = (0..THREADS_PER_WARP as usize)
                .map(|lane| self.get(ptr, warp_start + lane))
                .collect();
            for (lane, address) in addresses.iter().enumerate().take(8 * count as usize) {
                if !address.is_multiple_of(16) {
                    let message = format!("row address {address} is not 16-byte aligned");
                    return Err(self.error(inst, Some(warp_start + lane), message));
                }
            }
            for lane in 0..THREADS_PER_WARP {
                let thread = warp_start + lane as usize;
                for (reg, regs) in out.iter_mut().enumerate() {
                    for half in 0..K_WIDTH {
                        let (source, elem) = ldmatrix_source(lane, reg, half, trans);
                        let at = addresses[source as usize] + 2 * elem as u64;
                        let id = self.id(thread);
                        let bits = self
                            .c()
                            .shared
                            .read(at, Type::I16, id)
                            .map_err(|m| self.error(inst, Some(thread), m))?;
                        regs[thread] |= bits << (16 * half);
                    }
                }
            }
        }
        for (&result, values) in inst.results.iter().zip(out) {
            self.regs[result.index()] = values;
        }
        Ok(())
    }

    /// `mma.sync.m16n8k16` over each warp: the lanes' fragments (`mma::a_fragment`,
    /// `b_fragment`, `acc_fragment`) assembled into A (16 x 16), B (16 x 8) and C, then
    /// `D = C + A B` with the 16 exact products summed in f64 and the total rounded to f32 once.
    fn mma(&mut self, inst: &Inst, a: &[Reg], b: &[Reg], c: &[Reg]) -> Result<()> {
        let half_value = match self.ty(a[0]) {
            Type::F16x2 => |bits: u64| f16::from_bits(bits as u16).to_f64(),
            Type::BF16x2 => |bits: u64| bf16::from_bits(bits as u16).to_f64(),
            other => {
                let message = format!("operands of {}, expected f16x2 or bf16x2", other.name());
                return Err(self.error(inst, None, message));
            }
        };
        let mut out = vec![vec![0u64; self.threads]; ACC_REGS_PER_MMA];
        for warp_start in (0..self.threads).step_by(THREADS_PER_WARP as usize) {
            let mut a_tile = [[0f64; MMA_K]; MMA_M];
            let mut b_tile = [[0f64; MMA_N]; MMA_K];
            let mut c_tile = [[0f64; MMA_N]; MMA_M];
            for lane in 0..THREADS_PER_WARP {
                let thread = warp_start + lane as usize;
                for half in 0..K_WIDTH {
                    for (reg, &r) in a.iter().enumerate() {
                        let [m, k] = a_fragment(lane, reg, half);
                        a_tile[m][k] = half_value(self.get(r, thread) >> (16 * half));
                    }
                    for (reg, &r) in b.iter().enumerate() {
                        let [k, n] = b_fragment(lane, reg, half);
                        b_tile[k][n] = half_value(self.get(r, thread) >> (16 * half));
                    }
                }
                for (reg, &r) in c.iter().enumerate() {
                    let [m, n] = acc_fragment(lane, reg);
                    c_tile[m][n] = f32_of(self.get(r, thread)) as f64;
                }
            }
            for lane in 0..THREADS_PER_WARP {
                for (reg, regs) in out.iter_mut().enumerate() {
                    let [m, n] = acc_fragment(lane, reg);
                    let products: f64 = (0..MMA_K).map(|k| a_tile[m][k] * b_tile[k][n]).sum();
                    regs[warp_start + lane as usize] = bits_of((c_tile[m][n] + products) as f32);
                }
            }
        }
        for (&result, values) in inst.results.iter().zip(out) {
            self.regs[result.index()] = values;
        }
        Ok(())
    }

    /// One `wgmma.mma_async.m64nNk16` over each warpgroup: B (and A, unless in registers) read
    /// where the descriptor's canonical layout says (`wgmma::Descriptor::element_offset`), A
    /// in registers and the accumulators (`acc[register][thread]`) from each warp's `mma.sync`
    /// fragments (warp `w` of the warpgroup: rows `16 w ..`; register `r`: columns `8 (r / 4)
    /// ..`), then `D = C + A B` with the 16 exact products summed in f64 and rounded to f32 once.
    fn wgmma(
        &mut self,
        inst: &Inst,
        WgmmaStep { a, b }: &WgmmaStep,
        trans_b: bool,
        acc: &[Vec<u64>],
        elem: Type,
    ) -> Result<Vec<Vec<u64>>> {
        let half_value = match elem {
            Type::F16 => |bits: u64| f16::from_bits(bits as u16).to_f64(),
            Type::BF16 => |bits: u64| bf16::from_bits(bits as u16).to_f64(),
            other => {
                let message = format!("wgmma of {}, expected f16 or bf16", other.name());
                return Err(self.error(inst, None, message));
            }
        };
        let group = (WARPS_PER_WARPGROUP * THREADS_PER_WARP) as usize;
        if !self.threads.is_multiple_of(group) {
            let message = format!("{} threads are not whole warpgroups", self.threads);
            return Err(self.error(inst, None, message));
        }
        let n = 2 * acc.len();
        let mut out = vec![vec![0u64; self.threads]; acc.len()];
        for first in (0..self.threads).step_by(group) {
            // A descriptor is the warpgroup's: every thread must give the same.
            let descriptor = |this: &Self, desc: &WgmmaDesc| {
                let bits = this.get(desc.base, first);
                if let Some(t) = (first..first + group).find(|&t| this.get(desc.base, t) != bits) {
                    let message = format!("descriptor differs across the warpgroup: {bits:#x}");
                    return Err(this.error(inst, Some(t), message));
                }
                // The offset goes into the low word, as the statement adds it.
                let low = (bits as u32).wrapping_add(desc.offset);
                let bits = (bits & !0xffff_ffff) | u64::from(low);
                Descriptor::decode(bits).map_err(|m| this.error(inst, Some(first), m))
            };
            let read = |this: &mut Self, desc: &Descriptor, major: Major, mn, k| {
                let at = desc.element_offset(major, 2, mn, k) as u64;
                let id = this.id(first);
                let bits = this
                    .c()
                    .shared
                    .read_async(at, Type::I16, id)
                    .map_err(|m| this.error(inst, Some(first), m))?;
                Ok::<f64, EmulationError>(half_value(bits))
            };
            let b_desc = descriptor(self, b)?;
            let b_major = if trans_b { Major::MN } else { Major::K };
            let mut b_tile = vec![[0f64; WGMMA_K]; n];
            for (col, column) in b_tile.iter_mut().enumerate() {
                for (k, value) in column.iter_mut().enumerate() {
                    *value = read(self, &b_desc, b_major, col, k)?;
                }
            }
            let mut a_tile = vec![[0f64; WGMMA_K]; WGMMA_M];
            for (row, values) in a_tile.iter_mut().enumerate() {
                for (k, value) in values.iter_mut().enumerate() {
                    *value = match a {
                        WgmmaA::Descriptor { desc, trans } => {
                            let a_desc = descriptor(self, desc)?;
                            let major = if *trans { Major::MN } else { Major::K };
                            read(self, &a_desc, major, row, k)?
                        }
                        WgmmaA::Registers(regs) => {
                            let (lane, reg, half) = a_fragment_inverse([row % MMA_M, k]);
                            let thread = first + (row / MMA_M) * THREADS_PER_WARP as usize;
                            let bits = self.get(regs[reg], thread + lane as usize);
                            half_value(bits >> (16 * half))
                        }
                    };
                }
            }
            for (row, a_row) in a_tile.iter().enumerate() {
                let warp_first = first + (row / MMA_M) * THREADS_PER_WARP as usize;
                for (col, b_column) in b_tile.iter().enumerate() {
                    let (lane, c) = acc_fragment_inverse([row % MMA_M, col % MMA_N]);
                    let (thread, reg) = (warp_first + lane as usize, 4 * (col / MMA_N) + c);
                    let products: f64 = a_row.iter().zip(b_column).map(|(a, b)| a * b).sum();
                    let c_value = f32_of(acc[reg][thread]) as f64;
                    out[reg][thread] = bits_of((c_value + products) as f32);
                }
            }
        }
        Ok(out)
    }

    /// Where warpgroups run apart, waits (passing the baton on) until the phase of parity
    /// `parity` of the `mbarrier` at `bar` is complete or can complete; in lockstep
    /// [`Mbarriers::wait`] completes it or reports the deadlock.
    fn wait_until_ready(&mut self, inst: &Inst, bar: u64, parity: u32) -> Result<()> {
        let Some((me, baton)) = self.context else {
            return Ok(());
        };
        loop {
            let ready = self.c().mbarriers.ready(bar, parity);
            if ready.map_err(|m| self.error(inst, None, m))? {
                return Ok(());
            }
            let waits_on = || {
                format!(
                    "the mbarrier at shared byte {bar} for its phase of parity {parity}, which \
                     nothing left completes"
                )
            };
            self.pass_baton(inst, (me, baton), waits_on)?;
        }
    }

    /// Lets another context run while this one waits; where every context waits and none
    /// moved, the deadlock is an error naming what this one `waits_on`.
    fn pass_baton(
        &mut self,
        inst: &Inst,
        (me, baton): (usize, &Baton),
        waits_on: impl FnOnce() -> String,
    ) -> Result<()> {
        let common = self
            .common
            .take()
            .expect("a running context holds the block's state");
        match baton.block(me, common) {
            Ok(common) => {
                self.common = Some(common);
                Ok(())
            }
            Err(common) => {
                self.common = Some(common);
                let message = format!("deadlock: every warpgroup waits, these on {}", waits_on());
                Err(self.error(inst, None, message))
            }
        }
    }

    /// `setmaxnreg` by every thread here (whole warpgroups): `.dec` gives registers back to the
    /// block's pool; `.inc` takes them from it, waiting (as the GPU does) until it has enough,
    /// which where nothing else will give any back is a deadlock.
    fn set_max_nreg(&mut self, inst: &Inst, increase: bool, regs: u32) -> Result<()> {
        let ids: Vec<usize> = (0..self.threads).map(|t| self.id(t) as usize).collect();
        loop {
            let c = self.c();
            let held: u64 = ids.iter().map(|&i| u64::from(c.registers[i])).sum();
            let wanted = u64::from(regs) * ids.len() as u64;
            let fits = if increase {
                wanted >= held && wanted - held <= c.register_pool
            } else {
                wanted <= held
            };
            if fits {
                c.register_pool = c.register_pool + held - wanted;
                for &i in &ids {
                    c.registers[i] = regs;
                }
                c.progress += 1;
                return Ok(());
            }
            let (way, now) = (if increase { "inc" } else { "dec" }, c.registers[ids[0]]);
            let pool = c.register_pool;
            let stuck = format!(
                "setmaxnreg.{way} {regs} by {} threads holding {now} each: the block's pool has \
                 {pool} registers",
                ids.len()
            );
            let Some(context) = self.context.filter(|_| increase && wanted >= held) else {
                return Err(self.error(inst, None, stuck));
            };
            self.pass_baton(inst, context, || stuck)?;
        }
    }

    /// An `if` whose condition splits the block by whole warps: a branch that only some warps
    /// run (the rest skip it) runs on them alone; two that both run code (a producer
    /// warpgroup's and its consumers') each in a context of its own ([`super::apart`]), whole
    /// warpgroups each, the first error of one the split's.
    fn run_apart(
        &mut self,
        inst: &Inst,
        cond: Reg,
        [then_block, else_block]: [&Block; 2],
        divergent: EmulationError,
    ) -> Result<()> {
        let warp = THREADS_PER_WARP as usize;
        if !inst.results.is_empty() || !self.threads.is_multiple_of(warp) {
            return Err(divergent);
        }
        let taken = |t: usize| self.get(cond, t) & 1 != 0;
        let mut parts: Vec<(usize, usize, bool)> = Vec::new();
        for start in (0..self.threads).step_by(warp) {
            let side = taken(start);
            if (start..start + warp).any(|t| taken(t) != side) {
                return Err(divergent);
            }
            match parts.last_mut() {
                Some(part) if part.2 == side => part.1 = start + warp,
                _ => parts.push((start, start + warp, side)),
            }
        }
        let block = |side: bool| if side { then_block } else { else_block };
        // A branch that yields nothing and does nothing is skipped.
        let idle = |b: &Block| match b.insts.as_slice() {
            [] => true,
            [only] => matches!(&only.op, Op::Yield(values) if values.is_empty()),
            _ => false,
        };
        parts.retain(|&(_, _, side)| !idle(block(side)));
        if let [(start, end, side)] = parts[..] {
            // The others skip it: this state's context runs it on these warps.
            let common = self.common.take();
            let mut part = self.context_state(start..end, self.context);
            part.common = common;
            let ran = part.block(block(side)).map(|_| ());
            self.common = part.common.take();
            self.open_copies.splice(start..end, part.open_copies);
            self.groups.splice(start..end, part.groups);
            return ran;
        }
        let group = (WARPS_PER_WARPGROUP * THREADS_PER_WARP) as usize;
        let whole =
            |&(start, end, _): &(usize, usize, bool)| start % group == 0 && end % group == 0;
        if self.context.is_some() || !parts.iter().all(whole) {
            return Err(divergent);
        }
        let common = self
            .common
            .take()
            .expect("the block's state holds what it shares");
        let baton = Baton::new(common, parts.len());
        let contexts: Vec<BlockState<'_, '_>> = parts
            .iter()
            .enumerate()
            .map(|(i, &(start, end, _))| self.context_state(start..end, Some((i, &baton))))
            .collect();
        let ended = std::thread::scope(|scope| {
            let runs: Vec<_> = contexts
                .into_iter()
                .zip(&parts)
                .enumerate()
                .map(|(i, (mut context, &(_, _, side)))| {
                    let block = block(side);
                    let baton = &baton;
                    scope.spawn(move || {
                        context.common = Some(baton.take(i));
                        let ran = context.block(block).map(|_| ());
                        let common = context.common.take();
                        baton.end(i, common.expect("a context ends holding the block's state"));
                        (ran, context.open_copies, context.groups)
                    })
                })
                .collect();
            runs.into_iter()
                .map(|run| {
                    run.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect::<Vec<_>>()
        });
        self.common = baton.into_common();
        let mut errors = Vec::new();
        for (&(start, end, _), (ran, open_copies, groups)) in parts.iter().zip(ended) {
            self.open_copies.splice(start..end, open_copies);
            self.groups.splice(start..end, groups);
            if let Err(e) = ran {
                errors.push(e);
            }
        }
        // A context's own error before the deadlock it left the others in.
        match errors.iter().position(|e| !e.message.contains("deadlock")) {
            Some(i) => Err(errors.swap_remove(i)),
            None => errors.into_iter().next().map_or(Ok(()), Err),
        }
    }

    /// The state of this one's `threads` in `context`, their registers so far, not running.
    fn context_state<'s>(
        &self,
        threads: std::ops::Range<usize>,
        context: Option<(usize, &'s Baton)>,
    ) -> BlockState<'s, 'g>
    where
        'a: 's,
    {
        BlockState {
            program: self.program,
            global: self.global,
            ctaid: self.ctaid,
            nctaid: self.nctaid,
            threads: threads.len(),
            first: self.first + threads.start,
            regs: self
                .regs
                .iter()
                .map(|r| {
                    r.get(threads.clone())
                        .map(<[u64]>::to_vec)
                        .unwrap_or_default()
                })
                .collect(),
            common: None,
            context,
            open_copies: self.open_copies[threads.clone()].to_vec(),
            groups: self.groups[threads].to_vec(),
            maps: self.maps,
        }
    }

    /// The first lane of each warp where `warps` holds (every warp without it), which must hold
    /// in all its lanes or in none (a branch whole warps take or skip: around `elect.sync`,
    /// which every lane of the warp must reach, or a wait or barrier; kiln's are uniform by
    /// construction, and a split one is a lowering bug), as must the `operands` the lane issues
    /// with.
    fn issuing_lanes(
        &self,
        inst: &Inst,
        warps: Option<Reg>,
        operands: &[Reg],
    ) -> Result<Vec<usize>> {
        let mut lanes = Vec::new();
        for start in (0..self.threads).step_by(THREADS_PER_WARP as usize) {
            let end = (start + THREADS_PER_WARP as usize).min(self.threads);
            let holds = |t: usize| warps.is_none_or(|w| self.get(w, t) & 1 != 0);
            if (start..end).any(holds) != (start..end).all(holds) {
                let message = format!(
                    "the warp of threads {start}..{end} is split on whether it runs this {}",
                    inst_name(&inst.op)
                );
                return Err(self.error(inst, Some(start), message));
            }
            if !holds(start) {
                continue;
            }
            for &operand in operands {
                let value = self.get(operand, start);
                if let Some(t) = (start..end).find(|&t| self.get(operand, t) != value) {
                    let message = format!(
                        "the warp of threads {start}..{end} issues with operands that differ \
                         between its lanes (thread {t})"
                    );
                    return Err(self.error(inst, Some(t), message));
                }
            }
            lanes.push(start);
        }
        Ok(lanes)
    }

    /// The tensor map `map` of a TMA copy and, for each warp where `warps` holds, its issuing
    /// lane and the copy's coordinates (`shared` and `coords` the same across the warp).
    fn tma_lanes(
        &self,
        inst: &Inst,
        map: usize,
        warps: Reg,
        shared: &[Reg],
        coords: &[Reg],
    ) -> Result<(&'a TensorMapParams, Vec<TmaLane>)> {
        let Some(params) = self.maps.get(map) else {
            let message = format!("no tensor map {map}");
            return Err(self.error(inst, None, message));
        };
        let operands: Vec<Reg> = shared.iter().chain(coords).copied().collect();
        let lanes = self.issuing_lanes(inst, Some(warps), &operands)?;
        let at = |t: usize| -> Vec<i64> {
            coords
                .iter()
                .map(|&c| signed(self.get(c, t), Type::I32))
                .collect()
        };
        Ok((params, lanes.into_iter().map(|t| (t, at(t))).collect()))
    }

    /// Logs `event` for warp `warp`, where the block keeps a log.
    fn log(&mut self, warp: usize, event: Event) {
        let warp = self.first / THREADS_PER_WARP as usize + warp;
        if let Some(log) = &mut self.c().log {
            log.record(warp, event);
        }
    }

    /// Logs `event` for the warp of thread `thread`.
    fn log_thread(&mut self, thread: usize, event: Event) {
        self.log(thread / THREADS_PER_WARP as usize, event);
    }

    /// The threads where `pred` holds.
    fn predicated(&self, pred: Reg) -> Vec<usize> {
        (0..self.threads)
            .filter(|&t| self.get(pred, t) & 1 != 0)
            .collect()
    }

    fn space(&self, ptr: Reg) -> Space {
        match self.ty(ptr) {
            Type::Ptr(space) => space,
            _ => Space::Global,
        }
    }

    /// The bits of a value op's result in thread `t`.
    fn value_op(&self, op: &Op, ty: Type, t: usize) -> std::result::Result<u64, String> {
        let get = |r: &Reg| self.get(*r, t);
        Ok(match op {
            Op::Const(Constant::Int(v)) => *v as u64,
            Op::Const(Constant::Float(v)) => match ty {
                Type::F16 => f16::from_f64(*v).to_bits() as u64,
                Type::BF16 => bf16::from_f64(*v).to_bits() as u64,
                _ => bits_of(*v as f32),
            },
            Op::Special(special) => match special {
                Special::Tid | Special::TidAgain => (self.first + t) as u64,
                Special::Ctaid(axis) => self.ctaid[*axis as usize % 3] as u64,
                Special::Nctaid(axis) => self.nctaid[*axis as usize % 3] as u64,
            },
            Op::Int(op, x, y) => int_op(*op, get(x), get(y), ty)?,
            Op::IntAbs(x) => signed(get(x), ty).wrapping_abs() as u64,
            Op::Float(op, x, y) => {
                let (x, y) = (f32_of(get(x)), f32_of(get(y)));
                bits_of(match op {
                    FloatOp::Add => x + y,
                    FloatOp::Sub => x - y,
                    FloatOp::Mul => x * y,
                    FloatOp::Div => x / y,
                    FloatOp::Max => x.max(y),
                    FloatOp::Min => x.min(y),
                })
            }
            Op::Math(math, x) => {
                let x = f32_of(get(x));
                bits_of(match math {
                    Math::Neg => -x,
                    Math::Abs => x.abs(),
                    Math::Sqrt => x.sqrt(),
                    Math::Ex2Approx => flush(flush(x).exp2()),
                    Math::Lg2Approx => flush(x).log2(),
                    Math::TanhApprox => x.tanh(),
                })
            }
            Op::IntCmp(cmp, x, y) => {
                let operand_ty = self.ty(*x);
                let (a, b) = (get(x) & mask(operand_ty), get(y) & mask(operand_ty));
                let (sa, sb) = (signed(a, operand_ty), signed(b, operand_ty));
                (match cmp {
                    IntCmp::Eq => a == b,
                    IntCmp::Ne => a != b,
                    IntCmp::Slt => sa < sb,
                    IntCmp::Sle => sa <= sb,
                    IntCmp::Sgt => sa > sb,
                    IntCmp::Sge => sa >= sb,
                    IntCmp::Ult => a < b,
                    IntCmp::Ule => a <= b,
                    IntCmp::Ugt => a > b,
                    IntCmp::Uge => a >= b,
                }) as u64
            }
            Op::FloatCmp(cmp, x, y) => {
                let (a, b) = (f32_of(get(x)), f32_of(get(y)));
                (match cmp {
                    FloatCmp::Olt => a < b,
                    FloatCmp::Ole => a <= b,
                    FloatCmp::Ogt => a > b,
                    FloatCmp::Oge => a >= b,
                    FloatCmp::Oeq => a == b,
                    FloatCmp::Une => a != b,
                }) as u64
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                if get(cond) & 1 != 0 {
                    get(if_true)
                } else {
                    get(if_false)
                }
            }
            Op::Fma { a, b, c } => bits_of(f32_of(get(a)).mul_add(f32_of(get(b)), f32_of(get(c)))),
            Op::Cast(cast, x) => self.cast(*cast, get(x), self.ty(*x), ty)?,
            Op::PtrAdd { ptr, offset, elem } => {
                let offset = signed(get(offset), self.ty(*offset));
                get(ptr).wrapping_add((offset.wrapping_mul(elem.bytes() as i64)) as u64)
            }
            Op::SharedAddress { offset } => *offset as u64,
            Op::Pack { lo, hi } => (get(lo) & 0xffff) | (get(hi) & 0xffff) << 16,
            Op::PackRounded { lo, hi } => {
                let half = match ty {
                    Type::F16x2 => Type::F16,
                    _ => Type::BF16,
                };
                let round = |r: &Reg| self.cast(Cast::FpTrunc, get(r), Type::F32, half);
                round(lo)? | round(hi)? << 16
            }
            Op::For { .. }
            | Op::If { .. }
            | Op::Yield(_)
            | Op::Barrier
            | Op::NamedBarrier { .. }
            | Op::Store { .. }
            | Op::AtomicAdd { .. }
            | Op::StoreVector { .. }
            | Op::LoadVector { .. }
            | Op::CpAsync { .. }
            | Op::CpAsyncCommit
            | Op::CpAsyncWait { .. }
            | Op::MbarrierInit { .. }
            | Op::FenceMbarrierInit
            | Op::GridControl(_)
            | Op::AtomicArrive { .. }
            | Op::FenceGpu
            | Op::SetMaxNreg { .. }
            | Op::MbarrierArriveExpectTx { .. }
            | Op::MbarrierArrive { .. }
            | Op::MbarrierWait { .. }
            | Op::MbarrierInval { .. }
            | Op::TmaLoad { .. }
            | Op::TmaStore { .. }
            | Op::BulkWaitRead
            | Op::Load { .. }
            | Op::Ldmatrix { .. }
            | Op::Mma { .. }
            | Op::FenceProxyAsync
            | Op::WgmmaFence
            | Op::Wgmma { .. }
            | Op::WgmmaCommit
            | Op::KeepLive(_)
            | Op::WgmmaWait { .. }
            | Op::Shuffle { .. } => return Err("not a value op".to_string()),
        })
    }

    fn cast(
        &self,
        cast: Cast,
        bits: u64,
        from: Type,
        to: Type,
    ) -> std::result::Result<u64, String> {
        let float = |bits: u64| match from {
            Type::F16 => f16::from_bits(bits as u16).to_f32(),
            Type::BF16 => bf16::from_bits(bits as u16).to_f32(),
            _ => f32_of(bits),
        };
        let to_float = |x: f32| match to {
            Type::F16 => f16::from_f32(x).to_bits() as u64,
            Type::BF16 => bf16::from_f32(x).to_bits() as u64,
            _ => bits_of(x),
        };
        Ok(match cast {
            Cast::FpExt | Cast::FpTrunc => to_float(float(bits)),
            // Rust's `as` saturates and takes NaN to 0, as `cvt.rzi.sat` does.
            Cast::FpToSiSat => match to {
                Type::I64 => float(bits) as i64 as u64,
                Type::I32 => float(bits) as i32 as u32 as u64,
                other => {
                    return Err(format!(
                        "float to {} is not a cast kiln makes",
                        other.name()
                    ));
                }
            },
            Cast::SiToFp => to_float(signed(bits, from) as f32),
            Cast::UiToFp => to_float((bits & mask(from)) as f32),
            Cast::ZExt => bits & mask(from),
            Cast::SExt => signed(bits, from) as u64,
            Cast::Trunc | Cast::PtrToInt => bits,
        })
    }
}

/// An integer op of `ty`'s width; a division by zero or a shift past the width is LLVM poison,
/// which the lowering never lets happen: an error here.
fn int_op(op: IntOp, x: u64, y: u64, ty: Type) -> std::result::Result<u64, String> {
    let (x, y) = (x & mask(ty), y & mask(ty));
    let (sx, sy) = (signed(x, ty), signed(y, ty));
    let width = ty.bits() as u64;
    let shift = |y: u64| {
        if y < width {
            Ok(y as u32)
        } else {
            Err(format!(
                "shift by {y}, at or past the width {width} (llvm poison)"
            ))
        }
    };
    Ok(match op {
        IntOp::Add => x.wrapping_add(y),
        IntOp::Sub => x.wrapping_sub(y),
        IntOp::Mul => x.wrapping_mul(y),
        IntOp::SDiv | IntOp::SRem if sy == 0 || sy == -1 => {
            return Err(format!("division by {sy} (the lowering guards these)"));
        }
        IntOp::SDiv => (sx / sy) as u64,
        IntOp::SRem => (sx % sy) as u64,
        IntOp::SMax => sx.max(sy) as u64,
        IntOp::SMin => sx.min(sy) as u64,
        IntOp::And => x & y,
        IntOp::Or => x | y,
        IntOp::Xor => x ^ y,
        IntOp::Shl => x << shift(y)?,
        IntOp::AShr => (sx >> shift(y)?) as u64,
        IntOp::LShr => x >> shift(y)?,
    })
}

/// An op's name for error messages.
fn inst_name(op: &Op) -> &'static str {
    match op {
        Op::Load { .. } | Op::LoadVector { .. } => "ld",
        Op::CpAsync { .. } => "cp.async",
        Op::CpAsyncCommit => "cp.async.commit_group",
        Op::CpAsyncWait { .. } => "cp.async.wait_group",
        Op::MbarrierInit { .. } => "mbarrier.init",
        Op::FenceMbarrierInit => "fence.mbarrier_init",
        Op::GridControl(control) => grid_control_ptx(*control),
        Op::AtomicArrive { .. } => "atom.acq_rel.gpu.global.add.u32",
        Op::FenceGpu => "fence.acq_rel.gpu",
        Op::SetMaxNreg { .. } => "setmaxnreg",
        Op::MbarrierArriveExpectTx { .. } => "mbarrier.arrive.expect_tx",
        Op::MbarrierWait { .. } => "mbarrier.try_wait.parity",
        Op::MbarrierInval { .. } => "mbarrier.inval",
        Op::TmaLoad { .. } | Op::TmaStore { .. } => "cp.async.bulk.tensor",
        Op::BulkWaitRead => "cp.async.bulk.wait_group.read",
        Op::Store { .. } | Op::StoreVector { .. } => "st",
        Op::AtomicAdd { .. } => "red.global.add.f32",
        Op::Shuffle { .. } => "shfl.sync",
        Op::Ldmatrix { .. } => "ldmatrix",
        Op::Mma { .. } => "mma.sync",
        Op::Barrier | Op::NamedBarrier { wait: true, .. } => "bar.sync",
        Op::NamedBarrier { .. } => "bar.arrive",
        Op::For { .. } => "for",
        Op::If { .. } => "if",
        Op::Int(..) | Op::IntAbs(..) => "integer op",
        Op::Float(..) | Op::Math(..) => "float op",
        Op::Cast(..) => "cvt",
        _ => "op",
    }
}
