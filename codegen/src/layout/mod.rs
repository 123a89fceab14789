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
//! Only blocked layouts of 1-D tiles are assigned today ([`assign`]); the other kinds are here so
//! that the type is the one the mma, reduction and shared-memory work will fill in.

mod assign;
mod text;

use std::fmt;

pub use assign::{LayoutAssignment, assign};

/// Lanes per warp on every NVIDIA GPU kiln targets.
pub const THREADS_PER_WARP: u32 = 32;

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

/// Where one register of one thread sits in a tile of a [`BlockedLayout`].
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

    pub fn rank(&self) -> usize {
        self.size_per_thread.len()
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

    /// The divisor that extracts dimension `d`'s index from a linear id over `per_dim` (lane ids
    /// over `threads_per_warp`, warp ids over `warps_per_cta`): index = (id / stride) % per_dim[d].
    fn strides(&self, per_dim: &[u32]) -> Vec<u32> {
        let mut strides = vec![1; self.rank()];
        let mut stride = 1;
        for &d in &self.order {
            strides[d] = stride;
            stride *= per_dim[d];
        }
        strides
    }

    /// For each dimension, `(divisor, modulus)` that take a lane id to the lane's index along it.
    pub fn lane_decomposition(&self) -> Vec<(u32, u32)> {
        let strides = self.strides(&self.threads_per_warp);
        strides
            .into_iter()
            .zip(&self.threads_per_warp)
            .map(|(s, &n)| (s, n))
            .collect()
    }

    /// For each dimension, `(divisor, modulus)` that take a warp id to the warp's index along it.
    pub fn warp_decomposition(&self) -> Vec<(u32, u32)> {
        let strides = self.strides(&self.warps_per_cta);
        strides
            .into_iter()
            .zip(&self.warps_per_cta)
            .map(|(s, &n)| (s, n))
            .collect()
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

    /// The first element of a thread's chunk along each dimension, before repeats and wrapping.
    pub fn thread_base(&self, warp: u32, lane: u32) -> Vec<usize> {
        let lanes = self.lane_decomposition();
        let warps = self.warp_decomposition();
        (0..self.rank())
            .map(|d| {
                let lane_d = (lane / lanes[d].0) % lanes[d].1;
                let warp_d = (warp / warps[d].0) % warps[d].1;
                ((warp_d * self.threads_per_warp[d] + lane_d) * self.size_per_thread[d]) as usize
            })
            .collect()
    }

    /// Where register `register` of thread (`warp`, `lane`) sits in a tile of `shape`: what the
    /// LLVM lowering computes with thread ids, done on the CPU (for tests and, later, the emulator).
    pub fn position(
        &self,
        shape: &[usize],
        warp: u32,
        lane: u32,
        register: usize,
    ) -> ElementPosition {
        let base = self.thread_base(warp, lane);
        let offsets = &self.register_offsets(shape)[register];
        let unwrapped: Vec<usize> = (0..self.rank()).map(|d| base[d] + offsets[d]).collect();
        ElementPosition {
            coords: unwrapped.iter().zip(shape).map(|(&u, &s)| u % s).collect(),
            owner: unwrapped.iter().zip(shape).all(|(&u, &s)| u < s),
        }
    }
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
    /// `l / 4` and `l / 4 + 8`, columns `2 * (l % 4) + {0, 1}`. Hopper's warpgroup `wgmma`
    /// accumulator becomes a `V3` beside it.
    V2,
}

/// The accumulator layout of an mma: warps tile the M and N dimensions with `instr_shape`
/// fragments.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MmaLayout {
    pub version: MmaVersion,
    pub warps_per_cta: Vec<u32>,
    /// The M x N fragment of one instruction (16 x 8 for v2).
    pub instr_shape: Vec<u32>,
}

impl fmt::Display for MmaLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let version = match self.version {
            MmaVersion::V2 => 2,
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
}

impl fmt::Display for SharedLayout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "#shared<{{vec = {}, per_phase = {}, max_phase = {}, order = {}}}>",
            self.vec,
            self.per_phase,
            self.max_phase,
            list(&self.order)
        )
    }
}
