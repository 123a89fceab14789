//! Tile IR with layouts -> the thread program.
//!
//! A tile value becomes the registers this thread holds under its layout, in the order of its
//! [`ThreadMap`]'s registers; a scalar becomes one register every thread holds; a block pointer
//! its base, shape, strides and offsets (scalars). Positions are computed from the thread id: the
//! lane and warp fields of every layout are hoisted to the program's entry, the per-register
//! offsets added where they are used. One module per kind of op:
//! `arith` (elementwise), `memory` (pointers, loads, stores, block pointers), `movement`
//! (splat, broadcast, `expand_dims`, `trans`, layout conversions, reductions), `partial_sums`
//! (sums that only accumulate kept as lanes' partial sums), `dot` (tiles
//! staged in shared memory, `ldmatrix`, `mma.sync`), `wgmma`, `control`, `pipeline` (`cp.async`
//! or TMA into multi-buffered shared tiles), `turns` (warpgroups taking turns at the tensor
//! cores), `producer` (a producer warpgroup issuing the copies, the consumers computing).

mod arith;
mod control;
mod dot;
mod memory;
mod movement;
mod partial_sums;
mod pipeline;
mod producer;
mod refill;
mod turns;
mod wgmma;

use std::collections::{HashMap, HashSet};

use kiln_dsl::ir::{Inst as TileInst, Kernel, Op as TileOp, Region, Value};
use kiln_dsl::passes::for_each_operand;
use kiln_dsl::types::{DType, Elem, Type as TileType};
use kiln_dsl::{Loc, Target};

use super::ir::{Block, Constant, Inst, IntCmp, IntOp, Op, Param, Program, Reg, Special, Type};
use crate::layout::divisibility::definitions;
use crate::layout::{
    ConversionKind, Id, IdField, Layout, LayoutAssignment, THREADS_PER_WARP, ThreadMap,
    nested_regions, walk_insts,
};
use crate::{CodegenError, CompileOptions, Stage};
use dot::SharedTile;
use producer::Role;

type Result<T> = std::result::Result<T, CodegenError>;

/// Lowers `kernel` with its `layouts` to the program one thread of a block runs.
pub fn lower(
    kernel: &Kernel,
    layouts: &LayoutAssignment,
    options: &CompileOptions,
) -> Result<Program> {
    let mut plan = dot::SharedPlan::of(kernel, layouts, options.target.max_shared_bytes());
    // More buffers leave less room for the scratch reserved as lowering goes: where that runs
    // out, fewer ([`dot::SharedPlan::smaller`]).
    loop {
        match lower_in(kernel, layouts, options, plan) {
            Err(e) => match plan.smaller(kernel, layouts) {
                Some(smaller) => plan = smaller,
                None => return Err(e),
            },
            lowered => return lowered,
        }
    }
}

/// [`lower`] with its tiles in shared memory as `plan` places them.
fn lower_in(
    kernel: &Kernel,
    layouts: &LayoutAssignment,
    options: &CompileOptions,
    plan: dot::SharedPlan,
) -> Result<Program> {
    let max_shared_bytes = options.target.max_shared_bytes();
    if plan.end > max_shared_bytes {
        return Err(CodegenError::Options {
            message: format!(
                "the tiles staged in shared memory need {} bytes at {} stages; {} \
                 gives a block at most {max_shared_bytes}: use smaller blocks or fewer stages",
                plan.end, options.num_stages, options.target
            ),
        });
    }
    let mut lowering = Lowering {
        kernel,
        definitions: definitions(kernel),
        layouts,
        types: Vec::new(),
        prelude: Vec::new(),
        blocks: vec![Vec::new()],
        values: vec![None; kernel.values.len()],
        next_inst: 0,
        current_inst: 0,
        loc: None,
        converted: Vec::new(),
        hoisted: Vec::new(),
        fields: HashMap::new(),
        tid_again: None,
        loop_tid: options.loop_tid,
        uniform_warpgroup: None,
        uniform_descriptors: options.uniform_warpgroup,
        descriptors_at_issue: options.descriptors_at_issue,
        tid: Reg(0),
        shared_bytes: plan.end,
        max_shared_bytes,
        max_atomic_vector: match options.target {
            Target::Sm90a => 4,
            Target::Sm80 => 1,
        },
        scratch: plan.end,
        next_staged: plan.refilled,
        next_buffer: plan.staged,
        next_barrier: plan.barriers,
        once_barriers: plan.once_barriers,
        refill_buffers: plan.refill_buffers,
        ring_staging: plan.ring_staging,
        staging_ring: None,
        once_loads: Vec::new(),
        loop_counter: None,
        releases: Vec::new(),
        ring_slot: None,
        tma_store_bytes: 0,
        reduction_tile: plan.reduction,
        bulk_stores: false,
        shared_tiles: HashMap::new(),
        staged_by_threads: HashSet::new(),
        arrived_for_owner: false,
        owner_turns_body: None,
        owner_turns_open: false,
        buffered: HashMap::new(),
        pending: dot::Pending::default(),
        narrowed: HashMap::new(),
        in_flight: wgmma::InFlight::default(),
        deferred_copies: None,
        turns: None,
        early_prologue: (!options.producer)
            .then(|| pipeline::early_prologue(kernel, layouts))
            .flatten(),
        early_pipeline: None,
        threads: options.num_warps * crate::layout::THREADS_PER_WARP,
        role: Role::Whole,
        ring: None,
        consumer_barrier: None,
        partial_sums: partial_sums::PartialSums::default(),
        partial_totals: HashMap::new(),
        grid_controls: Vec::new(),
    };
    if options.partial_sums {
        lowering.partial_sums = lowering.find_partial_sums();
    }
    let mut params = Vec::new();
    for (&arg, decl) in kernel.args.iter().zip(kernel.signature.args) {
        let ty = match kernel.ty(arg).elem() {
            Some(Elem::Value(dtype)) => register_type(dtype),
            _ => Type::Ptr(super::Space::Global),
        };
        let reg = lowering.new_reg(ty);
        lowering.values[arg.index()] = Some(vec![reg]);
        params.push(Param {
            name: decl.name,
            reg,
        });
    }
    lowering.tid = lowering.emit_prelude(Op::Special(Special::Tid), Type::I32);
    if let Some(registers) = options.register_split() {
        lowering.split_roles(&kernel.body, registers)?;
    } else {
        lowering.region(&kernel.body)?;
    }
    if lowering.bulk_stores {
        // The lanes that issued TMA stores keep the block until the copies have read their tiles.
        lowering.emit_effect(Op::BulkWaitRead);
    }
    // Grid controls come first, before any load (the builder put them before every memory
    // access of the kernel, but copies may be issued as early as the prelude); below sm_90
    // there are none, and launches are serialized as usual.
    let mut insts = Vec::new();
    if options.target == Target::Sm90a {
        for &control in &lowering.grid_controls {
            insts.push(Inst {
                op: Op::GridControl(control),
                results: Vec::new(),
                loc: None,
            });
        }
    }
    insts.append(&mut lowering.prelude);
    insts.extend(lowering.blocks.pop().unwrap_or_default());
    Ok(Program {
        name: kernel.name(),
        file: kernel.signature.file,
        params,
        threads_per_block: options.threads_per_block(),
        shared_bytes: lowering.shared_bytes,
        shared_align: if layouts.uses_wgmma() { 1024 } else { 16 },
        types: lowering.types,
        body: Block { insts },
        assumptions: layouts.divisibility.assumptions.clone(),
        tensor_maps: layouts.tensor_maps.clone(),
    })
}

/// Where one register of a tile sits, as registers of this thread.
pub(super) struct Position {
    /// The element's index along each dimension (i32).
    pub coords: Vec<Reg>,
    /// Whether this thread is the element's owner; `None` where every holder owns it.
    pub owner: Option<Reg>,
}

pub(super) struct Lowering<'a> {
    kernel: &'a Kernel,
    /// Each value's defining instruction (none for arguments and region parameters).
    definitions: Vec<Option<&'a TileInst>>,
    layouts: &'a LayoutAssignment,
    types: Vec<Type>,
    /// Thread-id arithmetic, hoisted to the program's entry so that it dominates every use.
    prelude: Vec<Inst>,
    /// The blocks being built, innermost last.
    blocks: Vec<Vec<Inst>>,
    /// The registers of every tile value lowered so far, by [`Value`].
    values: Vec<Option<Vec<Reg>>>,
    /// The pre-order index of the next tile instruction (the layout stage's numbering).
    next_inst: usize,
    /// The pre-order index of the tile instruction being lowered.
    current_inst: usize,
    /// The tile op being lowered: its location goes on every instruction it makes.
    loc: Option<Loc>,
    /// The operands of the current op converted to another layout: (value, layout, registers).
    converted: Vec<(Value, Layout, Vec<Reg>)>,
    /// Where the `mbarrier`s of top-level TMA loads start.
    once_barriers: u32,
    /// How many tiles each refilled load takes by turns ([`dot::SharedPlan`]).
    refill_buffers: u32,
    /// Whether tiles staged at a TMA loop's top level take a buffer a stage of its ring
    /// ([`dot::ring_staged`]), and the ring of the loop whose body is being lowered, where they
    /// do.
    ring_staging: bool,
    staging_ring: Option<dot::StagingRing>,
    /// The tiles top-level or refilled TMA loads fill (and their `trans` views), with the
    /// load's barrier and the parity of the phase to wait for, until someone waited for it.
    once_loads: Vec<(Value, Option<(Reg, Reg)>)>,
    /// The innermost loop being lowered: its induction variable, lower bound and step.
    loop_counter: Option<[Reg; 3]>,
    /// Refilled tiles to free once the `wgmma` that last reads each is waited for: (its
    /// result, the tile's `empty` barrier) ([`refill`]).
    releases: Vec<(Value, Reg)>,
    /// The ring's slot a tile's top takes for its refilled loads, until they are freed
    /// ([`refill`]).
    ring_slot: Option<refill::RingSlot>,
    /// Values converted before a loop that uses them (`ConversionKind::BeforeLoop`,
    /// `LdmatrixBeforeLoop`), for the loop's uses: (value, layout, registers).
    hoisted: Vec<(Value, Layout, Vec<Reg>)>,
    /// Lane and warp fields computed in the prelude.
    fields: HashMap<IdField, Reg>,
    /// `%tid.x` read again after the loops or at a loop body's top ([`Lowering::read_tid_again`]),
    /// the fields' source from there on.
    tid_again: Option<Reg>,
    /// [`crate::CompileOptions::loop_tid`]: each `mma.sync` loop body reads `%tid.x` again.
    loop_tid: bool,
    /// [`Lowering::uniform_warpgroup`], once computed in the prelude.
    uniform_warpgroup: Option<Reg>,
    /// [`crate::CompileOptions::uniform_warpgroup`].
    uniform_descriptors: bool,
    /// [`crate::CompileOptions::descriptors_at_issue`].
    descriptors_at_issue: bool,
    tid: Reg,
    /// The shared memory the program uses so far (staged tiles, then scratch).
    shared_bytes: u32,
    /// What the target lets a block have.
    max_shared_bytes: u32,
    /// The most f32 one atomic add moves: 4 (`red.global.add.v4.f32`) on sm_90, 1 before.
    max_atomic_vector: usize,
    /// Where conversions and cross-warp reductions keep their scratch: above the staged tiles.
    scratch: u32,
    /// The byte offset of the next staged tile.
    next_staged: u32,
    /// Where the next pipelined loop's buffers go: above the enclosing loops' ones.
    next_buffer: u32,
    /// Where the next TMA loop's `mbarrier`s go (they stack as the buffers do).
    next_barrier: u32,
    /// The bytes TMA stores have taken from `next_buffer` on.
    tma_store_bytes: u32,
    /// Where the tile TMA reductions share starts.
    reduction_tile: u32,
    /// Whether the program issued TMA stores or reductions: it waits for their reads at its end.
    bulk_stores: bool,
    /// The tiles in shared memory `dot` reads, by value: staged ones and views of them.
    shared_tiles: HashMap<Value, SharedTile>,
    /// The tiles of `shared_tiles` that threads wrote (staged operands and their `trans`
    /// views), not TMA: what a `wgmma` must not read before a barrier while writes are pending.
    staged_by_threads: HashSet<Value>,
    /// Whether the warpgroups whose turn it is not arrived for the owner of the next `dot` of
    /// one warpgroup when its operand was staged ([`wgmma`]'s `arrive_for_the_owner`).
    arrived_for_owner: bool,
    /// The depth among `blocks` of the innermost loop's body, while it is lowered, where it
    /// holds one `dot` of one warpgroup (nested ones counted): its owners take turns by
    /// iteration ([`wgmma`]'s `one_warpgroup_dot`).
    owner_turns_body: Option<usize>,
    /// Whether the innermost loop's body met on the owners' barriers by iteration parity: its
    /// end meets at a barrier of the block ([`wgmma`]'s `one_warpgroup_dot`).
    owner_turns_open: bool,
    /// The buffer of this iteration (a shared pointer) of each pipelined load read into
    /// registers, by value.
    buffered: HashMap<Value, Reg>,
    /// Staged-tile accesses since the last barrier.
    pending: dot::Pending,
    /// The f32 register each f32 -> f16/bf16 rounding was made from: `dot` packs operand pairs
    /// from these with one rounding conversion (`Op::PackRounded`).
    narrowed: HashMap<Reg, Reg>,
    /// `dot`s on `wgmma` whose results are not waited for yet, and the groups committed so far.
    in_flight: wgmma::InFlight,
    /// Threads per block: every one arrives on a TMA buffer's `empty` barrier.
    threads: u32,
    /// A pipelined loop's copies held back until its body's first `wgmma`s, with the depth of
    /// the body's block ([`pipeline`]); one loop's at a time.
    deferred_copies: Option<(usize, Vec<Inst>)>,
    /// The turns of the pipelined loop whose body is being lowered, where warpgroups take
    /// them ([`turns`]).
    turns: Option<turns::Turns>,
    /// Where the first top-level TMA loop's prologue goes ahead of the loop, until it is
    /// emitted; then the loop's index and pipeline, until the loop takes them up.
    early_prologue: Option<pipeline::EarlyPrologue>,
    early_pipeline: Option<(usize, pipeline::Pipeline)>,
    /// Which part of a warp-specialised program is being lowered ([`producer`]).
    role: Role,
    /// Where the next TMA loop takes up the producer's ring of buffers: the slot and phase the
    /// last one ended at.
    ring: Option<[Reg; 2]>,
    /// The consumers' named barrier, in place of `bar.sync 0` where a producer runs apart.
    consumer_barrier: Option<Reg>,
    /// The sums kept as lanes' partial sums and where each is totalled
    /// ([`crate::CompileOptions::partial_sums`]).
    partial_sums: partial_sums::PartialSums,
    /// The registers of the latest total of each partial sum, for the reads it dominates.
    partial_totals: HashMap<Value, Vec<Reg>>,
    /// The kernel's [`kiln_dsl::GridControl`] ops, in order, for the program's entry.
    grid_controls: Vec<kiln_dsl::GridControl>,
}

impl Lowering<'_> {
    fn new_reg(&mut self, ty: Type) -> Reg {
        self.types.push(ty);
        Reg(self.types.len() as u32 - 1)
    }

    pub(super) fn ty(&self, reg: Reg) -> Type {
        self.types[reg.index()]
    }

    /// Appends an instruction with one result of type `ty` to the current block.
    pub(super) fn emit(&mut self, op: Op, ty: Type) -> Reg {
        let reg = self.new_reg(ty);
        self.push(Inst {
            results: vec![reg],
            op,
            loc: self.loc,
        });
        reg
    }

    /// Appends an instruction without results (a store, a barrier).
    pub(super) fn emit_effect(&mut self, op: Op) {
        self.push(Inst {
            results: Vec::new(),
            op,
            loc: self.loc,
        });
    }

    pub(super) fn push(&mut self, inst: Inst) {
        if let Some(block) = self.blocks.last_mut() {
            block.push(inst);
        }
    }

    fn emit_prelude(&mut self, op: Op, ty: Type) -> Reg {
        let reg = self.new_reg(ty);
        self.prelude.push(Inst {
            results: vec![reg],
            op,
            loc: None,
        });
        reg
    }

    pub(super) fn int_const(&mut self, ty: Type, value: i64) -> Reg {
        self.emit(Op::Const(Constant::Int(value)), ty)
    }

    pub(super) fn i32_const(&mut self, value: i64) -> Reg {
        self.int_const(Type::I32, value)
    }

    pub(super) fn int(&mut self, op: IntOp, a: Reg, b: Reg) -> Reg {
        let ty = self.ty(a);
        self.emit(Op::Int(op, a, b), ty)
    }

    pub(super) fn icmp(&mut self, cmp: IntCmp, a: Reg, b: Reg) -> Reg {
        self.emit(Op::IntCmp(cmp, a, b), Type::I1)
    }

    /// `a && b` where either may be absent (true).
    pub(super) fn and_pred(&mut self, a: Option<Reg>, b: Option<Reg>) -> Option<Reg> {
        match (a, b) {
            (Some(a), Some(b)) => Some(self.int(IntOp::And, a, b)),
            (a, None) => a,
            (None, b) => b,
        }
    }

    /// `(id >> shift) & mask`, computed once in the prelude; after [`Self::read_tid_again`],
    /// where it is needed, from that read.
    pub(super) fn field(&mut self, field: IdField) -> Reg {
        let (shift, mask) = field_shift_mask(field);
        if let Some(tid) = self.tid_again {
            let shift = self.i32_const(shift as i64);
            let shifted = self.int(IntOp::LShr, tid, shift);
            let mask = self.i32_const(mask as i64);
            return self.int(IntOp::And, shifted, mask);
        }
        if let Some(&reg) = self.fields.get(&field) {
            return reg;
        }
        let prelude_const =
            |this: &mut Self, v: i64| this.emit_prelude(Op::Const(Constant::Int(v)), Type::I32);
        let shift = prelude_const(self, shift as i64);
        let shifted = self.emit_prelude(Op::Int(IntOp::LShr, self.tid, shift), Type::I32);
        let mask = prelude_const(self, mask as i64);
        let reg = self.emit_prelude(Op::Int(IntOp::And, shifted, mask), Type::I32);
        self.fields.insert(field, reg);
        reg
    }

    /// From here on, the thread's fields ([`Self::field`]) come from `%tid.x` read again, each
    /// where it is needed, not kept live from the prelude: after the loops (a top-level point,
    /// which dominates the rest), or in a loop body (whose lowering restores the fields' source
    /// after the loop).
    pub(super) fn read_tid_again(&mut self) {
        let mut tid = self.emit(Op::Special(Special::TidAgain), Type::I32);
        let first = self.role.first_thread();
        if first > 0 {
            let first = self.i32_const(first as i64);
            tid = self.int(IntOp::Sub, tid, first);
        }
        self.tid_again = Some(tid);
    }

    /// The thread-dependent part of every position under `map`, per dimension (i32): register
    /// `r` sits at this plus `map.registers[r]`.
    pub(super) fn thread_bases(&mut self, map: &ThreadMap) -> Vec<Reg> {
        (0..map.rank())
            .map(|d| {
                let mut base = self.i32_const(0);
                for term in map.bases[d].clone() {
                    let field = self.field(term.field);
                    let scale = self.i32_const(term.scale as i64);
                    let scaled = self.int(IntOp::Mul, field, scale);
                    base = self.int(IntOp::Add, base, scaled);
                }
                base
            })
            .collect()
    }

    /// Each register's position under `map`, from the thread id.
    pub(super) fn positions(&mut self, map: &ThreadMap) -> Vec<Position> {
        let mut replicas: Option<Reg> = None;
        for &field in &map.replicas {
            let value = self.field(field);
            let zero = self.i32_const(0);
            let is_zero = self.icmp(IntCmp::Eq, value, zero);
            replicas = self.and_pred(replicas, Some(is_zero));
        }
        let bases = self.thread_bases(map);
        let mut positions = Vec::new();
        for offsets in &map.registers {
            let mut coords = Vec::new();
            let mut owner = replicas;
            for d in 0..map.rank() {
                let offset = self.i32_const(offsets[d] as i64);
                let unwrapped = self.int(IntOp::Add, bases[d], offset);
                if !map.wraps(d) {
                    coords.push(unwrapped);
                    continue;
                }
                // A tile smaller than the layout's extent wraps: later threads hold copies.
                let mask = self.i32_const(map.shape[d] as i64 - 1);
                coords.push(self.int(IntOp::And, unwrapped, mask));
                let size = self.i32_const(map.shape[d] as i64);
                let first = self.icmp(IntCmp::Ult, unwrapped, size);
                owner = self.and_pred(owner, Some(first));
            }
            positions.push(Position { coords, owner });
        }
        positions
    }

    /// The thread map of `layout` for `shape`, or an error naming the op.
    pub(super) fn map(
        &self,
        inst: &TileInst,
        layout: &Layout,
        shape: &[usize],
    ) -> Result<ThreadMap> {
        layout.thread_map(shape).ok_or_else(|| {
            unsupported(
                inst,
                format!("the {} layout is not lowered yet", layout.kind_name()),
            )
        })
    }

    /// The layout `value` has as an operand of the current op (after any conversion).
    pub(super) fn layout_of(&self, value: Value) -> Option<&Layout> {
        self.converted
            .iter()
            .find(|(v, _, _)| *v == value)
            .map(|(_, layout, _)| layout)
            .or_else(|| self.layouts.layout(value))
    }

    /// The registers of a value already lowered, as an operand of the current op.
    pub(super) fn regs(&self, value: Value) -> Result<Vec<Reg>> {
        if let Some((_, _, regs)) = self.converted.iter().find(|(v, _, _)| *v == value) {
            return Ok(regs.clone());
        }
        self.values[value.index()].clone().ok_or_else(|| {
            CodegenError::internal(
                Stage::Thread,
                format!("value %{} is used before it is lowered", value.0),
            )
        })
    }

    pub(super) fn reg(&self, value: Value) -> Result<Reg> {
        Ok(self.regs(value)?[0])
    }

    pub(super) fn bind(&mut self, value: Value, regs: Vec<Reg>) {
        self.values[value.index()] = Some(regs);
    }

    /// How many registers a thread holds of `value`: its layout's, 1 for a scalar.
    pub(super) fn register_count(&self, inst: &TileInst, value: Value) -> Result<usize> {
        match self.layouts.layout(value) {
            Some(layout) => Ok(self
                .map(inst, layout, self.kernel.ty(value).shape())?
                .registers
                .len()),
            None => Ok(1),
        }
    }

    /// The thread map of `value` under its (operand) layout; `None` for a scalar.
    pub(super) fn value_map(&self, inst: &TileInst, value: Value) -> Result<Option<ThreadMap>> {
        match self.layout_of(value) {
            Some(layout) => Ok(Some(self.map(
                inst,
                layout,
                self.kernel.ty(value).shape(),
            )?)),
            None => Ok(None),
        }
    }

    /// Makes room for `bytes` of scratch (from [`Self::scratch_base`]).
    pub(super) fn reserve_shared(&mut self, inst: &TileInst, bytes: u32) -> Result<()> {
        let end = self.scratch + bytes;
        if end > self.max_shared_bytes {
            return Err(unsupported(
                inst,
                format!(
                    "expected at most {} bytes of shared memory, needs {end}",
                    self.max_shared_bytes
                ),
            ));
        }
        self.shared_bytes = self.shared_bytes.max(end);
        Ok(())
    }

    /// Where scratch starts: above every staged tile.
    pub(super) fn scratch_base(&self) -> u32 {
        self.scratch
    }

    /// `bar.sync 0`; nothing staged is pending after it. Where `wgmma` reads shared memory,
    /// each thread's writes first fence the async proxy.
    pub(super) fn barrier(&mut self) {
        // The producer touches no staged tile and meets the consumers on mbarriers only.
        if self.role == Role::Producer {
            return;
        }
        // A warpgroup holding its turn must pass it first: the others wait for it there.
        self.pass_turn();
        for op in self.barrier_ops() {
            self.emit_effect(op);
        }
        self.pending = dot::Pending::default();
    }

    /// What a barrier is: `bar.sync`, after a proxy fence where `wgmma` reads shared memory and
    /// staged writes are pending (what threads wrote becomes visible to the tensor cores' async
    /// proxy; with none pending the fence would only stall, `MEMBAR.ALL.CTA`, every iteration).
    pub(super) fn barrier_ops(&self) -> Vec<Op> {
        let barrier = match self.consumer_barrier {
            Some(id) => Op::NamedBarrier {
                id,
                threads: self.threads,
                wait: true,
                pred: None,
            },
            None => Op::Barrier,
        };
        let mut ops = vec![barrier];
        if self.layouts.uses_wgmma() && self.pending.writes {
            ops.insert(0, Op::FenceProxyAsync);
        }
        ops
    }

    /// Emits an instruction with several results, of `types`.
    pub(super) fn emit_multi(&mut self, op: Op, types: &[Type]) -> Vec<Reg> {
        let results: Vec<Reg> = types.iter().map(|&ty| self.new_reg(ty)).collect();
        self.push(Inst {
            results: results.clone(),
            op,
            loc: self.loc,
        });
        results
    }

    /// Lowers a region's instructions; returns the registers of the values its `yield` names.
    /// The `dot`s it starts on `wgmma` end in it; those in flight around it stay so.
    pub(super) fn region(&mut self, region: &Region) -> Result<Vec<Vec<Reg>>> {
        let outer = self.in_flight.enter();
        let yielded = self.region_insts(region);
        self.wait_for_all();
        self.in_flight.leave(outer);
        yielded
    }

    fn region_insts(&mut self, region: &Region) -> Result<Vec<Vec<Reg>>> {
        for inst in &region.insts {
            let index = self.next_inst;
            self.next_inst += 1;
            self.current_inst = index;
            self.loc = Some(inst.loc);
            if self.role == Role::Producer {
                if let Some(yielded) = self.produce(inst)? {
                    return Ok(yielded);
                }
                // A branch is the consumers': its instructions keep their numbers.
                if matches!(inst.op, TileOp::If { .. }) {
                    for nested in nested_regions(&inst.op) {
                        walk_insts(nested, &mut self.next_inst, &mut |_, _| {});
                    }
                }
                continue;
            }
            self.converted.clear();
            if self.blocks.len() == 1
                && let Some(early) = self.early_prologue.take_if(|e| e.before == index)
            {
                self.early_pipeline_prologue(early)?;
            }
            self.wait_for_operands(inst);
            self.wait_for_once_loads(inst);
            // Held-back copies go right after the body's first `wgmma`s, before the first
            // instruction after them that is neither another nor one that emits nothing.
            if !self.in_flight.is_empty()
                && !self.issues_wgmma(inst)
                && !self.lowers_to_nothing(inst)
            {
                self.after_opening_wgmmas();
            }
            // A `wgmma` operand loaded before this loop, kept live past it.
            let mut resident = Vec::new();
            for conversion in self.layouts.conversions_at(index) {
                match &conversion.kind {
                    ConversionKind::ThroughShared => {
                        let regs = self.convert(inst, conversion.value, &conversion.to)?;
                        self.converted
                            .push((conversion.value, conversion.to.clone(), regs));
                    }
                    ConversionKind::BeforeLoop => {
                        let regs = self.convert(inst, conversion.value, &conversion.to)?;
                        self.hoisted
                            .push((conversion.value, conversion.to.clone(), regs));
                    }
                    ConversionKind::LdmatrixBeforeLoop { .. } => {
                        let regs = self.resident_a(inst, conversion.value, &conversion.to)?;
                        resident.extend(&regs);
                        self.hoisted
                            .push((conversion.value, conversion.to.clone(), regs));
                    }
                    ConversionKind::Hoisted => {
                        // The latest: its loop's own (lowered in program order, it dominates
                        // the loop; a sibling loop's in another branch would not).
                        let regs = self
                            .hoisted
                            .iter()
                            .rev()
                            .find(|(v, to, _)| *v == conversion.value && *to == conversion.to)
                            .map(|(_, _, regs)| regs.clone())
                            .ok_or_else(|| {
                                CodegenError::internal(
                                    Stage::Thread,
                                    format!(
                                        "%{} was not converted before its loop",
                                        conversion.value.0
                                    ),
                                )
                            })?;
                        self.converted
                            .push((conversion.value, conversion.to.clone(), regs));
                    }
                    ConversionKind::ThroughBuffers { shared, offset } => {
                        let (value, to) = (conversion.value, &conversion.to);
                        let regs =
                            self.convert_through_buffers(inst, value, to, shared, *offset)?;
                        self.converted.push((value, to.clone(), regs));
                    }
                    ConversionKind::Stage => self.stage(inst, conversion.value, &conversion.to)?,
                    // The `dot` reads its operands itself, one k step at a time.
                    ConversionKind::Ldmatrix { .. }
                    | ConversionKind::Descriptor { .. }
                    | ConversionKind::AccumulatorAsA => {}
                }
            }
            self.total_partial_sums(index)?;
            if let TileOp::Yield { values } = &inst.op {
                return values.iter().map(|&v| self.regs(v)).collect();
            }
            let results = self.inst(inst)?;
            for (&result, regs) in inst.results.iter().zip(results) {
                self.bind(result, regs);
            }
            if !resident.is_empty() {
                self.emit_effect(Op::KeepLive(resident));
            }
            self.release_refills(index, inst)?;
        }
        Ok(Vec::new())
    }

    /// The values `inst` reads: its operands, those of the instructions in its regions, and
    /// those converted right before it.
    pub(super) fn values_read(&self, inst: &TileInst) -> Vec<Value> {
        let mut used = Vec::new();
        for_each_operand(&inst.op, |v| used.push(v));
        for region in nested_regions(&inst.op) {
            walk_insts(region, &mut 0, &mut |_, inner| {
                for_each_operand(&inner.op, |v| used.push(v))
            });
        }
        used.extend(
            self.layouts
                .conversions_at(self.current_inst)
                .iter()
                .map(|c| c.value),
        );
        used
    }

    /// Whether `inst` emits no instruction: a pipelined load that `dot`s read (its tile is in
    /// its buffer already) or a transposed view of a staged tile (a view, recorded).
    fn lowers_to_nothing(&self, inst: &TileInst) -> bool {
        match inst.op {
            TileOp::LoadBlock { .. } => self
                .layouts
                .pipelined_load(self.current_inst)
                .is_some_and(|l| !l.read_in_registers()),
            TileOp::Trans { .. } => {
                matches!(
                    self.layouts.layout(inst.results[0]),
                    Some(Layout::Shared(_))
                )
            }
            _ => false,
        }
    }

    pub(super) fn inst(&mut self, inst: &TileInst) -> Result<Vec<Vec<Reg>>> {
        let one = |regs: Vec<Reg>| Ok(vec![regs]);
        match &inst.op {
            TileOp::Constant(c) => {
                let dtype = self.result_dtype(inst)?;
                let reg = self.constant(*c, dtype);
                one(vec![reg; self.register_count(inst, inst.results[0])?])
            }
            TileOp::ProgramId { axis } => one(vec![
                self.emit(Op::Special(Special::Ctaid(*axis)), Type::I32),
            ]),
            TileOp::NumPrograms { axis } => one(vec![
                self.emit(Op::Special(Special::Nctaid(*axis)), Type::I32),
            ]),
            TileOp::Arange { start, .. } => one(self.arange(inst, *start)?),
            TileOp::Splat { value } => {
                let scalar = self.reg(*value)?;
                one(vec![scalar; self.register_count(inst, inst.results[0])?])
            }
            TileOp::Broadcast { value } => one(self.broadcast(inst, *value)?),
            TileOp::ExpandDims { value, axis } => one(self.expand_dims(inst, *value, *axis)?),
            TileOp::Trans { value } if self.lowers_to_nothing(inst) => {
                self.transposed_view(inst, *value)?;
                one(Vec::new())
            }
            TileOp::Trans { value } => one(self.trans(inst, *value)?),
            TileOp::Cast { value } => one(self.cast(inst, *value)?),
            TileOp::Unary { op, value } => one(self.unary(inst, *op, *value)?),
            TileOp::Binary { op, lhs, rhs } => one(self.binary(inst, *op, *lhs, *rhs)?),
            TileOp::Compare { op, lhs, rhs } => one(self.compare(*op, *lhs, *rhs)?),
            TileOp::Select {
                cond,
                if_true,
                if_false,
            } => one(self.select(*cond, *if_true, *if_false)?),
            TileOp::Fma { a, b, c } => one(self.fma(*a, *b, *c)?),
            TileOp::Reduce { op, value, axis } => one(self.reduce(inst, *op, *value, *axis)?),
            TileOp::AddPtr { ptr, offset } => one(self.add_ptr(*ptr, *offset)?),
            TileOp::Load { ptr, mask, other } => one(self.load(inst, *ptr, *mask, *other)?),
            TileOp::Store { ptr, value, mask } => {
                self.store(inst, *ptr, *value, *mask, false)?;
                Ok(Vec::new())
            }
            TileOp::AtomicAdd { ptr, value, mask } => {
                self.store(inst, *ptr, *value, *mask, true)?;
                Ok(Vec::new())
            }
            TileOp::AtomicArrive { ptr } => one(vec![self.atomic_arrive(inst, *ptr)?]),
            // Placed at the program's entry when it is assembled (a producer's and the
            // consumers' walks of the body both meet it: once is enough).
            TileOp::GridControl(control) => {
                if !self.grid_controls.contains(control) {
                    self.grid_controls.push(*control);
                }
                Ok(Vec::new())
            }
            TileOp::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                order,
            } => one(self.make_block_ptr(*base, shape, strides, offsets, order.len())?),
            TileOp::Advance { ptr, offsets } => one(self.advance(*ptr, offsets)?),
            // A pipelined load is already in its shared buffer: only `dot`s read it, from there.
            TileOp::LoadBlock { .. } if self.lowers_to_nothing(inst) => one(Vec::new()),
            // A pipelined load registers read: from this iteration's buffer.
            TileOp::LoadBlock { .. }
                if self.layouts.pipelined_load(self.current_inst).is_some() =>
            {
                one(self.load_from_buffer(inst)?)
            }
            TileOp::LoadBlock {
                ptr,
                boundary_check,
            } => match self.layouts.tma_once_at(self.current_inst) {
                Some((rank, load)) if load.refills() => {
                    self.consume_refill(inst, rank, &load.clone())?;
                    one(Vec::new())
                }
                Some((rank, load)) => {
                    self.load_once_by_tma(inst, *ptr, rank, &load.clone())?;
                    one(Vec::new())
                }
                None => one(self.load_block(inst, *ptr, boundary_check)?),
            },
            TileOp::StoreBlock {
                ptr,
                value,
                boundary_check,
            } => {
                match self.layouts.tma_store_at(self.current_inst) {
                    Some(store) => self.store_block_by_tma(inst, *ptr, store)?,
                    None => self.store_block(inst, *ptr, *value, boundary_check, false)?,
                }
                Ok(Vec::new())
            }
            TileOp::AtomicAddBlock {
                ptr,
                value,
                boundary_check,
            } => {
                match self.layouts.tma_store_at(self.current_inst) {
                    // Lowered with the `dot` one warpgroup computes.
                    Some(reduction) if reduction.by_one_warpgroup => {}
                    Some(reduction) => self.store_block_by_tma(inst, *ptr, reduction)?,
                    None => self.store_block(inst, *ptr, *value, boundary_check, true)?,
                }
                Ok(Vec::new())
            }
            TileOp::For {
                lower,
                upper,
                step,
                init,
                body,
            } => self.for_loop(inst, *lower, *upper, *step, init, body),
            TileOp::If {
                cond,
                then_region,
                else_region,
            } => self.if_else(*cond, then_region, else_region),
            TileOp::Yield { .. } => Err(CodegenError::internal(
                Stage::Thread,
                "a yield that does not end its region",
            )),
            TileOp::Dot { lhs, rhs, acc } => one(self.dot(inst, *lhs, *rhs, *acc)?),
        }
    }

    /// The number type of an instruction's (first) result.
    pub(super) fn result_dtype(&self, inst: &TileInst) -> Result<DType> {
        inst.results
            .first()
            .and_then(|&r| self.kernel.ty(r).dtype())
            .ok_or_else(|| {
                CodegenError::internal(
                    Stage::Thread,
                    format!("expected `{}` to give numbers", inst.op.name()),
                )
            })
    }

    /// The number type of a value, or of what a pointer or block pointer points at.
    pub(super) fn dtype(&self, value: Value) -> DType {
        match self.kernel.ty(value) {
            TileType::Tensor {
                elem: Elem::Value(dtype) | Elem::Ptr(dtype),
                ..
            } => *dtype,
            TileType::BlockPtr { pointee, .. } => *pointee,
        }
    }

    pub(super) fn shape(&self, value: Value) -> Vec<usize> {
        match self.kernel.ty(value) {
            TileType::Tensor { shape, .. } => shape.clone(),
            TileType::BlockPtr { block_shape, .. } => block_shape.clone(),
        }
    }
}

pub(super) fn unsupported(inst: &TileInst, message: impl Into<String>) -> CodegenError {
    CodegenError::unsupported(Stage::Thread, inst.op.name(), inst.loc, message)
}

/// The register type of a number dtype.
pub(super) fn register_type(dtype: DType) -> Type {
    match dtype {
        DType::F16 => Type::F16,
        DType::BF16 => Type::BF16,
        DType::F32 => Type::F32,
        DType::I32 => Type::I32,
        DType::I64 => Type::I64,
        DType::I1 => Type::I1,
    }
}

/// The memory type of a dtype: booleans are bytes in memory (as the interpreter's buffers hold them).
pub(super) fn memory_type(dtype: DType) -> Type {
    match dtype {
        DType::I1 => Type::I8,
        other => register_type(other),
    }
}

/// The shift and mask that take `field` out of the thread index.
fn field_shift_mask(field: IdField) -> (u32, u32) {
    let (id_shift, id_mask) = match field.id {
        Id::Lane => (0, THREADS_PER_WARP - 1),
        Id::Warp => (THREADS_PER_WARP.trailing_zeros(), u32::MAX),
    };
    (
        id_shift + field.shift,
        (id_mask >> field.shift) & field.mask(),
    )
}
