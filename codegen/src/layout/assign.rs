//! Layout assignment: which layout every tile value gets, and where an op needs an operand in
//! another layout than the one it has (an explicit conversion, through shared memory).
//!
//! Values that elementwise ops, loads, stores, `broadcast`, loop-carried values, `if` results and
//! a `dot`'s result and accumulator tie together form a class that shares one layout. A class
//! with a `dot` result gets the mma accumulator layout ([`MmaV2::choose`]: warps along M first);
//! another class of 2-D tiles gets the coalescing
//! blocked layout of its widest shape ([`BlockedLayout::coalesced`], Triton's `Coalesce`); a class
//! of 1-D tiles gets the slice of a 2-D layout when a reduction produces it or `expand_dims`
//! consumes it (so that neither moves data), and a coalescing 1-D layout otherwise. Then each op
//! that relates two layouts checks its operand: `expand_dims` wants the slice of its result's
//! layout, a reduction the parent of its result's slice, `trans` the transpose of its result's
//! layout; an operand in another layout gets a [`Conversion`] right before the op. A `dot`'s
//! operands: an mma accumulator of the same layout that is exactly the A operand is taken in
//! registers ([`ConversionKind::AccumulatorAsA`]); any other operand is staged once into a
//! swizzled shared tile right after its definition ([`ConversionKind::Stage`],
//! `SwizzledShared::for_mma_operand`) and read with `ldmatrix` by each `dot`
//! ([`ConversionKind::Ldmatrix`]); a `trans` that only dots read is a view of its operand's tile.
//! (On `wgmma`, a top-level load that only dots read may instead be copied into its tile with
//! TMA: [`super::pipeline`]'s one-shot loads.)
//!
//! Instructions are numbered in pre-order (an op, then the ops of its regions, `yield`s
//! included), the order in which the printer and the lowering visit them.

use std::collections::BTreeMap;

use kiln_dsl::ir::{Inst, Kernel, Op, Region, Value};
use kiln_dsl::passes::for_each_operand;
use kiln_dsl::types::{DType, Elem, Type};

use super::divisibility::Divisibility;
use super::mma::MMA_M;
use super::mma::{K_WIDTH, MmaV2, Operand};
use super::pipeline::{self, OnceLoad, PipelinedLoad, PipelinedLoop};
use super::staged_store;
use super::swizzle::SwizzledShared;
use super::tma_store::{self, TmaStore};
use super::wgmma::{MAX_N, WARPS_PER_WARPGROUP, WGMMA_M};
use super::{BlockedLayout, DotOperandLayout, Layout, MmaLayout, MmaVersion, SharedLayout};
use crate::{CodegenError, CompileOptions, Stage};

/// A value moved into another layout (or into shared memory) at an instruction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversion {
    pub value: Value,
    pub to: Layout,
    pub kind: ConversionKind,
}

/// How a [`Conversion`] moves its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConversionKind {
    /// Registers to registers of another distributed layout, through shared memory, right
    /// before the op that uses the operand.
    ThroughShared,
    /// As `ThroughShared`, of a value a loop uses but does not define: right before the `for`,
    /// once (the layout stage hoists it); the loop's uses read these registers (`Hoisted`).
    BeforeLoop,
    /// An operand converted before its loop (`BeforeLoop`, `LdmatrixBeforeLoop`): no data
    /// moves here.
    Hoisted,
    /// Registers into a swizzled shared tile (`to` is [`Layout::Shared`]) right after the value
    /// is defined; `ldmatrix` reads it for every `dot` that uses it, directly or through `trans`.
    Stage,
    /// A shared tile (`from`) into a dot operand's registers, by `ldmatrix`, inside the `dot`.
    Ldmatrix { from: Layout },
    /// A shared tile (`from`) read by `wgmma` itself, through a matrix descriptor.
    Descriptor { from: Layout },
    /// A shared tile (`from`) into a `wgmma` A operand's registers by `ldmatrix`, once, right
    /// before the outermost loop that does not define it ([`crate::CompileOptions::resident_a`]);
    /// the loop's `dot`s read those registers (`Hoisted`).
    LdmatrixBeforeLoop { from: Layout },
    /// An mma accumulator (rounded to 16 bits) as the A operand of the next mma: register pairs
    /// of the accumulator are the operand's registers, no data moves (FlashAttention-2's `P @ V`).
    AccumulatorAsA,
    /// Registers to registers of another distributed layout (`to`, the coalescing one) through
    /// a swizzled tile (`shared`) `offset` bytes into the drained loops' buffers, in vector
    /// accesses, right before the `store_block` that stores it ([`super::staged_store`]).
    ThroughBuffers { shared: SharedLayout, offset: usize },
}

/// The layout stage's output: a layout for every tile value of a kernel, and the conversions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutAssignment {
    /// Indexed by [`Value`]: the layout of a tile; `None` for a scalar, which every thread holds,
    /// and for a block pointer (a handful of scalars).
    layouts: Vec<Option<Layout>>,
    /// By the pre-order index of the instruction that needs them.
    pub(super) conversions: BTreeMap<usize, Vec<Conversion>>,
    /// The pipelined loops ([`super::pipeline`]), by the pre-order index of their `for`.
    pub(super) pipelines: BTreeMap<usize, PipelinedLoop>,
    /// The stores TMA copies out of shared memory ([`super::tma_store`]), by the pre-order
    /// index of their `store_block`.
    pub(super) tma_stores: BTreeMap<usize, TmaStore>,
    /// Top-level loads that only `dot`s read, copied once into their staged tile with TMA
    /// ([`super::pipeline`]), by the pre-order index of the `load_block`.
    pub(super) tma_once: BTreeMap<usize, OnceLoad>,
    /// The tensor maps TMA loads and stores copy through, in the order of the kernel's hidden
    /// parameters.
    pub tensor_maps: Vec<kiln_dsl::TensorMapSpec>,
    /// What is known to divide scalars and block pointers: it decides vector widths.
    pub divisibility: Divisibility,
    /// The consumer warps: every warp but a producer warpgroup's.
    pub num_warps: u32,
    /// Whether a producer warpgroup issues the TMA loops' copies (`CompileOptions::producer`).
    pub producer: bool,
    /// The `dot`s one warpgroup computes, by pre-order index, with the block pointer their
    /// `atomic_add` adds into and their result ([`Self::one_warpgroup_dot`]).
    one_warpgroup_dots: BTreeMap<usize, (Value, Value)>,
    /// The staged operands of those after which the other warpgroups arrive for the owner
    /// ([`Self::arrives_when_staged`]).
    arrive_when_staged: Vec<Value>,
}

impl LayoutAssignment {
    pub fn layout(&self, value: Value) -> Option<&Layout> {
        self.layouts[value.index()].as_ref()
    }

    /// The conversions that run right before instruction `inst_index` (pre-order).
    pub fn conversions_at(&self, inst_index: usize) -> &[Conversion] {
        self.conversions
            .get(&inst_index)
            .map_or(&[], |c| c.as_slice())
    }

    /// Every conversion, in instruction order.
    pub fn all_conversions(&self) -> impl Iterator<Item = &Conversion> {
        self.conversions.values().flatten()
    }

    /// The pipelining of the `for` at `inst_index`, if it streams any load through `cp.async`.
    pub fn pipeline_at(&self, inst_index: usize) -> Option<&PipelinedLoop> {
        self.pipelines.get(&inst_index)
    }

    /// The pipelined load at `inst_index`, if it is one.
    pub fn pipelined_load(&self, inst_index: usize) -> Option<&PipelinedLoad> {
        self.pipelines
            .values()
            .flat_map(|p| &p.loads)
            .find(|l| l.inst_index == inst_index)
    }

    /// Every pipelined loop, by the pre-order index of its `for`.
    pub fn pipelines(&self) -> impl Iterator<Item = (usize, &PipelinedLoop)> {
        self.pipelines.iter().map(|(&i, p)| (i, p))
    }

    /// Where the `dot` at `inst_index` is computed by one warpgroup of several, the block
    /// pointer of the TMA reduction right after it, its one use, lowered with it. Its
    /// accumulator is one warpgroup's 64 rows, in the `wgmma` layout of the program's warps
    /// wrapped (every warpgroup's warps at the same rows). The warpgroups take such `dot`s by
    /// turns, one an iteration of the loop around it, which computes and adds it while the
    /// others go on (cuDNN's fused backward computes dQ so, docs/PERF.md, twenty-first
    /// session).
    pub fn one_warpgroup_dot(&self, inst_index: usize) -> Option<Value> {
        self.one_warpgroup_dots
            .get(&inst_index)
            .map(|&(ptr, _)| ptr)
    }

    /// Whether any `dot` is computed by one warpgroup ([`Self::one_warpgroup_dot`]).
    pub fn has_one_warpgroup_dots(&self) -> bool {
        !self.one_warpgroup_dots.is_empty()
    }

    /// Whether `value` is the result of a `dot` one warpgroup computes.
    pub fn computed_by_one_warpgroup(&self, value: Value) -> bool {
        self.one_warpgroup_dots.values().any(|&(_, v)| v == value)
    }

    /// Whether the warpgroups whose turn it is not arrive for the owner of a `dot` of one
    /// warpgroup as soon as `value` is staged, rather than at the `dot`: it is the last operand
    /// of it that threads stage, in the `dot`'s own region (the staging's iteration is the
    /// `dot`'s). They go on at once, and the owner, which waits for it, is not held up by
    /// what they do in between (their own products).
    pub fn arrives_when_staged(&self, value: Value) -> bool {
        self.arrive_when_staged.contains(&value)
    }

    /// The TMA store of the `store_block` at `inst_index`, if it is one.
    pub fn tma_store_at(&self, inst_index: usize) -> Option<&TmaStore> {
        self.tma_stores.get(&inst_index)
    }

    /// The TMA stores from a tile of their own: the `atomic_add`s TMA adds into their arrays,
    /// and stores inside loops ([`super::tma_store`]).
    pub fn own_tile_stores(&self) -> impl Iterator<Item = &TmaStore> {
        self.tma_stores.values().filter(|s| s.own_tile)
    }

    /// The top-level load at `inst_index`, where it copies into its staged tile with TMA, and
    /// its rank among those loads (each has an `mbarrier` of its own).
    pub fn tma_once_at(&self, inst_index: usize) -> Option<(usize, &OnceLoad)> {
        self.tma_once
            .iter()
            .enumerate()
            .find(|(_, (at, _))| **at == inst_index)
            .map(|(rank, (_, load))| (rank, load))
    }

    /// The top-level loads that copy with TMA, in program order.
    pub fn tma_once_loads(&self) -> impl Iterator<Item = &OnceLoad> {
        self.tma_once.values()
    }

    /// The index of tensor map `spec`, added if no TMA load or store uses it yet.
    pub(super) fn tensor_map(&mut self, spec: kiln_dsl::TensorMapSpec) -> usize {
        match self.tensor_maps.iter().position(|m| *m == spec) {
            Some(i) => i,
            None => {
                self.tensor_maps.push(spec);
                self.tensor_maps.len() - 1
            }
        }
    }

    /// How operand `value` of the `dot` at `inst_index` reaches its registers.
    pub fn dot_operand(&self, inst_index: usize, value: Value) -> Option<&Conversion> {
        self.conversions_at(inst_index).iter().find(|c| {
            c.value == value
                && match c.kind {
                    ConversionKind::Ldmatrix { .. }
                    | ConversionKind::Descriptor { .. }
                    | ConversionKind::AccumulatorAsA => true,
                    // A `wgmma`'s A loaded before its loop (`LdmatrixBeforeLoop`).
                    ConversionKind::Hoisted => matches!(c.to, Layout::DotOperand(_)),
                    _ => false,
                }
        })
    }

    /// Where staged tiles are aligned in shared memory: to 128 bytes (one pass over the 32
    /// banks), or to 1024 where `wgmma` reads them (its swizzle acts on address bits up to 1024).
    pub fn tile_align(&self) -> usize {
        if self.uses_wgmma() {
            super::wgmma::TILE_ALIGN
        } else {
            128
        }
    }

    /// The bytes a tile of `value` takes in shared memory, aligned for the next.
    pub fn shared_tile_bytes(&self, kernel: &Kernel, value: Value) -> usize {
        let bytes = kernel.ty(value).num_elements() * kernel.dtype(value).size_bytes();
        bytes.next_multiple_of(self.tile_align())
    }

    /// Whether any `dot` runs on `wgmma`: its shared tiles are aligned for the swizzle, and
    /// what writes them fences the async proxy.
    pub fn uses_wgmma(&self) -> bool {
        self.layouts
            .iter()
            .flatten()
            .any(|l| matches!(l, Layout::Mma(m) if m.version == MmaVersion::V3))
    }

    /// Whether the program's warpgroups issue `wgmma`s apart, several of them each on its own
    /// rows of every `dot`: they then take turns at the tensor cores, and a TMA loop frees its
    /// buffers with barriers rather than a `bar.sync` an iteration (`thread::lower`).
    pub fn warpgroups_take_turns(&self) -> bool {
        self.uses_wgmma() && self.num_warps > super::wgmma::WARPS_PER_WARPGROUP
    }

    /// Whether the program writes a tile from registers into shared memory where loops'
    /// buffers are or were (a staged operand, a TMA store's tile there, a `cp.async` loop's
    /// copies): without, consumers of a
    /// producer share no memory but its buffers and need no barrier among themselves
    /// (`thread::lower`'s turns through the program).
    pub fn stages_tiles(&self) -> bool {
        self.tma_stores.values().any(|s| !s.own_tile)
            || self.pipelines.values().any(|p| !p.uses_tma())
            || self.conversions.values().flatten().any(|c| {
                matches!(
                    c.kind,
                    ConversionKind::Stage | ConversionKind::ThroughBuffers { .. }
                )
            })
    }

    /// Whether a TMA loop frees its buffers on `empty` barriers rather than with a `bar.sync`
    /// an iteration: where warpgroups take turns, and where a producer warpgroup fills them.
    pub fn frees_on_barriers(&self) -> bool {
        self.warpgroups_take_turns() || self.producer
    }

    /// The distinct layouts in order of first use by a value, then conversion targets, then
    /// pipelined loads' buffers and one-shot loads' tiles: the text form's aliases.
    pub fn distinct_layouts(&self) -> Vec<Layout> {
        let mut distinct: Vec<Layout> = Vec::new();
        let targets = self.conversions.values().flatten().map(|c| c.to.clone());
        let buffers = self
            .pipelines
            .values()
            .flat_map(|p| &p.loads)
            .filter_map(|l| l.shared.as_ref())
            .chain(self.tma_once.values().map(|l| &l.shared))
            .chain(
                self.conversions
                    .values()
                    .flatten()
                    .filter_map(|c| match &c.kind {
                        ConversionKind::ThroughBuffers { shared, .. } => Some(shared),
                        _ => None,
                    }),
            )
            .map(|shared| Layout::Shared(shared.clone()));
        let values = self.layouts.iter().flatten().cloned();
        for layout in values.chain(targets).chain(buffers) {
            if !distinct.contains(&layout) {
                distinct.push(layout);
            }
        }
        distinct
    }
}

/// Calls `f` with every instruction of `region` and its pre-order index, starting at `*next`.
pub fn walk_insts<'k>(region: &'k Region, next: &mut usize, f: &mut dyn FnMut(usize, &'k Inst)) {
    for inst in &region.insts {
        f(*next, inst);
        *next += 1;
        for nested in nested_regions(&inst.op) {
            walk_insts(nested, next, f);
        }
    }
}

/// The regions an op owns, in printing order.
pub(crate) fn nested_regions(op: &Op) -> Vec<&Region> {
    match op {
        Op::For { body, .. } => vec![body],
        Op::If {
            then_region,
            else_region,
            ..
        } => vec![then_region, else_region],
        _ => Vec::new(),
    }
}

/// The values a region's closing `yield` names.
pub(crate) fn yielded(region: &Region) -> &[Value] {
    match region.insts.last().map(|i| &i.op) {
        Some(Op::Yield { values }) => values,
        _ => &[],
    }
}

/// An op whose operand and result layouts are related rather than equal.
#[derive(Clone, Copy)]
enum Relation {
    ExpandDims { axis: usize },
    Reduce { axis: usize },
    Trans,
}

/// A `dot` and its operands.
struct DotSite<'k> {
    inst_index: usize,
    inst: &'k Inst,
    lhs: Value,
    rhs: Value,
    acc: Value,
    result: Value,
}

/// The operands of the `dot`s one warpgroup computes that the others arrive for when staged
/// ([`LayoutAssignment::arrives_when_staged`]): for each, its operand staged last, where that
/// is in the `dot`'s region.
fn arrivals_when_staged(
    kernel: &Kernel,
    definitions: &[Option<&Op>],
    dots: &[DotSite<'_>],
    one_warpgroup_dots: &BTreeMap<usize, (Value, Value)>,
    conversions: &BTreeMap<usize, Vec<Conversion>>,
) -> Vec<Value> {
    let mut regions = Vec::new();
    region_of_insts(&kernel.body, 0, &mut 0, &mut regions);
    let staged_at = |value: Value| {
        conversions.iter().find_map(|(&at, list)| {
            list.iter()
                .any(|c| c.value == value && c.kind == ConversionKind::Stage)
                .then_some(at)
        })
    };
    let source = |value: Value| match definitions[value.index()] {
        Some(Op::Trans { value }) => *value,
        _ => value,
    };
    dots.iter()
        .filter(|dot| one_warpgroup_dots.contains_key(&dot.inst_index))
        .filter_map(|dot| {
            let (at, value) = [dot.lhs, dot.rhs]
                .into_iter()
                .filter_map(|v| staged_at(source(v)).map(|at| (at, source(v))))
                .max()?;
            (regions.get(at) == regions.get(dot.inst_index)).then_some(value)
        })
        .collect()
}

/// The region of each instruction, by pre-order index: a number of its own for each region.
fn region_of_insts(region: &Region, id: usize, last: &mut usize, out: &mut Vec<usize>) {
    for inst in &region.insts {
        out.push(id);
        for nested in nested_regions(&inst.op) {
            *last += 1;
            region_of_insts(nested, *last, last, out);
        }
    }
}

/// For every value a region defines (its parameters and its instructions' results), the
/// pre-order index of the instruction after its definition in the same region: where the value
/// is staged into shared memory, once, however often a loop reads it.
fn staging_points(region: &Region, next: &mut usize, out: &mut [Option<usize>]) {
    for &param in &region.params {
        out[param.index()] = Some(*next);
    }
    for inst in &region.insts {
        *next += 1;
        for nested in nested_regions(&inst.op) {
            staging_points(nested, next, out);
        }
        for &result in &inst.results {
            out[result.index()] = Some(*next);
        }
    }
}

struct Edge<'k> {
    inst_index: usize,
    inst: &'k Inst,
    relation: Relation,
    input: Value,
    result: Value,
}

/// Union-find over values, with what each class needs.
struct Classes {
    parent: Vec<usize>,
}

impl Classes {
    fn find(&mut self, v: usize) -> usize {
        let mut root = v;
        while self.parent[root] != root {
            root = self.parent[root];
        }
        let mut at = v;
        while self.parent[at] != root {
            let next = self.parent[at];
            self.parent[at] = root;
            at = next;
        }
        root
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        // The smaller index is the root: deterministic, and the first value names the class.
        if a < b {
            self.parent[b] = a;
        } else if b < a {
            self.parent[a] = b;
        }
    }
}

fn is_tile(kernel: &Kernel, v: Value) -> bool {
    matches!(kernel.ty(v), Type::Tensor { shape, .. } if !shape.is_empty())
}

fn unsupported(inst: &Inst, message: impl Into<String>) -> CodegenError {
    CodegenError::unsupported(Stage::Layout, inst.op.name(), inst.loc, message)
}

/// Assigns a layout to every tile value of `kernel`, or names the first op it cannot handle.
pub fn assign(kernel: &Kernel, options: &CompileOptions) -> Result<LayoutAssignment, CodegenError> {
    options.validate()?;
    let count = kernel.values.len();
    let mut classes = Classes {
        parent: (0..count).collect(),
    };
    // The narrowest element a load or store of the class moves, by value.
    let mut access_bytes: Vec<Option<usize>> = vec![None; count];
    let mut edges: Vec<Edge<'_>> = Vec::new();
    let mut dots: Vec<DotSite<'_>> = Vec::new();
    let mut definitions: Vec<Option<&Op>> = vec![None; count];
    // Uses of each value, and how many of them are `dot` operands (not accumulators).
    let mut uses = vec![0usize; count];
    let mut operand_uses = vec![0usize; count];
    // The block pointer and value of each `atomic_add` of a block pointer, by pre-order index.
    let mut block_atomic_adds: BTreeMap<usize, (Value, Value)> = BTreeMap::new();
    let mut refusal: Option<CodegenError> = None;
    let mut next = 0;
    walk_insts(&kernel.body, &mut next, &mut |inst_index, inst| {
        if refusal.is_none() {
            refusal = check_inst(kernel, inst).err();
        }
        for &result in &inst.results {
            definitions[result.index()] = Some(&inst.op);
        }
        for_each_operand(&inst.op, |v| uses[v.index()] += 1);
        let mut tie = |values: &[Value]| {
            let tiles: Vec<Value> = values
                .iter()
                .copied()
                .filter(|&v| is_tile(kernel, v))
                .collect();
            for pair in tiles.windows(2) {
                classes.union(pair[0].index(), pair[1].index());
            }
        };
        let results = &inst.results;
        let mut access = |value: Value, pointee: usize| {
            let bytes = &mut access_bytes[value.index()];
            *bytes = Some(bytes.map_or(pointee, |b| b.min(pointee)));
        };
        match &inst.op {
            Op::Unary { value, .. } | Op::Cast { value } | Op::Broadcast { value } => {
                tie(&[results[0], *value])
            }
            Op::Binary { lhs, rhs, .. } | Op::Compare { lhs, rhs, .. } => {
                tie(&[results[0], *lhs, *rhs])
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => tie(&[results[0], *cond, *if_true, *if_false]),
            Op::Fma { a, b, c } => tie(&[results[0], *a, *b, *c]),
            Op::AddPtr { ptr, offset } => tie(&[results[0], *ptr, *offset]),
            Op::Load { ptr, mask, other } => {
                let mut tied = vec![results[0], *ptr];
                tied.extend(mask.iter().chain(other.iter()));
                tie(&tied);
                access(results[0], pointee_bytes(kernel, *ptr));
            }
            Op::Store { ptr, value, mask } | Op::AtomicAdd { ptr, value, mask } => {
                let mut tied = vec![*ptr, *value];
                tied.extend(mask.iter());
                tie(&tied);
                access(*value, pointee_bytes(kernel, *ptr));
            }
            Op::LoadBlock { ptr, .. } => access(results[0], pointee_bytes(kernel, *ptr)),
            Op::StoreBlock { ptr, value, .. } => access(*value, pointee_bytes(kernel, *ptr)),
            Op::AtomicAddBlock { ptr, value, .. } => {
                access(*value, pointee_bytes(kernel, *ptr));
                block_atomic_adds.insert(inst_index, (*ptr, *value));
            }
            Op::For { init, body, .. } => {
                for (i, &init) in init.iter().enumerate() {
                    let mut tied = vec![init, body.params[i + 1], results[i]];
                    tied.extend(yielded(body).get(i));
                    tie(&tied);
                }
            }
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                for (i, &result) in results.iter().enumerate() {
                    let mut tied = vec![result];
                    tied.extend(yielded(then_region).get(i));
                    tied.extend(yielded(else_region).get(i));
                    tie(&tied);
                }
            }
            Op::ExpandDims { value, axis } => edges.push(Edge {
                inst_index,
                inst,
                relation: Relation::ExpandDims { axis: *axis },
                input: *value,
                result: results[0],
            }),
            Op::Reduce { value, axis, .. } => edges.push(Edge {
                inst_index,
                inst,
                relation: Relation::Reduce { axis: *axis },
                input: *value,
                result: results[0],
            }),
            Op::Trans { value } => edges.push(Edge {
                inst_index,
                inst,
                relation: Relation::Trans,
                input: *value,
                result: results[0],
            }),
            Op::Dot { lhs, rhs, acc } => {
                tie(&[results[0], *acc]);
                operand_uses[lhs.index()] += 1;
                operand_uses[rhs.index()] += 1;
                dots.push(DotSite {
                    inst_index,
                    inst,
                    lhs: *lhs,
                    rhs: *rhs,
                    acc: *acc,
                    result: results[0],
                });
            }
            _ => {}
        }
    });
    if let Some(error) = refusal {
        return Err(error);
    }

    // What each class covers: its widest shape and the narrowest element it moves.
    let mut widest: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut narrowest: BTreeMap<usize, usize> = BTreeMap::new();
    for (index, info) in kernel.values.iter().enumerate() {
        if !is_tile(kernel, Value(index as u32)) {
            continue;
        }
        let root = classes.find(index);
        let shape = info.ty.shape();
        let entry = widest.entry(root).or_insert_with(|| shape.to_vec());
        for (w, &s) in entry.iter_mut().zip(shape) {
            *w = (*w).max(s);
        }
        if let Some(bytes) = access_bytes[index] {
            let n = narrowest.entry(root).or_insert(bytes);
            *n = (*n).min(bytes);
        }
    }
    let coalesced = |root: usize, shape: &[usize]| {
        let bytes = narrowest.get(&root).copied().unwrap_or(4);
        Layout::Blocked(BlockedLayout::coalesced(shape, bytes, options.num_warps))
    };
    let mut class_layout: BTreeMap<usize, Layout> = BTreeMap::new();
    let mut one_warpgroup_dots = BTreeMap::new();
    // A dot's result and accumulator (and all that is tied to them: the loop-carried
    // accumulator, the scores and their elementwise math) get the mma accumulator layout.
    for dot in &dots {
        let root = classes.find(dot.result.index());
        let shape = kernel.ty(dot.result).shape();
        if one_warpgroup_rows(options, shape[0]) {
            let ptr = one_warpgroup_dot(kernel, &definitions, &uses, &block_atomic_adds, dot)?;
            one_warpgroup_dots.insert(dot.inst_index, (ptr, dot.result));
        }
        let mma = match class_layout.get(&root) {
            Some(Layout::Mma(mma)) => mma.as_v2(),
            _ => {
                let widest = &widest[&root];
                let layout = match wgmma_accumulator(options, [widest[0], widest[1]])
                    .map_err(|m| unsupported(dot.inst, m))?
                {
                    Some(v3) => v3,
                    None => MmaLayout::v2(
                        MmaV2::choose([widest[0], widest[1]], options.num_warps).map_err(|m| {
                            unsupported(dot.inst, format!("no mma layout fits: {m}"))
                        })?,
                    ),
                };
                let mma = layout.as_v2();
                class_layout.insert(root, Layout::Mma(layout));
                mma
            }
        };
        let mma = match one_warpgroup_dots.contains_key(&dot.inst_index) {
            true => MmaV2::new(WARPS_PER_WARPGROUP, 1),
            false => mma,
        };
        mma.check_acc_shape([shape[0], shape[1]])
            .map_err(|m| unsupported(dot.inst, m))?;
    }
    for (&root, shape) in &widest {
        if shape.len() >= 2 {
            class_layout
                .entry(root)
                .or_insert_with(|| coalesced(root, shape));
        }
    }
    // 1-D classes: the slice of the 2-D layout a reduction comes from, or that `expand_dims`
    // goes to, so that neither moves data.
    for prefer_reductions in [true, false] {
        for edge in &edges {
            let (known, derived, axis) = match (edge.relation, prefer_reductions) {
                (Relation::Reduce { axis }, true) => (edge.input, edge.result, axis),
                (Relation::ExpandDims { axis }, false) => (edge.result, edge.input, axis),
                _ => continue,
            };
            if !is_tile(kernel, derived) || !is_tile(kernel, known) {
                continue;
            }
            let derived_root = classes.find(derived.index());
            if class_layout.contains_key(&derived_root) {
                continue;
            }
            if let Some(parent) = class_layout.get(&classes.find(known.index())) {
                let slice = parent.slice(axis);
                class_layout.insert(derived_root, slice);
            }
        }
    }
    for (&root, shape) in &widest {
        class_layout
            .entry(root)
            .or_insert_with(|| coalesced(root, shape));
    }
    // A value dead-code removal took out (a constant branch's tile not taken) has none.
    let defined = super::divisibility::defined_in(&kernel.body);
    let mut layouts: Vec<Option<Layout>> = (0..count)
        .map(|index| {
            let value = Value(index as u32);
            (is_tile(kernel, value) && defined.contains(&value))
                .then(|| class_layout.get(&classes.find(index)).cloned())
                .flatten()
        })
        .collect();

    let mut conversions: BTreeMap<usize, Vec<Conversion>> = BTreeMap::new();
    let mut stage_at = vec![None; count];
    staging_points(&kernel.body, &mut 0, &mut stage_at);
    let mut staged: BTreeMap<usize, SharedLayout> = BTreeMap::new();
    for dot in &dots {
        let Some(Layout::Mma(result)) = layouts[dot.result.index()].clone() else {
            return Err(CodegenError::internal(
                Stage::Layout,
                "a dot result without an mma layout",
            ));
        };
        for (operand, value) in [(Operand::A, dot.lhs), (Operand::B, dot.rhs)] {
            let target = Layout::DotOperand(DotOperandLayout {
                parent: Box::new(Layout::Mma(result.clone())),
                op_index: operand as u8,
                k_width: K_WIDTH as u32,
            });
            let shape = kernel.ty(value).shape();
            // `P @ V`: the scores' accumulator, rounded to 16 bits, is already the A operand.
            if let (Operand::A, Some(Layout::Mma(from))) = (operand, &layouts[value.index()])
                && *from == result
                && result
                    .as_v2()
                    .acc_as_a_operand([shape[0], shape[1]])
                    .is_some()
            {
                let kind = ConversionKind::AccumulatorAsA;
                let conversion = Conversion {
                    value,
                    to: target,
                    kind,
                };
                conversions
                    .entry(dot.inst_index)
                    .or_default()
                    .push(conversion);
                continue;
            }
            // Everything else reads a swizzled shared copy with `ldmatrix`; a `trans` that only
            // dots read is a view of its operand's copy.
            let (source, transposed) = match definitions[value.index()] {
                Some(Op::Trans { value: input })
                    if uses[value.index()] == operand_uses[value.index()] =>
                {
                    (*input, true)
                }
                _ => (value, false),
            };
            let Some(source_layout) = layouts[source.index()].clone() else {
                return Err(unsupported(dot.inst, "expected tile operands"));
            };
            let shared = match staged.get(&source.index()) {
                Some(shared) => shared.clone(),
                None => {
                    let Some(at) = stage_at[source.index()] else {
                        return Err(CodegenError::internal(
                            Stage::Layout,
                            format!("no place to stage %{}", source.0),
                        ));
                    };
                    let source_shape = kernel.ty(source).shape();
                    let contiguous = match &source_layout {
                        Layout::Blocked(blocked) => blocked.order[0],
                        _ => 1,
                    };
                    let (elem_bytes, order) = (
                        kernel.dtype(source).size_bytes(),
                        [contiguous, 1 - contiguous],
                    );
                    let source_shape = [source_shape[0], source_shape[1]];
                    let tile = match result.version {
                        MmaVersion::V2 => {
                            SwizzledShared::for_mma_operand(elem_bytes, source_shape, order)
                        }
                        MmaVersion::V3 => {
                            SwizzledShared::for_wgmma_operand(elem_bytes, source_shape, order)
                                .ok_or_else(|| {
                                    unsupported(
                                        dot.inst,
                                        format!(
                                            "no wgmma shared layout for a {source_shape:?} \
                                             operand: expected rows of at least 32 bytes, in \
                                             groups of 8"
                                        ),
                                    )
                                })?
                        }
                    };
                    let shared = SharedLayout::from_swizzled(&tile);
                    conversions.entry(at).or_default().push(Conversion {
                        value: source,
                        to: Layout::Shared(shared.clone()),
                        kind: ConversionKind::Stage,
                    });
                    staged.insert(source.index(), shared.clone());
                    shared
                }
            };
            let from = if transposed {
                let view = Layout::Shared(shared.transposed());
                layouts[value.index()] = Some(view.clone());
                view
            } else {
                Layout::Shared(shared)
            };
            // A `wgmma`'s A in registers is loaded once before its loops (`hoist`); a `dot` of
            // one warpgroup (whose rows are not the program's) keeps its descriptors.
            let one_warpgroup = one_warpgroup_dots.contains_key(&dot.inst_index);
            let kind = match (result.version, operand) {
                (MmaVersion::V3, Operand::A) if options.resident_a && !one_warpgroup => {
                    ConversionKind::Ldmatrix { from }
                }
                (MmaVersion::V3, _) => ConversionKind::Descriptor { from },
                (MmaVersion::V2, _) => ConversionKind::Ldmatrix { from },
            };
            conversions
                .entry(dot.inst_index)
                .or_default()
                .push(Conversion {
                    value,
                    to: target,
                    kind,
                });
        }
    }
    for edge in &edges {
        let (Some(input), result) = (
            layouts[edge.input.index()].as_ref(),
            layouts[edge.result.index()].as_ref(),
        ) else {
            continue; // a scalar operand: every thread holds it
        };
        let wanted = match (edge.relation, result) {
            (Relation::ExpandDims { axis }, Some(result)) => result.slice(axis),
            (Relation::Reduce { axis }, Some(result)) => match result {
                Layout::Slice(slice) if slice.dim == axis => (*slice.parent).clone(),
                _ if *result == input.slice(axis) => continue,
                other => {
                    return Err(unsupported(
                        edge.inst,
                        format!("expected the result in a slice along {axis}, got {other}"),
                    ));
                }
            },
            (Relation::Reduce { .. }, None) => continue, // to a scalar: any layout reduces
            // `trans` of a tile staged for a dot: a view of the same shared memory.
            (Relation::Trans, Some(Layout::Shared(_))) => continue,
            (Relation::Trans, Some(Layout::Blocked(result))) => {
                Layout::Blocked(result.transposed())
            }
            (_, other) => {
                return Err(unsupported(
                    edge.inst,
                    format!(
                        "expected a blocked result layout, got {}",
                        other.map_or("none".to_string(), Layout::to_string)
                    ),
                ));
            }
        };
        if *input != wanted {
            conversions
                .entry(edge.inst_index)
                .or_default()
                .push(Conversion {
                    value: edge.input,
                    to: wanted,
                    kind: ConversionKind::ThroughShared,
                });
        }
    }
    let arrive_when_staged = arrivals_when_staged(
        kernel,
        &definitions,
        &dots,
        &one_warpgroup_dots,
        &conversions,
    );
    let mut assignment = LayoutAssignment {
        layouts,
        conversions,
        pipelines: BTreeMap::new(),
        tma_stores: BTreeMap::new(),
        tma_once: BTreeMap::new(),
        tensor_maps: Vec::new(),
        divisibility: Divisibility::analyse(kernel, options)?,
        num_warps: options.num_warps,
        producer: options.producer,
        one_warpgroup_dots,
        arrive_when_staged,
    };
    let divisibility = assignment.divisibility.clone();
    super::hoist::apply(kernel, &mut assignment);
    pipeline::apply(kernel, options, &divisibility, &mut assignment);
    assignment.tma_once = pipeline::once_loads(kernel, &divisibility, &mut assignment);
    tma_store::apply(kernel, &divisibility, &mut assignment);
    staged_store::apply(kernel, &mut assignment);
    // One warpgroup adds its tile through shared memory alone: by TMA.
    for dot in &dots {
        let by_tma = assignment
            .tma_store_at(dot.inst_index + 1)
            .is_some_and(|r| r.reduce);
        if assignment.one_warpgroup_dot(dot.inst_index).is_some() && !by_tma {
            return Err(unsupported(
                dot.inst,
                "one warpgroup's rows are added by TMA or not at all: the `atomic_add`'s \
                 block pointer must describe its f32 array whole (sm_90a)",
            ));
        }
    }
    Ok(assignment)
}

/// The `wgmma` accumulator layout for a class as wide as `widest` where the options ask for
/// `wgmma` (every warp along M, M in whole instructions, N within one), or why it does not fit.
fn wgmma_accumulator(
    options: &CompileOptions,
    widest: [usize; 2],
) -> Result<Option<MmaLayout>, String> {
    if !options.wgmma {
        return Ok(None);
    }
    let [m, n] = widest;
    if !n.is_multiple_of(8) || n > MAX_N {
        return Err(format!(
            "wgmma takes N a multiple of 8 up to {MAX_N}, got a [{m}, {n}] accumulator"
        ));
    }
    // One warpgroup's rows: the layout wraps, the others' warps hold copies (or, for a dot by
    // one warpgroup, nothing).
    let rows = if one_warpgroup_rows(options, m) {
        MMA_M * options.num_warps as usize
    } else {
        m
    };
    MmaV2::new(options.num_warps, 1)
        .check_acc_shape([rows, n])
        .map_err(|e| format!("wgmma with every warp along M: {e}"))?;
    Ok(Some(MmaLayout::v3(options.num_warps)))
}

/// Whether an accumulator of `m` rows is one warpgroup's in a program of several on `wgmma`:
/// a `dot` one warpgroup computes ([`LayoutAssignment::one_warpgroup_dot`]).
fn one_warpgroup_rows(options: &CompileOptions, m: usize) -> bool {
    options.wgmma && options.num_warps > WARPS_PER_WARPGROUP && m == WGMMA_M
}

/// The block pointer that a `dot` of one warpgroup's rows in a program of several is added
/// into, or a refusal unless one warpgroup alone can compute it: its accumulator starts from
/// zeros (no copy carried from a turn of another warpgroup) and its one use is an `atomic_add`
/// of a block pointer right after it, which the same warpgroup makes.
fn one_warpgroup_dot(
    kernel: &Kernel,
    definitions: &[Option<&Op>],
    uses: &[usize],
    block_atomic_adds: &BTreeMap<usize, (Value, Value)>,
    dot: &DotSite<'_>,
) -> Result<Value, CodegenError> {
    let zeros = is_zero_splat(dot.acc, |v| definitions[v.index()]);
    let added = block_atomic_adds
        .get(&(dot.inst_index + 1))
        .filter(|&&(_, value)| value == dot.result && uses[value.index()] == 1);
    if let (true, Some(&(ptr, _))) = (zeros, added) {
        return Ok(ptr);
    }
    let added = added.is_some();
    let shape = kernel.ty(dot.result).shape();
    Err(unsupported(
        dot.inst,
        format!(
            "a {shape:?} wgmma accumulator is one warpgroup's rows, and one warpgroup computes \
             it only from zeros into an `atomic_add` of a block pointer right after it, its one \
             use (zeros: {zeros}, added so: {added})"
        ),
    ))
}

/// Whether `value` is a tile of zeros, a splat of the constant 0, where `op_of` gives the op
/// that defines a value: an accumulator a `dot` need not read.
pub(crate) fn is_zero_splat<'k>(value: Value, op_of: impl Fn(Value) -> Option<&'k Op>) -> bool {
    match op_of(value) {
        Some(Op::Splat { value: scalar }) => matches!(
            op_of(*scalar),
            Some(Op::Constant(kiln_dsl::ir::Constant::Float(z))) if *z == 0.0
        ),
        _ => false,
    }
}

fn pointee_bytes(kernel: &Kernel, ptr: Value) -> usize {
    match kernel.ty(ptr) {
        Type::Tensor {
            elem: Elem::Ptr(pointee),
            ..
        } => pointee.size_bytes(),
        Type::BlockPtr { pointee, .. } => pointee.size_bytes(),
        Type::Tensor { .. } => 4,
    }
}

/// Refuses what no layout covers yet: `dot` of other than 16-bit floats (`mma.sync` takes
/// f16 and bf16), and tiles of more than two dimensions.
fn check_inst(kernel: &Kernel, inst: &Inst) -> Result<(), CodegenError> {
    if let Op::Dot { lhs, .. } = inst.op {
        let dtype = kernel.dtype(lhs);
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(unsupported(
                inst,
                format!("expected f16 or bf16 operands (mma.sync m16n8k16), got {dtype}"),
            ));
        }
    }
    for &result in &inst.results {
        let ty = kernel.ty(result);
        if ty.shape().len() > 2 {
            return Err(unsupported(
                inst,
                format!("expected a scalar, 1-D or 2-D tile, got {ty}"),
            ));
        }
    }
    Ok(())
}
