//! How each attention kernel is specialised, per target and head dim: block sizes, warps and
//! pipeline stages. The one table every launch, every shipped PTX and every test reads.
//!
//! Each entry is `BLOCK_M x BLOCK_N, warps, stages`, and `wgmma` where its `dot`s run on Hopper's
//! warpgroup tensor cores (the forward then overlaps its softmax with `P @ V`), `producer` where a
//! producer warpgroup of 4 more warps issues its copies, `uniform` where its `wgmma`
//! descriptors take their warpgroup's index from lane 0 (kiln-codegen's `uniform_warpgroup`),
//! `at issue` where each `wgmma` statement adds its descriptors' offsets (kiln-codegen's
//! `descriptors_at_issue`), `lean` where the producer keeps 24 registers and its consumers 240
//! (kiln-codegen's `lean_producer`), `A in registers` where a `wgmma`'s loop-invariant A operand
//! (the forward's Q) is loaded into registers once (kiln-codegen's `resident_a`), `partial sums`
//! where a sum that only accumulates (the forward's row sum) keeps each lane's partial sum
//! until it is read whole (kiln-codegen's `partial_sums`), `tid in loops` where each `mma.sync`
//! loop body reads `%tid.x` again for its thread-dependent offsets (kiln-codegen's `loop_tid`).
//! BLOCK_M counts query rows and BLOCK_N key rows in every kernel: the forward and dQ hold
//! BLOCK_M query rows per program and stream K/V in BLOCK_N-row tiles; dK/dV holds BLOCK_N key
//! rows and streams Q/dO in BLOCK_M-row tiles; the fused backward's preprocessing and dQ
//! conversion kernels have only BLOCK_M.
//!
//! | target | head dim | forward | dQ | dK/dV |
//! | --- | --- | --- | --- | --- |
//! | sm_90a | 32 | 64 x 128, 4, 2, wgmma (causal: 64 x 64) | 64 x 64, 4, 2, wgmma | 128 x 64, 4, 2, wgmma |
//! | sm_90a | 64 | 128 x 128, 8, 2, wgmma, producer, persistent (without a mask: partial sums, long: 256 x 64, 16, 2, wgmma, A in registers; causal, long: partial sums) | 128 x 64, 8, 2, wgmma (causal: 64 x 64, 4) | 128 x 64, 4, 2, wgmma |
//! | sm_90a | 128 | 128 x 128, 8, 2, wgmma, producer, persistent, uniform (without a mask: partial sums) | 128 x 128, 8, 2, wgmma, producer (causal: without) | 64 x 64, 4, 2, wgmma |
//! | sm_90a | 256 | 128 x 64, 8, 2, wgmma, producer | 64 x 64, 4, 2, wgmma | 64 x 64, 8, 2 |
//! | sm_80 | 32 | 128 x 64, 4, 2, tid in loops | 64 x 64, 4, 2 | 64 x 64, 8, 2 |
//! | sm_80 | 64 | 128 x 128, 4, 3 (causal: 2), partial sums, tid in loops | 128 x 64, 4, 2, tid in loops | 128 x 64, 4, 2 |
//! | sm_80 | 128 | 128 x 64, 4, 2 (without a mask: tid in loops) | 128 x 32, 4, 2 (causal: tid in loops) | 64 x 64, 4, 2, tid in loops |
//! | sm_80 | 256 | 64 x 32, 4, 2, tid in loops | 32 x 32, 4, 2, tid in loops | 32 x 32, 8, 2 |
//!
//! Short and long are the sequence lengths of [`KeyLength`]: up to 512 keys a program and from
//! 4096 (causal, half the keys), where another forward configuration than the entry's may
//! measure faster (today only long ones do); each such ships as a specialisation of its own
//! (`_short`, `_long`) and the launch picks it by `seqlen_q` and `seqlen_k`. A persistent
//! forward takes a softmax scale >= 0 only: a call with a negative one runs the long range's
//! entry, or where that one is persistent too (D64 causal, D128), its blocks one program a
//! block, shipped as `_signed` ([`super::plan::forward`], [`super::plan::signed_forward`]).
//!
//! The sm_90a entries are `kiln tune`'s winners on an H100 (bf16, seqlen 4096; every candidate
//! checked against f64 first; docs/PERF.md, 2026-11-22) and since: on `wgmma` wherever it won
//! (1.05-1.53x the `mma.sync` entries it replaced; dK/dV at 256 stays on `mma.sync`, which won
//! there); 8 warps where 4 cannot hold the accumulators, and two warpgroups taking turns at the
//! tensor cores (kiln-codegen's `thread::lower`, 2026-11-25) for the forward at 128 and dQ at
//! 64. The forward at 32 and 64 runs 64 query rows of one warpgroup, several programs an SM,
//! whose loads and stores overlap each other's products: at 32 1.13-1.25x the larger blocks
//! before from seqlen 1k to 16k, at 64 1.13-1.19x at 1k and 0.98-1.06x beyond (H200,
//! docs/PERF.md, 2026-11-26, seventh session). The forward at 128 and 256 has a producer
//! warpgroup issue its copies (FlashAttention-3's warp specialisation): at 128 1.04-1.07x from 1k
//! to 16k, causal or not, at 256 1.00-1.06x (most at 1k); elsewhere it lost or tied (dQ
//! 0.82-1.00x, dK/dV at 8 warps 0.94-1.00x the table's 4, the D64 forward 0.56-0.91x: `kiln
//! tune`, H200, docs/PERF.md, 2026-11-26, eleventh session), until the D128 dQ without a mask
//! measured 1.02-1.05x with one (twenty-first session). The D128 forward is persistent,
//! one program an SM looping over the blocks: without a mask 1.22x at seqlen 512, 1.11x at 1k,
//! 1.04x at 2k (H200, docs/PERF.md, fifteenth session), causal (on pairs of blocks) 1.21x at
//! 1k, 1.13x at 2k and 1.05x at 4k (sixteenth session), and at every length since its `wgmma`
//! descriptors went uniform (seventeenth session); so is D64's, in 128 x 128 blocks with a
//! producer, once its Q took two tiles by turns: without a mask 1.00-1.04x in compare.py at
//! 1k-2k, 1.06-1.10x under the power cap, causal 1.08-1.09x there (sixteenth session). Several
//! spill a little (up to 700 bytes, ptxas 13.0) and are still the fastest measured.
//!
//! The sm_80 entries at 64 and 128 are `kiln tune`'s winners for the sm_80 PTX run on an H200
//! (`KILN_TARGET=sm_80`, which is where Stage 1's bars are measured; bf16, seqlen 4096, sustained
//! timing; docs/PERF.md, 2026-11-26, seventh session): 1.04-1.30x the untuned shapes before,
//! FlashAttention-2's own sm_80 shapes for the forwards (128 x 128 of 4 warps at 64, 128 x 64 at
//! 128). ptxas for sm_80 spills 4-120 bytes in them (the timings are of the driver's compile for
//! Hopper); no Ampere GPU has timed them. At 32 and 256 they are untuned: FlashAttention-2's sm_80
//! shapes, halved at 256 to keep a program's tiles in registers. Stages are kiln-codegen's
//! `CompileOptions::num_stages` for the kernel's streaming loop: shared buffers per streamed tile,
//! one tile in flight with `cp.async` while the program computes on another.
//!
//! The fused backward runs a preprocessing kernel (the row statistics, and the dQ accumulator
//! zeroed) and a dQ conversion, both 64 rows of 4 warps, and its own dK/dV entry, since that one
//! also holds a dQ tile and adds it: on sm_90a 128 x 128, 8, 2, wgmma at head dims 32 and 64
//! (at issue at 64; `kiln tune --backward fused`, H100, 2026-11-25), and 64 x 128, 8, 2, wgmma,
//! producer, lean, uniform, at issue at 128 (key-major, H200, twelfth session; its descriptors
//! nineteenth, its producer twenty-first; dQ by turns not taken, twenty-second); elsewhere the
//! split dK/dV's entry, untuned. Those
//! short of registers compute their `wgmma` descriptors at issue: LLVM would hoist one register
//! pair per instruction out of the loop.
//!
//! Heads of at most [`DECODE_ROWS`] query rows run decode blocks: 16 rows whose warps take
//! keys of their own, on `mma.sync` at both targets. Split over the keys
//! ([`super::plan::forward_split`]; a decode step too small for the GPU), 4 warps (D32 16 x
//! 256, D64 16 x 128, D128 16 x 64, 3 stages; D256 16 x 64, 2; hand-chosen from six measured
//! variants, docs/PERF.md, thirty-second session); unsplit (a batch of steps that fills it),
//! the same but at D32, 16 x 32 of 2 warps on 2 stages (`kiln tune --decode`: 1.25x on sm_90a,
//! thirty-third session; 1.23x for the sm_80 PTX on an H200, thirty-seventh). A split forward
//! of more rows runs the medium range's forward. Its combine takes one query row a program, 16
//! splits a tile.

use kiln_dsl::Target;

use super::plan::AttentionKernel;

/// Head dims the attention kernels are built for; any other is refused.
pub const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];

/// The most query rows a head (a GQA group's heads counted as rows) whose forward runs the
/// decode blocks ([`AttentionConfig::decode`], [`AttentionConfig::split_decode`]).
pub const DECODE_ROWS: usize = 16;

/// How one kernel is specialised and launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// Query rows per program (forward, dQ, the fused backward's preprocessing and dQ
    /// conversion) or per streamed tile (dK/dV); the split forward's combine, one query row a
    /// program, takes this many splits a tile (`SPLIT_BLOCK`).
    pub block_m: usize,
    /// Key rows per streamed tile (forward, dQ) or per program (dK/dV); `None` for the
    /// fused backward's preprocessing and dQ conversion kernels, which read no keys.
    pub block_n: Option<usize>,
    pub num_warps: u32,
    /// kiln-codegen's `num_stages` for the kernel's streaming loop; 1 for the preprocessing
    /// kernel, which has none.
    pub num_stages: u32,
    /// kiln-codegen's `wgmma`: the kernel's `dot`s on Hopper's warpgroup tensor cores (sm_90a,
    /// a multiple of 4 warps).
    pub wgmma: bool,
    /// kiln-codegen's `producer`: a producer warpgroup of its own issues the streaming loops'
    /// TMA copies (4 warps beyond `num_warps`).
    pub producer: bool,
    /// A persistent forward: one program an SM loops over the query blocks, its producer
    /// copying the next block's Q and first K tile while the consumers finish this one (a
    /// forward with a producer only; [`super::forward`]).
    pub persistent: bool,
    /// kiln-codegen's `uniform_warpgroup`: the `wgmma` descriptors of A take their
    /// warpgroup's index from lane 0, so that ptxas keeps them in uniform registers (a
    /// configuration with `wgmma` and two warpgroups or more; it moves ptxas's schedule, which
    /// wins for some kernels and loses for others: docs/PERF.md, seventeenth session).
    pub uniform_warpgroup: bool,
    /// kiln-codegen's `descriptors_at_issue`: each `wgmma` statement adds its descriptors'
    /// offsets itself, so that LLVM holds no register pair per instruction across a loop
    /// (for kernels short of registers: docs/PERF.md, nineteenth session).
    pub descriptors_at_issue: bool,
    /// kiln-codegen's `lean_producer`: the producer keeps 24 registers a thread, its two
    /// consumer warpgroups 240 (a configuration with a producer; docs/PERF.md,
    /// twenty-first session).
    pub lean_producer: bool,
    /// kiln-codegen's `resident_a`: a `wgmma`'s A operand that its loop does not define (the
    /// forward's Q) loaded into registers once, not read from shared memory every iteration
    /// (a configuration with `wgmma`; docs/PERF.md, twenty-fourth session).
    pub resident_a: bool,
    /// kiln-codegen's `partial_sums`: a sum that only accumulates (the forward's row sum)
    /// keeps each lane's partial sum, its shuffles taken once where it is read whole
    /// (docs/PERF.md, twenty-sixth session).
    pub partial_sums: bool,
    /// kiln-codegen's `loop_tid`: each `mma.sync` loop body reads `%tid.x` again and computes
    /// its thread fields there, not keeping them across the loop, where ptxas spilled them
    /// (docs/PERF.md, twenty-ninth session).
    pub loop_tid: bool,
    /// The fused dK/dV's dQ by turns: key-major with a query tile of one warpgroup's 64 rows
    /// and two warpgroups, each tile's `dQ = dS K` computed whole by one of them, the two
    /// taking turns ([`super::dkdv_dq_by_turns`]).
    pub dq_by_turns: bool,
}

impl KernelConfig {
    pub const fn new(
        block_m: usize,
        block_n: usize,
        num_warps: u32,
        num_stages: u32,
    ) -> KernelConfig {
        KernelConfig {
            block_m,
            block_n: Some(block_n),
            num_warps,
            num_stages,
            wgmma: false,
            producer: false,
            persistent: false,
            uniform_warpgroup: false,
            descriptors_at_issue: false,
            lean_producer: false,
            resident_a: false,
            partial_sums: false,
            loop_tid: false,
            dq_by_turns: false,
        }
    }

    /// The same configuration with a producer warpgroup.
    pub const fn with_producer(self) -> KernelConfig {
        KernelConfig {
            producer: true,
            ..self
        }
    }

    /// The same configuration, persistent.
    pub const fn persistent(self) -> KernelConfig {
        KernelConfig {
            persistent: true,
            ..self
        }
    }

    /// The same configuration, its `wgmma` descriptors' warpgroup index from lane 0.
    pub const fn with_uniform_warpgroup(self) -> KernelConfig {
        KernelConfig {
            uniform_warpgroup: true,
            ..self
        }
    }

    /// The same configuration, its `wgmma` descriptors computed at issue.
    pub const fn with_descriptors_at_issue(self) -> KernelConfig {
        KernelConfig {
            descriptors_at_issue: true,
            ..self
        }
    }

    /// The same configuration, its producer keeping 24 registers.
    pub const fn with_lean_producer(self) -> KernelConfig {
        KernelConfig {
            lean_producer: true,
            ..self
        }
    }

    /// The same configuration, its loop-invariant `wgmma` A operands in registers.
    pub const fn with_resident_a(self) -> KernelConfig {
        KernelConfig {
            resident_a: true,
            ..self
        }
    }

    /// The same configuration, its sums that only accumulate kept as lanes' partial sums.
    pub const fn with_partial_sums(self) -> KernelConfig {
        KernelConfig {
            partial_sums: true,
            ..self
        }
    }

    /// The same configuration, its `mma.sync` loop bodies reading `%tid.x` again.
    pub const fn with_loop_tid(self) -> KernelConfig {
        KernelConfig {
            loop_tid: true,
            ..self
        }
    }

    /// The same configuration, the fused dK/dV's dQ by turns.
    pub const fn with_dq_by_turns(self) -> KernelConfig {
        KernelConfig {
            dq_by_turns: true,
            ..self
        }
    }

    /// What kiln-codegen is told beside the spec.
    pub const fn knobs(&self) -> CodegenKnobs {
        CodegenKnobs {
            num_warps: self.num_warps,
            num_stages: self.num_stages,
            wgmma: self.wgmma,
            producer: self.producer,
            lean_producer: self.lean_producer,
            uniform_warpgroup: self.uniform_warpgroup,
            descriptors_at_issue: self.descriptors_at_issue,
            resident_a: self.resident_a,
            partial_sums: self.partial_sums,
            loop_tid: self.loop_tid,
        }
    }

    /// Threads a program of this configuration launches with.
    pub const fn threads(&self) -> u32 {
        self.knobs().threads()
    }

    /// The same configuration with its `dot`s on `wgmma`.
    pub const fn on_wgmma(self) -> KernelConfig {
        KernelConfig {
            wgmma: true,
            ..self
        }
    }
}

/// `128 x 64, 4 warps, 2 stages` (`64, 4 warps, 1 stage` without a key block; `, wgmma` on
/// Hopper's warpgroup tensor cores, and the other knobs after it, then the kernel's flags).
impl std::fmt::Display for KernelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.block_m)?;
        if let Some(block_n) = self.block_n {
            write!(f, " x {block_n}")?;
        }
        write!(f, ", {}", self.knobs())?;
        if self.persistent {
            write!(f, ", persistent")?;
        }
        if self.dq_by_turns {
            write!(f, ", dQ by turns")?;
        }
        Ok(())
    }
}

/// What kiln-codegen is told to compile a kernel with beside its spec: a [`KernelConfig`]'s
/// warps, stages and Hopper knobs (its block sizes and the kernel's flags are the spec's), or
/// what `kiln <stage>` gives any registered kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodegenKnobs {
    pub num_warps: u32,
    pub num_stages: u32,
    pub wgmma: bool,
    pub producer: bool,
    pub lean_producer: bool,
    pub uniform_warpgroup: bool,
    pub descriptors_at_issue: bool,
    pub resident_a: bool,
    pub partial_sums: bool,
    pub loop_tid: bool,
}

impl CodegenKnobs {
    /// `num_warps` warps and `num_stages` stages, every other knob off.
    pub const fn new(num_warps: u32, num_stages: u32) -> CodegenKnobs {
        CodegenKnobs {
            num_warps,
            num_stages,
            wgmma: false,
            producer: false,
            lean_producer: false,
            uniform_warpgroup: false,
            descriptors_at_issue: false,
            resident_a: false,
            partial_sums: false,
            loop_tid: false,
        }
    }

    /// Threads a program launches with: a producer warpgroup's 4 warps beyond `num_warps`
    /// (saturating: `kiln <stage> --warps` takes any number, which kiln-codegen then refuses).
    pub const fn threads(&self) -> u32 {
        let producer = if self.producer { 4 } else { 0 };
        self.num_warps.saturating_add(producer).saturating_mul(32)
    }

    /// kiln-codegen's options for `target` with these knobs, assuming each `(argument, n)` of
    /// `divisibility` (the argument a multiple of `n`).
    #[cfg(feature = "codegen")]
    pub fn options<'a>(
        &self,
        target: Target,
        divisibility: impl IntoIterator<Item = (&'a str, u64)>,
    ) -> kiln_codegen::CompileOptions {
        divisibility.into_iter().fold(
            kiln_codegen::CompileOptions::new(target, self.num_warps)
                .with_stages(self.num_stages)
                .with_wgmma(self.wgmma)
                .with_producer(self.producer)
                .with_lean_producer(self.lean_producer)
                .with_uniform_warpgroup(self.uniform_warpgroup)
                .with_descriptors_at_issue(self.descriptors_at_issue)
                .with_resident_a(self.resident_a)
                .with_partial_sums(self.partial_sums)
                .with_loop_tid(self.loop_tid),
            |options, (name, n)| options.with_divisibility(name, n),
        )
    }
}

/// `4 warps, 2 stages, wgmma, producer, lean producer, uniform warpgroup, descriptors at issue,
/// A in registers, partial sums, tid in loops`.
impl std::fmt::Display for CodegenKnobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let plural = |n: u32| if n == 1 { "" } else { "s" };
        write!(
            f,
            "{} warp{}, {} stage{}",
            self.num_warps,
            plural(self.num_warps),
            self.num_stages,
            plural(self.num_stages)
        )?;
        let knobs = [
            (self.wgmma, "wgmma"),
            (self.producer, "producer"),
            (self.lean_producer, "lean producer"),
            (self.uniform_warpgroup, "uniform warpgroup"),
            (self.descriptors_at_issue, "descriptors at issue"),
            (self.resident_a, "A in registers"),
            (self.partial_sums, "partial sums"),
            (self.loop_tid, "tid in loops"),
        ];
        for (_, name) in knobs.into_iter().filter(|(on, _)| *on) {
            write!(f, ", {name}")?;
        }
        Ok(())
    }
}

/// The text form of a [`KernelConfig`] that `kiln tune --configs` takes, as a literal for
/// `concat!` (the refusal below and the CLI's usage say it alike).
#[macro_export]
macro_rules! kernel_config_grammar {
    () => {
        "BLOCK_MxBLOCK_N:WARPS:STAGES[:wgmma[:producer[:persistent][:lean]][:uniform][:at-issue]\
         [:resident-a][:turns]][:partial-sums][:loop-tid]"
    };
}

/// [`kernel_config_grammar!`], as `kiln tune --configs` takes it: `128x64:4:2:wgmma`,
/// `128x128:8:2:wgmma:producer:uniform`, `128x64:4:2:partial-sums`, `64x64:4:2:loop-tid`.
impl std::str::FromStr for KernelConfig {
    type Err = String;

    fn from_str(text: &str) -> Result<KernelConfig, String> {
        let refuse = || {
            format!(
                concat!("expected ", kernel_config_grammar!(), ", got `{}`"),
                text
            )
        };
        let mut parts: Vec<&str> = text.trim().split(':').collect();
        // Last, in this order: the options of any configuration (after its three numbers), then
        // the `wgmma` ones (after `wgmma`).
        let mut trailing = |name: &str, after: usize| {
            let found = parts.len() > after && parts.last() == Some(&name);
            if found {
                parts.pop();
            }
            found
        };
        let loop_tid = trailing("loop-tid", 3);
        let partial_sums = trailing("partial-sums", 3);
        let mut flag = |name: &str| trailing(name, 4);
        let turns = flag("turns");
        let resident_a = flag("resident-a");
        let at_issue = flag("at-issue");
        let uniform = flag("uniform");
        let lean = flag("lean");
        let (blocks, warps, stages, wgmma, producer, persistent) = match parts[..] {
            [b, w, s] => (b, w, s, false, false, false),
            [b, w, s, "wgmma"] => (b, w, s, true, false, false),
            [b, w, s, "wgmma", "producer"] => (b, w, s, true, true, false),
            [b, w, s, "wgmma", "producer", "persistent"] => (b, w, s, true, true, true),
            _ => return Err(refuse()),
        };
        if lean && !producer {
            return Err(refuse());
        }
        let (m, n) = blocks.split_once('x').ok_or_else(refuse)?;
        let number = |v: &str| v.parse::<usize>().map_err(|_| refuse());
        let config = KernelConfig::new(
            number(m)?,
            number(n)?,
            number(warps)? as u32,
            number(stages)? as u32,
        );
        type With = fn(KernelConfig) -> KernelConfig;
        let knobs: [(bool, With); 10] = [
            (wgmma, KernelConfig::on_wgmma),
            (producer, KernelConfig::with_producer),
            (persistent, KernelConfig::persistent),
            (lean, KernelConfig::with_lean_producer),
            (uniform, KernelConfig::with_uniform_warpgroup),
            (at_issue, KernelConfig::with_descriptors_at_issue),
            (resident_a, KernelConfig::with_resident_a),
            (turns, KernelConfig::with_dq_by_turns),
            (partial_sums, KernelConfig::with_partial_sums),
            (loop_tid, KernelConfig::with_loop_tid),
        ];
        Ok(knobs.into_iter().fold(
            config,
            |config, (on, with)| if on { with(config) } else { config },
        ))
    }
}

/// The attention kernels' configurations for one target and head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    pub forward: KernelConfig,
    /// The forward where a head has at most [`DECODE_ROWS`] query rows (a decode step, a GQA
    /// group's) and the call fills the GPU unsplit: blocks of 16 rows whose warps take keys of
    /// their own, tuned on a batch of decode steps (`kiln tune --decode`).
    pub decode: KernelConfig,
    /// [`AttentionConfig::decode`]'s blocks for a call split over the keys (a decode step of
    /// too few heads for the GPU), whose programs each must keep more bytes in flight.
    pub split_decode: KernelConfig,
    /// The split forward's combine.
    pub combine: KernelConfig,
    pub preprocess: KernelConfig,
    pub dq: KernelConfig,
    /// For the fused backward, its dK/dV, which also adds dQ with atomics.
    pub dkdv: KernelConfig,
    pub dq_convert: KernelConfig,
}

impl AttentionConfig {
    pub fn kernel(&self, kernel: AttentionKernel) -> KernelConfig {
        match kernel {
            AttentionKernel::Forward => self.forward,
            AttentionKernel::Combine => self.combine,
            AttentionKernel::Preprocess => self.preprocess,
            AttentionKernel::Dq => self.dq,
            AttentionKernel::DkDv => self.dkdv,
            AttentionKernel::DqConvert => self.dq_convert,
        }
    }

    /// The forward split over the keys (`plan::forward_split`): the forward's blocks, one
    /// program a block (a persistent forward takes every key of its blocks).
    pub fn split_forward(&self) -> KernelConfig {
        KernelConfig {
            persistent: false,
            ..self.forward
        }
    }

    /// This configuration with `kernel`'s replaced by `config`.
    pub fn with(mut self, kernel: AttentionKernel, config: KernelConfig) -> AttentionConfig {
        *match kernel {
            AttentionKernel::Forward => &mut self.forward,
            AttentionKernel::Combine => &mut self.combine,
            AttentionKernel::Preprocess => &mut self.preprocess,
            AttentionKernel::Dq => &mut self.dq,
            AttentionKernel::DkDv => &mut self.dkdv,
            AttentionKernel::DqConvert => &mut self.dq_convert,
        } = config;
        self
    }
}

/// How many keys a forward program streams, in the ranges the table tells apart. A program's
/// prologue and epilogue weigh most where it streams few key blocks, where small blocks, several
/// programs an SM, hide them best; over many, larger blocks win. Causal, a program streams half
/// the keys on average.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeyLength {
    /// Up to [`KeyLength::SHORT_UP_TO`] keys a program on average.
    Short,
    /// Between the two: the table's own entries (tuned at seqlen 4k, where the others have no
    /// specialisation of their own).
    Medium,
    /// From [`KeyLength::LONG_FROM`] keys a program on average.
    Long,
}

impl KeyLength {
    pub const ALL: [KeyLength; 3] = [KeyLength::Short, KeyLength::Medium, KeyLength::Long];
    pub const SHORT_UP_TO: usize = 512;
    pub const LONG_FROM: usize = 4096;

    /// The range of a call: by its keys, or causal by what a query row that sees keys sees on
    /// average, `seqlen_k - min(seqlen_q, seqlen_k) / 2` (the mask is aligned bottom-right: with
    /// more queries than keys, the first rows see none and the last all).
    pub fn of(seqlen_q: usize, seqlen_k: usize, causal: bool) -> KeyLength {
        let keys = if causal {
            seqlen_k - seqlen_q.min(seqlen_k) / 2
        } else {
            seqlen_k
        };
        if keys <= KeyLength::SHORT_UP_TO {
            KeyLength::Short
        } else if keys >= KeyLength::LONG_FROM {
            KeyLength::Long
        } else {
            KeyLength::Medium
        }
    }

    /// A sequence length (query and key) in this range, causal or not.
    pub fn example_seqlen(self, causal: bool) -> usize {
        let keys = match self {
            KeyLength::Short => KeyLength::SHORT_UP_TO,
            // Inside the range whatever its bounds: half the long range's start.
            KeyLength::Medium => KeyLength::LONG_FROM / 2,
            KeyLength::Long => KeyLength::LONG_FROM,
        };
        if causal { 2 * keys } else { keys }
    }

    /// What a specialisation's name says of the range: nothing for the table's own entry.
    pub fn suffix(self) -> &'static str {
        match self {
            KeyLength::Short => "_short",
            KeyLength::Medium => "",
            KeyLength::Long => "_long",
        }
    }
}

/// The configuration for `head_dim`, causal or not, for the split or the fused backward, on
/// `target`, for calls of `keys`, or `None` if kiln has no attention kernel for that head dim.
pub fn config(
    head_dim: usize,
    causal: bool,
    fused_backward: bool,
    target: Target,
    keys: KeyLength,
) -> Option<AttentionConfig> {
    let preprocess = KernelConfig {
        block_n: None,
        ..KernelConfig::new(64, 0, 4, 1)
    };
    let c = KernelConfig::new;
    let [forward, dq, dkdv] = match (target, head_dim) {
        // `kiln tune` on an H100, bf16, seqlen 4096 (docs/PERF.md, 2026-11-22); the forward on
        // `wgmma` since 2026-11-26: 1.13-1.25x `mma.sync`'s 128 x 128 from 1k to 16k, causal
        // 1.18-1.20x (interleaved A/B, H200, docs/PERF.md, seventh session).
        (Target::Sm90a, 32) => [
            if causal {
                c(64, 64, 4, 2).on_wgmma()
            } else {
                c(64, 128, 4, 2).on_wgmma()
            },
            c(64, 64, 4, 2).on_wgmma(),
            c(128, 64, 4, 2).on_wgmma(),
        ],
        // The forward persistent on pairs of 128 x 128 blocks with a producer, as without a mask
        // (below): 1.09x the 64 x 64 blocks of one warpgroup under the GPU's power cap at seqlen
        // 1k-4k, 1.01-1.02x in short bursts (run 202, sixteenth session). Those blocks had
        // beaten the ones before (causal 1.13x, 1.06x and 1.01x at seqlen 1k, 4k and 16k against
        // 128 x 64: interleaved A/B, H200, docs/PERF.md, 2026-11-26, seventh session).
        (Target::Sm90a, 64) if causal => [
            c(128, 128, 8, 2).on_wgmma().with_producer().persistent(),
            // On TMA: 1.04x 64 x 128 for dQ, and dK/dV back to the full one's 128 x 64,
            // 1.10x 64 x 64 on 3 stages (docs/PERF.md, 2026-11-25, third session).
            c(64, 64, 4, 2).on_wgmma(),
            c(128, 64, 4, 2).on_wgmma(),
        ],
        // Without a mask the forward is persistent in 128 x 128 blocks of two warpgroups with a
        // producer (its Q in two tiles by turns): against the 64 x 64 blocks of one warpgroup,
        // compare.py 1.00x at seqlen 1k and 1.04x at 2k, under the GPU's power cap 1.10x and
        // 1.06x (it runs the GPU ~10% faster), in short bursts 1.10x at 512, 1.00x at 1k and
        // 0.94-0.96x at 2k-3k (H200, run 197, docs/PERF.md, sixteenth session); long, below.
        // dQ in two warpgroups taking turns: 1.08x the blocks of one warpgroup at seqlen 8192
        // (`kiln tune`, docs/PERF.md, 2026-11-25, fifth session); the causal one keeps 64 x 64.
        // dK/dV key-major in 32-row query tiles: 1.03-1.09x 128 x 64 from 1k to 16k (run 113,
        // per kernel; `kiln tune` runs 102 and 106: causal 0.865x; docs/PERF.md, tenth session).
        // Its row sum kept as lanes' partial sums: 1.015x at 1k, 1.023x at 2k (run 315, H200,
        // twenty-sixth session; 1.018x and 1.022x on an H100, run 320; causal 0.99-1.04x, left
        // without).
        (Target::Sm90a, 64) => [
            c(128, 128, 8, 2)
                .on_wgmma()
                .with_producer()
                .persistent()
                .with_partial_sums(),
            c(128, 64, 8, 2).on_wgmma(),
            c(32, 64, 4, 2).on_wgmma(),
        ],
        (Target::Sm90a, 128) => [
            // Two warpgroups taking turns at the tensor cores: 1.19x (1.16x causal) the
            // 64 x 64 blocks of one warpgroup (`kiln tune`, seqlen 8192, docs/PERF.md,
            // 2026-11-25, fifth session); a producer warpgroup issues the copies: 1.04-1.07x
            // (eleventh session). Persistent: without a mask 1.22x at seqlen 512, 1.11x at
            // 1k, 1.04x at 2k, 1.02x at 3k (run 191, fifteenth session); causal, each program
            // on pairs of one head's blocks, 1.13x at 2k and 1.05x at 4k (1.07x and 1.04x under
            // the power cap; run 200, sixteenth session); long, below. Its `wgmma` descriptors'
            // warpgroup from lane 0: 1.03x without a mask at 1k, 1.05x causal at 1k and 4k
            // (runs 211-212, seventeenth session). Without a mask its row sum kept as lanes'
            // partial sums: 1.012-1.025x (run 315, H200, twenty-sixth session; 1.011-1.040x on
            // an H100, run 320; causal 0.99-1.01x).
            {
                let forward = c(128, 128, 8, 2)
                    .on_wgmma()
                    .with_producer()
                    .persistent()
                    .with_uniform_warpgroup();
                if causal {
                    forward
                } else {
                    forward.with_partial_sums()
                }
            },
            // dQ without a mask with a producer warpgroup: 1.021-1.050x per kernel, causal
            // 0.927-0.996x (run 258, twenty-first session; 0.82-1.00x in the eleventh).
            if causal {
                c(128, 128, 8, 2).on_wgmma()
            } else {
                c(128, 128, 8, 2).on_wgmma().with_producer()
            },
            c(64, 64, 4, 2).on_wgmma(),
        ],
        (Target::Sm90a, 256) => [
            // A producer warpgroup: 1.00-1.06x (eleventh session).
            c(128, 64, 8, 2).on_wgmma().with_producer(),
            c(64, 64, 4, 2).on_wgmma(),
            c(64, 64, 8, 2),
        ],
        // At 64 and 128: `kiln tune` of the sm_80 PTX on an H200 (`KILN_TARGET=sm_80`, bf16,
        // seqlen 4096; docs/PERF.md, 2026-11-26, seventh session), where Stage 1's bars are
        // measured: 1.04-1.30x the untuned shapes before. Not measured on Ampere.
        // The forward's row sum kept as lanes' partial sums: 1.030-1.045x at 2k-4k, causal or not
        // (run 327, twenty-seventh session; D128's 0.996-1.004x, left without). `%tid.x` read
        // again in each loop body where it measured faster (run 339, twenty-ninth session;
        // `kernel_times.py`, H200, control 0.99-1.006x): the D64 forward 1.007-1.014x (causal
        // at 16k 1.001x), the D64 dQ 1.004-1.037x, the D128 forward without a mask 1.024-1.032x
        // (causal 0.974-1.007x: without), the D128 dQ causal 1.008-1.017x (without a mask
        // 0.943-0.953x: without), the D128 dK/dV 1.053-1.077x; the D64 dK/dV without (0.970x at
        // 16k without a mask, causal 0.980-1.034x).
        (Target::Sm80, 64) => [
            c(128, 128, 4, if causal { 2 } else { 3 })
                .with_partial_sums()
                .with_loop_tid(),
            c(128, 64, 4, 2).with_loop_tid(),
            c(128, 64, 4, 2),
        ],
        (Target::Sm80, 128) => {
            let (forward, dq) = (c(128, 64, 4, 2), c(128, 32, 4, 2));
            [
                if causal {
                    forward
                } else {
                    forward.with_loop_tid()
                },
                if causal { dq.with_loop_tid() } else { dq },
                c(64, 64, 4, 2).with_loop_tid(),
            ]
        }
        // Not tuned yet: FlashAttention-2's sm_80 shapes, which fit without spills, halved at
        // head dim 256. `%tid.x` read again in each loop body where it measured faster (run 341,
        // twenty-ninth session; control 0.992-1.001x): the D32 forward 1.034-1.058x without a
        // mask (causal 1.000-1.006x), the D256 forward 1.010-1.017x, the D256 dQ 1.006-1.031x;
        // not the D32 dQ (0.984-1.003x) nor either dK/dV (D32 0.909-0.955x, D256 0.973-0.999x).
        (Target::Sm80, 32) => [
            c(128, 64, 4, 2).with_loop_tid(),
            c(64, 64, 4, 2),
            c(64, 64, 8, 2),
        ],
        (Target::Sm80, 256) => [
            c(64, 32, 4, 2).with_loop_tid(),
            c(32, 32, 4, 2).with_loop_tid(),
            c(32, 32, 8, 2),
        ],
        _ => return None,
    };
    // Where other blocks measured faster for long sequences (`kiln tune --seqlen`, sustained
    // timing, H200, docs/PERF.md, 2026-11-26, eighth session): D64's forward without a mask in
    // 256 x 64 of 16 warps from 4k keys a program (1.03-1.04x the 64 x 64 at 8k and 16k;
    // compare.py 1.04x at 4k: runs 175-177, fourteenth session; the persistent entry 0.95x at
    // 8k and 16k, run 203, sixteenth session; causal the entry, persistent on pairs of blocks,
    // beats it: 1.11x at 8k, 1.07x at 16k, 1.03x under the power cap, run 203). D128's forward
    // is persistent at every length since its descriptors went uniform: against one program a
    // block (its `wgmma` descriptors uniform where causal) 1.03x at 4k, 1.02x at 8k, 0.98x at
    // 16k without a mask, causal 1.05x at 8k, 0.99x at 16k; under the power cap 1.01-1.03x
    // and 1.05x, 1.00x (run 215, seventeenth session). The long D64 forward's Q in registers (its
    // `m64n64k16` scores read 128 bytes of shared memory a clock from descriptors): 1.02-1.03x
    // from 4k to 16k, and under the power cap (runs 293 and 296, twenty-fourth session). The
    // long causal D64 forward is the entry with its row sum kept as lanes' partial sums: 1.036x
    // at 16k (1.014x at 4k, 0.989x at 1k, which the entry keeps; run 315, twenty-sixth session),
    // under the power cap 1.017x at 16k (run 324, twenty-seventh session).
    let forward = match (target, head_dim, causal, keys) {
        (Target::Sm90a, 64, false, KeyLength::Long) => {
            c(256, 64, 16, 2).on_wgmma().with_resident_a()
        }
        (Target::Sm90a, 64, true, KeyLength::Long) => forward.with_partial_sums(),
        _ => forward,
    };
    let dkdv = match (fused_backward, target, head_dim) {
        // `kiln tune --backward fused --kernels attention_bwd_dkdv` on an H100, bf16, seqlen
        // 4096 (docs/PERF.md, 2026-11-25). Its descriptors at issue: 1.03-1.07x at D64,
        // 0.97-1.00x at D32 (runs 226-227, nineteenth session).
        (true, Target::Sm90a, 32) => c(128, 128, 8, 2).on_wgmma(),
        (true, Target::Sm90a, 64) => c(128, 128, 8, 2).on_wgmma().with_descriptors_at_issue(),
        // Key-major in two warpgroups, dQ transposed (FlashAttention-3's shape): 1.42x the
        // 64 x 64 blocks of one warpgroup, causal 1.24x (`kiln tune`, H200, seqlen 4096,
        // docs/PERF.md, twelfth session). Its descriptors at issue and uniform: 196 -> 32
        // bytes of spills, 1.05-1.09x (run 226, nineteenth session). A lean producer issues its
        // copies (FlashAttention-3's and cuDNN's split: at 232 registers ptxas serialises its
        // `wgmma`s): 1.007-1.028x (runs 254, 256, twenty-first session).
        (true, Target::Sm90a, 128) => c(64, 128, 8, 2)
            .on_wgmma()
            .with_producer()
            .with_lean_producer()
            .with_uniform_warpgroup()
            .with_descriptors_at_issue(),
        // Not tuned for the fused backward: the split one's.
        _ => dkdv,
    };
    // A decode step's 16-row block (its rows past the end are work for nothing in any block)
    // on `mma.sync` at every target, its warps side by side along the keys, `P @ V` reading P
    // from shared memory. Split, each of a few programs an SM streams its share of the keys: as
    // many keys a tile as keep two programs an SM.
    let split_decode = match head_dim {
        32 => c(16, 256, 4, 3),
        64 => c(16, 128, 4, 3),
        128 => c(16, 64, 4, 3),
        _ => c(16, 64, 4, 2),
    }
    .with_partial_sums();
    // Unsplit, a batch of steps fills the SMs with programs: at D32 smaller ones, more of them
    // an SM (16 x 32, 2 warps, 2 stages: on 16 x 64 heads x 8k keys 1.25x on sm_90a, run 387,
    // and 1.23x for the sm_80 PTX, run 408; at D64, D128 and D256 every candidate within
    // 0.97-1.03x of these on either, runs 386-387 and 408).
    let decode = match head_dim {
        32 => c(16, 32, 2, 2).with_partial_sums(),
        _ => split_decode,
    };
    Some(AttentionConfig {
        forward,
        decode,
        split_decode,
        // One query row a program, 16 splits a tile (a decode step splits its keys 2 to
        // `MAX_SPLITS` ways, most often 16 or fewer).
        combine: KernelConfig {
            block_n: None,
            ..c(16, 0, 4, 1)
        },
        preprocess,
        dq,
        dkdv,
        // Row-wise like the preprocessing kernel.
        dq_convert: preprocess,
    })
}

/// Every block size the attention kernels use, for tests that step just below and above each
/// (the combine's splits a tile are no sequence's block).
pub fn all_block_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = Target::ALL
        .into_iter()
        .flat_map(|target| {
            HEAD_DIMS.iter().flat_map(move |&d| {
                [(false, false), (true, false), (false, true), (true, true)]
                    .into_iter()
                    .flat_map(move |(causal, fused)| {
                        KeyLength::ALL.map(|keys| config(d, causal, fused, target, keys))
                    })
            })
        })
        .flatten()
        .flat_map(|c| {
            AttentionKernel::ALL
                .into_iter()
                .filter(|&k| k != AttentionKernel::Combine)
                .map(move |k| c.kernel(k))
                .chain([c.decode, c.split_decode])
        })
        .flat_map(|k| [Some(k.block_m), k.block_n])
        .flatten()
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn configurations_read_as_they_print_for_tune() {
        let c = KernelConfig::new;
        // (text, configuration, as printed): each reads as the configuration and prints so.
        for (text, config, printed) in [
            (
                "128x64:4:2:wgmma",
                c(128, 64, 4, 2).on_wgmma(),
                "128 x 64, 4 warps, 2 stages, wgmma",
            ),
            (
                "128x128:8:2:wgmma:producer",
                c(128, 128, 8, 2).on_wgmma().with_producer(),
                "128 x 128, 8 warps, 2 stages, wgmma, producer",
            ),
            (
                "128x128:8:2:wgmma:producer:persistent:uniform",
                c(128, 128, 8, 2)
                    .on_wgmma()
                    .with_producer()
                    .persistent()
                    .with_uniform_warpgroup(),
                "128 x 128, 8 warps, 2 stages, wgmma, producer, uniform warpgroup, persistent",
            ),
            (
                "64x128:8:2:wgmma:uniform:at-issue",
                c(64, 128, 8, 2)
                    .on_wgmma()
                    .with_uniform_warpgroup()
                    .with_descriptors_at_issue(),
                "64 x 128, 8 warps, 2 stages, wgmma, uniform warpgroup, descriptors at issue",
            ),
            (
                "64x128:8:2:wgmma:producer:lean:uniform:at-issue",
                c(64, 128, 8, 2)
                    .on_wgmma()
                    .with_producer()
                    .with_lean_producer()
                    .with_uniform_warpgroup()
                    .with_descriptors_at_issue(),
                "64 x 128, 8 warps, 2 stages, wgmma, producer, lean producer, uniform warpgroup, \
                 descriptors at issue",
            ),
            (
                "64x128:8:2:wgmma:producer:lean:turns",
                c(64, 128, 8, 2)
                    .on_wgmma()
                    .with_producer()
                    .with_lean_producer()
                    .with_dq_by_turns(),
                "64 x 128, 8 warps, 2 stages, wgmma, producer, lean producer, dQ by turns",
            ),
            (
                "256x64:16:2:wgmma:resident-a",
                c(256, 64, 16, 2).on_wgmma().with_resident_a(),
                "256 x 64, 16 warps, 2 stages, wgmma, A in registers",
            ),
            (
                "128x128:8:2:wgmma:producer:persistent:partial-sums",
                c(128, 128, 8, 2)
                    .on_wgmma()
                    .with_producer()
                    .persistent()
                    .with_partial_sums(),
                "128 x 128, 8 warps, 2 stages, wgmma, producer, partial sums, persistent",
            ),
            (
                "128x128:4:3:partial-sums:loop-tid",
                c(128, 128, 4, 3).with_partial_sums().with_loop_tid(),
                "128 x 128, 4 warps, 3 stages, partial sums, tid in loops",
            ),
        ] {
            let parsed: KernelConfig = text.parse().unwrap();
            assert_eq!(parsed, config, "{text}");
            assert_eq!(parsed.to_string(), printed);
        }
        assert_eq!(
            "128x128:8:2:wgmma:producer"
                .parse::<KernelConfig>()
                .unwrap()
                .threads(),
            384
        );
        // Read only.
        for (text, config) in [
            ("64x32:8:3", c(64, 32, 8, 3)),
            (
                "128x64:8:2:wgmma:uniform",
                c(128, 64, 8, 2).on_wgmma().with_uniform_warpgroup(),
            ),
            (
                "128x64:4:2:partial-sums",
                c(128, 64, 4, 2).with_partial_sums(),
            ),
            ("64x64:4:2:loop-tid", c(64, 64, 4, 2).with_loop_tid()),
        ] {
            assert_eq!(text.parse(), Ok(config));
        }
        for bad in [
            "64x128:8:2:turns",
            "128x64:4:partial-sums",
            "128x64:4:2:partial-sums:wgmma",
            "128x64:4:2:loop-tid:partial-sums",
            "128x64:4:loop-tid",
            "64x128:8:2:wgmma:turns:uniform",
            "128x64:4",
            "128:4:2",
            "128x64:4:2:mma",
            "ax64:4:2",
            "128x64:4:2:producer",
            "128x64:4:2:uniform",
            "128x64:4:2:at-issue",
            "128x64:8:2:wgmma:uniform:producer",
            "128x64:8:2:wgmma:at-issue:uniform",
            "128x64:8:2:wgmma:lean",
            "128x128:8:2:wgmma:producer:lean:persistent",
            "128x64:4:2:resident-a",
            "256x64:16:2:wgmma:resident-a:at-issue",
        ] {
            let err = bad.parse::<KernelConfig>().unwrap_err();
            assert!(err.contains(&format!("got `{bad}`")), "{err}");
        }
    }

    #[test]
    fn key_lengths_split_at_what_a_program_streams() {
        use KeyLength::*;
        assert_eq!(KeyLength::of(512, 512, false), Short);
        assert_eq!(KeyLength::of(513, 513, false), Medium);
        assert_eq!(KeyLength::of(4095, 4095, false), Medium);
        assert_eq!(KeyLength::of(4096, 4096, false), Long);
        // Causal, a row sees `seqlen_k - seqlen_q / 2` keys on average.
        assert_eq!(KeyLength::of(1024, 1024, true), Short);
        assert_eq!(KeyLength::of(1026, 1026, true), Medium);
        assert_eq!(KeyLength::of(8190, 8190, true), Medium);
        assert_eq!(KeyLength::of(8192, 8192, true), Long);
        assert_eq!(KeyLength::of(100, 8300, true), Long);
        // More queries than keys: the rows that see keys see half of them on average.
        assert_eq!(KeyLength::of(20000, 100, true), Short);
        assert_eq!(KeyLength::of(24576, 16384, true), Long);
        assert_eq!(KeyLength::of(40000, 16384, true), Long);
        for keys in KeyLength::ALL {
            for causal in [false, true] {
                let n = keys.example_seqlen(causal);
                assert_eq!(
                    KeyLength::of(n, n, causal),
                    keys,
                    "{keys:?} causal {causal}"
                );
            }
        }
    }

    #[test]
    fn every_head_dim_has_a_configuration_on_every_target() {
        for target in Target::ALL {
            for head_dim in HEAD_DIMS {
                let c = config(head_dim, false, false, target, KeyLength::Medium)
                    .expect("a configuration");
                for kernel in AttentionKernel::ALL {
                    assert_eq!(
                        c.kernel(kernel).block_n.is_some(),
                        kernel.reads_keys(),
                        "{kernel:?} at {head_dim}"
                    );
                }
            }
        }
        assert_eq!(
            config(96, false, false, Target::Sm80, KeyLength::Medium),
            None
        );
    }

    /// dP early where each warpgroup's score tile is at most 64 x 64: the fused D128 dK/dV's two
    /// warpgroups of 64 x 64, not the fused D64's 64 x 128 nor the split causal D64's one
    /// warpgroup of 128 x 64; on `mma.sync` the program's tile.
    #[test]
    fn dp_goes_early_where_each_warpgroups_scores_are_64_by_64() {
        use crate::attention::dkdv_early_dp;
        let dkdv = |d, causal, fused, target| {
            config(d, causal, fused, target, KeyLength::Medium)
                .unwrap()
                .dkdv
        };
        assert!(dkdv_early_dp(dkdv(128, false, true, Target::Sm90a)));
        assert!(!dkdv_early_dp(dkdv(64, false, true, Target::Sm90a)));
        assert!(!dkdv_early_dp(dkdv(64, true, false, Target::Sm90a)));
        assert!(dkdv_early_dp(dkdv(128, false, false, Target::Sm90a)));
        assert!(dkdv_early_dp(KernelConfig::new(64, 64, 8, 2)));
        assert!(!dkdv_early_dp(KernelConfig::new(64, 128, 8, 2)));
    }

    /// dQ by turns where asked, in the fused dK/dV of two warpgroups of 64 query rows only.
    #[test]
    fn dq_goes_by_turns_where_asked_and_one_warpgroup_holds_a_query_tile() {
        use crate::attention::dkdv_dq_by_turns;
        let fused = config(128, false, true, Target::Sm90a, KeyLength::Medium)
            .unwrap()
            .dkdv;
        assert!(!dkdv_dq_by_turns(true, fused), "not in the table");
        assert!(dkdv_dq_by_turns(true, fused.with_dq_by_turns()));
        assert!(!dkdv_dq_by_turns(false, fused.with_dq_by_turns()));
        let one_warpgroup = KernelConfig::new(64, 64, 4, 2).on_wgmma();
        assert!(!dkdv_dq_by_turns(true, one_warpgroup.with_dq_by_turns()));
        let query_major = KernelConfig::new(128, 128, 8, 2).on_wgmma();
        assert!(!dkdv_dq_by_turns(true, query_major.with_dq_by_turns()));
    }
}
