//! The GPU test's kernels, cases and runs, shared by two test binaries: kiln-codegen's tests
//! compile each case, keep its PTX under `ptx/` up to date and run every run in the emulator
//! against the interpreter (they link LLVM); kiln-runtime's GPU test loads that PTX, runs the
//! same runs on the GPU and compares with the interpreter (it needs no LLVM).

/// The sliding-window/softcap variant is a user-style example; it is included, not copied, so
/// that the GPU runs the example's own kernel, launch and test shapes.
#[allow(
    dead_code,
    reason = "the example's main, CPU launcher and f64 reference: the cases use its kernel, launch and shapes"
)]
#[path = "../../../kernels/examples/sliding_window.rs"]
mod sliding_window;

use kiln_dsl::prelude::*;
use kiln_dsl::{HostBuffer, Kernel, KernelArg, SpecValue, kernel};
use kiln_kernels::attention::check::{LayoutKind, Tolerance as AttentionTolerance};
use kiln_kernels::attention::{
    AttentionKernel, AttentionParams, CodegenKnobs, DECODE_ROWS, KernelConfig, Tensor, cpu,
    dkdv_dq_by_turns, plan, prebuilt,
};
use kiln_kernels::general::{gemm, layernorm, reduce, softmax, transpose};

/// `out = x + y`, masked past `n`: the first kernel to run end to end.
#[kernel]
pub fn vector_add<T, const BLOCK: usize>(x: Ptr<T>, y: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(
        out + offs,
        load(x + offs, mask) + load(y + offs, mask),
        mask,
    );
}

/// Casts, scalar arguments, a loop carrying a tile, a scalar `if`, compares, selects, integer
/// remainders, a bool store: every exactly-rounded op the first lowering handles, masked past `n`.
#[kernel]
pub fn scale_loop<T, const BLOCK: usize>(
    x: Ptr<T>,
    out: Ptr<T>,
    flags: Ptr<i32>,
    n: i32,
    scale: f32,
    rounds: i32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 1.0).to::<f32>();
    let mut acc = v;
    for i in 0..rounds {
        acc = maximum(acc * scale + v, v - i.to::<f32>());
    }
    let mut bias = 0.0;
    if rounds > 2 {
        bias = 0.25;
    }
    store(out + offs, where_(acc > 1.0, acc, acc + bias), mask);
    store(flags + offs, (v < 0.0).to::<i32>() * 10 + offs % 3, mask);
}

/// `c = a @ b` and `d = a @ trans(bt)` for one `M x K` tile of `a`, with `b` stored `[K, N]` and
/// `bt` stored `[N, K]`: both `ldmatrix` forms of the B operand, the zero accumulator of a `dot`
/// without one, and index tiles used in two layouts (a blocked load, an mma-layout store).
#[kernel]
pub fn tile_dot<T, const M: usize, const N: usize, const K: usize>(
    a: Ptr<T>,
    b: Ptr<T>,
    bt: Ptr<T>,
    c: Ptr<f32>,
    d: Ptr<f32>,
) {
    let rows = arange(0, M);
    let cols = arange(0, N);
    let depth = arange(0, K);
    let a_tile = load(a + rows.expand_dims(1) * K + depth.expand_dims(0));
    let b_tile = load(b + depth.expand_dims(1) * N + cols.expand_dims(0));
    let bt_tile = load(bt + cols.expand_dims(1) * K + depth.expand_dims(0));
    let out = rows.expand_dims(1) * N + cols.expand_dims(0);
    store(c + out, dot(a_tile, b_tile));
    store(d + out, dot(a_tile, trans(bt_tile)));
}

/// Split-K `c += a @ b`: program `s` adds the product of its `K`-deep slice of `a [M, k]` and
/// `b [k, N]` into `c` (through a block pointer: vector atomics where `c` is known aligned), and
/// its slice's row sums of `a` into `sums` (through pointers), but for the last row: many
/// programs' atomic adds into the same elements, from an mma tile and from a reduction's result
/// that several threads hold (each element must be added once).
#[kernel]
pub fn split_k_dot<T, const M: usize, const N: usize, const K: usize>(
    a: Ptr<T>,
    b: Ptr<T>,
    c: Ptr<f32>,
    sums: Ptr<f32>,
    k: i32,
) {
    let rows = arange(0, M);
    let cols = arange(0, N);
    let depth = program_id(0) * K + arange(0, K);
    let in_k = depth < k;
    let a_tile = load(
        a + rows.expand_dims(1) * k + depth.expand_dims(0),
        in_k.expand_dims(0),
    );
    let b_tile = load(
        b + depth.expand_dims(1) * N + cols.expand_dims(0),
        in_k.expand_dims(1),
    );
    let c_block = make_block_ptr(c, [M, N], [N, 1], [0, 0], [M, N], [1, 0]);
    atomic_add(c_block, dot(a_tile, b_tile), [0]);
    atomic_add(sums + rows, sum(a_tile.to::<f32>(), 1), rows < M - 1);
}

/// A sum split over programs, finished by the last to arrive: each program adds up its block of
/// `x` into its part, arrives at `counter`, and the program that arrives last (it reads every
/// other's part, which their arrivals made visible) adds up the parts into `out` and zeroes the
/// counter for the next launch.
#[kernel]
pub fn split_sum<T, const BLOCK: usize>(
    x: Ptr<T>,
    parts: Ptr<f32>,
    counter: Ptr<i32>,
    out: Ptr<f32>,
    n: i32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    store(
        parts + program_id(0),
        load(x + offs, offs < n, 0.0).to::<f32>().sum(0),
    );
    let programs = num_programs(0);
    if atomic_arrive(counter) == programs - 1 {
        let mut total = zeros([BLOCK], f32);
        for first in (0..programs).step_by(BLOCK) {
            let part = first + arange(0, BLOCK);
            total = total + load(parts + part, part < programs, 0.0);
        }
        store(out, total.sum(0));
        store(counter, 0);
    }
}

/// How close a run's outputs must be to the interpreter's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tolerance {
    /// Bit for bit (NaN matches NaN): only correctly rounded ops, in the interpreter's order.
    Exact,
    /// `|got - want| <= rtol * max |want|` over the buffer: sums reassociated by shuffles and
    /// `ex2.approx` (2 ulp) below the output dtype's rounding.
    Relative(f64),
}

/// One compiled kernel the GPU test runs: the PTX file `ptx/{name}.ptx` holds it.
#[derive(Debug)]
pub struct Case {
    pub name: String,
    pub kernel: Kernel,
    /// kiln-codegen's warps, stages and Hopper knobs, as the table gives them to an attention
    /// kernel: `num_stages` shared buffers per pipelined load (1: no pipelining), `wgmma`'s
    /// `dot`s on Hopper's warpgroup tensor cores (sm_90a), a `producer` warpgroup of 4 more
    /// warps issuing the copies, and the rest kiln-codegen's tests compile with.
    pub knobs: CodegenKnobs,
    /// kiln-codegen's `divisibility`: `(argument, n)`, the argument is a multiple of `n` (a
    /// pointer's address in bytes, an integer's value) in every run, as the launcher checks.
    pub divisibility: Vec<(&'static str, u64)>,
    pub target: Target,
    pub tolerance: Tolerance,
}

/// What the aligned GEMM cases' runs guarantee: 16-byte aligned matrices, `n`, `k` and the row
/// strides multiples of 8 elements (16 bytes of f16/bf16), so that its K loop is pipelined.
pub const GEMM_DIVISIBILITY: [(&str, u64); 9] = [
    ("a", 16),
    ("b", 16),
    ("bias", 16),
    ("c", 16),
    ("n", 8),
    ("k", 8),
    ("a_row_stride", 8),
    ("b_row_stride", 8),
    ("c_row_stride", 8),
];

/// Tolerance of a kernel that reduces in f32 and may use `ex2.approx`, storing `dtype`: a few
/// units of its last place, and of f32's reassociated sums.
fn reduced(dtype: DType) -> Tolerance {
    Tolerance::Relative(match dtype {
        DType::F16 => 2e-3,
        DType::BF16 => 1.6e-2,
        _ => 1e-4,
    })
}

fn spec(dtype: DType, block_m: usize, block_n: usize) -> Spec {
    Spec::new()
        .dtype("T", dtype)
        .int("BLOCK_M", block_m as i64)
        .int("BLOCK_N", block_n as i64)
}

/// The parameters of an attention case's runs at `seqlen_q x seqlen_k`: batch 1, 2 heads, the
/// default scale.
pub fn attention_params(
    dtype: DType,
    head_dim: usize,
    causal: bool,
    seqlen_q: usize,
    seqlen_k: usize,
) -> AttentionParams {
    AttentionParams {
        dtype,
        batch: 1,
        seqlen_q,
        seqlen_k,
        heads_q: 2,
        heads_kv: 2,
        head_dim,
        causal,
        softmax_scale: AttentionParams::default_scale(head_dim),
        fused_backward: false,
    }
}

/// Attention kernel `which`, built as `kernel`, compiled for `target` as `config` says, with
/// the divisibility its launchers check.
pub fn attention_config_case(
    name: String,
    which: AttentionKernel,
    kernel: Kernel,
    target: Target,
    config: KernelConfig,
) -> Case {
    let dtype = kernel
        .spec
        .dtype_param("T")
        .expect("attention kernels have a T");
    Case {
        name,
        divisibility: prebuilt::divisibility(which),
        tolerance: attention_tolerance(kernel.name(), dtype),
        kernel,
        knobs: config.knobs(),
        target,
    }
}

/// The interpreter tests' bar for an attention kernel's outputs (`attention::check`): O's for
/// the forward, the gradients' for dQ and dK/dV; the preprocessing kernel sums in f32.
pub fn attention_tolerance(name: &str, dtype: DType) -> Tolerance {
    let bars = AttentionTolerance::for_dtype(dtype);
    Tolerance::Relative(match name {
        "attention_fwd" | "attention_fwd_combine" => bars.o,
        "attention_bwd_preprocess" => 1e-4,
        _ => bars.grad,
    })
}

/// Every case, in a fixed order: the 1-D kernels at a large block (several registers per thread)
/// and a block smaller than its 128 threads (threads hold copies; only the owner stores), and the
/// general 2-D kernels at the block sizes their launchers pick for the runs' shapes.
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for target in Target::ALL {
        let mut case = |name: String, kernel: Kernel, tolerance: Tolerance| {
            cases.push(Case {
                name: format!("{name}_w4_{target}"),
                kernel,
                knobs: CodegenKnobs::new(4, 1),
                divisibility: Vec::new(),
                target,
                tolerance,
            })
        };
        for (dtype, block) in [(F32, 1024), (F16, 1024), (F32, 64), (F16, 64)] {
            let spec = Spec::new().dtype("T", dtype).int("BLOCK", block);
            let kernel = vector_add::build(&spec).expect("vector_add builds");
            case(
                format!("vector_add_{dtype}_b{block}"),
                kernel,
                Tolerance::Exact,
            );
        }
        for dtype in [F32, BF16] {
            let spec = Spec::new().dtype("T", dtype).int("BLOCK", 256);
            let kernel = scale_loop::build(&spec).expect("scale_loop builds");
            case(format!("scale_loop_{dtype}_b256"), kernel, Tolerance::Exact);
        }
        for (dtype, cols) in [(F32, 100), (F16, 1000)] {
            let (m, n) = softmax::block_sizes(cols);
            let kernel = softmax::softmax_rows::build(&spec(dtype, m, n)).expect("softmax builds");
            case(format!("softmax_{dtype}_m{m}_n{n}"), kernel, reduced(dtype));
        }
        for (dtype, cols) in [(F32, 300), (BF16, 40)] {
            let (m, n) = layernorm::block_sizes(cols);
            let kernel = layernorm::layernorm::build(&spec(dtype, m, n)).expect("layernorm builds");
            case(
                format!("layernorm_{dtype}_m{m}_n{n}"),
                kernel,
                reduced(dtype),
            );
        }
        for dtype in [F32, F16] {
            let (m, n) = (reduce::BLOCK_M, reduce::BLOCK_N);
            let kernel =
                reduce::column_sums::build(&spec(dtype, m, n)).expect("column_sums builds");
            case(
                format!("column_sums_{dtype}_m{m}_n{n}"),
                kernel,
                reduced(F32),
            );
        }
        for dtype in [F32, F16] {
            let (m, n) = (transpose::BLOCK_M, transpose::BLOCK_N);
            let kernel = transpose::transpose::build(&spec(dtype, m, n)).expect("transpose builds");
            case(
                format!("transpose_{dtype}_m{m}_n{n}"),
                kernel,
                Tolerance::Exact,
            );
        }
        for (dtype, m, n, k) in [(F16, 64, 32, 32), (BF16, 16, 64, 64)] {
            let spec = Spec::new()
                .dtype("T", dtype)
                .int("M", m)
                .int("N", n)
                .int("K", k);
            let kernel = tile_dot::build(&spec).expect("tile_dot builds");
            case(
                format!("tile_dot_{dtype}_m{m}_n{n}_k{k}"),
                kernel,
                reduced(F32),
            );
        }
        for (dtype, m, n, k) in [(F16, 64, 32, 32), (BF16, 16, 64, 16)] {
            let spec = Spec::new()
                .dtype("T", dtype)
                .int("M", m)
                .int("N", n)
                .int("K", k);
            let kernel = split_k_dot::build(&spec).expect("split_k_dot builds");
            case(
                format!("split_k_dot_{dtype}_m{m}_n{n}_k{k}"),
                kernel,
                reduced(F32),
            );
        }
        for dtype in [F32, F16] {
            let spec = Spec::new().dtype("T", dtype).int("BLOCK", 64);
            let kernel = split_sum::build(&spec).expect("split_sum builds");
            case(format!("split_sum_{dtype}_b64"), kernel, reduced(F32));
        }
        for (dtype, bias) in [(F16, F32), (BF16, BF16)] {
            let blocks = gemm::GemmBlocks::default();
            let spec = Spec::new()
                .dtype("T", dtype)
                .dtype("B", bias)
                .int("BLOCK_M", blocks.m as i64)
                .int("BLOCK_N", blocks.n as i64)
                .int("BLOCK_K", blocks.k as i64);
            let kernel = gemm::gemm_bias_gelu::build(&spec).expect("gemm builds");
            case(
                format!(
                    "gemm_{dtype}_bias_{bias}_m{}_n{}_k{}",
                    blocks.m, blocks.n, blocks.k
                ),
                kernel,
                reduced(dtype),
            );
        }
    }
    // The GEMM again, its K loop pipelined in 3 stages: the runs keep rows 16-byte aligned.
    for target in Target::ALL {
        for dtype in [F16, BF16] {
            let blocks = gemm::GemmBlocks::default();
            let spec = Spec::new()
                .dtype("T", dtype)
                .dtype("B", dtype)
                .int("BLOCK_M", blocks.m as i64)
                .int("BLOCK_N", blocks.n as i64)
                .int("BLOCK_K", blocks.k as i64);
            let kernel = gemm::gemm_bias_gelu::build(&spec).expect("gemm builds");
            cases.push(Case {
                name: format!(
                    "gemm_{dtype}_aligned_m{}_n{}_k{}_s3_w4_{target}",
                    blocks.m, blocks.n, blocks.k
                ),
                kernel,
                knobs: CodegenKnobs::new(4, 3),
                divisibility: GEMM_DIVISIBILITY.to_vec(),
                target,
                tolerance: reduced(dtype),
            });
        }
    }
    // The GEMM on wgmma: a 64-byte swizzled A (K = 32) with an N-major B, and 128-byte ones
    // (K = 64) with B in two slabs, over one and two warpgroups.
    for (dtype, [m, n, k], num_warps, num_stages) in [
        (F16, [64, 64, 32], 4, 3),
        (BF16, [64, 64, 32], 4, 3),
        (BF16, [128, 128, 64], 4, 2),
        (F16, [128, 128, 64], 8, 3),
    ] {
        let spec = Spec::new()
            .dtype("T", dtype)
            .dtype("B", dtype)
            .int("BLOCK_M", m)
            .int("BLOCK_N", n)
            .int("BLOCK_K", k);
        let kernel = gemm::gemm_bias_gelu::build(&spec).expect("gemm builds");
        cases.push(Case {
            name: format!("gemm_{dtype}_wgmma_m{m}_n{n}_k{k}_s{num_stages}_w{num_warps}_sm_90a"),
            kernel,
            knobs: CodegenKnobs {
                wgmma: true,
                ..CodegenKnobs::new(num_warps, num_stages)
            },
            divisibility: GEMM_DIVISIBILITY.to_vec(),
            target: Target::Sm90a,
            tolerance: reduced(dtype),
        });
    }
    // Split-K atomic adds from the wgmma accumulator layout.
    let spec = Spec::new()
        .dtype("T", BF16)
        .int("M", 64)
        .int("N", 64)
        .int("K", 32);
    cases.push(Case {
        name: "split_k_dot_bf16_wgmma_m64_n64_k32_w4_sm_90a".to_string(),
        kernel: split_k_dot::build(&spec).expect("split_k_dot builds"),
        knobs: CodegenKnobs {
            wgmma: true,
            ..CodegenKnobs::new(4, 1)
        },
        // `c` 16-byte aligned: its adds are `red.global.add.v2.f32`.
        divisibility: vec![("c", 16)],
        target: Target::Sm90a,
        tolerance: reduced(F32),
    });
    // Every attention specialisation kiln ships, by its shipped name (its PTX is kiln-kernels').
    for s in prebuilt::shipped() {
        let kernel = s.kernel.build(&s.spec).expect("a shipped kernel builds");
        cases.push(attention_config_case(
            s.name, s.kernel, kernel, s.target, s.config,
        ));
    }
    // The fused D128 dK/dV with dQ by turns (not in the table): a `dot` of one warpgroup, the
    // warpgroups meeting on a pair of barriers, one arriving and one waiting.
    for s in prebuilt::shipped() {
        let config = s.config.with_dq_by_turns();
        let fused = s.spec.get("ACCUMULATE_DQ") == Some(SpecValue::Bool(true));
        if s.kernel != AttentionKernel::DkDv || !dkdv_dq_by_turns(fused, config) {
            continue;
        }
        let spec = s.spec.clone().flag("DQ_BY_TURNS", true);
        let kernel = s.kernel.build(&spec).expect("dQ by turns builds");
        let name = format!("{}_turns", s.name);
        cases.push(attention_config_case(
            name, s.kernel, kernel, s.target, config,
        ));
    }
    // The bf16 dQ kernels on `wgmma` with Q and dO in registers (kiln-codegen's `resident_a`,
    // not in the table), at the head dims with the registers for it (D128's spills, D256's
    // `wgmma`s are serialised): `ldmatrix` before the key loop, from Q's TMA tile and dO's
    // staged one. Without the use after the loop that keeps them live, the driver's JIT
    // (580.159.04, as ptxas 13.0.88 does) gave dO's registers to dS inside the loop: wrong from
    // the second key block (docs/PERF.md, run 295), where the emulator agreed.
    cases.extend(shipped_with(
        |s| s.kernel == AttentionKernel::Dq && s.config.wgmma && bf16_at(s, &[32, 64]),
        KernelConfig::with_resident_a,
        "resident_a",
    ));
    // The bf16 forwards at head dims 64 and 128 with their row sums kept as lanes' partial
    // sums (kiln-codegen's `partial_sums`) where the table keeps them whole (sm_80, causal, the
    // long D64): the key loops shuffle no row sum, `store_rows` totals it.
    cases.extend(shipped_with(
        |s| {
            s.kernel == AttentionKernel::Forward && !s.config.partial_sums && bf16_at(s, &[64, 128])
        },
        KernelConfig::with_partial_sums,
        "partial_sums",
    ));
    // The bf16 sm_80 kernels at head dims 64 and 128 that stream keys, with `%tid.x` read again
    // in their loop bodies (kiln-codegen's `loop_tid`) where the table reads it once (the D128
    // causal forward, the D128 dQ without a mask, the D64 dK/dV).
    cases.extend(shipped_with(
        |s| {
            s.target == Target::Sm80
                && s.kernel.reads_keys()
                && !s.config.loop_tid
                && bf16_at(s, &[64, 128])
        },
        KernelConfig::with_loop_tid,
        "loop_tid",
    ));
    for target in Target::ALL {
        for dtype in [F16, BF16] {
            for (head_dim, block_m, block_n, softcap) in sliding_window_specs() {
                let spec = Spec::new()
                    .dtype("T", dtype)
                    .int("HEAD_DIM", head_dim as i64)
                    .int("BLOCK_M", block_m as i64)
                    .int("BLOCK_N", block_n as i64)
                    .flag("SOFTCAP", softcap);
                let kernel = sliding_window::sliding_window_fwd::build(&spec)
                    .expect("sliding_window builds");
                let cap = if softcap { "_softcap" } else { "" };
                // A warp per 16 rows (at most 4): the mma tile of a 16-row block is one warp's.
                let num_warps = (block_m / 16).min(4) as u32;
                cases.push(Case {
                    name: format!(
                        "sliding_window_{dtype}_d{head_dim}_m{block_m}_n{block_n}{cap}_w{num_warps}_{target}"
                    ),
                    kernel,
                    knobs: CodegenKnobs::new(num_warps, 1),
                    divisibility: Vec::new(),
                    target,
                    tolerance: sliding_window_tolerance(dtype, softcap),
                });
            }
        }
    }
    cases
}

/// The shipped specialisations `pick` chooses, each compiled with `with` applied to its
/// configuration and named with `suffix` after its own name.
fn shipped_with(
    pick: impl Fn(&prebuilt::Specialisation) -> bool,
    with: fn(KernelConfig) -> KernelConfig,
    suffix: &str,
) -> Vec<Case> {
    prebuilt::shipped()
        .into_iter()
        .filter(|s| pick(s))
        .map(|s| {
            let kernel = s.kernel.build(&s.spec).expect("a shipped kernel builds");
            let name = format!("{}_{suffix}", s.name);
            attention_config_case(name, s.kernel, kernel, s.target, with(s.config))
        })
        .collect()
}

/// Whether `s` is a bf16 specialisation at one of `head_dims`.
fn bf16_at(s: &prebuilt::Specialisation, head_dims: &[i64]) -> bool {
    s.spec.get("T") == Some(SpecValue::DType(BF16))
        && matches!(s.spec.get("HEAD_DIM"), Some(SpecValue::Int(d)) if head_dims.contains(&d))
}

/// The sliding-window example's specialisations its test shapes need: (head dim, BLOCK_M,
/// BLOCK_N, soft-capped), in the shapes' order.
fn sliding_window_specs() -> Vec<(usize, usize, usize, bool)> {
    let mut specs = Vec::new();
    for w in sliding_window::test_cases() {
        let spec = (w.head_dim, w.block_m, w.block_n, w.softcap.is_some());
        if !specs.contains(&spec) {
            specs.push(spec);
        }
    }
    specs
}

/// The sliding-window kernel's bar: the attention forward's (`reduced`), and with the cap
/// `tanh.approx`'s error (2^-11 relative, so at most 2^-11 |s| in a score, |s| <= 5 or so in the
/// tests' shapes: about 2.5e-3 relative in each weight, as much in O and LSE) added.
fn sliding_window_tolerance(dtype: DType, softcap: bool) -> Tolerance {
    let Tolerance::Relative(rtol) = reduced(dtype) else {
        unreachable!("a reduced tolerance is relative")
    };
    Tolerance::Relative(if softcap { rtol + 2.5e-3 } else { rtol })
}

/// One argument of a run, shared by the interpreter's, the emulator's and the GPU's launch.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// An index into the run's buffers.
    Buffer(usize),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// A launch of a case: its buffers (inputs filled, outputs poisoned), arguments and grid.
#[derive(Debug)]
pub struct Run {
    pub label: String,
    pub buffers: Vec<HostBuffer>,
    pub args: Vec<Arg>,
    pub grid: [u32; 3],
}

impl Run {
    /// The arguments for the interpreter or the emulator, on `buffers` (this run's or a copy).
    pub fn host_args<'a>(&self, buffers: &'a [HostBuffer]) -> Vec<KernelArg<'a>> {
        self.args
            .iter()
            .map(|arg| match *arg {
                Arg::Buffer(i) => KernelArg::Buffer(&buffers[i]),
                Arg::I32(v) => KernelArg::I32(v),
                Arg::I64(v) => KernelArg::I64(v),
                Arg::F32(v) => KernelArg::F32(v),
            })
            .collect()
    }
}

/// Deterministic inputs in [-4, 4), rounded to `dtype` by the host buffer.
pub fn inputs(dtype: DType, len: usize, seed: u64) -> HostBuffer {
    scaled_inputs(dtype, len, seed, 1.0)
}

/// Deterministic inputs in [-4 scale, 4 scale), rounded to `dtype` by the host buffer.
pub fn scaled_inputs(dtype: DType, len: usize, seed: u64, scale: f32) -> HostBuffer {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let values: Vec<f32> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state % 8192) as f32 / 1024.0 - 4.0) * scale
        })
        .collect();
    HostBuffer::from_f32(dtype, &values)
}

fn int_spec(case: &Case, name: &str) -> usize {
    match case.kernel.spec.get(name) {
        Some(SpecValue::Int(value)) => value as usize,
        other => panic!("case {} has no {name}, got {other:?}", case.name),
    }
}

fn dtype_of(case: &Case) -> DType {
    case.kernel
        .spec
        .dtype_param("T")
        .unwrap_or_else(|| panic!("case {} has no T", case.name))
}

/// The runs of a case: sizes with ragged tails (and, for `scale_loop`, loop counts); a matrix is
/// `rows x cols` with a row stride padded past `cols`, so that a stride bug reads the padding.
/// A pipelined case's labels end with its stages (` s3`), one on `wgmma` with ` wgmma`.
pub fn runs(case: &Case) -> Vec<Run> {
    let mut runs = unlabelled_runs(case);
    for run in &mut runs {
        if case.knobs.num_stages > 1 {
            run.label.push_str(&format!(" s{}", case.knobs.num_stages));
        }
        if case.knobs.wgmma {
            run.label.push_str(" wgmma");
        }
    }
    runs
}

fn unlabelled_runs(case: &Case) -> Vec<Run> {
    let dtype = dtype_of(case);
    let programs = |n: usize, block: usize| n.div_ceil(block) as u32;
    let matrix = |rows: usize, cols: usize, seed: u64| {
        let stride = cols + 3;
        (
            inputs(dtype, (rows - 1) * stride + cols, seed),
            stride as i64,
        )
    };
    match case.kernel.name() {
        "vector_add" => {
            let block = int_spec(case, "BLOCK");
            [1usize, 1000, 4097, 1_000_003]
                .into_iter()
                .map(|n| Run {
                    label: format!("n={n}"),
                    buffers: vec![
                        inputs(dtype, n, 1),
                        inputs(dtype, n, 2),
                        HostBuffer::poisoned(dtype, n),
                    ],
                    args: vec![
                        Arg::Buffer(0),
                        Arg::Buffer(1),
                        Arg::Buffer(2),
                        Arg::I32(n as i32),
                    ],
                    grid: [programs(n, block), 1, 1],
                })
                .collect()
        }
        "scale_loop" => {
            let block = int_spec(case, "BLOCK");
            [(1usize, 0), (1000, 2), (65_537, 5)]
                .into_iter()
                .map(|(n, rounds)| Run {
                    label: format!("n={n} rounds={rounds}"),
                    buffers: vec![
                        inputs(dtype, n, 3),
                        HostBuffer::poisoned(dtype, n),
                        HostBuffer::poisoned(DType::I32, n),
                    ],
                    args: vec![
                        Arg::Buffer(0),
                        Arg::Buffer(1),
                        Arg::Buffer(2),
                        Arg::I32(n as i32),
                        Arg::F32(0.75),
                        Arg::I32(rounds),
                    ],
                    grid: [programs(n, block), 1, 1],
                })
                .collect()
        }
        "softmax_rows" | "layernorm" => {
            let (block_m, block_n) = (int_spec(case, "BLOCK_M"), int_spec(case, "BLOCK_N"));
            let softmax = case.kernel.name() == "softmax_rows";
            // Widths the block fits (softmax: one tile a row), ragged in both dimensions.
            let shapes: Vec<(usize, usize)> = if softmax {
                vec![(1, block_n / 2 + 1), (37, block_n - 5), (3, block_n)]
            } else {
                vec![(1, 1), (19, 300), (9, block_n * 2 + 7)]
            };
            shapes
                .into_iter()
                .map(|(rows, cols)| {
                    let (x, x_stride) = matrix(rows, cols, 4);
                    let (y, y_stride) = (HostBuffer::poisoned(dtype, x.len()), x_stride);
                    let mut buffers = vec![x];
                    let mut args = vec![Arg::Buffer(0)];
                    if !softmax {
                        buffers.push(inputs(dtype, cols, 5));
                        buffers.push(inputs(dtype, cols, 6));
                        args.extend([Arg::Buffer(1), Arg::Buffer(2)]);
                    }
                    args.push(Arg::Buffer(buffers.len()));
                    buffers.push(y);
                    args.extend([
                        Arg::I32(rows as i32),
                        Arg::I32(cols as i32),
                        Arg::I64(x_stride),
                        Arg::I64(y_stride),
                    ]);
                    if !softmax {
                        args.push(Arg::F32(1e-5));
                    }
                    Run {
                        label: format!("{rows}x{cols}"),
                        buffers,
                        args,
                        grid: [programs(rows, block_m), 1, 1],
                    }
                })
                .collect()
        }
        "column_sums" => {
            let block_n = int_spec(case, "BLOCK_N");
            [(1usize, 1usize), (100, 150), (333, 64)]
                .into_iter()
                .map(|(rows, cols)| {
                    let (x, stride) = matrix(rows, cols, 7);
                    Run {
                        label: format!("{rows}x{cols}"),
                        buffers: vec![x, HostBuffer::poisoned(DType::F32, cols)],
                        args: vec![
                            Arg::Buffer(0),
                            Arg::Buffer(1),
                            Arg::I32(rows as i32),
                            Arg::I32(cols as i32),
                            Arg::I64(stride),
                        ],
                        grid: [programs(cols, block_n), 1, 1],
                    }
                })
                .collect()
        }
        "transpose" => {
            let (block_m, block_n) = (int_spec(case, "BLOCK_M"), int_spec(case, "BLOCK_N"));
            [(1usize, 1usize), (70, 130), (64, 64)]
                .into_iter()
                .map(|(rows, cols)| {
                    let (x, x_stride) = matrix(rows, cols, 8);
                    let y_stride = rows + 1;
                    let y = HostBuffer::poisoned(dtype, (cols - 1) * y_stride + rows);
                    Run {
                        label: format!("{rows}x{cols}"),
                        buffers: vec![x, y],
                        args: vec![
                            Arg::Buffer(0),
                            Arg::Buffer(1),
                            Arg::I32(rows as i32),
                            Arg::I32(cols as i32),
                            Arg::I64(x_stride),
                            Arg::I64(y_stride as i64),
                        ],
                        grid: [programs(rows, block_m), programs(cols, block_n), 1],
                    }
                })
                .collect()
        }
        "tile_dot" => {
            let (m, n, k) = (
                int_spec(case, "M"),
                int_spec(case, "N"),
                int_spec(case, "K"),
            );
            vec![Run {
                label: format!("{m}x{n}x{k}"),
                buffers: vec![
                    inputs(dtype, m * k, 9),
                    inputs(dtype, k * n, 10),
                    inputs(dtype, n * k, 11),
                    HostBuffer::poisoned(DType::F32, m * n),
                    HostBuffer::poisoned(DType::F32, m * n),
                ],
                args: (0..5).map(Arg::Buffer).collect(),
                grid: [1, 1, 1],
            }]
        }
        "split_k_dot" => {
            let (m, n, k) = (
                int_spec(case, "M"),
                int_spec(case, "N"),
                int_spec(case, "K"),
            );
            // One slice, and many with a ragged last one; c and sums start non-zero, so that an
            // add that stores instead, or adds twice, shows.
            [k, 7 * k + 5]
                .into_iter()
                .map(|depth| Run {
                    label: format!("{m}x{n}x{depth}"),
                    buffers: vec![
                        inputs(dtype, m * depth, 12),
                        inputs(dtype, depth * n, 13),
                        inputs(DType::F32, m * n, 14),
                        inputs(DType::F32, m, 15),
                    ],
                    args: vec![
                        Arg::Buffer(0),
                        Arg::Buffer(1),
                        Arg::Buffer(2),
                        Arg::Buffer(3),
                        Arg::I32(depth as i32),
                    ],
                    grid: [programs(depth, k), 1, 1],
                })
                .collect()
        }
        "split_sum" => {
            let block = int_spec(case, "BLOCK");
            // One program; 16; and 79, more parts than the last program adds up in one tile. The
            // counter must be back at zero after.
            [1, 1000, 5000]
                .into_iter()
                .map(|n| Run {
                    label: format!("{n}"),
                    buffers: vec![
                        inputs(dtype, n, 16),
                        HostBuffer::poisoned(DType::F32, n.div_ceil(block)),
                        HostBuffer::zeros(DType::I32, 1),
                        HostBuffer::poisoned(DType::F32, 1),
                    ],
                    args: vec![
                        Arg::Buffer(0),
                        Arg::Buffer(1),
                        Arg::Buffer(2),
                        Arg::Buffer(3),
                        Arg::I32(n as i32),
                    ],
                    grid: [programs(n, block), 1, 1],
                })
                .collect()
        }
        "gemm_bias_gelu" => {
            let (block_m, block_n) = (int_spec(case, "BLOCK_M"), int_spec(case, "BLOCK_N"));
            let bias = case
                .kernel
                .spec
                .dtype_param("B")
                .expect("gemm has a bias dtype");
            let aligned = !case.divisibility.is_empty();
            // Ragged in every dimension, a K shorter than one step, and exact tiles; aligned:
            // n and k multiples of 8 whose K loops run 0, 1, 2 and 7 times, ragged or not.
            let shapes = if aligned {
                vec![
                    (70usize, 40usize, 0usize),
                    (1, 72, 24),
                    (70, 40, 40),
                    (65, 64, 200),
                ]
            } else {
                vec![(70, 45, 100), (1, 17, 5), (128, 64, 64)]
            };
            let pad = |extra: usize| if aligned { 8 * extra } else { extra };
            shapes
                .into_iter()
                .map(|(m, n, k)| {
                    // Inputs scaled so that sums of k products stay in GELU's interesting range.
                    let scale = 1.0 / (k.max(1) as f32).sqrt();
                    let (a_stride, b_stride, c_stride) = (k + pad(3), n + pad(5), n + pad(1));
                    Run {
                        label: format!("{m}x{n}x{k}"),
                        buffers: vec![
                            scaled_inputs(dtype, (m - 1) * a_stride + k, 12, scale),
                            scaled_inputs(dtype, (k.max(1) - 1) * b_stride + n, 13, 0.5),
                            inputs(bias, n, 14),
                            HostBuffer::poisoned(dtype, (m - 1) * c_stride + n),
                        ],
                        args: vec![
                            Arg::Buffer(0),
                            Arg::Buffer(1),
                            Arg::Buffer(2),
                            Arg::Buffer(3),
                            Arg::I32(m as i32),
                            Arg::I32(n as i32),
                            Arg::I32(k as i32),
                            Arg::I64(a_stride as i64),
                            Arg::I64(b_stride as i64),
                            Arg::I64(c_stride as i64),
                        ],
                        grid: [programs(m, block_m), programs(n, block_n), 1],
                    }
                })
                .collect()
        }
        name if name.starts_with("attention_") => attention_runs(case, dtype),
        "sliding_window_fwd" => sliding_window_runs(case, dtype),
        other => panic!("no runs for kernel {other}"),
    }
}

fn flag_spec(case: &Case, name: &str) -> bool {
    matches!(case.kernel.spec.get(name), Some(SpecValue::Bool(true)))
}

/// The attention runs: small ragged shapes (batch 1, 2 heads, seqlen 70 x 45 and 45 x 70, and
/// 40 x 555 of two query heads sharing one key/value head, whose key loops run long enough to
/// refill every pipeline buffer twice at 128-key blocks and whose dK/dV sums over the group;
/// for the fused dK/dV also 200 x 70, whose query loop runs four tiles, each reducing dQ
/// through the tile the last one used, its ring wrapping), padded
/// strides (`LayoutKind::Padded`: a stride bug reads poison), inputs in [-1, 1) (dO in
/// [-4, 4)).
/// The backward kernels get the interpreter's forward outputs (O, LSE), and dK/dV `delta =
/// rowsum(dO O)`.
fn attention_runs(case: &Case, dtype: DType) -> Vec<Run> {
    let name = case.kernel.name();
    let head_dim = int_spec(case, "HEAD_DIM");
    let causal = flag_spec(case, "CAUSAL");
    // The forward split over the keys in three splits: at 45 keys (one key block) two of them
    // empty, at 555 the last one short. Its combine in 37: three tiles of splits, the last
    // short.
    let splits = if name == "attention_fwd_combine" {
        37
    } else {
        3
    };
    let split = flag_spec(case, "SPLIT") || name == "attention_fwd_combine";
    // The fused backward's kernels: its preprocessing and dQ conversion, and its dK/dV.
    let fused_backward = matches!(
        name,
        "attention_bwd_preprocess" | "attention_bwd_dq_convert"
    ) || flag_spec(case, "ACCUMULATE_DQ");
    let query_loop = (fused_backward && name == "attention_bwd_dkdv").then_some((200, 70, 1));
    // The forward of a decode step's few rows, split or not (the decode blocks): one row
    // against one key block, one row of two heads sharing a kv head (grouped: two rows of one
    // head) against 555 keys, and 13 rows (under a block, causal a bottom-right mask inside
    // it) against 300.
    let decode = name == "attention_fwd" && int_spec(case, "BLOCK_M") <= DECODE_ROWS;
    let shapes: &[(usize, usize, usize)] = match decode {
        true => &[(1, 45, 2), (1, 555, 1), (13, 300, 2)],
        false => &[(70, 45, 2), (45, 70, 2), (40, 555, 1)],
    };
    shapes
        .iter()
        .copied()
        .chain(query_loop)
        .map(|(seqlen_q, seqlen_k, heads_kv)| {
            let p = AttentionParams {
                fused_backward,
                heads_kv,
                ..attention_params(dtype, head_dim, causal, seqlen_q, seqlen_k)
            };
            let ql = LayoutKind::Padded.layout(seqlen_q, p.heads_q, head_dim);
            let kl = LayoutKind::Padded.layout(seqlen_k, p.heads_kv, head_dim);
            let q_len = ql
                .required_len("q", 1, seqlen_q, p.heads_q, head_dim)
                .unwrap();
            let k_len = kl
                .required_len("k", 1, seqlen_k, p.heads_kv, head_dim)
                .unwrap();
            let q = scaled_inputs(dtype, q_len, 21, 0.25);
            let k = scaled_inputs(dtype, k_len, 22, 0.25);
            let v = scaled_inputs(dtype, k_len, 23, 0.25);
            let d_o = inputs(dtype, q_len, 24);
            let rows = p.lse_len();
            let forward_layouts = plan::ForwardLayouts {
                q: ql,
                k: kl,
                v: kl,
                o: ql,
            };
            let backward_layouts = plan::BackwardLayouts {
                q: ql,
                k: kl,
                v: kl,
                o: ql,
                d_o: ql,
                dq: ql,
                dk: kl,
                dv: kl,
            };
            let launch = if split {
                let [forward, combine] =
                    plan::forward_split(&p, &forward_layouts, case.target, splits)
                        .expect("a valid call");
                if name == "attention_fwd" {
                    forward
                } else {
                    combine
                }
            } else if name == "attention_fwd" {
                plan::forward(&p, &forward_layouts, case.target).expect("a valid call")
            } else {
                plan::backward(&p, &backward_layouts, case.target)
                    .expect("a valid call")
                    .into_iter()
                    .find(|launch| launch.kernel.name() == name)
                    .expect("every backward kernel is planned")
            };
            // The backward kernels read the interpreter's forward outputs, dK/dV also the row
            // statistics dQ or the preprocessing write (LSE in base 2, delta).
            let stats = p.stats_len();
            let (o, lse, lse_base2, delta) = if name.starts_with("attention_fwd") {
                (
                    HostBuffer::poisoned(dtype, q_len),
                    HostBuffer::poisoned(DType::F32, rows),
                    HostBuffer::poisoned(DType::F32, stats),
                    HostBuffer::poisoned(DType::F32, stats),
                )
            } else {
                let o = HostBuffer::poisoned(dtype, q_len);
                let lse = HostBuffer::poisoned(DType::F32, rows);
                cpu::forward(
                    &p,
                    case.target,
                    Tensor::new(&q, ql),
                    Tensor::new(&k, kl),
                    Tensor::new(&v, kl),
                    Tensor::new(&o, ql),
                    &lse,
                )
                .expect("the interpreter runs the forward");
                let lse_base2 = HostBuffer::poisoned(DType::F32, stats);
                let delta = HostBuffer::poisoned(DType::F32, stats);
                // dQ and the preprocessing write the statistics (so they start poisoned there).
                if name == "attention_bwd_dkdv" {
                    for head in 0..p.heads_q {
                        for row in 0..seqlen_q {
                            let at = |d: usize| {
                                (row as i64 * ql.seq_stride + head as i64 * ql.head_stride) as usize
                                    + d
                            };
                            let sum: f32 = (0..head_dim)
                                .map(|d| o.read_float(at(d)) * d_o.read_float(at(d)))
                                .sum();
                            let stat = head * p.stats_stride() + row;
                            delta.write_float(stat, sum);
                            let lse = lse.read_float(head * seqlen_q + row);
                            let base2 = if lse == f32::NEG_INFINITY {
                                f32::INFINITY
                            } else {
                                lse * std::f32::consts::LOG2_E
                            };
                            lse_base2.write_float(stat, base2);
                        }
                    }
                }
                (o, lse, lse_base2, delta)
            };
            // The fused backward's dK/dV adds into a zeroed accumulator, which the
            // preprocessing zeroes (so it starts poisoned there) and the conversion reads (so it
            // holds values).
            // The split forward writes its parts (so they start poisoned there); the combine
            // reads them: values, and LSEs of -inf where a split saw none of a row's keys.
            let [o_parts_len, lse_parts_len] = plan::split_workspace_len(&p, splits);
            let (o_parts, lse_parts) = if name == "attention_fwd_combine" {
                let lse_parts = scaled_inputs(DType::F32, lse_parts_len, 27, 2.0);
                for i in (0..lse_parts_len).step_by(7) {
                    lse_parts.write_float(i, f32::NEG_INFINITY);
                }
                (inputs(DType::F32, o_parts_len, 26), lse_parts)
            } else {
                (
                    HostBuffer::poisoned(DType::F32, o_parts_len),
                    HostBuffer::poisoned(DType::F32, lse_parts_len),
                )
            };
            let dq_accum_len = p.dq_accum_len();
            let dq_accum = match name {
                "attention_bwd_dkdv" => HostBuffer::zeros(DType::F32, dq_accum_len),
                "attention_bwd_dq_convert" => inputs(DType::F32, dq_accum_len, 25),
                _ => HostBuffer::poisoned(DType::F32, dq_accum_len),
            };
            let mut slots = [
                (plan::Role::Q, Some(q)),
                (plan::Role::K, Some(k)),
                (plan::Role::V, Some(v)),
                (plan::Role::DO, Some(d_o)),
                (plan::Role::O, Some(o)),
                (plan::Role::Lse, Some(lse)),
                (plan::Role::LseBase2, Some(lse_base2)),
                (plan::Role::Delta, Some(delta)),
                (plan::Role::Dq, Some(HostBuffer::poisoned(dtype, q_len))),
                (plan::Role::Dk, Some(HostBuffer::poisoned(dtype, k_len))),
                (plan::Role::Dv, Some(HostBuffer::poisoned(dtype, k_len))),
                (plan::Role::DqAccum, Some(dq_accum)),
                (plan::Role::OParts, Some(o_parts)),
                (plan::Role::LseParts, Some(lse_parts)),
            ];
            // The run's buffers are the roles the launch names, in the order it first names them.
            let mut buffers = Vec::new();
            let mut named = Vec::new();
            let args = launch
                .args
                .iter()
                .map(|arg| match *arg {
                    plan::Arg::Buffer(role) => {
                        if let Some(i) = named.iter().position(|&r| r == role) {
                            return Arg::Buffer(i);
                        }
                        let slot = slots.iter_mut().find(|(r, _)| *r == role).expect("a role");
                        buffers.push(slot.1.take().expect("a role's buffer"));
                        named.push(role);
                        Arg::Buffer(buffers.len() - 1)
                    }
                    plan::Arg::I32(v) => Arg::I32(v),
                    plan::Arg::I64(v) => Arg::I64(v),
                    plan::Arg::F32(v) => Arg::F32(v),
                })
                .collect();
            // A persistent forward's tiles all go to one program, which loops over them (every
            // shape has two heads: the refilled tiles' barriers go through two phases).
            let grid = if flag_spec(case, "PERSISTENT") {
                [1, 1, 1]
            } else {
                launch.grid
            };
            Run {
                label: format!("{seqlen_q}x{seqlen_k}"),
                buffers,
                args,
                grid,
            }
        })
        .collect()
}

/// The sliding-window example's test shapes of this case's specialisation, in its dtype, on
/// inputs as the example draws them (q and k at 1.5: soft caps of a few units bend the scores),
/// launched as the example launches them.
fn sliding_window_runs(case: &Case, dtype: DType) -> Vec<Run> {
    let spec = (
        int_spec(case, "HEAD_DIM"),
        int_spec(case, "BLOCK_M"),
        int_spec(case, "BLOCK_N"),
        flag_spec(case, "SOFTCAP"),
    );
    let mut rng = kiln_kernels::reference::Rng::new(31);
    sliding_window::test_cases()
        .into_iter()
        .filter(|w| (w.head_dim, w.block_m, w.block_n, w.softcap.is_some()) == spec)
        .map(|w| {
            let w = sliding_window::Window { dtype, ..w };
            let mut input = |seqlen: usize, scale: f64| {
                HostBuffer::from_f64(dtype, &rng.normals(w.len(seqlen), scale))
            };
            let buffers = vec![
                input(w.seqlen_q, 1.5),
                input(w.seqlen_k, 1.5),
                input(w.seqlen_k, 1.0),
                HostBuffer::poisoned(dtype, w.len(w.seqlen_q)),
                HostBuffer::poisoned(DType::F32, w.batch * w.heads * w.seqlen_q),
            ];
            let [q, k, v, o, lse] = [0, 1, 2, 3, 4].map(|i| &buffers[i]);
            let (_, grid, host_args) = w.launch([q, k, v, o, lse]).expect("a valid shape");
            // The launch names the buffers; the run names them by index.
            let args = host_args
                .iter()
                .map(|arg| match *arg {
                    KernelArg::Buffer(b) => Arg::Buffer(
                        buffers
                            .iter()
                            .position(|x| std::ptr::eq(x, b))
                            .expect("a buffer of the run"),
                    ),
                    KernelArg::I32(v) => Arg::I32(v),
                    KernelArg::I64(v) => Arg::I64(v),
                    KernelArg::F32(v) => Arg::F32(v),
                })
                .collect();
            let cap = w.softcap.map_or(String::new(), |c| format!(" cap{c}"));
            Run {
                label: format!(
                    "{}x{} b{}h{} w{},{}{cap}",
                    w.seqlen_q, w.seqlen_k, w.batch, w.heads, w.window_left, w.window_right
                ),
                buffers,
                args,
                grid: grid.0,
            }
        })
        .collect()
}

/// What comparing one run's outputs with the interpreter's found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub elements: usize,
    pub mismatches: usize,
    pub max_diff: f64,
    pub first: Vec<String>,
}

/// Every element of every buffer, `actual` against the interpreter's `expected`, within
/// `tolerance` (NaN matches NaN; padding the kernel must not write stays as it was).
pub fn compare(expected: &[HostBuffer], actual: &[HostBuffer], tolerance: Tolerance) -> Outcome {
    let mut outcome = Outcome::default();
    for (buffer, (want, got)) in expected.iter().zip(actual).enumerate() {
        let (want, got) = (want.to_f64(), got.to_f64());
        let scale = want
            .iter()
            .filter(|w| w.is_finite())
            .fold(0.0f64, |m, w| m.max(w.abs()));
        let allowed = match tolerance {
            Tolerance::Exact => 0.0,
            Tolerance::Relative(rtol) => rtol * scale,
        };
        for (i, (&w, &g)) in want.iter().zip(&got).enumerate() {
            outcome.elements += 1;
            let diff = (w - g).abs();
            if w == g || (w.is_nan() && g.is_nan()) || diff <= allowed {
                outcome.max_diff = outcome.max_diff.max(if w == g { 0.0 } else { diff });
                continue;
            }
            outcome.mismatches += 1;
            outcome.max_diff = outcome.max_diff.max(diff);
            if outcome.first.len() < 5 {
                outcome.first.push(format!(
                    "buffer {buffer} element {i}: got {g}, interpreter {w}"
                ));
            }
        }
    }
    outcome
}
