//! kiln-codegen: lowers a checked kernel of tile IR (kiln-dsl) to PTX, through named stages that
//! can each be dumped as text. It is the only crate of kiln that links LLVM (19, statically,
//! through inkwell).
//!
//! Where it sits: after kiln-dsl's builder and semantic checks, beside the CPU interpreter (which
//! defines what a kernel means: the PTX must agree with it within rounding); kiln-runtime loads
//! what it emits.
//!
//! The stages, one module each, in the order [`compile`] runs them (Triton's ttir -> ttgir ->
//! llir -> ptx):
//!
//! | stage | module | what its dump shows |
//! | --- | --- | --- |
//! | `tile` | kiln-dsl | the checked tile IR, as kiln-dsl prints it |
//! | `layout` | [`layout`] | the same IR with a [`layout::Layout`] on every tile value, and the conversions |
//! | `thread` | [`thread`] | the thread program: what one thread runs, registers, shuffles, shared memory; each instruction keeps its tile op's source location (not shown) |
//! | `llir` | [`llvm`] | LLVM NVVM IR translated op for op from the thread program, verified; line info as `!dbg` locations |
//! | `llir-opt` | [`ptx`] | the LLVM IR after kiln's pass pipeline ([`ptx::PIPELINE`]): what the NVPTX back end gets |
//! | `ptx` | [`ptx`] | PTX for the chosen [`Target`], byte-identical for the same input, with `.loc` lines at the DSL source ([`CompileOptions::line_info`]) |
//!
//! Beside the pipeline, [`emulate`] runs the thread program on the CPU for a whole grid (every
//! thread's registers, warp shuffles, shared memory and barriers) on the interpreter's host
//! buffers, so that a layout, conversion or reduction bug fails in CI against the interpreter,
//! not on the GPU. [`thread_program`] gives that program without LLVM's stages.
//!
//! What lowers today: scalars and 1-D and 2-D tiles in blocked, slice and mma layouts,
//! elementwise arithmetic, casts, compares and selects, pointer arithmetic, masked loads and
//! stores, block pointers with boundary checks, `splat`, `broadcast`, `expand_dims`, `trans`,
//! reductions along an axis, layout conversions through shared memory, `program_id` and
//! `num_programs`, scalar `for` and `if`, and `dot` of f16/bf16 tiles on tensor cores
//! (`mma.sync.m16n8k16`, operands staged in swizzled shared memory and read with `ldmatrix`, or
//! an earlier `dot`'s accumulator taken as the A operand in registers) or, on sm_90a with
//! [`CompileOptions::wgmma`], on Hopper's warpgroup tensor cores (`wgmma.mma_async`, operands
//! read from shared memory through matrix descriptors, [`layout::wgmma`]), with dynamic shared
//! memory above 48 KiB. Loops that stream block-pointer tiles into `dot` are software-pipelined
//! with `cp.async` ([`CompileOptions::num_stages`], [`layout::pipeline`]), or on `wgmma` with TMA
//! (`cp.async.bulk.tensor` on `mbarrier`s) where the kernel's arguments describe the array whole
//! (the tensor maps a launch builds are [`Compiled::tensor_maps`]), their copies issued by a
//! producer warpgroup of their own where [`CompileOptions::producer`] asks, and block-pointer loads
//! and stores move up to 16 bytes per vector where [`layout::divisibility`] proves it aligned
//! from what the launcher guarantees ([`CompileOptions::divisibility`]); a tile stored after the
//! pipelined loops goes out through their drained buffers, by TMA on `wgmma`
//! ([`layout::tma_store`]), else in the coalescing layout ([`layout::staged_store`]). The
//! attention kernels (forward, its combine, preprocess, dQ, dK/dV, the dQ conversion) and the
//! general kernels lower. Anything else (`dot` of f32, float remainders, tiles of more than two
//! dimensions) is a [`CodegenError::Unsupported`] naming the op and its DSL source line.

pub mod cache;
pub mod emulate;
pub mod error;
pub mod layout;
pub mod llvm;
pub mod ptx;
pub mod thread;

use std::fmt;
use std::str::FromStr;

use inkwell::context::Context;
use kiln_dsl::Kernel;
pub use kiln_dsl::Target;

pub use error::CodegenError;
pub use layout::Layout;

/// How to compile a kernel: for which GPU, with how many warps per program, how deep its
/// streaming loops are pipelined, and what the launcher guarantees about the arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompileOptions {
    pub target: Target,
    /// Warps per program (per CUDA block): a power of two from 1 to 32.
    pub num_warps: u32,
    /// Shared-memory buffers per pipelined load (Triton's `num_stages`): a loop that streams
    /// tiles into `dot` keeps `num_stages - 1` tiles in flight with `cp.async` while it computes
    /// on one. 1 turns pipelining off (loads go through registers). From 1 to 4.
    pub num_stages: u32,
    /// What the launcher guarantees (Triton's divisibility specialisation): `(argument, n)`
    /// says the argument is a multiple of `n` (a power of two): a pointer's address in bytes, an
    /// integer's value. It is what proves 16-byte vector accesses aligned; a launch must check it
    /// ([`Compiled::assumptions`]; the emulator does).
    pub divisibility: Vec<(String, u64)>,
    /// Whether the PTX carries `.loc` lines that lead from its instructions to the DSL source
    /// (`file line col`, the path relative to the workspace), for profilers and debuggers. The
    /// machine code is the same either way; ptxas adds line tables to the cubin.
    pub line_info: bool,
    /// Whether `dot`s run on Hopper's warpgroup tensor cores (`wgmma.mma_async`, sm_90a)
    /// instead of `mma.sync` ([`layout::wgmma`]): every `dot` then needs M a multiple of 16 x
    /// `num_warps`, N a multiple of 8 up to 256, and B (and A unless it is an earlier `dot`'s
    /// accumulator) in shared memory with rows of 32 bytes or more; one that does not fit is an
    /// error naming it.
    pub wgmma: bool,
    /// Whether a producer warpgroup of its own issues the TMA loops' copies (warp
    /// specialisation, FlashAttention-3's): it runs ahead of the `num_warps` consumer warps,
    /// as far as the buffers let it, and gives them its registers (`setmaxnreg`,
    /// [`CompileOptions::register_split`]). Needs `wgmma` and two or more consumer
    /// warpgroups; adds 4 warps to a block ([`thread`]'s lowering, `producer`).
    pub producer: bool,
    /// Whether the `wgmma` descriptors of A tiles split by warpgroup take the warpgroup's
    /// index as lane 0 of each warp has it (`shfl.sync.idx`) rather than from `%tid.x`: ptxas
    /// then knows it is the same in every lane and keeps the descriptors in uniform registers,
    /// without an `R2UR` before each use. It moves ptxas's schedule of the whole loop with
    /// it: 1.02-1.05x for D128's forward, 0.94-0.99x for D64's (docs/PERF.md, seventeenth
    /// session), so it is a configuration the table and `kiln tune` choose. Needs `wgmma`.
    pub uniform_warpgroup: bool,
    /// Whether each `wgmma` statement adds its descriptors' offsets (the k step's, the
    /// instruction's rows) to their tile's base itself, rather than LLVM computing one
    /// register pair per instruction, which it hoists out of loops over resident tiles: the
    /// fused D128 dK/dV held 48 registers of them and spilled 196 bytes (32 at issue),
    /// 1.03-1.09x there; D64's forward and D128's dQ, which have the registers, lost 2-8%
    /// (docs/PERF.md, nineteenth session). So the table chooses it. Needs `wgmma`.
    pub descriptors_at_issue: bool,
    /// Whether the producer warpgroup keeps [`LEAN_PRODUCER_REGISTERS`] registers a thread
    /// rather than [`PRODUCER_REGISTERS`], leaving the consumers 240 where two warpgroups
    /// compute (FlashAttention-3's split; [`CompileOptions::register_split`]). The fused D128
    /// dK/dV with a producer needs it: at 232 ptxas serialises its `wgmma`s (C7512); D64's
    /// causal forward loses 5-6% with it (docs/PERF.md, twenty-first session), so the table
    /// chooses it. Needs `producer`.
    pub lean_producer: bool,
    /// Whether a `wgmma` takes an A operand its loop does not define (a tile in shared memory
    /// it would otherwise read through a descriptor every iteration) from registers: `ldmatrix`
    /// loads it once before the outermost such loop, outside any loop at the `dot`. It spares
    /// the tensor cores' shared-memory reads where they bind: D64's forward in 256 x 64 blocks
    /// (`m64n64k16`, whose A and B reads take 128 bytes a clock) 1.02-1.03x (run 296); the
    /// forwards at N = 128 ran 0.91-0.97x in a timing-only trial (run 292), the dQ kernels
    /// 0.75-0.97x but for one at 1.03x (run 296; docs/PERF.md, twenty-fourth session), so it is
    /// a configuration the table and `kiln tune` choose. ptxas before CUDA 13.3 (and the JIT of
    /// drivers before it) ends the life of a register only `wgmma`s read at its last read in
    /// the loop and gives it to another value, which the next iteration then multiplies: a use
    /// after the loop that never runs keeps it (`thread::ir::Op::KeepLive`). Needs `wgmma`.
    pub resident_a: bool,
    /// Whether a sum reduced across the lanes of a warp that only ever accumulates (added to
    /// other such sums, scaled by a value each row's lanes share, carried around loops) keeps
    /// each lane's partial sum and takes the lanes' butterfly only where something else reads
    /// it: the forward's row sum `l` then costs no shuffles in its key loops, where cuDNN's
    /// keeps it per thread too (FlashAttention's convention; [`thread`]'s lowering,
    /// `partial_sums`). The persistent D64 and D128 forwards without a mask ran 1.01-1.02x with
    /// it, the long D64 one 0.98x (ptxas's schedule moves with it: run 315, docs/PERF.md,
    /// twenty-sixth session), so a table entry chooses it (kiln-kernels' sm_90a forwards where
    /// it measured faster).
    pub partial_sums: bool,
    /// Whether each loop body on `mma.sync` reads `%tid.x` again at its top and computes its
    /// thread fields from that read, each where it is needed (`thread::lower`'s loops), rather
    /// than from the prelude's: there LLVM hoisted the loop-invariant ones (every `ldmatrix`'s
    /// and copy's shared-memory offsets) out of the loop, where ptxas, short of registers across
    /// it, spilled them and reloaded them every iteration (the sm_80 D128 dK/dV 132-144 bytes,
    /// 0-4 with it). It trades those reloads for address arithmetic in the loop: the sm_80 D128
    /// dK/dV ran 1.05-1.08x with it, the D128 dQ without a mask 0.94-0.95x (run 339,
    /// docs/PERF.md, twenty-ninth session), so a table entry chooses it. Loops on `wgmma` read
    /// their operands through descriptors and keep it off: there it took the fused D128 dK/dV's
    /// spills from 20 bytes to 0 and ran 0.987-1.013x, the D128 dQ 0.93-1.00x (run 345).
    pub loop_tid: bool,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions::new(Target::Sm80, 4)
    }
}

/// Most `num_stages` a loop may have: four buffers of a 64 x 128 f16 tile already take 64 KiB.
const MAX_STAGES: u32 = 4;

/// 32-bit registers an SM has for its blocks, the unit they are allocated in (a thread's
/// share), the most a thread may have, and the most `setmaxnreg` may ask.
const REGISTER_FILE: u32 = 65536;
const REGISTER_UNIT: u32 = 8;
const MAX_REGISTERS: u32 = 255;
const MAX_SETMAXNREG: u32 = 256;

/// Registers a thread of the producer warpgroup keeps: its address arithmetic, loops and
/// copies fit (FlashAttention-3 keeps 24 to 56).
pub const PRODUCER_REGISTERS: u32 = 40;
/// What a lean producer keeps ([`CompileOptions::lean_producer`]): FlashAttention-3's 24, which
/// leaves two consumer warpgroups 240.
pub const LEAN_PRODUCER_REGISTERS: u32 = 24;

/// The registers each thread of a block of `threads` threads launches with where ptxas may give
/// it all it can at one block an SM (`.maxntid threads`, `.minnctapersm 1`), as it does for a
/// kernel that uses `setmaxnreg`.
pub fn launch_registers(threads: u32) -> u32 {
    (REGISTER_FILE / threads / REGISTER_UNIT * REGISTER_UNIT).min(MAX_REGISTERS)
}

/// A warp-specialised block's registers a thread ([`CompileOptions::register_split`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegisterSplit {
    /// What each thread starts with: ptxas's count for the kernel.
    pub launch: u32,
    /// What the producer keeps (`setmaxnreg.dec`) and the consumers take (`.inc`).
    pub producer: u32,
    pub consumer: u32,
}

impl CompileOptions {
    /// `num_warps` warps for `target`, no pipelining, nothing known about the arguments, line
    /// info on.
    pub fn new(target: Target, num_warps: u32) -> CompileOptions {
        CompileOptions {
            target,
            num_warps,
            num_stages: 1,
            divisibility: Vec::new(),
            line_info: true,
            wgmma: false,
            producer: false,
            uniform_warpgroup: false,
            descriptors_at_issue: false,
            lean_producer: false,
            resident_a: false,
            partial_sums: false,
            loop_tid: false,
        }
    }

    /// The same options with `dot`s on `wgmma` (or not).
    pub fn with_wgmma(self, wgmma: bool) -> CompileOptions {
        CompileOptions { wgmma, ..self }
    }

    /// The same options with a producer warpgroup (or not).
    pub fn with_producer(self, producer: bool) -> CompileOptions {
        CompileOptions { producer, ..self }
    }

    /// The same options with the warpgroup's index of `wgmma` descriptors from lane 0 (or
    /// not): [`CompileOptions::uniform_warpgroup`].
    pub fn with_uniform_warpgroup(self, uniform_warpgroup: bool) -> CompileOptions {
        CompileOptions {
            uniform_warpgroup,
            ..self
        }
    }

    /// The same options with each `wgmma`'s descriptors computed at issue (or not):
    /// [`CompileOptions::descriptors_at_issue`].
    pub fn with_descriptors_at_issue(self, descriptors_at_issue: bool) -> CompileOptions {
        CompileOptions {
            descriptors_at_issue,
            ..self
        }
    }

    /// The same options with a producer that keeps [`LEAN_PRODUCER_REGISTERS`] (or not):
    /// [`CompileOptions::lean_producer`].
    pub fn with_lean_producer(self, lean_producer: bool) -> CompileOptions {
        CompileOptions {
            lean_producer,
            ..self
        }
    }

    /// The same options with loop-invariant `wgmma` A operands in registers (or not):
    /// [`CompileOptions::resident_a`].
    pub fn with_resident_a(self, resident_a: bool) -> CompileOptions {
        CompileOptions { resident_a, ..self }
    }

    /// The same options with sums that only accumulate kept as lanes' partial sums (or not):
    /// [`CompileOptions::partial_sums`].
    pub fn with_partial_sums(self, partial_sums: bool) -> CompileOptions {
        CompileOptions {
            partial_sums,
            ..self
        }
    }

    /// The same options with `%tid.x` read again in each `mma.sync` loop body (or not):
    /// [`CompileOptions::loop_tid`].
    pub fn with_loop_tid(self, loop_tid: bool) -> CompileOptions {
        CompileOptions { loop_tid, ..self }
    }

    /// The same options with `num_stages` buffers per pipelined load.
    pub fn with_stages(self, num_stages: u32) -> CompileOptions {
        CompileOptions { num_stages, ..self }
    }

    /// The same options, assuming argument `name` is a multiple of `n`.
    pub fn with_divisibility(mut self, name: &str, n: u64) -> CompileOptions {
        self.divisibility.push((name.to_string(), n));
        self
    }

    /// Threads per program: what a launch must give as the block size.
    pub fn threads_per_block(&self) -> u32 {
        let producer = if self.producer {
            layout::wgmma::WARPS_PER_WARPGROUP
        } else {
            0
        };
        (self.num_warps + producer) * layout::THREADS_PER_WARP
    }

    /// With a producer warpgroup, the registers a thread has in each role. A block starts with
    /// what ptxas gives each thread at one block an SM (`.maxntid`, `.minnctapersm 1`: the
    /// register file's 64K shared out in units of 8), and `setmaxnreg.inc` takes registers only
    /// from the block's pool, which holds what `setmaxnreg.dec` gave back: the consumers can
    /// grow by what the producer releases and no more, or they wait for it forever (a producer
    /// for four consumer warpgroups asking 24 and 120 of 640 threads' 96 hung on the GPU,
    /// docs/PERF.md, eleventh session). For two consumer warpgroups: 168, 40 and 232 (24 and
    /// 240 with a lean producer).
    pub fn register_split(&self) -> Option<RegisterSplit> {
        if !self.producer {
            return None;
        }
        let threads = self.threads_per_block();
        let launch = launch_registers(threads);
        let producer_threads = layout::wgmma::WARPS_PER_WARPGROUP * layout::THREADS_PER_WARP;
        let consumer_threads = threads - producer_threads;
        let producer = if self.lean_producer {
            LEAN_PRODUCER_REGISTERS
        } else {
            PRODUCER_REGISTERS
        };
        let pool = launch * threads - producer * producer_threads;
        let consumer =
            (pool / consumer_threads / REGISTER_UNIT * REGISTER_UNIT).min(MAX_SETMAXNREG);
        Some(RegisterSplit {
            launch,
            producer,
            consumer,
        })
    }

    /// Checks what every stage relies on: a power-of-two number of warps a block can hold, a
    /// pipeline depth from 1 to 4, power-of-two divisors.
    pub fn validate(&self) -> Result<(), CodegenError> {
        let invalid = |message: String| Err(CodegenError::Options { message });
        if !self.num_warps.is_power_of_two() || self.num_warps > 32 {
            return invalid(format!(
                "expected num_warps to be a power of two from 1 to 32, got {}",
                self.num_warps
            ));
        }
        if !(1..=MAX_STAGES).contains(&self.num_stages) {
            return invalid(format!(
                "expected num_stages from 1 to {MAX_STAGES}, got {}",
                self.num_stages
            ));
        }
        if self.producer && !self.wgmma {
            return invalid("a producer warpgroup needs wgmma".to_string());
        }
        if self.uniform_warpgroup && !self.wgmma {
            return invalid(
                "a uniform warpgroup index is for wgmma descriptors: it needs wgmma".to_string(),
            );
        }
        if self.descriptors_at_issue && !self.wgmma {
            return invalid("descriptors at issue are wgmma's: they need wgmma".to_string());
        }
        if self.resident_a && !self.wgmma {
            return invalid("A operands in registers are wgmma's: they need wgmma".to_string());
        }
        if self.lean_producer && !self.producer {
            return invalid(
                "a lean producer is a producer's register split: it needs a producer".to_string(),
            );
        }
        // One consumer warpgroup already has the most registers a thread can: the producer's
        // would go unused.
        if self.producer && self.num_warps < 2 * layout::wgmma::WARPS_PER_WARPGROUP {
            return invalid(format!(
                "a producer warpgroup feeds two or more consumer warpgroups (8 warps or more), \
                 got {} warps",
                self.num_warps
            ));
        }
        if self.wgmma && self.target != Target::Sm90a {
            return invalid(format!(
                "wgmma needs the sm_90a target, got {}",
                self.target.name()
            ));
        }
        if self.wgmma
            && !self
                .num_warps
                .is_multiple_of(layout::wgmma::WARPS_PER_WARPGROUP)
        {
            return invalid(format!(
                "wgmma needs whole warpgroups: num_warps a multiple of 4, got {}",
                self.num_warps
            ));
        }
        if let Some((name, n)) = self.divisibility.iter().find(|(_, n)| !n.is_power_of_two()) {
            return invalid(format!(
                "expected a power of two as the divisor of `{name}`, got {n}"
            ));
        }
        Ok(())
    }
}

/// A named pipeline stage; [`Compiled::stage`] gives its text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    Tile,
    Layout,
    Thread,
    Llir,
    LlirOpt,
    Ptx,
}

impl Stage {
    pub const ALL: [Stage; 6] = [
        Stage::Tile,
        Stage::Layout,
        Stage::Thread,
        Stage::Llir,
        Stage::LlirOpt,
        Stage::Ptx,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::Tile => "tile",
            Stage::Layout => "layout",
            Stage::Thread => "thread",
            Stage::Llir => "llir",
            Stage::LlirOpt => "llir-opt",
            Stage::Ptx => "ptx",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Stage {
    type Err = CodegenError;

    fn from_str(name: &str) -> Result<Stage, CodegenError> {
        Stage::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| CodegenError::Options {
                message: format!(
                    "expected a stage of tile, layout, thread, llir, llir-opt or ptx, got `{name}`"
                ),
            })
    }
}

/// What a compile keeps beside the PTX and the thread program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// The text of every stage: `kiln <stage>`, `KILN_DUMP`, the tests.
    EveryStage,
    /// The PTX only, for a launch (the JIT, `kiln tune`): printing LLVM's module before and
    /// after its passes is a sixth of a compile (docs/PERF.md).
    Ptx,
}

/// A compiled kernel: the PTX, the text of the other stages where the compile kept them
/// ([`Keep`]), the thread program (which [`emulate`] runs), and what a launch needs to know.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    /// The kernel's name, which is also the PTX entry's name.
    pub name: String,
    pub options: CompileOptions,
    /// The text of each stage before the PTX, in [`Stage::ALL`] order, if kept.
    stages: Option<Vec<String>>,
    ptx: String,
    program: thread::Program,
}

impl Compiled {
    /// The dump of one stage; only the PTX where the compile kept [`Keep::Ptx`].
    pub fn stage(&self, stage: Stage) -> Result<&str, CodegenError> {
        if stage == Stage::Ptx {
            return Ok(&self.ptx);
        }
        let stages = self.stages.as_ref().ok_or_else(|| CodegenError::Options {
            message: format!(
                "the {stage} stage of `{}` was not kept: compile it with \
                 `kiln_codegen::compile` for every stage's text",
                self.name
            ),
        })?;
        let index = Stage::ALL
            .iter()
            .position(|&s| s == stage)
            .expect("Stage::ALL lists every stage");
        Ok(&stages[index])
    }

    /// The dump of the stage called `name` (`tile`, `layout`, `thread`, `llir`, `llir-opt`, `ptx`).
    pub fn dump(&self, name: &str) -> Result<&str, CodegenError> {
        self.stage(name.parse()?)
    }

    pub fn ptx(&self) -> &str {
        &self.ptx
    }

    /// The thread program the PTX was translated from.
    pub fn program(&self) -> &thread::Program {
        &self.program
    }

    /// The dynamic shared memory a launch must give (0: the kernel's is static); above 48 KiB
    /// the function must opt in (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
    pub fn dynamic_shared_bytes(&self) -> u32 {
        self.program.dynamic_shared_bytes()
    }

    /// The block size a launch must use: `32 * num_warps` threads along x.
    pub fn threads_per_block(&self) -> u32 {
        self.options.threads_per_block()
    }

    /// The tensor maps a launch builds from its arguments and passes after them (the PTX
    /// carries them too, [`kiln_dsl::TensorMapSpec::in_ptx`]).
    pub fn tensor_maps(&self) -> &[kiln_dsl::TensorMapSpec] {
        &self.program.tensor_maps
    }

    /// What a launch must check before it runs the PTX: each `(parameter index, n)` says that
    /// argument must be a multiple of `n` (a pointer's address in bytes, an integer's value),
    /// as [`CompileOptions::divisibility`] promised.
    pub fn assumptions(&self) -> &[(usize, u64)] {
        &self.program.assumptions
    }
}

/// The layout and thread stages only: the program [`emulate`] runs, without LLVM.
pub fn thread_program(
    kernel: &Kernel,
    options: &CompileOptions,
) -> Result<thread::Program, CodegenError> {
    options.validate()?;
    let layouts = layout::assign(kernel, options)?;
    thread::lower(kernel, &layouts, options)
}

/// Runs every stage on `kernel`: layouts, the thread program, LLVM IR (verified), LLVM's
/// optimisation, PTX; keeps every stage's text.
pub fn compile(kernel: &Kernel, options: &CompileOptions) -> Result<Compiled, CodegenError> {
    compile_keeping(kernel, options, Keep::EveryStage)
}

/// [`compile`], keeping what `keep` says.
pub fn compile_keeping(
    kernel: &Kernel,
    options: &CompileOptions,
    keep: Keep,
) -> Result<Compiled, CodegenError> {
    options.validate()?;
    let keep_text = keep == Keep::EveryStage;
    let layouts = layout::assign(kernel, options)?;
    let layout_text = keep_text.then(|| layouts.to_text(kernel)).transpose()?;
    let program = thread::lower(kernel, &layouts, options)?;
    // One LLVM context per compile: nothing is shared between threads or between kernels.
    let context = Context::create();
    let machine = ptx::target_machine(options.target)?;
    let module = llvm::lower(
        &context,
        &program,
        options.target,
        &machine,
        options.line_info,
    )?;
    let llir = keep_text.then(|| module.print_to_string().to_string());
    ptx::optimize(&module, &machine)?;
    let llir_opt = keep_text.then(|| module.print_to_string().to_string());
    let ptx = ptx::emit(&module, &machine)?;
    // The tensor maps the kernel takes after its parameters, for whoever launches the PTX.
    let maps: String = program
        .tensor_maps
        .iter()
        .map(|m| format!("{}{m}\n", kiln_dsl::tensor_map::PTX_LINE))
        .collect();
    let stages = layout_text
        .zip(llir.zip(llir_opt))
        .map(|(layout, (llir, llir_opt))| {
            vec![
                kernel.to_string(),
                layout,
                program.to_string(),
                llir,
                llir_opt,
            ]
        });
    Ok(Compiled {
        name: kernel.name().to_string(),
        options: options.clone(),
        stages,
        ptx: maps + &ptx,
        program,
    })
}
