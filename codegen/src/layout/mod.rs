//! The layout stage: which thread holds which elements of a tile, in which registers.
//!
//! After this stage every tile value of the kernel has a [`Layout`] (scalars have none: every
//! thread holds the same value). The kinds are Triton's GPU dialect's, the ones attention needs
//! (see the design brief's codegen notes):
//! - [`BlockedLayout`]: `size_per_thread x threads_per_warp x warps_per_cta` with a dimension
//!   order, for coalesced global access and elementwise work;
//! - [`SliceLayout`]: a parent layout with one dimension reduced away (row statistics);
//! - [`MmaLayout`]: the accumulator fragment of a tensor-core instruction;
//! - [`DotOperandLayout`]: an A or B operand of that instruction;
//! - [`SharedLayout`]: a swizzled tile in shared memory.
//!
//! [`assign()`] gives every value one of them: a `dot`'s result, accumulator and all that is tied
//! to them the mma layout, their row statistics its slices, other tiles the coalescing blocked
//! layout; operands of a `dot` are staged into swizzled shared memory after their definition
//! and read as dot operands with `ldmatrix` (a `trans` of a staged tile is a view of it), except
//! an earlier `dot`'s accumulator that is already the A operand (FlashAttention-2's `P @ V`);
//! other mismatches are explicit conversions through shared memory (a tile stored after the
//! pipelined loops through their drained buffers, [`staged_store`]). [`ThreadMap`] is the one
//! description of where a distributed layout (blocked, slice, mma) puts each element: the
//! thread-program lowering computes it from thread ids, tests compute it on the CPU; the mma
//! layout's comes from [`mma`]'s fragment maps, through [`linear_terms`].

mod assign;
pub mod divisibility;
mod hoist;
pub mod mma;
pub mod pipeline;
pub mod staged_store;
pub mod swizzle;
mod text;
pub mod tma_store;
pub mod wgmma;

use std::fmt;

pub use assign::{Conversion, ConversionKind, LayoutAssignment, assign, walk_insts};
pub(crate) use assign::{is_zero_splat, nested_regions, yielded};
pub use divisibility::Divisibility;
pub use pipeline::{Delta, OnceLoad, PipelinedLoad, PipelinedLoop, TmaLoad};
pub use tma_store::TmaStore;

/// Lanes per warp on every NVIDIA GPU kiln targets.
pub const THREADS_PER_WARP: u32 = 32;

/// The bytes one thread should access contiguously: a 16-byte vector load or store.
const ACCESS_BYTES: usize = 16;

/// Where the elements of a tile live.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    Blocked(BlockedLayout),
    Slice(SliceLayout),
    Mma(MmaLayout),
    DotOperand(DotOperandLayout),
    Shared(SharedLayout),
}

impl Layout {
    /// The name of the kind, as text aliases spell it (`#blocked`, `#blocked1`, `#mma`, ..).
    pub fn kind_name(&self) -> &'static str {
        match self {
            Layout::Blocked(_) => "blocked",
            Layout::Slice(_) => "slice",
            Layout::Mma(_) => "mma",
            Layout::DotOperand(_) => "dot_op",
            Layout::Shared(_) => "shared",
        }
    }

    /// Whether the tile lives in registers (spread over threads) rather than in shared memory.
    pub fn is_distributed(&self) -> bool {
        !matches!(self, Layout::Shared(_))
    }

    /// The slice of this layout along `dim`.
    pub fn slice(&self, dim: usize) -> Layout {
        Layout::Slice(SliceLayout {
            parent: Box::new(self.clone()),
            dim,
        })
    }

    /// Where this layout puts the elements of a tile of `shape`; `None` for the kinds that hold
    /// no tile values in registers: dot operands (which only the `dot` lowering builds, one
    /// instruction's fragment at a time) and shared memory.
    pub fn thread_map(&self, shape: &[usize]) -> Option<ThreadMap> {
        match self {
            Layout::Blocked(blocked) if blocked.rank() == shape.len() => {
                Some(blocked.thread_map(shape))
            }
            Layout::Mma(mma) => mma.thread_map(shape),
            Layout::Slice(slice) if slice.dim <= shape.len() => {
                let mut parent_shape = shape.to_vec();
                parent_shape.insert(slice.dim, 1);
                Some(slice.parent.thread_map(&parent_shape)?.sliced(slice.dim))
            }
            _ => None,
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Blocked(l) => write!(f, "{l}"),
            Layout::Slice(l) => write!(f, "{l}"),
            Layout::Mma(l) => write!(f, "{l}"),
            Layout::DotOperand(l) => write!(f, "{l}"),
            Layout::Shared(l) => write!(f, "{l}"),
        }
    }
}

/// Prints `[4, 32]`.
fn list<T: fmt::Display>(items: &[T]) -> String {
    let items: Vec<String> = items.iter().map(T::to_string).collect();
    format!("[{}]", items.join(", "))
}

/// Each thread holds `size_per_thread` contiguous elements per dimension; a warp's threads, then
/// a program's warps, tile the dimensions in `order` (fastest first). A tile larger than this
/// "CTA tile" repeats it (each thread holds several chunks); a smaller one wraps, so that several
/// threads hold copies of an element and only the first of them (its owner) stores it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct BlockedLayout {
    pub size_per_thread: Vec<u32>,
    pub threads_per_warp: Vec<u32>,
    pub warps_per_cta: Vec<u32>,
    /// Dimensions from fastest varying (contiguous) to slowest.
    pub order: Vec<usize>,
}

/// Where one register of one thread sits in a tile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElementPosition {
    pub coords: Vec<usize>,
    /// Whether this thread is the first of the threads that hold a copy of the element.
    pub owner: bool,
}

impl BlockedLayout {
    /// A 1-D layout: `size_per_thread` contiguous elements per thread, 32 threads per warp,
    /// `num_warps` warps.
    pub fn one_dim(size_per_thread: u32, num_warps: u32) -> BlockedLayout {
        BlockedLayout {
            size_per_thread: vec![size_per_thread],
            threads_per_warp: vec![THREADS_PER_WARP],
            warps_per_cta: vec![num_warps],
            order: vec![0],
        }
    }

    /// The coalescing layout of a tile of `shape` whose global accesses move `access_bytes`
    /// elements (Triton's `Coalesce`): up to 16 bytes per thread along the last (contiguous)
    /// dimension, then the lanes of a warp along it, the warps along the first dimension (rows,
    /// so that a row reduction stays inside a warp), and what is left over wraps along the slowest
    /// dimension. Every count is a power of two, as every tile dimension is.
    pub fn coalesced(shape: &[usize], access_bytes: usize, num_warps: u32) -> BlockedLayout {
        let rank = shape.len();
        let order: Vec<usize> = (0..rank).rev().collect();
        let threads = (num_warps * THREADS_PER_WARP) as usize;
        let total: usize = shape.iter().product();
        let contiguous = order[0];
        let mut size_per_thread = vec![1u32; rank];
        size_per_thread[contiguous] = (ACCESS_BYTES / access_bytes.max(1))
            .min(shape[contiguous])
            .min((total / threads).max(1))
            .max(1) as u32;
        // Lanes fastest dimension first, warps slowest first.
        let mut threads_per_warp = vec![1u32; rank];
        let mut lanes_left = THREADS_PER_WARP;
        for &d in &order {
            let fits = (shape[d] as u32 / size_per_thread[d]).max(1);
            threads_per_warp[d] = fits.min(lanes_left);
            lanes_left /= threads_per_warp[d];
        }
        threads_per_warp[order[rank - 1]] *= lanes_left;
        let mut warps_per_cta = vec![1u32; rank];
        let mut warps_left = num_warps;
        for &d in order.iter().rev() {
            let fits = (shape[d] as u32 / (size_per_thread[d] * threads_per_warp[d])).max(1);
            warps_per_cta[d] = fits.min(warps_left);
            warps_left /= warps_per_cta[d];
        }
        warps_per_cta[order[rank - 1]] *= warps_left;
        BlockedLayout {
            size_per_thread,
            threads_per_warp,
            warps_per_cta,
            order,
        }
    }

    pub fn rank(&self) -> usize {
        self.size_per_thread.len()
    }

    /// The same layout with the two dimensions of a 2-D tile swapped: what `trans` gives without
    /// moving data.
    pub fn transposed(&self) -> BlockedLayout {
        let swap = |v: &[u32]| v.iter().rev().copied().collect::<Vec<u32>>();
        BlockedLayout {
            size_per_thread: swap(&self.size_per_thread),
            threads_per_warp: swap(&self.threads_per_warp),
            warps_per_cta: swap(&self.warps_per_cta),
            order: self.order.iter().map(|&d| 1 - d).collect(),
        }
    }

    /// The extent one pass of all threads covers, per dimension.
    pub fn cta_tile(&self) -> Vec<usize> {
        (0..self.rank())
            .map(|d| {
                (self.size_per_thread[d] * self.threads_per_warp[d] * self.warps_per_cta[d])
                    as usize
            })
            .collect()
    }

    /// How many times the CTA tile repeats along each dimension of `shape` (1 where it wraps).
    pub fn repeats(&self, shape: &[usize]) -> Vec<usize> {
        let tile = self.cta_tile();
        shape
            .iter()
            .zip(&tile)
            .map(|(&s, &t)| (s / t).max(1))
            .collect()
    }

    pub fn elements_per_thread(&self, shape: &[usize]) -> usize {
        let repeats = self.repeats(shape);
        (0..self.rank())
            .map(|d| self.size_per_thread[d] as usize * repeats[d])
            .product()
    }

    /// For each dimension, the shift that takes a linear id over `per_dim` (lane ids over
    /// `threads_per_warp`, warp ids over `warps_per_cta`) to its index along it, in `order`.
    fn shifts(&self, per_dim: &[u32]) -> Vec<u32> {
        let mut shifts = vec![0; self.rank()];
        let mut shift = 0;
        for &d in &self.order {
            shifts[d] = shift;
            shift += per_dim[d].trailing_zeros();
        }
        shifts
    }

    /// The constant part of each register's position in `shape`, per dimension, before wrapping:
    /// `repeat * cta_tile + i` for its repeat and its element `i` within the thread's chunk.
    /// Registers are ordered with repeats outermost and, within each, the fastest dimension
    /// innermost (a 1-D register `r` is repeat `r / size_per_thread`, element `r % size_per_thread`).
    pub fn register_offsets(&self, shape: &[usize]) -> Vec<Vec<usize>> {
        let tile = self.cta_tile();
        let repeats = self.repeats(shape);
        let spt: Vec<usize> = self.size_per_thread.iter().map(|&s| s as usize).collect();
        // Slowest dimension first, so that the fastest varies fastest in the register index.
        let slow_to_fast: Vec<usize> = self.order.iter().rev().copied().collect();
        let mut offsets = Vec::new();
        for repeat in multi_index(&slow_to_fast, &repeats) {
            for within in multi_index(&slow_to_fast, &spt) {
                offsets.push(
                    (0..self.rank())
                        .map(|d| repeat[d] * tile[d] + within[d])
                        .collect(),
                );
            }
        }
        offsets
    }

    /// Where this layout puts the elements of a tile of `shape`.
    pub fn thread_map(&self, shape: &[usize]) -> ThreadMap {
        let lane_shifts = self.shifts(&self.threads_per_warp);
        let warp_shifts = self.shifts(&self.warps_per_cta);
        let repeats = self.repeats(shape);
        let tile = self.cta_tile();
        let bases = (0..self.rank())
            .map(|d| {
                let spt = self.size_per_thread[d];
                let lanes = IdField::new(Id::Lane, lane_shifts[d], self.threads_per_warp[d]);
                let warps = IdField::new(Id::Warp, warp_shifts[d], self.warps_per_cta[d]);
                [(lanes, spt), (warps, spt * self.threads_per_warp[d])]
                    .into_iter()
                    .filter(|(field, _)| field.bits > 0)
                    .map(|(field, scale)| Term { field, scale })
                    .collect()
            })
            .collect();
        ThreadMap {
            shape: shape.to_vec(),
            bases,
            extents: (0..self.rank()).map(|d| tile[d] * repeats[d]).collect(),
            registers: self.register_offsets(shape),
            replicas: Vec::new(),
        }
    }
}

/// The two ids a thread's position derives from: its lane in the warp and its warp in the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Id {
    Lane,
    Warp,
}

/// A bit field of an id: `(id >> shift) & (2^bits - 1)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdField {
    pub id: Id,
    pub shift: u32,
    pub bits: u32,
}

impl IdField {
    /// The field of `count` (a power of two) values at `shift`.
    fn new(id: Id, shift: u32, count: u32) -> IdField {
        IdField {
            id,
            shift,
            bits: count.trailing_zeros(),
        }
    }

    pub fn mask(&self) -> u32 {
        (1u32 << self.bits) - 1
    }

    pub fn of(&self, warp: u32, lane: u32) -> u32 {
        let id = match self.id {
            Id::Lane => lane,
            Id::Warp => warp,
        };
        (id >> self.shift) & self.mask()
    }
}

/// One term of a thread's base position along a dimension: `field * scale`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    pub field: IdField,
    pub scale: u32,
}

/// Where a distributed layout puts the elements of a tile of one shape: the one description of
/// positions that the lowering computes from thread ids and tests compute on the CPU.
///
/// Register `r` of a thread sits, along dimension `d`, at `unwrapped = sum(bases[d]) +
/// registers[r][d]`, at `unwrapped % shape[d]` (a tile smaller than the layout's extent wraps).
/// The thread owns it (is the first of the threads holding a copy) when `unwrapped < shape[d]`
/// along every dimension and every field of `replicas` is zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadMap {
    pub shape: Vec<usize>,
    pub bases: Vec<Vec<Term>>,
    /// The extent the layout covers along each dimension; above `shape[d]` it wraps.
    pub extents: Vec<usize>,
    pub registers: Vec<Vec<usize>>,
    /// Fields that tell copies apart along dimensions sliced away: zero in the owner.
    pub replicas: Vec<IdField>,
}

impl ThreadMap {
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    pub fn wraps(&self, d: usize) -> bool {
        self.extents[d] > self.shape[d]
    }

    /// How a reduction along `axis` of a tile `extent` long there combines across threads:
    /// the lane masks of its butterfly, one per lane bit that tells distinct elements apart
    /// (higher bits hold copies, which reach the same total), and the warp fields it spans,
    /// each with how many distinct warps.
    pub fn butterfly(&self, axis: usize, extent: usize) -> (Vec<u32>, Vec<(IdField, usize)>) {
        let mut lanes = Vec::new();
        let mut warps = Vec::new();
        for term in &self.bases[axis] {
            let distinct = (extent / term.scale as usize).clamp(1, 1 << term.field.bits);
            match term.field.id {
                Id::Lane => lanes.extend(
                    (0..distinct.trailing_zeros()).map(|bit| 1 << (term.field.shift + bit)),
                ),
                Id::Warp if distinct > 1 => warps.push((term.field, distinct)),
                Id::Warp => {}
            }
        }
        (lanes, warps)
    }

    /// Whether every element is held by exactly one thread, once: no copies, no wrapping.
    pub fn is_exclusive(&self) -> bool {
        self.replicas.is_empty() && (0..self.rank()).all(|d| !self.wraps(d))
    }

    /// The longest run, a power of two up to `max`, in which this map's registers come along
    /// dimension `dim`: registers `r * run .. r * run + run - 1` are consecutive elements along
    /// `dim` starting at a multiple of `run` in every thread (the base's steps along `dim` are
    /// multiples of it). One vector access can move such a run.
    pub fn run_along(&self, dim: usize, max: usize) -> usize {
        let mut run = max.max(1);
        while run > 1 {
            let aligned_bases = self.bases[dim]
                .iter()
                .all(|t| (t.scale as usize).is_multiple_of(run));
            let runs = self.registers.chunks(run).all(|chunk| {
                chunk.len() == run
                    && chunk[0][dim].is_multiple_of(run)
                    && chunk.iter().enumerate().all(|(i, r)| {
                        (0..self.rank()).all(|d| {
                            let expected = chunk[0][d] + if d == dim { i } else { 0 };
                            r[d] == expected
                        })
                    })
            });
            if aligned_bases && runs {
                return run;
            }
            run /= 2;
        }
        1
    }

    /// Where `register` of thread (`warp`, `lane`) sits: the CPU form of what the lowering
    /// computes with thread ids.
    pub fn position(&self, warp: u32, lane: u32, register: usize) -> ElementPosition {
        let mut owner = self.replicas.iter().all(|f| f.of(warp, lane) == 0);
        let coords = (0..self.rank())
            .map(|d| {
                let base: u32 = self.bases[d]
                    .iter()
                    .map(|t| t.field.of(warp, lane) * t.scale)
                    .sum();
                let unwrapped = base as usize + self.registers[register][d];
                owner &= unwrapped < self.shape[d];
                unwrapped % self.shape[d]
            })
            .collect();
        ElementPosition { coords, owner }
    }

    /// This map with dimension `dim` removed: the slice's registers are the parent's with offset
    /// 0 along `dim` (the others hold the same slice element), and the threads along `dim` hold
    /// copies of one another.
    fn sliced(&self, dim: usize) -> ThreadMap {
        let drop = |v: &[usize]| {
            let mut v = v.to_vec();
            v.remove(dim);
            v
        };
        let mut bases = self.bases.clone();
        let removed = bases.remove(dim);
        let mut replicas = self.replicas.clone();
        replicas.extend(removed.iter().map(|t| t.field));
        ThreadMap {
            shape: drop(&self.shape),
            bases,
            extents: drop(&self.extents),
            registers: self
                .registers
                .iter()
                .filter(|r| r[dim] == 0)
                .map(|r| drop(r))
                .collect(),
            replicas,
        }
    }
}

/// The thread-dependent part of a position that is linear in the bits of the lane and warp ids,
/// `f(warp, lane)` per dimension (as every fragment map of [`mma`] is), as [`Term`]s: one probe
/// per id bit, adjacent bits that double the same dimension's step merged into one field. Bits
/// that move nothing are returned as replica fields (threads that hold copies). Checked against
/// `f` for every thread, so a map that is not linear is an error, not a wrong layout.
pub fn linear_terms(
    rank: usize,
    num_warps: u32,
    f: &dyn Fn(u32, u32) -> Vec<usize>,
) -> Result<(Vec<Vec<Term>>, Vec<IdField>), String> {
    let origin = f(0, 0);
    let mut bases: Vec<Vec<Term>> = vec![Vec::new(); rank];
    let mut replicas = Vec::new();
    for (id, bits) in [
        (Id::Lane, THREADS_PER_WARP.trailing_zeros()),
        (Id::Warp, num_warps.trailing_zeros()),
    ] {
        for bit in 0..bits {
            let probe = match id {
                Id::Lane => f(0, 1 << bit),
                Id::Warp => f(1 << bit, 0),
            };
            let moved: Vec<usize> = (0..rank).filter(|&d| probe[d] != origin[d]).collect();
            let single = IdField {
                id,
                shift: bit,
                bits: 1,
            };
            match moved.as_slice() {
                [] => replicas.push(single),
                &[d] if probe[d] > origin[d] => {
                    let scale = (probe[d] - origin[d]) as u32;
                    let terms = &mut bases[d];
                    match terms.last_mut() {
                        // The next bit of the same field, twice the step: widen the field.
                        Some(last)
                            if last.field.id == id
                                && last.field.shift + last.field.bits == bit
                                && last.scale << last.field.bits == scale =>
                        {
                            last.field.bits += 1
                        }
                        _ => terms.push(Term {
                            field: single,
                            scale,
                        }),
                    }
                }
                _ => return Err(format!("{id:?} bit {bit} moves {origin:?} to {probe:?}")),
            }
        }
    }
    for warp in 0..num_warps {
        for lane in 0..THREADS_PER_WARP {
            let linear: Vec<usize> = (0..rank)
                .map(|d| {
                    origin[d]
                        + bases[d]
                            .iter()
                            .map(|t| (t.field.of(warp, lane) * t.scale) as usize)
                            .sum::<usize>()
                })
                .collect();
            if linear != f(warp, lane) {
                return Err(format!("not linear at warp {warp}, lane {lane}"));
            }
        }
    }
    Ok((bases, replicas))
}

/// Every index of a box of `extents`, with the dimensions in `slow_to_fast` order of variation.
fn multi_index(slow_to_fast: &[usize], extents: &[usize]) -> Vec<Vec<usize>> {
    let mut all = vec![vec![0; extents.len()]];
    for &d in slow_to_fast {
        all = all
            .into_iter()
            .flat_map(|prefix| {
                (0..extents[d]).map(move |i| {
                    let mut index = prefix.clone();
                    index[d] = i;
                    index
                })
            })
            .collect();
    }
    all
}

impl fmt::Display for BlockedLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#blocked<{{size_per_thread = {}, threads_per_warp = {}, warps_per_cta = {}, order = {}}}>",
            list(&self.size_per_thread),
            list(&self.threads_per_warp),
            list(&self.warps_per_cta),
            list(&self.order)
        )
    }
}

/// The parent's layout with dimension `dim` removed: the layout of a reduction along `dim`
/// (`m_i`, `l_i`, `lse` in attention live in the slice of the accumulator layout).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SliceLayout {
    pub parent: Box<Layout>,
    pub dim: usize,
}

impl fmt::Display for SliceLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#slice<{{dim = {}, parent = {}}}>",
            self.dim, self.parent
        )
    }
}

/// Which tensor-core instruction family an [`MmaLayout`] is the accumulator of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaVersion {
    /// `mma.sync.aligned.m16n8k16` (sm_80+): per warp a 16x8 fragment; lane `l` holds rows
    /// `l / 4` and `l / 4 + 8`, columns `2 * (l % 4) + {0, 1}`.
    V2,
    /// `wgmma.mma_async.m64nNk16` (sm_90a): a warpgroup's instruction covers 64 rows and the
    /// whole N; per warp the same fragments as `V2` with every warp along M
    /// ([`wgmma`]'s module doc).
    V3,
}

/// The accumulator layout of an mma: warps tile the M and N dimensions with `instr_shape`
/// fragments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaLayout {
    pub version: MmaVersion,
    pub warps_per_cta: Vec<u32>,
    /// The M x N fragment of one warp's instruction (16 x 8; a v3 instruction of N columns
    /// is `N / 8` of them).
    pub instr_shape: Vec<u32>,
}

impl MmaLayout {
    /// The layout of an [`mma::MmaV2`] accumulator.
    pub fn v2(mma: mma::MmaV2) -> MmaLayout {
        MmaLayout {
            version: MmaVersion::V2,
            warps_per_cta: mma.warps_per_cta.to_vec(),
            instr_shape: vec![mma::MMA_M as u32, mma::MMA_N as u32],
        }
    }

    /// The layout of a `wgmma` accumulator: [`mma::MmaV2`]'s fragments with every warp along M.
    /// An instruction of any N holds `N / 8` of the 16 x 8 fragments side by side, so the
    /// layout does not depend on N: the scores and the output of attention share it, and the
    /// row statistics of one scale the other without moving.
    pub fn v3(num_warps: u32) -> MmaLayout {
        MmaLayout {
            version: MmaVersion::V3,
            warps_per_cta: vec![num_warps, 1],
            instr_shape: vec![mma::MMA_M as u32, mma::MMA_N as u32],
        }
    }

    /// The per-warp fragment maps of this layout (a `V3` one's are `V2`'s).
    pub fn as_v2(&self) -> mma::MmaV2 {
        mma::MmaV2::new(self.warps_per_cta[0], self.warps_per_cta[1])
    }

    /// Where the accumulator layout puts a tile of `shape`, from [`mma::MmaV2`]'s maps. A
    /// dimension smaller than the CTA tile (a `[1, n]` or `[m, 1]` operand of a broadcast, in
    /// the same class as the accumulator) wraps: its extent is the CTA tile's, and the threads
    /// past it hold copies.
    pub fn thread_map(&self, shape: &[usize]) -> Option<ThreadMap> {
        let &[rows, cols] = shape else {
            return None;
        };
        let mma = self.as_v2();
        let tile = mma.cta_tile();
        let padded = [rows.max(tile[0]), cols.max(tile[1])];
        mma.check_acc_shape(padded).ok()?;
        let (bases, replicas) = linear_terms(2, mma.num_warps(), &|warp, lane| {
            mma.acc_thread_base(warp, lane).to_vec()
        })
        .ok()?;
        debug_assert!(replicas.is_empty(), "every thread holds its own fragment");
        Some(ThreadMap {
            shape: shape.to_vec(),
            bases,
            extents: padded.to_vec(),
            registers: (0..mma.acc_registers(padded))
                .map(|r| mma.acc_register_offset(padded, r).to_vec())
                .collect(),
            replicas,
        })
    }
}

impl fmt::Display for MmaLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = match self.version {
            MmaVersion::V2 => 2,
            MmaVersion::V3 => 3,
        };
        write!(
            f,
            "#mma<{{version = {version}, warps_per_cta = {}, instr_shape = {}}}>",
            list(&self.warps_per_cta),
            list(&self.instr_shape)
        )
    }
}

/// Operand A (`op_index` 0) or B (1) of an mma whose accumulator layout is `parent`; each thread
/// holds `k_width` consecutive elements along K per register (2 for f16/bf16 with m16n8k16).
/// The f32 accumulator of one mma, rounded to f16 pairs, is exactly the A operand of the next:
/// `P @ V` in attention takes P from registers.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct DotOperandLayout {
    pub parent: Box<Layout>,
    pub op_index: u8,
    pub k_width: u32,
}

impl fmt::Display for DotOperandLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#dot_op<{{op_index = {}, parent = {}, k_width = {}}}>",
            self.op_index, self.parent, self.k_width
        )
    }
}

/// A tile in shared memory, swizzled so that row stores and `ldmatrix` column reads are free of
/// bank conflicts: vectors of `vec` elements are XORed with `(row / per_phase) % max_phase`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SharedLayout {
    pub vec: u32,
    pub per_phase: u32,
    pub max_phase: u32,
    /// Dimensions from fastest varying (contiguous) to slowest.
    pub order: Vec<usize>,
    /// Elements per slab of a storage row ([`swizzle::SwizzledShared::slab`]), where rows are
    /// cut into slabs.
    pub slab: Option<u32>,
}

impl SharedLayout {
    /// The layout of a [`swizzle::SwizzledShared`] tile.
    pub fn from_swizzled(tile: &swizzle::SwizzledShared) -> SharedLayout {
        SharedLayout {
            vec: tile.vec as u32,
            per_phase: tile.per_phase as u32,
            max_phase: tile.max_phase as u32,
            order: tile.order.to_vec(),
            slab: (tile.slab < tile.row_len()).then_some(tile.slab as u32),
        }
    }

    /// Element offsets of a tile of `shape` in this layout.
    pub fn swizzled(&self, shape: [usize; 2]) -> swizzle::SwizzledShared {
        let tile = swizzle::SwizzledShared::new(
            self.vec as usize,
            self.per_phase as usize,
            self.max_phase as usize,
            [self.order[0], self.order[1]],
            shape,
        );
        match self.slab {
            Some(slab) => tile.in_slabs(slab as usize),
            None => tile,
        }
    }

    /// The same tile seen transposed (`trans` of a tile in shared memory moves nothing).
    pub fn transposed(&self) -> SharedLayout {
        SharedLayout {
            order: self.order.iter().map(|&d| 1 - d).collect(),
            ..self.clone()
        }
    }
}

impl fmt::Display for SharedLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#shared<{{vec = {}, per_phase = {}, max_phase = {}, order = {}",
            self.vec,
            self.per_phase,
            self.max_phase,
            list(&self.order)
        )?;
        if let Some(slab) = self.slab {
            write!(f, ", slab = {slab}")?;
        }
        write!(f, "}}>")
    }
}
