//! The thread program's types, ops and instructions.

use kiln_dsl::{GridControl, Loc};

/// The type of a register (or of a memory access).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    I1,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    /// Two f16 in 32 bits (`.f16x2`), the lower `k` in the low half: an mma operand register.
    F16x2,
    /// Two bf16 in 32 bits.
    BF16x2,
    Ptr(Space),
}

impl Type {
    /// The width in bits (pointers are 64-bit, in every space: generic addressing).
    pub fn bits(self) -> u32 {
        match self {
            Type::I1 => 1,
            Type::I8 => 8,
            Type::I16 | Type::F16 | Type::BF16 => 16,
            Type::I32 | Type::F32 | Type::F16x2 | Type::BF16x2 => 32,
            Type::I64 | Type::Ptr(_) => 64,
        }
    }

    /// The bytes it takes in memory.
    pub fn bytes(self) -> u32 {
        self.bits().div_ceil(8)
    }

    pub fn is_float(self) -> bool {
        matches!(self, Type::F16 | Type::BF16 | Type::F32)
    }

    pub fn name(self) -> &'static str {
        match self {
            Type::I1 => "i1",
            Type::I8 => "i8",
            Type::I16 => "i16",
            Type::I32 => "i32",
            Type::I64 => "i64",
            Type::F16 => "f16",
            Type::BF16 => "bf16",
            Type::F32 => "f32",
            Type::F16x2 => "f16x2",
            Type::BF16x2 => "bf16x2",
            Type::Ptr(Space::Global) => "ptr.global",
            Type::Ptr(Space::Shared) => "ptr.shared",
        }
    }
}

/// An address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Space {
    Global,
    /// The block's shared memory; a pointer into it is a byte offset from its start.
    Shared,
}

/// A register: an index into [`Program::types`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Reg(pub u32);

impl Reg {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A constant of its result register's type (floats as the f64 that rounds exactly to it).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Constant {
    Int(i64),
    Float(f64),
}

/// PTX special registers, all i32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Special {
    /// `%tid.x`: the thread's index in its block (blocks are 1-D).
    Tid,
    /// `%tid.x` read again, where LLVM cannot merge it with the first read: what derives from
    /// it is computed anew there, not kept live from before (across a loop, in registers a
    /// loop needs).
    TidAgain,
    /// `%ctaid.{x,y,z}`: the block's index in the grid.
    Ctaid(u8),
    /// `%nctaid.{x,y,z}`: the grid's size.
    Nctaid(u8),
}

/// Integer ops, wrapping. `SDiv`/`SRem` truncate; their divisor is never zero or -1 (the lowering
/// selects around both). Shifts take an amount below the width (the lowering clamps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntOp {
    Add,
    Sub,
    Mul,
    SDiv,
    SRem,
    SMax,
    SMin,
    And,
    Or,
    Xor,
    Shl,
    AShr,
    LShr,
}

/// f32 ops, each correctly rounded (`add.rn.f32`, ...), never contracted into an fma.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatOp {
    Add,
    Sub,
    Mul,
    Div,
    /// IEEE maxNum: a NaN operand loses (`max.f32`).
    Max,
    Min,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IntCmp {
    Eq,
    Ne,
    Slt,
    Sle,
    Sgt,
    Sge,
    Ult,
    Ule,
    Ugt,
    Uge,
}

/// Ordered compares are false on NaN; `Une` is true on NaN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatCmp {
    Olt,
    Ole,
    Ogt,
    Oge,
    Oeq,
    Une,
}

/// Conversions to the result register's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cast {
    /// f16/bf16 to f32, exact.
    FpExt,
    /// f32 to f16/bf16, round to nearest even (`cvt.rn`).
    FpTrunc,
    /// Float to integer toward zero, saturating, NaN to 0 (`cvt.rzi.sat`).
    FpToSiSat,
    /// Signed integer to float, round to nearest even.
    SiToFp,
    /// Unsigned integer (a bool) to float.
    UiToFp,
    ZExt,
    SExt,
    Trunc,
    /// A pointer to the i64 address within its space (a shared-memory byte offset).
    PtrToInt,
}

/// f32 math functions, named after the PTX instruction each is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Math {
    Neg,
    Abs,
    /// `sqrt.rn.f32`: correctly rounded.
    Sqrt,
    /// `ex2.approx.ftz.f32`: 2^x within 2 ulp, subnormal inputs and results flushed to zero.
    Ex2Approx,
    /// `lg2.approx.ftz.f32`: log2 x within 2^-22 absolute, subnormal inputs flushed to zero.
    Lg2Approx,
    /// `tanh.approx.f32`: within 2^-11 relative.
    TanhApprox,
}

impl Math {
    /// Whether the GPU computes it approximately (the emulator, with Rust's f32 function).
    pub fn is_approx(self) -> bool {
        matches!(self, Math::Ex2Approx | Math::Lg2Approx | Math::TanhApprox)
    }
}

/// `shfl.sync` modes: the source lane is `lane ^ operand` or `operand`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShuffleMode {
    Bfly,
    Idx,
}

/// One operation; results are in its [`Inst`].
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    Const(Constant),
    Special(Special),
    Int(IntOp, Reg, Reg),
    /// Integer absolute value; the minimum stays itself.
    IntAbs(Reg),
    Float(FloatOp, Reg, Reg),
    Math(Math, Reg),
    IntCmp(IntCmp, Reg, Reg),
    FloatCmp(FloatCmp, Reg, Reg),
    Select {
        cond: Reg,
        if_true: Reg,
        if_false: Reg,
    },
    /// `a * b + c` on f32, rounded once: `fma.rn.f32`.
    Fma {
        a: Reg,
        b: Reg,
        c: Reg,
    },
    Cast(Cast, Reg),
    /// `ptr + offset * elem.bytes()` (a signed offset of any integer type, sign-extended).
    PtrAdd {
        ptr: Reg,
        offset: Reg,
        elem: Type,
    },
    /// A pointer to byte `offset` of the block's shared memory.
    SharedAddress {
        offset: u32,
    },
    /// Reads the result's type at `ptr` where `pred` holds (or always); gives `other` (or zero)
    /// where it does not, without touching memory.
    Load {
        ptr: Reg,
        pred: Option<Reg>,
        other: Option<Reg>,
    },
    /// Writes `value` at `ptr` where `pred` holds (or always).
    Store {
        ptr: Reg,
        value: Reg,
        pred: Option<Reg>,
    },
    /// Adds the f32 `values` (1, or 2 or 4 on sm_90) to consecutive f32 elements at global
    /// `ptr` where `pred` holds (or always), each addition atomic: `red.global.add.f32`,
    /// `red.global.add.v2.f32`, `.v4.f32` (one access; `ptr` aligned to the vector).
    AtomicAdd {
        ptr: Reg,
        values: Vec<Reg>,
        pred: Option<Reg>,
    },
    /// `atom.acq_rel.gpu.global.add.u32`: adds 1 to the i32 at global `ptr` where `pred` holds,
    /// giving the value before there (0 where it does not).
    AtomicArrive {
        ptr: Reg,
        pred: Reg,
    },
    /// `fence.acq_rel.gpu`: this thread's memory accesses before it are ordered GPU-wide
    /// before those after it.
    FenceGpu,
    /// Writes `values` (2, 4 or 8 of one type) to consecutive elements at `ptr` where `pred`
    /// holds (or always), one vector access (`st.shared.v4.b32` for eight 16-bit values, at most
    /// 16 bytes); `ptr` is aligned to the vector.
    StoreVector {
        ptr: Reg,
        values: Vec<Reg>,
        pred: Option<Reg>,
    },
    /// Reads the results (2, 4 or 8 of one type) from consecutive elements at `ptr` where `pred`
    /// holds (or always), one vector access (`ld.global.v4.b32` for eight 16-bit values), zeros
    /// where it does not, without touching memory; `ptr` is aligned to the vector.
    LoadVector {
        ptr: Reg,
        pred: Option<Reg>,
    },
    /// `cp.async.cg.shared.global [dst], [src], 16, src_bytes`: copies 16 bytes from global
    /// `src` to shared `dst` (both 16-byte aligned) in the background, reading only the first
    /// `src_bytes` (an i32, 16 or 0) and zero-filling the rest. The copy joins this thread's open
    /// group; its bytes may be read only after a [`Op::CpAsyncWait`] has retired the group (by
    /// this thread; by others after a barrier that follows it).
    CpAsync {
        dst: Reg,
        src: Reg,
        src_bytes: Reg,
    },
    /// `cp.async.commit_group`: closes this thread's open group of copies.
    CpAsyncCommit,
    /// `cp.async.wait_group pending`: waits until at most `pending` of this thread's committed
    /// groups are incomplete (the oldest complete first).
    CpAsyncWait {
        pending: u32,
    },
    /// `bar.sync 0`: every thread of the block waits here; shared-memory writes before it are
    /// visible to reads after it.
    Barrier,
    /// `bar.sync id, threads` (with `wait`) or `bar.arrive id, threads` on the named barrier `id`
    /// (an i32 register from 1, the same in every lane of a warp), in the warps where `pred`
    /// holds (all without one; the same in all their lanes, and in all warps of a warpgroup):
    /// `threads` arrivals, the waiting and the arriving warps' together, complete a phase.
    /// Warpgroups take turns issuing `wgmma`s on them ([`mod@crate::thread::lower`]'s turns);
    /// nothing relies on them to order memory, and the emulator orders none by them.
    NamedBarrier {
        id: Reg,
        threads: u32,
        wait: bool,
        pred: Option<Reg>,
    },
    /// `shfl.sync.{bfly,idx}.b32` over the full warp: the value (i32 or f32) of the source lane.
    Shuffle {
        mode: ShuffleMode,
        value: Reg,
        lane: Reg,
    },
    /// `for iv in (lower..upper).step_by(step)` while `iv` does not wrap; the body's parameters
    /// are `iv` and the carried values (`init` on entry); results are the last yield (or `init`).
    For {
        lower: Reg,
        upper: Reg,
        step: Reg,
        init: Vec<Reg>,
        iv: Reg,
        params: Vec<Reg>,
        body: Block,
    },
    If {
        cond: Reg,
        then_block: Block,
        else_block: Block,
    },
    /// Ends a `for` body or an `if` branch; its operands become the op's results.
    Yield(Vec<Reg>),
    /// Two 16-bit floats in one register (`mov.b32 {lo, hi}`): `lo` in the low half.
    Pack {
        lo: Reg,
        hi: Reg,
    },
    /// Two f32 rounded to nearest even into the result's 16-bit pair type, `lo` in the low half:
    /// one `cvt.rn.{bf16,f16}x2.f32` where a cast of each and a `Pack` take three instructions
    /// and two more registers.
    PackRounded {
        lo: Reg,
        hi: Reg,
    },
    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.shared.b16`: the warp's lanes `8 j .. 8 j
    /// + 7` give the 16-byte rows of matrix `j` at `ptr`; result `j` is this lane's fragment
    /// of matrix `j` (`layout::mma::ldmatrix_source`), a 16-bit pair.
    Ldmatrix {
        ptr: Reg,
        count: u8,
        trans: bool,
    },
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32` over the warp: `a` (4
    /// pairs), `b` (2 pairs) and `c` (4 f32) are this lane's fragments (`layout::mma`); the 4
    /// results are its fragment of `d = a * b + c`.
    Mma {
        a: Vec<Reg>,
        b: Vec<Reg>,
        c: Vec<Reg>,
    },
    /// `fence.proxy.async.shared::cta`: this thread's shared-memory writes so far are ordered
    /// before what the async proxy (`wgmma`'s operand reads) does after the next barrier.
    FenceProxyAsync,
    /// `wgmma.fence.sync.aligned`: register writes before it (accumulators, A fragments) are
    /// ordered before the `wgmma`s after it. It names no registers: ptxas, which sees which
    /// registers a `wgmma` reads, adds a fence of its own (and says so) where one is missing,
    /// and passing the accumulators through it cost LLVM a third of a kernel's compile time.
    WgmmaFence,
    /// `wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{elem}.{elem}` over the warpgroup, once per
    /// k step, back to back into the same accumulators, `N = 2 * acc.len()`: `acc` are this
    /// thread's f32 accumulators (`layout::wgmma`), each step's B a descriptor (`trans_b`:
    /// N-major); the results are `acc + sum of a * b` (without `accumulate`, the sum alone),
    /// which may be read only after a [`Op::WgmmaWait`] retires the group the instructions
    /// join. One statement for the chain keeps LLVM from handling the accumulators once per
    /// step.
    Wgmma {
        steps: Vec<WgmmaStep>,
        trans_b: bool,
        acc: Vec<Reg>,
        /// False where the accumulator is zeros: the first step does not read `acc`
        /// (`scale-d` 0), so that no register is set to zero for it.
        accumulate: bool,
        /// F16 or BF16.
        elem: Type,
    },
    /// `wgmma.commit_group.sync.aligned`: the `wgmma`s issued since the last commit form a group.
    WgmmaCommit,
    /// A use of `regs` that never runs (a store under a predicate no launch makes true), after
    /// a loop whose `wgmma`s read them as A: ptxas before CUDA 13.3 ends the life of a register
    /// only `wgmma`s read at its last such read, and gives it to another value while the loop
    /// still needs it (docs/PERF.md, twenty-fourth session); a use after the loop keeps it.
    KeepLive(Vec<Reg>),
    /// `wgmma.wait_group.sync.aligned pending`: waits until at most `pending` groups are
    /// incomplete. The results are `values` (the accumulators of the groups it retires),
    /// passed through, so that what reads them stays after the wait.
    WgmmaWait {
        pending: u32,
        values: Vec<Reg>,
    },
    /// `mbarrier.init.shared::cta.b64 [bar], count` where `pred` holds: a barrier at shared
    /// `bar` (8 bytes, 8-aligned) whose phases complete after `count` arrivals and every
    /// transaction byte the arrivals expect, in phase 0.
    MbarrierInit {
        bar: Reg,
        count: u32,
        pred: Reg,
    },
    /// `fence.mbarrier_init.release.cluster`: barriers initialised before it are seen as such by
    /// the async proxy (the copies that complete their transactions).
    FenceMbarrierInit,
    /// `griddepcontrol.wait` or `griddepcontrol.launch_dependents` (sm_90): programmatic
    /// dependent launch, the kernel's [`GridControl`] ops, first in the program.
    GridControl(GridControl),
    /// `setmaxnreg.{inc,dec}.sync.aligned.u32 regs`: the warpgroup's registers per thread move
    /// to `regs` (a producer warpgroup gives its own to the consumers).
    SetMaxNreg {
        increase: bool,
        regs: u32,
    },
    /// `mbarrier.arrive.expect_tx.shared::cta.b64 _, [bar], bytes` where `pred` holds: one
    /// arrival on the current phase, which then also waits for `bytes` of copies.
    MbarrierArriveExpectTx {
        bar: Reg,
        bytes: u32,
        pred: Reg,
    },
    /// `mbarrier.arrive.shared::cta.b64 _, [bar]` in every thread: one arrival each on the
    /// current phase (a pipeline buffer's `empty` barrier: this thread is done reading it).
    MbarrierArrive {
        bar: Reg,
    },
    /// Waits until the phase of `bar` with parity `parity` (an i32, 0 or 1) has completed
    /// (`mbarrier.try_wait.parity` until it says so), in every thread or, with `warps`, in the
    /// warps where it holds (the same in all their lanes); what the copies completing the phase
    /// wrote is then visible to the threads that waited.
    MbarrierWait {
        bar: Reg,
        parity: Reg,
        warps: Option<Reg>,
    },
    /// `mbarrier.inval.shared::cta.b64 [bar]` where `pred` holds: its bytes may serve again
    /// (another barrier's) after a [`Op::Barrier`].
    MbarrierInval {
        bar: Reg,
        pred: Reg,
    },
    /// `cp.async.bulk.tensor.{n}d.shared::cluster.global.tile.mbarrier::complete_tx::bytes`,
    /// once per copy, from one lane (`elect.sync`) of each warp where `warps` holds (in the PTX,
    /// where any of its lanes' does; the emulator requires it, and the operands, the same in
    /// all of them): each copies the box of the program's tensor map `map` at `coords` (i32,
    /// the array's innermost dimension first) to shared `dst` (128-aligned), swizzled as the
    /// map says, zeros where the box leaves the array; their bytes complete transactions on
    /// `bar`. One op for all of an iteration's copies: the lane is elected once.
    TmaLoad {
        copies: Vec<TmaCopy>,
        bar: Reg,
        warps: Reg,
    },
    /// `cp.async.bulk.tensor.{n}d.global.shared::cta.bulk_group` from one lane (`elect.sync`) of
    /// each warp where `warps` holds, then `cp.async.bulk.commit_group` in that lane: copies
    /// shared `src` (128-aligned, swizzled as the map says) to the box of the program's tensor
    /// map `map` at `coords` (i32, innermost dimension first), writing only what lies inside the
    /// array; with `add`, `cp.reduce.async.bulk.tensor .add`: adds it there instead, each
    /// element atomically. The lane reads `src` until its [`Op::BulkWaitRead`]; the writers
    /// must have fenced the async proxy and met the lane at a barrier first.
    TmaStore {
        src: Reg,
        map: usize,
        coords: Vec<Reg>,
        warps: Reg,
        add: bool,
    },
    /// `cp.async.bulk.wait_group.read 0`: this thread's bulk stores have read their shared
    /// memory, which may then be written again or released with the block.
    BulkWaitRead,
}

/// The PTX instruction of a [`GridControl`].
pub fn grid_control_ptx(control: GridControl) -> &'static str {
    match control {
        GridControl::WaitForPriorGrids => "griddepcontrol.wait",
        GridControl::LaunchDependentGrids => "griddepcontrol.launch_dependents",
    }
}

/// One copy of an [`Op::TmaLoad`]: the box of tensor map `map` at `coords` to shared `dst`.
#[derive(Clone, Debug, PartialEq)]
pub struct TmaCopy {
    pub dst: Reg,
    pub map: usize,
    pub coords: Vec<Reg>,
}

/// One k step of an [`Op::Wgmma`] chain: its A and B's descriptor.
#[derive(Clone, Debug, PartialEq)]
pub struct WgmmaStep {
    pub a: WgmmaA,
    pub b: WgmmaDesc,
}

/// A `wgmma` operand's i64 matrix descriptor: its tile's `base` plus `offset` 16-byte units
/// (the start address field's, in the low word, which never carries into the high one), added
/// in the `wgmma` statement itself
/// ([`crate::CompileOptions::descriptors_at_issue`]; otherwise the offset is 0 and the base
/// the instruction's own descriptor).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WgmmaDesc {
    pub base: Reg,
    pub offset: u32,
}

/// Where a `wgmma` takes A from.
#[derive(Clone, Debug, PartialEq)]
pub enum WgmmaA {
    /// Shared memory, through a descriptor (`trans`: M-major).
    Descriptor { desc: WgmmaDesc, trans: bool },
    /// Four 16-bit pairs of this thread: the `mma.sync` A fragment of its warp's 16 rows.
    Registers(Vec<Reg>),
}

/// An op with its results and, where it came from a tile op, that op's DSL source position.
#[derive(Clone, Debug, PartialEq)]
pub struct Inst {
    pub results: Vec<Reg>,
    pub op: Op,
    pub loc: Option<Loc>,
}

/// A straight-line list of instructions.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Block {
    pub insts: Vec<Inst>,
}

impl Op {
    /// The blocks nested in this op: a `for`'s body, an `if`'s two branches.
    pub fn nested_blocks(&self) -> Vec<&Block> {
        match self {
            Op::For { body, .. } => vec![body],
            Op::If {
                then_block,
                else_block,
                ..
            } => vec![then_block, else_block],
            _ => Vec::new(),
        }
    }
}

/// A kernel parameter: a global pointer or a scalar, in the tile kernel's argument order.
#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: &'static str,
    pub reg: Reg,
}

/// What one thread of a block runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    pub name: &'static str,
    /// The kernel's source file, as `file!()` gives it: the file of the PTX's line info.
    pub file: &'static str,
    pub params: Vec<Param>,
    pub threads_per_block: u32,
    /// The block's shared memory, in bytes: static up to 48 KiB, dynamic above
    /// ([`Program::dynamic_shared_bytes`]).
    pub shared_bytes: u32,
    /// The alignment of the shared memory's start, in bytes: 16, or 1024 where `wgmma` reads
    /// swizzled tiles (the swizzle acts on addresses).
    pub shared_align: u32,
    /// The type of every register, by [`Reg`].
    pub types: Vec<Type>,
    pub body: Block,
    /// What the launch guarantees, by parameter index: the argument is a multiple of `n` (a
    /// pointer's address in bytes, an integer's value). Vector accesses rely on it.
    pub assumptions: Vec<(usize, u64)>,
    /// The tensor maps [`Op::TmaLoad`]s and [`Op::TmaStore`]s copy through: hidden parameters
    /// after `params`, which the launch encodes from its arguments.
    pub tensor_maps: Vec<kiln_dsl::TensorMapSpec>,
}

/// Shared memory a block may use without opting into the dynamic carve-out.
pub const MAX_STATIC_SHARED_BYTES: u32 = 48 * 1024;

impl Program {
    pub fn ty(&self, reg: Reg) -> Type {
        self.types[reg.index()]
    }

    /// The dynamic shared memory a launch must give (and opt into with
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): the program's shared memory when it
    /// is above the 48 KiB a static allocation may have, else 0.
    pub fn dynamic_shared_bytes(&self) -> u32 {
        if self.shared_bytes > MAX_STATIC_SHARED_BYTES {
            self.shared_bytes
        } else {
            0
        }
    }
}
