//! kiln-codegen's tests, all in one binary because each test binary links LLVM (a long link):
//! golden layout and thread-program text, byte-identical PTX, the verifier on every op the
//! lowering knows, errors that name the op and its line, the emulator against the interpreter on
//! every GPU case, ptxas on the PTX for sm_80 and sm_90a, and the PTX that kiln-runtime's GPU
//! test carries, kept up to date.
//!
//! Regenerate golden files and the GPU test's PTX with `KILN_BLESS=1 cargo test -p kiln-codegen`.
//! ptxas is taken from `KILN_PTXAS` (CI sets it; it must then work) or `PATH`; without it the
//! ptxas test says so and passes.

#[path = "../../runtime/tests/gpu/cases.rs"]
mod cases;
mod layout_math;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_codegen::layout::{BlockedLayout, Layout};
use kiln_codegen::{
    CodegenError, CompileOptions, Compiled, Keep, Stage, Target, cache, compile, compile_keeping,
    emulate, thread_program,
};
use kiln_dsl::prelude::*;
use kiln_dsl::{Grid, HostBuffer, Kernel, KernelArg, Spec};
use kiln_kernels::attention::{
    AttentionKernel, AttentionParams, CodegenKnobs, KernelConfig, KeyLength, plan, prebuilt,
};

fn blessing() -> bool {
    std::env::var_os("KILN_BLESS").is_some()
}

/// Compares `actual` with the golden `expected` text, printing a line diff on mismatch.
#[track_caller]
fn check_text(actual: &str, expected: &str) {
    if actual.trim_end() == expected.trim_end() {
        return;
    }
    let mut diff = String::new();
    let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
    for i in 0..a.len().max(e.len()) {
        match (e.get(i), a.get(i)) {
            (Some(x), Some(y)) if x == y => {
                let _ = writeln!(diff, "  {x}");
            }
            (x, y) => {
                if let Some(x) = x {
                    let _ = writeln!(diff, "- {x}");
                }
                if let Some(y) = y {
                    let _ = writeln!(diff, "+ {y}");
                }
            }
        }
    }
    panic!("text differs from the golden text (- expected, + actual):\n{diff}");
}

/// Compares `actual` with the file at `path`, or writes it there when blessing.
#[track_caller]
fn check_file(path: &Path, actual: &str) {
    if blessing() {
        std::fs::write(path, actual).unwrap();
    }
    let expected = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with KILN_BLESS=1 to create it)",
            path.display()
        )
    });
    check_text(actual, &expected);
}

/// The options a case is compiled with, for `target`: its knobs and divisibility.
fn case_options(case: &cases::Case, target: Target) -> CompileOptions {
    knob_options(&case.knobs, target, case.divisibility.iter().copied())
}

/// kiln-codegen's options for `target` with `knobs`, assuming each `(argument, n)` of
/// `divisibility`: kiln-kernels' `CodegenKnobs::options`, which its `codegen` feature builds;
/// taking that feature here would build kiln-kernels with it for every test binary of the
/// workspace (features unify), each then a static link of LLVM.
fn knob_options<'a>(
    knobs: &CodegenKnobs,
    target: Target,
    divisibility: impl IntoIterator<Item = (&'a str, u64)>,
) -> CompileOptions {
    divisibility.into_iter().fold(
        CompileOptions::new(target, knobs.num_warps)
            .with_stages(knobs.num_stages)
            .with_wgmma(knobs.wgmma)
            .with_producer(knobs.producer)
            .with_lean_producer(knobs.lean_producer)
            .with_uniform_warpgroup(knobs.uniform_warpgroup)
            .with_descriptors_at_issue(knobs.descriptors_at_issue)
            .with_resident_a(knobs.resident_a)
            .with_partial_sums(knobs.partial_sums)
            .with_loop_tid(knobs.loop_tid),
        |options, (name, n)| options.with_divisibility(name, n),
    )
}

fn compile_case(case: &cases::Case) -> Compiled {
    compile(&case.kernel, &case_options(case, case.target))
        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

fn case(name: &str) -> cases::Case {
    cases::cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no GPU case named {name}"))
}

fn manifest_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

// ---- the layout stage ----

fn golden_layout(name: &str, case_name: &str) {
    let compiled = compile_case(&case(case_name));
    let path = manifest_path(&format!("tests/golden/{name}.layout"));
    check_file(&path, compiled.stage(Stage::Layout).unwrap());
}

#[test]
fn layout_of_an_f16_vector_add_gives_each_thread_16_bytes() {
    golden_layout("vector_add_f16_b1024", "vector_add_f16_b1024_w4_sm_80");
}

#[test]
fn layout_of_an_f32_vector_add_repeats_16_byte_chunks() {
    golden_layout("vector_add_f32_b1024", "vector_add_f32_b1024_w4_sm_80");
}

#[test]
fn layout_of_a_tile_smaller_than_the_block_wraps() {
    golden_layout("vector_add_f16_b64", "vector_add_f16_b64_w4_sm_80");
}

#[test]
fn layout_covers_loops_and_branches() {
    golden_layout("scale_loop_bf16_b256", "scale_loop_bf16_b256_w4_sm_80");
}

#[test]
fn layout_of_a_row_softmax_reduces_in_slices_without_conversions() {
    golden_layout("softmax_f32_m16_n128", "softmax_f32_m16_n128_w4_sm_80");
}

#[test]
fn layout_of_a_transpose_converts_through_shared_memory() {
    golden_layout("transpose_f16_m32_n64", "transpose_f16_m32_n64_w4_sm_80");
}

#[test]
fn layout_of_column_sums_slices_along_rows() {
    golden_layout(
        "column_sums_f32_m32_n64",
        "column_sums_f32_m32_n64_w4_sm_80",
    );
}

/// A small `dot` kernel: its accumulator and the stores of it in the mma layout, index tiles
/// in its slices, the operands staged into swizzled shared memory after their loads (B once as
/// `[K, N]`, once as `[N, K]` seen through `trans`), and `ldmatrix` conversions to dot operands.
#[test]
fn layout_of_a_dot_stages_operands_in_swizzled_shared_memory() {
    golden_layout(
        "tile_dot_f16_m64_n32_k32",
        "tile_dot_f16_m64_n32_k32_w4_sm_80",
    );
}

/// The forward attention kernel: `Q K^T` reads Q and K from shared memory (K through `trans`,
/// plain `ldmatrix`), the scores and O share one mma layout with their row statistics in its
/// slice, and `P @ V` takes P from the scores' registers with no `convert_layout` (V by
/// `ldmatrix.trans`).
#[test]
fn layout_of_attention_forward_takes_p_from_registers() {
    golden_layout(
        "attention_fwd_f16_d64_causal",
        "attention_fwd_f16_d64_causal_sm_80",
    );
    let compiled = compile_case(&case("attention_fwd_f16_d64_causal_sm_80"));
    let layout = compiled.stage(Stage::Layout).unwrap();
    let pv = layout
        .lines()
        .find(|l| l.contains("%acc.") && l.contains(" = dot "))
        .expect("the P @ V dot");
    assert!(
        pv.ends_with("is #dot_op in registers: no data movement"),
        "{pv}"
    );
    let p = pv
        .split(" = dot ")
        .nth(1)
        .unwrap()
        .split(',')
        .next()
        .unwrap();
    assert!(
        !layout.contains(&format!("convert_layout {p} ")),
        "P is converted:\n{layout}"
    );
    // Everything is in the mma layout or its slices: no conversion of registers.
    assert!(!layout.contains("#blocked1"), "{layout}");
}

/// A loop-invariant conversion runs once, before the loop: dQ's delta, a row reduction of O and
/// dO in their load layout, is what every iteration's `dS` needs in the scores' row layout
/// (converted once an iteration, dQ ran 2-5% slower: docs/PERF.md, 2026-11-26, eighth session).
#[test]
fn layout_converts_a_loop_invariant_value_before_the_loop() {
    for target in Target::ALL {
        let name = format!("attention_bwd_dq_bf16_d128_{target}");
        let layout = compile_case(&case(&name))
            .stage(Stage::Layout)
            .unwrap()
            .to_string();
        let loop_at = layout
            .lines()
            .position(|l| l.contains(" = for "))
            .expect("dQ's key loop");
        let lines: Vec<&str> = layout.lines().collect();
        let delta = lines[..loop_at]
            .iter()
            .find(|l| l.contains("= reduce_sum"))
            .and_then(|l| l.split(" = ").next())
            .map(str::trim)
            .expect("delta, reduced before the loop");
        let converted_to = lines[..loop_at]
            .iter()
            .find(|l| {
                l.trim_start()
                    .starts_with(&format!("convert_layout {delta} "))
            })
            .and_then(|l| l.split(" -> ").nth(1))
            .map(str::trim)
            .unwrap_or_else(|| panic!("{name}: {delta} not converted before the loop:\n{layout}"));
        assert!(
            !lines[loop_at..]
                .iter()
                .any(|l| l.contains(&format!("convert_layout {delta} "))),
            "{name}: {delta} converted in the loop:\n{layout}"
        );
        assert!(
            lines[loop_at..].iter().any(|l| l.contains(&format!(
                "{delta} is {converted_to} in registers converted before the loop"
            ))),
            "{name}:\n{layout}"
        );
    }
}

/// Every element of `out` within 1e-3 of the f64 `expected`, relative where it exceeds 1 (f16
/// inputs, f32 sums in another order).
fn assert_near_f64(out: &HostBuffer, expected: &[f64], label: &str) {
    for (i, want) in expected.iter().enumerate() {
        let got = out.read_float(i) as f64;
        assert!(
            (got - want).abs() <= 1e-3 * want.abs().max(1.0),
            "{label}: out[{i}] = {got}, expected {want}"
        );
    }
}

/// Row sums of X (a reduction in X's load layout) added to the rows of a product inside loops:
/// in an `if` of a loop, in a loop nested in it, and in a sibling loop after it. Each use needs
/// the sums in the product's row layout.
#[kernel]
fn row_sums_in_loops(x: Ptr<f16>, y: Ptr<f16>, out: Ptr<f32>, n: i32) {
    let x_block = make_block_ptr(x, [64, 32], [32, 1], [0, 0], [64, 32], [1, 0]);
    let y_block = make_block_ptr(y, [32, 32], [32, 1], [0, 0], [32, 32], [1, 0]);
    let x_tile = load(x_block, [0, 1]);
    let y_tile = load(y_block, [0, 1]);
    let rows = sum(x_tile.to::<f32>(), 1);
    let mut acc = zeros([64, 32], f32);
    for i in 0..n {
        acc = dot(x_tile, y_tile, acc);
        if i % 2 == 0 {
            acc = acc + rows.expand_dims(1);
        }
        for _ in 0..2 {
            acc = acc - rows.expand_dims(1) * 0.5;
        }
    }
    for _ in 0..n {
        acc = acc + rows.expand_dims(1);
    }
    let out_block = make_block_ptr(out, [64, 32], [32, 1], [0, 0], [64, 32], [1, 0]);
    store(out_block, acc, [0, 1]);
}

/// The row sums are converted once before each outer loop, not in any loop (an `if` or a nested
/// loop in a loop takes the outer loop's; a sibling loop has its own), and the program computes
/// what an f64 reference does, on both targets (the emulator).
#[test]
fn loop_invariant_conversions_run_before_the_outermost_loop() {
    let kernel = row_sums_in_loops::build(&Spec::new()).unwrap();
    let x: Vec<f64> = (0..64 * 32)
        .map(|i| ((i * 7 % 23) as f64 - 11.0) / 16.0)
        .collect();
    let y: Vec<f64> = (0..32 * 32)
        .map(|i| ((i * 5 % 19) as f64 - 9.0) / 16.0)
        .collect();
    let n: i32 = 3;
    let mut expected = vec![0.0; 64 * 32];
    for r in 0..64 {
        let row: f64 = (0..32).map(|k| x[r * 32 + k]).sum();
        for c in 0..32 {
            let product: f64 = (0..32).map(|k| x[r * 32 + k] * y[k * 32 + c]).sum();
            // n products, the sums added on even iterations, subtracted on every one, then
            // added once a sibling iteration.
            let even = ((n + 1) / 2) as f64;
            expected[r * 32 + c] =
                n as f64 * product + even * row - n as f64 * row + n as f64 * row;
        }
    }
    for target in Target::ALL {
        let options = CompileOptions::new(target, 4);
        let compiled = compile(&kernel, &options).unwrap();
        let layout = compiled.stage(Stage::Layout).unwrap().to_string();
        let lines: Vec<&str> = layout.lines().collect();
        let rows = lines
            .iter()
            .find(|l| l.contains("= reduce_sum"))
            .and_then(|l| l.split(" = ").next())
            .map(str::trim)
            .expect("the row sums");
        let mut depth = 0usize;
        let mut before_loops = 0;
        for line in &lines {
            if line
                .trim_start()
                .starts_with(&format!("convert_layout {rows} "))
            {
                assert_eq!(depth, 0, "{target}: converted in a loop:\n{layout}");
                before_loops += 1;
            }
            if line.contains(" = for ") || line.trim_start().starts_with("for ") {
                depth += 1;
            }
            if line.trim() == "}" && depth > 0 {
                depth -= 1;
            }
        }
        assert_eq!(
            before_loops, 2,
            "{target}: one before each outer loop:\n{layout}"
        );
        let program = thread_program(&kernel, &options).unwrap();
        let x_buffer = HostBuffer::from_f64(F16, &x);
        let y_buffer = HostBuffer::from_f64(F16, &y);
        let out = HostBuffer::poisoned(F32, 64 * 32);
        let args = [
            KernelArg::Buffer(&x_buffer),
            KernelArg::Buffer(&y_buffer),
            KernelArg::Buffer(&out),
            KernelArg::I32(n),
        ];
        emulate::run(&program, Grid::new(1, 1, 1), &args).unwrap();
        assert_near_f64(&out, &expected, &target.to_string());
    }
}

/// The thread program of small kernels, as text: positions from thread ids, predicated
/// accesses, a reduction's shuffles and shared-memory round, a conversion's barriers.
#[test]
fn thread_programs_of_small_kernels() {
    for (name, case_name) in [
        ("vector_add_f16_b64", "vector_add_f16_b64_w4_sm_80"),
        ("row_max_f32_b64", ""),
    ] {
        let program = if case_name.is_empty() {
            let kernel = row_max::build(&Spec::new().int("BLOCK", 64)).unwrap();
            compile(&kernel, &CompileOptions::new(Target::Sm80, 2)).unwrap()
        } else {
            compile_case(&case(case_name))
        };
        let path = manifest_path(&format!("tests/golden/{name}.thread"));
        check_file(&path, program.stage(Stage::Thread).unwrap());
    }
}

/// A 2 x 64 tile reduced along its rows into a 2-element column, on 2 warps: the lanes of a warp
/// split a row, so the reduction is one in-thread step and five butterfly shuffles, and the
/// result is the slice of the tile's layout.
#[kernel]
fn row_max<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let row = arange(0, 2).expand_dims(1);
    let col = arange(0, BLOCK).expand_dims(0);
    let m = load(x + row * BLOCK + col).max(1);
    store(out + arange(0, 2), m);
}

// ---- the emulator against the interpreter ----

/// A copy of a buffer (same dtype and bits): the emulator's own outputs.
fn copy(buffer: &HostBuffer) -> HostBuffer {
    let copy = HostBuffer::zeros(buffer.dtype(), buffer.len());
    for i in 0..buffer.len() {
        if buffer.dtype().is_float() {
            copy.write_float(i, buffer.read_float(i));
        } else {
            copy.write_int(i, buffer.read_int(i));
        }
    }
    copy
}

/// Runs `run` on the interpreter and, on copies of its buffers, on the emulator; returns what
/// comparing them found.
fn emulate_run(case: &cases::Case, run: &cases::Run) -> cases::Outcome {
    let options = case_options(case, case.target);
    let program =
        thread_program(&case.kernel, &options).unwrap_or_else(|e| panic!("{}: {e}", case.name));
    emulate_program(case, run, &program)
        .unwrap_or_else(|e| panic!("{} {}: {e}", case.name, run.label))
}

/// Asserts that the emulator agrees with the interpreter on every run of `case`, its failures
/// named after `what` and the run.
fn assert_emulator_agrees(case: &cases::Case, what: &str) {
    for run in cases::runs(case) {
        let outcome = emulate_run(case, &run);
        let at = if what.is_empty() {
            run.label.clone()
        } else {
            format!("{what} {}", run.label)
        };
        assert_eq!(outcome.mismatches, 0, "{at}: {:?}", outcome.first);
    }
}

/// [`emulate_run`] of `program`, the case's or one edited: the emulator's error, or what
/// comparing with the interpreter found.
fn emulate_program(
    case: &cases::Case,
    run: &cases::Run,
    program: &kiln_codegen::thread::Program,
) -> Result<cases::Outcome, emulate::EmulationError> {
    let emulated: Vec<HostBuffer> = run.buffers.iter().map(copy).collect();
    let [x, y, z] = run.grid;
    kiln_dsl::run(
        &case.kernel,
        Grid::new(x, y, z),
        &run.host_args(&run.buffers),
    )
    .unwrap_or_else(|e| panic!("{} {}: interpreter: {e}", case.name, run.label));
    emulate::run(program, Grid::new(x, y, z), &run.host_args(&emulated))?;
    Ok(cases::compare(&run.buffers, &emulated, case.tolerance))
}

/// Every run of every GPU case (the thread program is the same for both targets, but for `dot`s
/// on `wgmma`), in the emulator, agrees with the interpreter within the case's tolerance: what
/// the GPU test checks on the GPU, checked in CI. The attention cases are left to
/// `the_emulator_agrees_on_every_attention_kernel`, which runs the same specialisations on the
/// same shapes: running them here too would double the emulator's longest work.
#[test]
fn the_emulator_agrees_with_the_interpreter_on_every_gpu_case() {
    let mut failures = Vec::new();
    for case in cases::cases()
        .iter()
        .filter(|c| (c.target == Target::Sm80 || c.knobs.wgmma) && !is_attention(c))
    {
        for run in cases::runs(case) {
            let outcome = emulate_run(case, &run);
            println!(
                "{:40} {:14} {:>9} elements, max |diff| {:.3e}",
                case.name, run.label, outcome.elements, outcome.max_diff
            );
            if outcome.mismatches > 0 {
                failures.push(format!(
                    "{} {}: {} mismatches\n  {}",
                    case.name,
                    run.label,
                    outcome.mismatches,
                    outcome.first.join("\n  ")
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The general kernels at other warp counts: layouts, slices and cross-warp reductions change
/// shape with the number of warps, and must agree with the interpreter at each. The attention
/// cases come along at head dims 64 and 128 only (32 and 256 share their code and would double
/// this test's time); the sliding-window cases not at all (their 16-row blocks fit one warp's
/// mma tile per 16 rows, no more).
#[test]
fn the_emulator_agrees_at_one_and_eight_warps() {
    for num_warps in [1, 8] {
        for case in cases::cases().into_iter().filter(|c| {
            c.target == Target::Sm80
                && !c.name.starts_with("vector_add")
                && !c.name.starts_with("scale")
                && !c.name.starts_with("sliding_window")
                && (!is_attention(c) || matches!(head_dim(c), 64 | 128))
        }) {
            let case = cases::Case {
                knobs: CodegenKnobs {
                    num_warps,
                    ..case.knobs
                },
                ..case
            };
            assert_emulator_agrees(&case, &format!("{} at {num_warps} warps,", case.name));
        }
    }
}

/// An attention case's head dim (0 for other kernels).
fn head_dim(case: &cases::Case) -> usize {
    match case.kernel.spec.get("HEAD_DIM") {
        Some(kiln_dsl::SpecValue::Int(d)) => d as usize,
        _ => 0,
    }
}

/// Whether `case` is one of the attention kernels.
fn is_attention(case: &cases::Case) -> bool {
    AttentionKernel::from_name(case.kernel.name()).is_some()
}

/// Whether `case` is the fused backward's dK/dV, which adds dQ into an accumulator.
fn accumulates_dq(case: &cases::Case) -> bool {
    case.kernel.spec.get("ACCUMULATE_DQ") == Some(kiln_dsl::SpecValue::Bool(true))
}

/// Block sizes, warps and stages of attention kernel `name` at `head_dim`, causal or not, on
/// `target`.
fn attention_config(name: &str, head_dim: usize, causal: bool, target: Target) -> KernelConfig {
    table_params(F16, head_dim, causal)
        .config(target)
        .expect("a shipped head dim")
        .kernel(AttentionKernel::from_name(name).expect("an attention kernel"))
}

/// An attention kernel as kiln ships it for `target`: its block sizes, warps and stages from
/// the config table, and the divisibility its launchers check.
fn attention_case(
    name: &str,
    dtype: DType,
    head_dim: usize,
    causal: bool,
    target: Target,
) -> cases::Case {
    let config = attention_config(name, head_dim, causal, target);
    attention_case_at(name, dtype, head_dim, causal, target, config)
}

/// An attention call at the sequence lengths the table's own entries are for
/// ([`KeyLength::Medium`]; some forwards run other blocks for short or long ones).
fn table_params(dtype: DType, head_dim: usize, causal: bool) -> AttentionParams {
    let seqlen = KeyLength::Medium.example_seqlen(causal);
    cases::attention_params(dtype, head_dim, causal, seqlen, seqlen)
}

/// The fused backward's bf16 D128 call without a mask, as [`table_params`].
fn fused_d128_params() -> AttentionParams {
    AttentionParams {
        fused_backward: true,
        ..table_params(BF16, 128, false)
    }
}

/// [`attention_case`] at `config` instead of the table's, named as the shipped specialisation.
fn attention_case_at(
    name: &str,
    dtype: DType,
    head_dim: usize,
    causal: bool,
    target: Target,
    config: KernelConfig,
) -> cases::Case {
    let kernel = AttentionKernel::from_name(name).expect("an attention kernel");
    let p = table_params(dtype, head_dim, causal);
    call_case(&p, kernel, target, config)
}

/// Attention kernel `kernel` for the call `p` at `config` on `target`, named as the shipped
/// specialisation.
fn call_case(
    p: &AttentionParams,
    kernel: AttentionKernel,
    target: Target,
    config: KernelConfig,
) -> cases::Case {
    let built = kernel
        .build(&p.spec(kernel, config))
        .expect("an attention kernel builds");
    let name = plan::specialisation_name(kernel, p, target);
    cases::attention_config_case(name, kernel, built, target, config)
}

/// Options for `kernel` at `config` on `target`, assuming of its arguments what the prebuilt
/// kernels do.
fn attention_options(
    kernel: AttentionKernel,
    config: KernelConfig,
    target: Target,
) -> CompileOptions {
    knob_options(&config.knobs(), target, prebuilt::divisibility(kernel))
}

/// Warpgroups take turns only in a loop body that stages no tile: the fused D128 dK/dV stages
/// dS^T for dQ^T's product every iteration, where its two warpgroups meet at a `bar.sync 0`
/// anyway (with turns 0.98-1.00x, docs/PERF.md, twentieth session); the D128 dQ of two
/// warpgroups stages nothing and takes them.
#[test]
fn warpgroups_take_no_turns_in_a_loop_that_stages_a_tile() {
    // A named barrier of 256 threads: a turn's (each warpgroup's own and its predecessor's).
    let takes_turns = |p: &AttentionParams, kernel: AttentionKernel| {
        let config = p.config(Target::Sm90a).unwrap().kernel(kernel);
        assert_eq!(config.num_warps, 8, "{config}: two warpgroups");
        let case = call_case(p, kernel, Target::Sm90a, config);
        let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
        program
            .to_string()
            .lines()
            .any(|l| l.trim_start().starts_with("bar.arrive") && l.ends_with(", 256"))
    };
    let fused = fused_d128_params();
    assert!(!takes_turns(&fused, AttentionKernel::DkDv));
    assert!(takes_turns(
        &table_params(BF16, 128, false),
        AttentionKernel::Dq
    ));
}

/// A tile staged at the top level of a TMA loop whose buffers are freed on barriers takes one
/// buffer a stage of the loop's ring, so that writing this iteration's waits for no reads of
/// the last one's: the fused D128 dK/dV's query loop meets at one barrier of its consumers an
/// iteration (after staging dS^T, before dQ^T's product reads it), not two (1.02-1.05x,
/// docs/PERF.md, twentieth session); the emulator agrees with the interpreter on it.
#[test]
fn tiles_staged_in_a_tma_loop_take_a_buffer_of_its_ring() {
    use kiln_codegen::thread::Op;
    let p = fused_d128_params();
    let config = p.config(Target::Sm90a).unwrap().dkdv;
    let case = call_case(&p, AttentionKernel::DkDv, Target::Sm90a, config);
    let mut program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    // The consumers' query loop's body, the block with the most `wgmma`s (the loop over the
    // group's heads holds the products of none, the branch of dQ's warpgroup one): its
    // barriers of all the consumers.
    let mut blocks = Vec::new();
    let mut count = |block: &mut kiln_codegen::thread::Block| {
        let count = |f: &dyn Fn(&Op) -> bool| block.insts.iter().filter(|i| f(&i.op)).count();
        // With a producer the consumers meet on a named barrier of theirs.
        let consumers = config.num_warps * 32;
        blocks.push((
            count(&|op| matches!(op, Op::Wgmma { .. })),
            count(&|op| match *op {
                Op::Barrier => true,
                Op::NamedBarrier { threads, wait, .. } => wait && threads == consumers,
                _ => false,
            }),
        ));
    };
    fn each_block(
        block: &mut kiln_codegen::thread::Block,
        f: &mut dyn FnMut(&mut kiln_codegen::thread::Block),
    ) {
        f(block);
        for_each_block(block, &mut |inner| each_block(inner, f));
    }
    each_block(&mut program.body, &mut count);
    assert_eq!(
        blocks.iter().max().map(|&(_, barriers)| barriers),
        Some(1),
        "the query loop's barriers of the block"
    );
    assert_emulator_agrees(&case, "");
}

/// Four warpgroups taking turns at the tensor cores, which no table entry uses since the D64
/// forward went to 64-row blocks (2026-11-26) and `kiln tune` still tries: the D64 forward at
/// 256 x 64 of 16 warps, 3 stages, on `wgmma`, against the interpreter.
#[test]
fn four_warpgroups_taking_turns_agree_with_the_interpreter() {
    let config = KernelConfig::new(256, 64, 16, 3).on_wgmma();
    for causal in [false, true] {
        let case = attention_case_at("attention_fwd", BF16, 64, causal, Target::Sm90a, config);
        let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
        // Each warpgroup waits for its turn on a named barrier of 256 threads (its own and its
        // predecessor's) and passes it on with `bar.arrive`.
        let text = program.to_string();
        let turns = |op: &str| {
            text.lines()
                .any(|l| l.trim_start().starts_with(op) && l.ends_with(", 256"))
        };
        assert!(
            turns("bar.sync") && turns("bar.arrive"),
            "{}: no turns",
            case.name
        );
        let runs = cases::runs(&case);
        assert!(!runs.is_empty(), "{}: nothing to run", case.name);
        for run in runs {
            let outcome = emulate_run(&case, &run);
            assert_eq!(
                outcome.mismatches, 0,
                "{} {}: {:?}",
                case.name, run.label, outcome.first
            );
        }
    }
}

/// Every attention specialisation kiln ships (both backwards' kernels, every head dim, f16 and
/// bf16, causal and not) as the config table compiles it (pipelined, vectorised), on the GPU
/// cases' ragged shapes (seqlen 70 x 45 and 45 x 70); one compiled alike for both targets runs
/// once, on sm_90a.
#[test]
fn the_emulator_agrees_on_every_attention_kernel() {
    let cases: Vec<cases::Case> = cases::cases().into_iter().filter(is_attention).collect();
    let alike =
        |a: &cases::Case, b: &cases::Case| a.kernel.spec == b.kernel.spec && a.knobs == b.knobs;
    for case in &cases {
        if case.target == Target::Sm80
            && cases
                .iter()
                .any(|c| c.target == Target::Sm90a && alike(c, case))
        {
            continue;
        }
        assert_emulator_agrees(case, &case.name);
    }
}

/// The pipelined loops at 1 (off), 2, 3 and 4 stages agree with the interpreter: the aligned
/// GEMM, whose K loop runs 0, 1, 2 and 7 times with ragged M, N and K, and the forward, dQ and
/// dK/dV kernels (their loops run once or twice on the ragged shapes, and dK/dV's inner loop
/// restarts for every query head of its group); dK/dV's 128 x 64 tiles do not fit 4 stages, and
/// must be refused for it.
#[test]
fn pipelined_loops_agree_with_the_interpreter_at_every_depth() {
    let gemm = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
    let mut pipelined = vec![gemm];
    for name in ["attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv"] {
        pipelined.push(attention_case(name, BF16, 64, true, Target::Sm80));
    }
    for base in &pipelined {
        for num_stages in 1..=4 {
            let case = cases::Case {
                name: base.name.clone(),
                kernel: base.kernel.clone(),
                knobs: CodegenKnobs::new(base.knobs.num_warps, num_stages),
                divisibility: base.divisibility.clone(),
                target: Target::Sm80,
                tolerance: base.tolerance,
            };
            let program = match thread_program(&case.kernel, &case_options(&case, Target::Sm80)) {
                Ok(program) => program,
                // dK/dV's 128 x 64 tiles (D64's) take 180 KiB at 4 stages.
                Err(CodegenError::Options { message })
                    if num_stages == 4
                        && case.name.starts_with("attention_bwd_dkdv")
                        && message.contains("sm_80 gives a block at most") =>
                {
                    continue;
                }
                Err(e) => panic!("{} at {num_stages} stages: {e}", case.name),
            };
            let copies = program.to_string().matches("cp.async.cg").count();
            assert_eq!(
                copies > 0,
                num_stages > 1,
                "{} at {num_stages} stages",
                case.name
            );
            assert_emulator_agrees(&case, &format!("{} at {num_stages} stages,", case.name));
        }
    }
}

/// Drops every instruction `drop` picks, at any depth.
fn drop_insts(
    block: &mut kiln_codegen::thread::Block,
    drop: &dyn Fn(&kiln_codegen::thread::Op) -> bool,
) {
    block.insts.retain(|inst| !drop(&inst.op));
    for_each_block(block, &mut |inner| drop_insts(inner, drop));
}

/// `f` on each op of `block` and its nested blocks.
fn edit_ops(
    block: &mut kiln_codegen::thread::Block,
    f: &mut dyn FnMut(&mut kiln_codegen::thread::Op),
) {
    for inst in &mut block.insts {
        f(&mut inst.op);
    }
    for_each_block(block, &mut |inner| edit_ops(inner, f));
}

/// For each wait on a named barrier of several warpgroups in `block` and the blocks nested in
/// it, whether it takes a warpgroup's turn: the next op fences the `wgmma`s it issues. (A
/// warpgroup's own barrier, before its band of a TMA store, holds no other back.)
fn turn_waits(block: &mut kiln_codegen::thread::Block, turns: &mut Vec<bool>) {
    use kiln_codegen::thread::Op;
    for (i, inst) in block.insts.iter().enumerate() {
        if let Op::NamedBarrier {
            wait: true,
            threads,
            ..
        } = inst.op
            && threads > 128
        {
            let next = block.insts.get(i + 1).map(|n| &n.op);
            turns.push(matches!(next, Some(Op::WgmmaFence)));
        }
    }
    for_each_block(block, &mut |inner| turn_waits(inner, turns));
}

/// `f` on the blocks nested in `block`'s ops.
fn for_each_block(
    block: &mut kiln_codegen::thread::Block,
    f: &mut dyn FnMut(&mut kiln_codegen::thread::Block),
) {
    for inst in &mut block.insts {
        match &mut inst.op {
            kiln_codegen::thread::Op::For { body, .. } => f(body),
            kiln_codegen::thread::Op::If {
                then_block,
                else_block,
                ..
            } => {
                f(then_block);
                f(else_block);
            }
            _ => {}
        }
    }
}

/// A `wgmma` group not waited for before its operand buffer is refilled, or at the end of the
/// kernel, is an error in the emulator.
#[test]
fn the_emulator_finds_writes_under_a_wgmma_in_flight() {
    use kiln_codegen::thread::Op;
    let case = case("gemm_f16_wgmma_m64_n64_k32_s3_w4_sm_90a");
    let run = cases::runs(&case).swap_remove(3);
    let [x, y, z] = run.grid;
    let mut program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    edit_ops(&mut program.body, &mut |op| {
        if let Op::WgmmaWait { pending, .. } = op {
            *pending += 1;
        }
    });
    let err = emulate::run(&program, Grid::new(x, y, z), &run.host_args(&run.buffers)).unwrap_err();
    assert!(
        err.to_string()
            .contains("written while a wgmma may still read it"),
        "{err}"
    );
}

/// A pipelined loop that reads its buffer before waiting for the copies into it, or that
/// waits but meets no barrier, is an error in the emulator, naming the DSL line of the op.
#[test]
fn the_emulator_finds_reads_of_copies_in_flight() {
    use kiln_codegen::thread::Op;
    let case = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
    let run = cases::runs(&case).swap_remove(3);
    let [x, y, z] = run.grid;
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm80)).unwrap();
    let no_wait = |op: &Op| matches!(op, Op::CpAsyncWait { pending } if *pending > 0);
    let mut early = program.clone();
    drop_insts(&mut early.body, &no_wait);
    let err = emulate::run(&early, Grid::new(x, y, z), &run.host_args(&run.buffers)).unwrap_err();
    assert!(
        err.to_string().contains("while an async copy writes it"),
        "{err}"
    );
    assert_eq!(
        err.loc.map(|l| l.file),
        Some("kernels/src/general/gemm.rs"),
        "{err}"
    );
    let mut unmet = program.clone();
    drop_insts(&mut unmet.body, &|op| *op == Op::Barrier);
    let err = emulate::run(&unmet, Grid::new(x, y, z), &run.host_args(&run.buffers)).unwrap_err();
    assert!(err.to_string().contains("race: shared byte"), "{err}");
}

/// TMA's copies as the emulator checks them (the GEMM on `wgmma`, whose K loop copies with
/// TMA): without the wait, the body reads bytes a copy is still writing; without the arrival
/// or the copy, or with a box smaller than the bytes the arrival expects, the wait waits for a
/// phase nothing completes (a hang on the GPU).
#[test]
fn the_emulator_finds_tma_copies_misused() {
    use kiln_codegen::thread::Op;
    let case = case("gemm_f16_wgmma_m64_n64_k32_s3_w4_sm_90a");
    let run = cases::runs(&case).swap_remove(3);
    let [x, y, z] = run.grid;
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    assert!(
        !program.tensor_maps.is_empty(),
        "the GEMM's K loop is not on TMA"
    );
    let emulated = |program: &kiln_codegen::thread::Program| {
        emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers))
    };
    emulated(&program).unwrap();
    let mut unwaited = program.clone();
    drop_insts(&mut unwaited.body, &|op| {
        matches!(op, Op::MbarrierWait { .. })
    });
    let err = emulated(&unwaited).unwrap_err();
    assert!(
        err.to_string().contains("while an async copy writes it"),
        "{err}"
    );
    for dropped in [
        &(|op: &Op| matches!(op, Op::MbarrierArriveExpectTx { .. })) as &dyn Fn(&Op) -> bool,
        &|op: &Op| matches!(op, Op::TmaLoad { .. }),
    ] {
        let mut stuck = program.clone();
        drop_insts(&mut stuck.body, dropped);
        let err = emulated(&stuck).unwrap_err();
        assert!(
            err.to_string()
                .contains("deadlock: waiting for phase parity 0"),
            "{err}"
        );
    }
    // A copy is issued by whole warps (one elected lane): thread 0 alone is refused.
    let mut issuer = None;
    edit_ops(&mut program.clone().body, &mut |op| {
        if let Op::MbarrierArriveExpectTx { pred, .. } = op {
            issuer.get_or_insert(*pred);
        }
    });
    let issuer = issuer.expect("the GEMM arrives on its barriers");
    let mut one_thread = program.clone();
    edit_ops(&mut one_thread.body, &mut |op| {
        if let Op::TmaLoad { warps, .. } = op {
            *warps = issuer;
        }
    });
    let err = emulated(&one_thread).unwrap_err();
    assert!(
        err.to_string()
            .contains("is split on whether it runs this cp.async.bulk.tensor"),
        "{err}"
    );
    let mut short = program.clone();
    short.tensor_maps[0].box_shape[0] /= 2;
    let err = emulated(&short).unwrap_err();
    assert!(
        err.to_string().contains("transaction bytes would complete"),
        "{err}"
    );
}

/// Top-level loads that only `dot`s read are TMA copies into their staged tiles, each waited for
/// once at the top level where the tile is first read (before a loop that reads it): the
/// forward's first K and last V tiles (the backward's resident tiles are not described whole,
/// so they load through registers). Without those waits the emulator finds the tiles read while
/// their copies write them.
#[test]
fn top_level_tma_loads_are_waited_for_where_first_read() {
    use kiln_codegen::thread::Op;
    // (The D64 and D128 forwards' other blocks have a producer warpgroup issue their copies.)
    for (name, copies) in [
        ("attention_fwd_bf16_d32_sm_90a", 2),
        ("attention_fwd_f16_d32_causal_sm_90a", 2),
        ("attention_fwd_bf16_d64_long_sm_90a", 1),
    ] {
        let case = case(name);
        // 40 x 555: several key blocks, so that the loops run.
        let run = cases::runs(&case).swap_remove(2);
        let [x, y, z] = run.grid;
        let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
        let emulated = |program: &kiln_codegen::thread::Program| {
            emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers))
        };
        emulated(&program).unwrap_or_else(|e| panic!("{name}: {e}"));
        let top = |op: fn(&Op) -> bool| program.body.insts.iter().filter(|i| op(&i.op)).count();
        let waits = top(|op| matches!(op, Op::MbarrierWait { .. }));
        assert_eq!(
            waits, copies,
            "{name}: one wait per copied tile, at the top level"
        );
        let copied: usize = (program.body.insts.iter())
            .map(|i| match &i.op {
                Op::TmaLoad { copies, .. } => copies.len(),
                _ => 0,
            })
            .sum();
        assert!(
            copied >= 2 * copies,
            "{name}: copies at the top level (the first loop's early ones too)"
        );
        let mut unwaited = program.clone();
        unwaited
            .body
            .insts
            .retain(|i| !matches!(i.op, Op::MbarrierWait { .. }));
        let err = emulated(&unwaited).unwrap_err();
        assert!(
            err.to_string().contains("while an async copy writes it"),
            "{name}: {err}"
        );
    }
}

/// B read by a `dot` and added to its product in registers: staged for the `dot`, it is not a
/// one-shot TMA copy (which has no registers), and its tile before a second load's tile is seen
/// through a `trans`.
#[kernel]
fn product_plus_b(a: Ptr<f16>, b: Ptr<f16>, c: Ptr<f16>, out: Ptr<f32>) {
    let a_tile = load(
        make_block_ptr(a, [64, 64], [64, 1], [0, 0], [64, 64], [1, 0]),
        [0, 1],
    );
    let b_tile = load(
        make_block_ptr(b, [64, 64], [64, 1], [0, 0], [64, 64], [1, 0]),
        [0, 1],
    );
    let at = trans(a_tile);
    let c_tile = load(
        make_block_ptr(c, [64, 64], [64, 1], [0, 0], [64, 64], [1, 0]),
        [0, 1],
    );
    let acc = dot(at, b_tile) + dot(c_tile, a_tile) + b_tile.to::<f32>();
    store(
        make_block_ptr(out, [64, 64], [64, 1], [0, 0], [64, 64], [1, 0]),
        acc,
        [0, 1],
    );
}

#[test]
fn a_tile_read_in_registers_too_is_not_a_one_shot_copy() {
    let kernel = product_plus_b::build(&Spec::new()).unwrap();
    let value = |i: usize, k: usize| ((i * k % 13) as f64 - 6.0) / 8.0;
    let [a, b, c] = [3, 5, 7].map(|k| (0..64 * 64).map(|i| value(i, k)).collect::<Vec<f64>>());
    let mut expected = vec![0.0; 64 * 64];
    for r in 0..64 {
        for col in 0..64 {
            let at_b: f64 = (0..64).map(|k| a[k * 64 + r] * b[k * 64 + col]).sum();
            let c_a: f64 = (0..64).map(|k| c[r * 64 + k] * a[k * 64 + col]).sum();
            expected[r * 64 + col] = at_b + c_a + b[r * 64 + col];
        }
    }
    let options = CompileOptions::new(Target::Sm90a, 4).with_wgmma(true);
    let options = ["a", "b", "c", "out"]
        .into_iter()
        .fold(options, |o, name| o.with_divisibility(name, 16));
    let program = thread_program(&kernel, &options).unwrap();
    let buffers = [&a, &b, &c].map(|x| HostBuffer::from_f64(F16, x));
    let out = HostBuffer::poisoned(F32, 64 * 64);
    let args = [
        KernelArg::Buffer(&buffers[0]),
        KernelArg::Buffer(&buffers[1]),
        KernelArg::Buffer(&buffers[2]),
        KernelArg::Buffer(&out),
    ];
    emulate::run(&program, Grid::new(1, 1, 1), &args).unwrap();
    assert_near_f64(&out, &expected, "product_plus_b");
    // A and C are copies (A's seen through its `trans` before C's load), B is not.
    let copies = program
        .body
        .insts
        .iter()
        .filter(|i| matches!(i.op, kiln_codegen::thread::Op::MbarrierWait { .. }))
        .count();
    assert_eq!(copies, 2, "{program}");
}

/// A GEMM whose K loop runs, under an `if` before its own `dot`, another GEMM's K loop: both
/// loops pipelined on TMA, each body holding its copies back for its first `wgmma`s.
#[kernel]
fn gemm_with_a_nested_gemm(
    a: Ptr<f16>,
    b: Ptr<f16>,
    c: Ptr<f32>,
    d: Ptr<f32>,
    m: i32,
    k: i32,
    a_row_stride: i64,
    b_row_stride: i64,
    inner: i32,
) {
    let mut a_block = make_block_ptr(a, [m, k], [a_row_stride, 1], [0, 0], [64, 32], [1, 0]);
    let mut b_block = make_block_ptr(b, [k, 64], [b_row_stride, 1], [0, 0], [32, 64], [1, 0]);
    let mut acc = zeros([64, 64], f32);
    for _ in (0..k).step_by(32) {
        if inner > 0 {
            let mut a_inner =
                make_block_ptr(a, [m, k], [a_row_stride, 1], [0, 0], [64, 32], [1, 0]);
            let mut b_inner =
                make_block_ptr(b, [k, 64], [b_row_stride, 1], [0, 0], [32, 64], [1, 0]);
            let mut inner_acc = zeros([64, 64], f32);
            for _ in (0..k).step_by(32) {
                inner_acc = dot(load(a_inner, [0, 1]), load(b_inner, [0, 1]), inner_acc);
                a_inner = advance(a_inner, [0, 32]);
                b_inner = advance(b_inner, [32, 0]);
            }
            let d_block = make_block_ptr(d, [m, 64], [64, 1], [0, 0], [64, 64], [1, 0]);
            store(d_block, inner_acc, [0, 1]);
        }
        acc = dot(load(a_block, [0, 1]), load(b_block, [0, 1]), acc);
        a_block = advance(a_block, [0, 32]);
        b_block = advance(b_block, [32, 0]);
    }
    let c_block = make_block_ptr(c, [m, 64], [64, 1], [0, 0], [64, 64], [1, 0]);
    store(c_block, acc, [0, 1]);
}

/// A loop nested before its enclosing body's first `wgmma`s issues its own copies; the
/// enclosing loop's held-back ones still follow that body's `dot` (one loop's are held at a
/// time: the inner loop's must not replace the outer's).
#[test]
fn nested_pipelined_loops_keep_their_own_copies() {
    use kiln_codegen::thread::{Block, Op};
    let kernel = gemm_with_a_nested_gemm::build(&Spec::new()).unwrap();
    let options = aligned_gemm_options();
    let program = thread_program(&kernel, &options).unwrap();
    // The copies directly in a block, and the first `for` body in it or in its `if`s.
    let copies = |block: &Block| {
        block
            .insts
            .iter()
            .filter(|i| matches!(i.op, Op::TmaLoad { .. }))
            .count()
    };
    fn first_loop(block: &Block) -> Option<&Block> {
        block.insts.iter().find_map(|inst| match &inst.op {
            Op::For { body, .. } => Some(body),
            Op::If {
                then_block,
                else_block,
                ..
            } => first_loop(then_block).or_else(|| first_loop(else_block)),
            _ => None,
        })
    }
    let outer = first_loop(&program.body).expect("the outer loop");
    let inner = first_loop(outer).expect("the inner loop");
    // A's tile on TMA (B's row stride is not promised 16-byte aligned), one slab.
    assert_eq!(copies(outer), 1, "{program}");
    assert_eq!(copies(inner), 1, "{program}");
    let commit = outer
        .insts
        .iter()
        .position(|i| matches!(i.op, Op::WgmmaCommit))
        .expect("the outer dot");
    let first_copy = outer
        .insts
        .iter()
        .position(|i| matches!(i.op, Op::TmaLoad { .. }))
        .unwrap_or(0);
    assert!(first_copy > commit, "the outer copies come before its dot");
}

/// The forward's first K and V copies go out before Q's load and the first key block's
/// scores (its first loop's prologue goes where what it needs exists, ahead of the `dot`
/// before the loop); dQ's K copies, with no `dot` before its loop to hide them behind, stay at
/// the loop, while its Q (a one-shot copy) goes out first.
#[test]
fn the_forward_issues_its_first_copies_before_its_first_scores() {
    use kiln_codegen::thread::{Op, Program};
    // At head dims whose table has no producer warpgroup issue the copies.
    let program = |name: &str, head_dim| {
        let case = attention_case(name, BF16, head_dim, true, Target::Sm90a);
        thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap()
    };
    // The top-level position of the first op `op` accepts.
    let first = |program: &Program, op: &dyn Fn(&Op) -> bool| {
        program.body.insts.iter().position(|i| op(&i.op))
    };
    // A TMA copy through a map of kernel argument `base`.
    let copy_of = |program: &Program, base: usize| {
        let maps = program.tensor_maps.clone();
        move |op: &Op| match op {
            Op::TmaLoad { copies, .. } => copies.iter().any(|c| maps[c.map].base == base),
            _ => false,
        }
    };
    let copy = |op: &Op| matches!(op, Op::TmaLoad { .. });
    let wgmma = |op: &Op| matches!(op, Op::Wgmma { .. });
    let global_load = |op: &Op| matches!(op, Op::LoadVector { .. });
    let forward = program("attention_fwd", 32);
    let forward_copy = first(&forward, &copy).expect("the forward copies");
    assert!(forward_copy < first(&forward, &global_load).expect("Q's load"));
    assert!(forward_copy < first(&forward, &wgmma).expect("the first scores"));
    // dQ's arguments begin `q, k, v`: its K copies go out at its loop, after O and dO load.
    let dq = program("attention_bwd_dq", 128);
    let dq_load = first(&dq, &global_load).expect("O's load");
    let q_copy = first(&dq, &copy_of(&dq, 0)).expect("dQ copies Q with TMA");
    let k_copy = first(&dq, &copy_of(&dq, 1)).expect("dQ copies K with TMA");
    assert!(q_copy < dq_load && dq_load < k_copy);
}

/// The GEMM of two warpgroups (taking turns, its K loop on three TMA stages, its buffers freed
/// on `empty` barriers) and a run of a thread program in its place in the emulator.
fn two_warpgroup_gemm() -> (
    kiln_codegen::thread::Program,
    impl Fn(&kiln_codegen::thread::Program) -> Result<(), emulate::EmulationError>,
) {
    let case = case("gemm_f16_wgmma_m128_n128_k64_s3_w8_sm_90a");
    let run = cases::runs(&case).swap_remove(3);
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    let emulated = move |program: &kiln_codegen::thread::Program| {
        let [x, y, z] = run.grid;
        emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers))
    };
    (program, emulated)
}

/// A tile staged from registers for `wgmma` (the D32 causal forward's Q, which it scales in
/// registers) is fenced for the async proxy before the barrier that precedes its first read:
/// without the fence the emulator refuses the read. Barriers with nothing staged since the last
/// one carry no fence: the key loop's, once per iteration, stays unfenced (a `MEMBAR.ALL.CTA`
/// each in the SASS otherwise).
#[test]
fn staged_tiles_are_fenced_for_wgmma_and_nothing_else_is() {
    use kiln_codegen::thread::{Block, Op};
    let case = case("attention_fwd_bf16_d32_causal_sm_90a");
    let run = cases::runs(&case).swap_remove(0);
    let [x, y, z] = run.grid;
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    let emulated = |program: &kiln_codegen::thread::Program| {
        emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers))
    };
    emulated(&program).unwrap();
    // Every barrier in a loop body, and whether a fence comes right before it.
    fn loop_barriers(block: &Block, in_loop: bool, out: &mut Vec<bool>) {
        for (i, inst) in block.insts.iter().enumerate() {
            if in_loop && matches!(inst.op, Op::Barrier) {
                out.push(i > 0 && matches!(block.insts[i - 1].op, Op::FenceProxyAsync));
            }
            match &inst.op {
                Op::For { body, .. } => loop_barriers(body, true, out),
                Op::If {
                    then_block,
                    else_block,
                    ..
                } => {
                    loop_barriers(then_block, in_loop, out);
                    loop_barriers(else_block, in_loop, out);
                }
                _ => {}
            }
        }
    }
    let mut fenced = Vec::new();
    loop_barriers(&program.body, false, &mut fenced);
    assert!(
        !fenced.is_empty(),
        "the key loops meet at a barrier\n{program}"
    );
    assert!(
        fenced.iter().all(|&f| !f),
        "a loop barrier is fenced: {fenced:?}\n{program}"
    );
    let mut unfenced = program.clone();
    drop_insts(&mut unfenced.body, &|op| matches!(op, Op::FenceProxyAsync));
    let err = emulated(&unfenced).unwrap_err();
    assert!(
        err.to_string()
            .contains("without a fence.proxy.async before a wgmma reads it"),
        "{err}"
    );
}

/// A product stored by TMA (a GEMM's C, as `gemm_bias_gelu` stores it), then an arrival: the
/// fence before the count does not order the async proxy's writes, so the arrival is refused
/// there; stored through pointers, it is not.
#[kernel]
fn stored_then_arrived<const BLOCK_STORE: bool>(
    a: Ptr<f16>,
    b: Ptr<f16>,
    c: Ptr<f16>,
    counter: Ptr<i32>,
    k: i32,
    row_stride: i64,
) {
    let mut a_block = make_block_ptr(a, [64, k], [row_stride, 1], [0, 0], [64, 32], [1, 0]);
    let mut b_block = make_block_ptr(b, [k, 64], [row_stride, 1], [0, 0], [32, 64], [1, 0]);
    let mut acc = zeros([64, 64], f32);
    for _ in (0..k).step_by(32) {
        acc = dot(load(a_block, [0, 1]), load(b_block, [0, 1]), acc);
        a_block = advance(a_block, [0, 32]);
        b_block = advance(b_block, [32, 0]);
    }
    if BLOCK_STORE {
        let c_block = make_block_ptr(c, [64, k], [row_stride, 1], [0, 0], [64, 64], [1, 0]);
        store(c_block, acc.to::<f16>(), [0, 1]);
    } else {
        let rows = arange(0, 64).expand_dims(1);
        store(
            c + rows * 64 + arange(0, 64).expand_dims(0),
            acc.to::<f16>(),
        );
    }
    let count = atomic_arrive(counter);
    store(counter + 1, count);
}

#[test]
fn an_arrival_after_a_tma_store_is_refused() {
    let options = CompileOptions::new(Target::Sm90a, 4)
        .with_wgmma(true)
        .with_stages(3);
    let options = ["a", "b", "c", "row_stride"]
        .into_iter()
        .fold(options, |o, name| o.with_divisibility(name, 16));
    let build = |block_store| {
        stored_then_arrived::build(&Spec::new().flag("BLOCK_STORE", block_store)).unwrap()
    };
    let err = thread_program(&build(true), &options).unwrap_err();
    assert!(
        err.to_string()
            .contains("`atomic_arrive` after a store by TMA would not order"),
        "{err}"
    );
    let program = thread_program(&build(false), &options).unwrap();
    let text = program.to_string();
    assert!(text.contains("atom.acq_rel.gpu.add"), "{text}");
}

/// The wgmma GEMM writes C by TMA (a swizzled shared tile, a proxy fence and a barrier, one
/// lane's bulk copy, its wait at the end): without the barrier the copy reads what other threads
/// wrote unordered, without the fence what the async proxy may not see yet, without the wait
/// the block ends while it may still read, and a write into its tile before the wait races it.
/// Of two warpgroups, each stores its own rows after a barrier of its own warps: without it,
/// the same race.
#[test]
fn the_emulator_finds_tma_stores_misused() {
    use kiln_codegen::thread::{Inst, Op};
    let case = case("gemm_f16_wgmma_m64_n64_k32_s3_w4_sm_90a");
    let run = cases::runs(&case).swap_remove(3);
    let [x, y, z] = run.grid;
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    let emulated = |program: &kiln_codegen::thread::Program| {
        emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers))
    };
    emulated(&program).unwrap();
    let top = &program.body.insts;
    let store = top
        .iter()
        .position(|i| matches!(i.op, Op::TmaStore { .. }))
        .expect("the GEMM stores C by TMA");
    let barrier = top[..store]
        .iter()
        .rposition(|i| matches!(i.op, Op::Barrier))
        .expect("a barrier before the store");
    let mut unordered = program.clone();
    unordered.body.insts.remove(barrier);
    let err = emulated(&unordered).unwrap_err();
    assert!(
        err.to_string().contains("read without a barrier between"),
        "{err}"
    );
    assert!(matches!(top[barrier - 1].op, Op::FenceProxyAsync));
    let mut unfenced = program.clone();
    unfenced.body.insts.remove(barrier - 1);
    let err = emulated(&unfenced).unwrap_err();
    assert!(
        err.to_string()
            .contains("without a fence.proxy.async before a TMA store reads it"),
        "{err}"
    );
    let mut unwaited = program.clone();
    drop_insts(&mut unwaited.body, &|op| matches!(op, Op::BulkWaitRead));
    let err = emulated(&unwaited).unwrap_err();
    assert!(
        err.to_string().contains("TMA store that may still read"),
        "{err}"
    );
    // The first element the store reads, written again (as it was) right after the store.
    let mut overwritten = program.clone();
    let mut written = None;
    for inst in &top[barrier - 3..barrier - 1] {
        if let Op::StoreVector { ptr, values, pred } = &inst.op {
            written = Some((*ptr, values.clone(), *pred));
        }
    }
    let (ptr, values, pred) = written.expect("the tile's last write before the barrier");
    let last_store = top
        .iter()
        .rposition(|i| matches!(i.op, Op::TmaStore { .. }))
        .unwrap();
    overwritten.body.insts.insert(
        last_store + 1,
        Inst {
            results: Vec::new(),
            op: Op::StoreVector { ptr, values, pred },
            loc: None,
        },
    );
    let err = emulated(&overwritten).unwrap_err();
    assert!(
        err.to_string()
            .contains("while a TMA store of thread 0 may still read it"),
        "{err}"
    );

    let (program, emulated) = two_warpgroup_gemm();
    let bands = |op: &Op| matches!(op, Op::NamedBarrier { threads: 128, .. });
    let mut stores = 0;
    edit_ops(&mut program.clone().body, &mut |op| {
        stores += usize::from(matches!(op, Op::TmaStore { .. }));
    });
    assert_eq!(
        stores, 2,
        "two slabs, each warpgroup's band by its own lane\n{program}"
    );
    let mut unordered = program.clone();
    drop_insts(&mut unordered.body, &bands);
    assert_ne!(
        unordered, program,
        "no barrier of one warpgroup before the stores"
    );
    let err = emulated(&unordered).unwrap_err();
    assert!(
        err.to_string().contains("read without a barrier between"),
        "{err}"
    );
}

/// On `mma.sync` the GEMM's C goes out through the drained loop's buffers: the block meets
/// before writing them (other warps may still read the last tiles there) and again before
/// reading the tile back; without either barrier the emulator finds the race (on a run whose
/// last iteration reads a buffer C's tile covers).
#[test]
fn the_emulator_finds_a_store_through_the_buffers_unordered() {
    use kiln_codegen::thread::Op;
    let case = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm80)).unwrap();
    let top = &program.body.insts;
    let drained = top
        .iter()
        .rposition(|i| matches!(i.op, Op::CpAsyncWait { pending: 0 }))
        .expect("the K loop drains its copies");
    let barriers: Vec<usize> = (drained..top.len())
        .filter(|&i| matches!(top[i].op, Op::Barrier))
        .collect();
    assert_eq!(barriers.len(), 2, "{program}");
    // The run whose K loop goes round 7 times: its last tiles are in the first buffers.
    let run = cases::runs(&case)
        .into_iter()
        .find(|r| r.label.starts_with("65x64x200"))
        .expect("a run of 7 K steps");
    let [x, y, z] = run.grid;
    let emulated = |program: &kiln_codegen::thread::Program| {
        emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers))
    };
    emulated(&program).unwrap();
    for barrier in barriers {
        let mut unordered = program.clone();
        unordered.body.insts.remove(barrier);
        let err = emulated(&unordered).unwrap_err();
        assert!(err.to_string().contains("race: shared byte"), "{err}");
    }
}

/// The fused backward's dK/dV adds each query tile's dQ by TMA (`cp.reduce.async.bulk.tensor`)
/// on sm_90a, from the tile its reductions share, instead of with per-thread atomics:
/// query-major in one warpgroup (64 x 64 at D128) by one lane of the block, a slab at a time;
/// key-major in two warpgroups (64 x 128, the table's), dQ transposed (`dQ^T = K^T dS^T`)
/// through a transposed view of the accumulator, each warpgroup its own slabs; or by turns,
/// `dQ = dS K` whole by the warpgroup whose turn it is, which adds its slabs (a `dot` of one
/// warpgroup), with a producer or without. All agree with the interpreter where the query
/// loop goes round (40 x 555, two query heads a key/value head); a reduction that does not
/// wait for the last one's reads before its tile is written again is an error in the
/// emulator, and so is dQ by turns computed by both warpgroups or by neither.
#[test]
fn the_fused_backward_adds_dq_by_tma() {
    use kiln_codegen::thread::Op;
    let p = fused_d128_params();
    let one_warpgroup = KernelConfig::new(64, 64, 4, 2).on_wgmma();
    let two_warpgroups = KernelConfig::new(64, 128, 8, 2).on_wgmma();
    // dQ by turns: the shipped configuration's, with and without its producer.
    let shipped = p.config(Target::Sm90a).unwrap().dkdv;
    let by_turns = [
        two_warpgroups.with_dq_by_turns(),
        shipped.with_dq_by_turns(),
    ];
    // (config, reductions issued in the loop: 4 slabs by one lane, 2 by each warpgroup's, or
    // 4 by the lane of the warpgroup whose turn it is)
    let configs = [(one_warpgroup, 4), (two_warpgroups, 2)];
    for (config, slabs) in configs.into_iter().chain(by_turns.map(|c| (c, 4))) {
        let case = call_case(&p, AttentionKernel::DkDv, Target::Sm90a, config);
        let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
        let (mut reductions, mut atomics) = (0, 0);
        let mut body = program.body.clone();
        for_each_block(&mut body, &mut |inner| {
            edit_ops(inner, &mut |op| {
                reductions += usize::from(matches!(op, Op::TmaStore { add: true, .. }));
            })
        });
        edit_ops(&mut body, &mut |op| {
            atomics += usize::from(matches!(op, Op::AtomicAdd { .. }));
        });
        assert_eq!(
            (reductions, atomics),
            (slabs, 0),
            "{config}: dQ's 64 x 128 f32 tile by TMA in its loop, 32-column slabs, no atomics"
        );
        assert_emulator_agrees(&case, &config.to_string());
        let run = cases::runs(&case)
            .into_iter()
            .find(|r| r.label.contains("555"))
            .expect("the 40 x 555 run");
        let [x, y, z] = run.grid;
        let mut unwaited = program.clone();
        for_each_block(&mut unwaited.body, &mut |inner| {
            drop_insts(inner, &|op| matches!(op, Op::BulkWaitRead))
        });
        assert_ne!(unwaited, program, "a wait for the last reduction's reads");
        let err =
            emulate::run(&unwaited, Grid::new(x, y, z), &run.host_args(&run.buffers)).unwrap_err();
        assert!(
            err.to_string().contains("may still read it"),
            "{config}: {err}"
        );
        if !config.dq_by_turns {
            continue;
        }
        // dQ by the warpgroup whose turn it is: by both, or by neither, it is wrong.
        let adds = |block: &kiln_codegen::thread::Block| {
            block
                .insts
                .iter()
                .any(|i| matches!(i.op, Op::TmaStore { add: true, .. }))
        };
        for both in [true, false] {
            let mut edited = program.clone();
            edit_ops(&mut edited.body, &mut |op| {
                if let Op::If {
                    then_block,
                    else_block,
                    ..
                } = op
                    && adds(then_block)
                {
                    match both {
                        true => *else_block = then_block.clone(),
                        false => *then_block = else_block.clone(),
                    }
                }
            });
            assert_ne!(edited, program, "dQ in a branch of its warpgroup's");
            let wrong = match emulate_program(&case, &run, &edited) {
                Ok(outcome) => outcome.mismatches > 0,
                Err(_) => true,
            };
            assert!(
                wrong,
                "{config}: dQ by both warpgroups ({both}) or neither passed"
            );
        }
        // Without the other warpgroup's arrival, the owner reads its staged dS^T unordered.
        let mut unmet = program.clone();
        drop_insts(&mut unmet.body, &|op| {
            matches!(
                op,
                Op::NamedBarrier {
                    wait: false,
                    pred: Some(_),
                    ..
                }
            )
        });
        assert_ne!(unmet, program, "the other warpgroup arrives for the owner");
        let err = emulate_program(&case, &run, &unmet).unwrap_err();
        assert!(err.to_string().contains("race"), "{config}: {err}");
    }
}

/// Split-K products of one warpgroup's 64 rows in a program of two warpgroups, each added into
/// C by TMA (`dot`s of one warpgroup): the K loop's by turns, in a loop over `rounds`, whose
/// every round starts the turns afresh; and one more after the loops.
#[kernel]
fn split_k_by_turns(
    a: Ptr<f16>,
    b: Ptr<f16>,
    c: Ptr<f32>,
    m: i32,
    k: i32,
    a_row_stride: i64,
    rounds: i32,
) {
    for _ in 0..rounds {
        let mut a_block = make_block_ptr(a, [m, k], [a_row_stride, 1], [0, 0], [64, 32], [1, 0]);
        let mut b_block = make_block_ptr(b, [k, 64], [64, 1], [0, 0], [32, 64], [1, 0]);
        for _ in (0..k).step_by(32) {
            let c_block = make_block_ptr(c, [m, 64], [64, 1], [0, 0], [64, 64], [1, 0]);
            atomic_add(
                c_block,
                dot(load(a_block, [0, 1]), load(b_block, [0, 1])),
                [0, 1],
            );
            a_block = advance(a_block, [0, 32]);
            b_block = advance(b_block, [32, 0]);
        }
    }
    let a_block = make_block_ptr(a, [m, k], [a_row_stride, 1], [0, 0], [64, 32], [1, 0]);
    let b_block = make_block_ptr(b, [k, 64], [64, 1], [0, 0], [32, 64], [1, 0]);
    let c_block = make_block_ptr(c, [m, 64], [64, 1], [0, 0], [64, 64], [1, 0]);
    atomic_add(
        c_block,
        dot(load(a_block, [0, 1]), load(b_block, [0, 1])),
        [0, 1],
    );
}

/// `dot`s of one warpgroup whose operands TMA loads: their sums agree with f64 (3 rounds of
/// a K loop of 5 steps, one more product after them); each is issued in a branch of one
/// warpgroup, and the block meets after each K loop and after the last product, so that the
/// owners' barriers start afresh.
#[test]
fn dots_of_one_warpgroup_take_turns_in_loops_and_meet_after_them() {
    use kiln_codegen::thread::{Block, Op};
    let kernel = split_k_by_turns::build(&Spec::new()).unwrap();
    let options = ["a", "b", "c"]
        .into_iter()
        .fold(
            CompileOptions::new(Target::Sm90a, 8)
                .with_stages(2)
                .with_wgmma(true),
            |options, name| options.with_divisibility(name, 16),
        )
        .with_divisibility("a_row_stride", 8)
        .with_divisibility("k", 32);
    let program = thread_program(&kernel, &options).unwrap();
    let (rounds, k) = (3, 160);
    let value = |i: usize, salt: usize| ((i * salt % 11) as f64 - 5.0) / 8.0;
    let a: Vec<f64> = (0..64 * k).map(|i| value(i, 3)).collect();
    let b: Vec<f64> = (0..k * 64).map(|i| value(i, 7)).collect();
    let product = |depth: usize, r: usize, col: usize| -> f64 {
        (0..depth).map(|i| a[r * k + i] * b[i * 64 + col]).sum()
    };
    let expected: Vec<f64> = (0..64 * 64)
        .map(|i| rounds as f64 * product(k, i / 64, i % 64) + product(32, i / 64, i % 64))
        .collect();
    let (a, b) = (HostBuffer::from_f64(F16, &a), HostBuffer::from_f64(F16, &b));
    let c = HostBuffer::zeros(F32, 64 * 64);
    let args = [
        KernelArg::Buffer(&a),
        KernelArg::Buffer(&b),
        KernelArg::Buffer(&c),
        KernelArg::I32(64),
        KernelArg::I32(k as i32),
        KernelArg::I64(k as i64),
        KernelArg::I32(rounds),
    ];
    emulate::run(&program, Grid::new(1, 1, 1), &args).unwrap();
    assert_near_f64(&c, &expected, "split_k_by_turns");
    // Each `wgmma` in a branch; the block's barriers after the K loop and the last product.
    fn count(block: &Block, in_branch: bool, wgmmas: &mut [usize; 2]) {
        for inst in &block.insts {
            match &inst.op {
                Op::Wgmma { .. } => wgmmas[usize::from(in_branch)] += 1,
                Op::For { body, .. } => count(body, in_branch, wgmmas),
                Op::If {
                    then_block,
                    else_block,
                    ..
                } => {
                    count(then_block, true, wgmmas);
                    count(else_block, true, wgmmas);
                }
                _ => {}
            }
        }
    }
    let mut wgmmas = [0, 0];
    count(&program.body, false, &mut wgmmas);
    assert_eq!(wgmmas[0], 0, "{program}");
    assert!(wgmmas[1] >= 2, "{program}");
    // A barrier of the block after `inst` in `block` (where `after` finds it).
    let meets_after = |block: &Block, after: &dyn Fn(&Op) -> bool| {
        let at = block.insts.iter().rposition(|i| after(&i.op));
        at.is_some_and(|at| {
            block.insts[at + 1..].iter().any(|i| match i.op {
                Op::Barrier => true,
                Op::NamedBarrier {
                    threads,
                    wait,
                    pred,
                    ..
                } => wait && pred.is_none() && threads == 256,
                _ => false,
            })
        })
    };
    let rounds_body = program
        .body
        .insts
        .iter()
        .find_map(|i| match &i.op {
            Op::For { body, .. } => Some(body),
            _ => None,
        })
        .expect("the rounds' loop");
    assert!(
        meets_after(rounds_body, &|op| matches!(op, Op::For { .. })),
        "after the K loop: {program}"
    );
    assert!(
        meets_after(&program.body, &|op| matches!(op, Op::If { .. })),
        "after the last product: {program}"
    );
}

/// A TMA buffer is copied into again only after every thread arrived on its `empty` barrier:
/// without the arrivals the copier waits forever, and without its wait the copy races the
/// other warpgroup's reads (the GEMM of two warpgroups, its K loop on three stages).
#[test]
fn the_emulator_finds_empty_barriers_misused() {
    use kiln_codegen::thread::Op;
    let (program, emulated) = two_warpgroup_gemm();
    emulated(&program).unwrap();
    let mut no_arrivals = program.clone();
    drop_insts(&mut no_arrivals.body, &|op| {
        matches!(op, Op::MbarrierArrive { .. })
    });
    let err = emulated(&no_arrivals).unwrap_err();
    assert!(
        err.to_string().contains("deadlock: waiting for phase"),
        "{err}"
    );
    let mut no_waits = program.clone();
    drop_insts(&mut no_waits.body, &|op| {
        matches!(op, Op::MbarrierWait { warps: Some(_), .. })
    });
    let err = emulated(&no_waits).unwrap_err();
    assert!(err.to_string().contains("race"), "{err}");
}

/// A producer warpgroup issues the D128 forward's copies (its table entry has one): the program
/// splits by role once, the producer's registers go to the consumers, every copy of a loop is
/// the producer's (the consumers copy only their one-shot tiles) and no barrier after the split
/// is block-wide. The emulator runs the roles apart: without the consumers' `empty` arrivals the
/// producer waits forever, and without its waits it runs a pass of the ring ahead, arriving
/// on `full` barriers whose phase the consumers have not yet waited for.
#[test]
fn a_producer_warpgroup_issues_the_forwards_copies() {
    use kiln_codegen::thread::{Block, Op, Program};
    let case = case("attention_fwd_bf16_d128_sm_90a");
    assert!(
        case.knobs.producer,
        "the D128 forward has a producer warpgroup"
    );
    // 40 x 555: five key blocks, so that the ring of buffers goes round twice.
    let run = cases::runs(&case).swap_remove(2);
    let [x, y, z] = run.grid;
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    assert_eq!(
        program.threads_per_block, 384,
        "two consumer warpgroups and the producer"
    );
    let emulated =
        |program: &Program| emulate::run(program, Grid::new(x, y, z), &run.host_args(&run.buffers));
    emulated(&program).unwrap();
    let count = |block: &Block, pick: &dyn Fn(&Op) -> bool| {
        let mut n = 0;
        edit_ops(&mut block.clone(), &mut |op| n += usize::from(pick(op)));
        n
    };
    let split = program.body.insts.iter().find_map(|i| match &i.op {
        Op::If {
            then_block,
            else_block,
            ..
        } => Some((then_block, else_block)),
        _ => None,
    });
    let (producer, consumers) = split.unwrap_or_else(|| panic!("no split by role\n{program}"));
    let copy = |op: &Op| matches!(op, Op::TmaLoad { .. });
    let gives = |op: &Op| {
        matches!(
            op,
            Op::SetMaxNreg {
                increase: false,
                ..
            }
        )
    };
    let takes = |op: &Op| matches!(op, Op::SetMaxNreg { increase: true, .. });
    assert_eq!((count(producer, &gives), count(consumers, &takes)), (1, 1));
    assert!(count(producer, &copy) > 0, "the producer copies\n{program}");
    let top_level = consumers.insts.iter().filter(|i| copy(&i.op)).count();
    assert_eq!(
        count(consumers, &copy),
        top_level,
        "only one-shot copies\n{program}"
    );
    assert_eq!(count(consumers, &|op| matches!(op, Op::Barrier)), 0);

    let mut no_arrivals = program.clone();
    drop_insts(&mut no_arrivals.body, &|op| {
        matches!(op, Op::MbarrierArrive { .. })
    });
    let err = emulated(&no_arrivals).unwrap_err();
    assert!(err.to_string().contains("deadlock"), "{err}");
    let mut no_waits = program.clone();
    drop_insts(&mut no_waits.body, &|op| {
        matches!(op, Op::MbarrierWait { warps: Some(_), .. })
    });
    let err = emulated(&no_waits).unwrap_err();
    assert!(
        err.to_string().contains("whose phase has all its arrivals"),
        "{err}"
    );
}

/// A persistent forward writes, on the interpreter, what the one-program-per-block forward
/// writes, bit for bit (the same products and sums in the same order; that one is checked against
/// f64 in `kiln-tests`): D128 causal or not and D64 without a mask (which a persistent forward
/// runs with its last block's `P @ V` apart, unlike D64's others), three query blocks of two
/// heads (six tiles; causal, four pairs of blocks, two of them a middle block alone) taken by
/// one, three (causal, a program's second pair two rounds after its first), four and six
/// programs (causal, at most four: one a pair). Outputs start poisoned: every row is written,
/// none twice differently. Its launch runs at most one program a tile, and refuses a negative
/// scale, naming it.
#[test]
fn a_persistent_forward_writes_what_one_program_per_block_does() {
    use kiln_kernels::attention::check::LayoutKind;
    let table = KernelConfig::new(128, 128, 8, 2).on_wgmma().with_producer();
    for (head_dim, causal) in [(128, false), (128, true), (64, false)] {
        let p = AttentionParams {
            heads_q: 2,
            heads_kv: 1,
            ..cases::attention_params(BF16, head_dim, causal, 300, 333)
        };
        let ql = LayoutKind::Padded.layout(p.seqlen_q, p.heads_q, p.head_dim);
        let kl = LayoutKind::Padded.layout(p.seqlen_k, p.heads_kv, p.head_dim);
        let layouts = plan::ForwardLayouts {
            q: ql,
            k: kl,
            v: kl,
            o: ql,
        };
        let q_len = ql
            .required_len("q", 1, p.seqlen_q, p.heads_q, p.head_dim)
            .unwrap();
        let k_len = kl
            .required_len("k", 1, p.seqlen_k, p.heads_kv, p.head_dim)
            .unwrap();
        let inputs = [(q_len, 31), (k_len, 32), (k_len, 33)]
            .map(|(len, seed)| cases::scaled_inputs(BF16, len, seed, 0.25));
        let forward = |config: KernelConfig, programs: Option<u32>| {
            let launch = plan::forward_with(&p, &layouts, Target::Sm90a, config).unwrap();
            let kernel = launch.kernel.build(&launch.spec).unwrap();
            let o = HostBuffer::poisoned(BF16, q_len);
            let lse = HostBuffer::poisoned(DType::F32, p.lse_len());
            let args: Vec<KernelArg<'_>> = launch
                .args
                .iter()
                .map(|arg| match *arg {
                    plan::Arg::Buffer(plan::Role::Q) => KernelArg::Buffer(&inputs[0]),
                    plan::Arg::Buffer(plan::Role::K) => KernelArg::Buffer(&inputs[1]),
                    plan::Arg::Buffer(plan::Role::V) => KernelArg::Buffer(&inputs[2]),
                    plan::Arg::Buffer(plan::Role::O) => KernelArg::Buffer(&o),
                    plan::Arg::Buffer(role) => {
                        assert_eq!(role, plan::Role::Lse);
                        KernelArg::Buffer(&lse)
                    }
                    plan::Arg::I32(v) => KernelArg::I32(v),
                    plan::Arg::I64(v) => KernelArg::I64(v),
                    plan::Arg::F32(v) => KernelArg::F32(v),
                })
                .collect();
            let [x, y, z] = match programs {
                Some(n) => launch.grid_within(n),
                None => launch.grid,
            };
            kiln_dsl::run(&kernel, Grid::new(x, y, z), &args).unwrap();
            [o, lse]
        };
        // Six tiles (causal, four pairs): a launch runs at most as many programs, and at most
        // one an SM.
        let tiles = if causal { 4 } else { 6 };
        let launch = plan::forward_with(&p, &layouts, Target::Sm90a, table.persistent()).unwrap();
        assert_eq!(launch.grid, [tiles, 1, 1]);
        assert_eq!(launch.grid_within(4), [4, 1, 1]);
        assert_eq!(launch.grid_within(132), [tiles, 1, 1]);
        // Q goes to the tensor cores as loaded: a negative scale is refused, named.
        let negative = AttentionParams {
            softmax_scale: -0.125,
            ..p
        };
        let refusal = plan::forward_with(&negative, &layouts, Target::Sm90a, table.persistent())
            .unwrap_err()
            .to_string();
        assert!(
            refusal.contains("softmax_scale = -0.125") && refusal.contains("persistent"),
            "{refusal}"
        );
        let expected = forward(table, None);
        for programs in [1, 3, 4, 6] {
            let got = forward(table.persistent(), Some(programs));
            let outcome = cases::compare(&expected, &got, cases::Tolerance::Exact);
            assert_eq!(
                outcome.mismatches, 0,
                "D{head_dim}, causal {causal}, {programs} programs: {:?}",
                outcome.first
            );
        }
    }
}

/// The thread program of a persistent forward without a mask at `head_dim`, and a run of a
/// thread program in its place in the emulator: one program over two heads' blocks.
fn persistent_forward(
    head_dim: usize,
    config: KernelConfig,
) -> (
    kiln_codegen::thread::Program,
    impl Fn(&kiln_codegen::thread::Program) -> Result<(), emulate::EmulationError>,
) {
    let case = attention_case_at(
        "attention_fwd",
        BF16,
        head_dim,
        false,
        Target::Sm90a,
        config,
    );
    let run = cases::runs(&case).swap_remove(0);
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    let emulated = move |program: &kiln_codegen::thread::Program| {
        emulate::run(program, Grid::new(1, 1, 1), &run.host_args(&run.buffers))
    };
    (program, emulated)
}

/// A persistent forward (one program looping over the query blocks of every head) has its
/// producer copy each block's Q, first K and last V tiles as well as the ring's, one block ahead:
/// in the emulator it agrees with the interpreter, causal or not, with one program looping over
/// two heads' blocks (each refilled tile's barriers through two phases; Q's two tiles by
/// turns). Without the consumers' arrivals on the refilled tiles' `empty` barriers the producer
/// waits forever; without the producer's waits on them, where a ring of four slots lets it run
/// two blocks ahead (D64), it copies over a Q tile the consumers may still read.
/// Its consumers stage no tile, so their turns run through the program: inside the loop over
/// blocks every wait on a barrier of both warpgroups is a turn taken right before a `wgmma`, none
/// a barrier of all consumers where a key loop starts or ends; without the turn given at the
/// top, they deadlock. Its output goes out by TMA from a tile of its own, a band a warpgroup.
#[test]
fn a_persistent_forward_refills_each_blocks_tiles_by_its_producer() {
    use kiln_codegen::thread::{Block, Op};
    let config = KernelConfig::new(128, 128, 8, 2)
        .on_wgmma()
        .with_producer()
        .persistent();
    for causal in [false, true] {
        let case = attention_case_at("attention_fwd", BF16, 128, causal, Target::Sm90a, config);
        for run in cases::runs(&case) {
            assert_eq!(run.grid, [1, 1, 1], "one program loops over every block");
            let outcome = emulate_run(&case, &run);
            assert_eq!(outcome.mismatches, 0, "{}: {:?}", run.label, outcome.first);
        }
    }
    let (program, emulated) = persistent_forward(128, config);
    emulated(&program).unwrap();
    // The split by role: the producer's branch, then the consumers'.
    let roles = |program: &mut kiln_codegen::thread::Program| -> (*mut Block, *mut Block) {
        let split = program.body.insts.iter_mut().find_map(|i| match &mut i.op {
            Op::If {
                then_block,
                else_block,
                ..
            } => Some((then_block as *mut Block, else_block as *mut Block)),
            _ => None,
        });
        split.expect("a split by role")
    };
    let mut apart = program.clone();
    // Safety (of the test): the pointer is into `apart`, alive and not aliased here.
    let consumers = unsafe { &mut *roles(&mut apart).1 };
    let tile_loop = consumers.insts.iter_mut().find_map(|i| match &mut i.op {
        Op::For { body, .. } => Some(body),
        _ => None,
    });
    let tile_loop = tile_loop.expect("the loop over blocks");
    let stores = tile_loop
        .insts
        .iter()
        .filter(|i| matches!(i.op, Op::TmaStore { add: false, .. }))
        .count();
    assert!(stores > 0, "O by TMA in the loop over blocks\n{program}");
    let mut waits = Vec::new();
    turn_waits(tile_loop, &mut waits);
    assert!(
        waits.len() >= 3,
        "a turn for each group of wgmmas: {waits:?}"
    );
    assert!(waits.iter().all(|&turn| turn), "{waits:?}\n{program}");
    // Without the last warpgroup's arrival at the top, warpgroup 0 never gets its first turn.
    let mut no_first_turn = program.clone();
    let consumers = unsafe { &mut *roles(&mut no_first_turn).1 };
    let first_turn = consumers.insts.iter().position(|i| {
        matches!(
            i.op,
            Op::NamedBarrier {
                wait: false,
                pred: Some(_),
                ..
            }
        )
    });
    consumers
        .insts
        .remove(first_turn.expect("the first turn given"));
    let err = emulated(&no_first_turn).unwrap_err();
    assert!(err.to_string().contains("deadlock"), "{err}");
    // Refilled tiles' `empty` waits are the producer's waits of every warp (`warps: None`);
    // the ring's name their warps. Q takes two tiles by turns, and a ring of two slots keeps
    // the producer from running two blocks ahead; one of four (at D64) does not.
    let refill_wait = |op: &Op| matches!(op, Op::MbarrierWait { warps: None, .. });
    let deep = KernelConfig::new(128, 128, 8, 4)
        .on_wgmma()
        .with_producer()
        .persistent();
    let (program, emulated) = persistent_forward(64, deep);
    emulated(&program).unwrap();
    let mut no_waits = program.clone();
    // Safety (of the test): the pointers are into `no_waits`, alive and not aliased here.
    let producer = unsafe { &mut *roles(&mut no_waits).0 };
    drop_insts(producer, &refill_wait);
    let err = emulated(&no_waits).unwrap_err();
    assert!(
        err.to_string().contains("whose phase has all its arrivals"),
        "{err}"
    );
    let mut no_arrivals = program.clone();
    let consumers = unsafe { &mut *roles(&mut no_arrivals).1 };
    // The consumers' arrivals outside the key loops: the refilled tiles' only.
    consumers
        .insts
        .retain(|i| !matches!(i.op, Op::MbarrierArrive { .. }));
    for inst in &mut consumers.insts {
        if let Op::For { body, .. } = &mut inst.op {
            body.insts
                .retain(|i| !matches!(i.op, Op::MbarrierArrive { .. }));
        }
    }
    let err = emulated(&no_arrivals).unwrap_err();
    assert!(err.to_string().contains("deadlock"), "{err}");
}

/// A producer warpgroup feeds TMA loops nested in other loops, the ring's slot and phase
/// carried through them: dK/dV's query loop inside its loop over a group's query heads (two
/// sharing a key/value head at 40 x 555) agrees with the interpreter in the emulator.
#[test]
fn a_producer_warpgroup_feeds_loops_nested_in_loops() {
    let config = KernelConfig::new(64, 128, 8, 2).on_wgmma().with_producer();
    let case = attention_case_at("attention_bwd_dkdv", BF16, 64, false, Target::Sm90a, config);
    assert_emulator_agrees(&case, "");
}

/// A producer warpgroup is refused, naming why, where it cannot feed the kernel: one consumer
/// warpgroup would not take the registers it gives, and `mma.sync` has no TMA loop.
#[test]
fn a_producer_warpgroup_is_refused_where_it_cannot_feed() {
    let refusal = |name: &str, config: KernelConfig, wgmma: bool| {
        let case = attention_case_at(name, BF16, 128, false, Target::Sm90a, config);
        let options = case_options(&case, Target::Sm90a).with_wgmma(wgmma);
        compile(&case.kernel, &options).unwrap_err().to_string()
    };
    let producer = |m, n, warps| KernelConfig::new(m, n, warps, 2).on_wgmma().with_producer();
    let one = refusal("attention_fwd", producer(64, 64, 4), true);
    assert!(
        one.contains("two or more consumer warpgroups (8 warps or more), got 4"),
        "{one}"
    );
    let no_wgmma = refusal("attention_fwd", producer(128, 128, 8), false);
    assert!(no_wgmma.contains("needs wgmma"), "{no_wgmma}");
    let uniform = KernelConfig::new(128, 128, 8, 2).with_uniform_warpgroup();
    let uniform = refusal("attention_fwd", uniform, false);
    assert!(
        uniform.contains("a uniform warpgroup index is for wgmma descriptors: it needs wgmma"),
        "{uniform}"
    );
    let at_issue = KernelConfig::new(128, 128, 8, 2).with_descriptors_at_issue();
    let at_issue = refusal("attention_fwd", at_issue, false);
    assert!(
        at_issue.contains("descriptors at issue are wgmma's: they need wgmma"),
        "{at_issue}"
    );
}

/// `descriptors_at_issue` (the fused D128 dK/dV's table entry): every `wgmma` statement gets
/// its descriptors as their tiles' bases and adds each instruction's offset itself, so the
/// thread program has no descriptor additions of its own and the PTX adds in the statements;
/// without it the offsets are LLVM's additions (which LLVM hoists out of the loop: 196 bytes of
/// spills there, docs/PERF.md, nineteenth session). The emulator agrees with the interpreter
/// on it (as on every shipped kernel).
#[test]
fn descriptors_at_issue_are_added_in_the_wgmma_statement() {
    let p = fused_d128_params();
    let table = p.config(Target::Sm90a).unwrap().dkdv;
    assert!(table.descriptors_at_issue, "{table}");
    let with = call_case(&p, AttentionKernel::DkDv, Target::Sm90a, table);
    let without_config = KernelConfig {
        descriptors_at_issue: false,
        ..table
    };
    let without = call_case(&p, AttentionKernel::DkDv, Target::Sm90a, without_config);
    // Descriptors with an offset in the thread program's `wgmma`s (`%base+offset`).
    let offsets = |case: &cases::Case| {
        let program = thread_program(&case.kernel, &case_options(case, Target::Sm90a)).unwrap();
        program
            .to_string()
            .lines()
            .filter(|l| l.contains("wgmma.m64"))
            .map(|l| {
                l.match_indices('+')
                    .filter(|&(i, _)| l[i + 1..].starts_with(|c: char| c.is_ascii_digit()))
                    .count()
            })
            .sum::<usize>()
    };
    assert!(offsets(&with) > 0);
    assert_eq!(offsets(&without), 0);
    let adds = |case: &cases::Case| {
        let ptx = compile(&case.kernel, &case_options(case, Target::Sm90a)).unwrap();
        ptx.ptx().matches("mov.b64 desc").count()
    };
    assert!(adds(&with) > 0);
    assert_eq!(adds(&without), 0);
    assert_emulator_agrees(&with, "");
}

/// `partial_sums`: the forward's row sum `l = l * alpha + sum(p, 1)` keeps each lane's partial
/// sum through its key loops, whose shuffles of f32 (the innermost ones in the program) are then
/// the row max's alone, half as many; `store_rows` totals it once a block, its comparison and
/// its division sharing the total. The persistent D64 and D128 forwards (`wgmma`, a producer)
/// also sum their first block before the loops partially: 8 shuffles fewer in all (3 sums of 2
/// rows x 2 lane bits, less the total); the sm_80 D64 one (`mma.sync`, 4 rows a thread, one
/// loop) as many as before, its loop's 8 now after it. The emulator agrees with the interpreter
/// on each.
#[test]
fn a_row_sum_kept_as_partial_sums_is_shuffled_only_where_it_is_read_whole() {
    // (all, in the innermost loops): f32 butterflies, by the program text's indentation.
    let shuffles = |case: &cases::Case| {
        let program = thread_program(&case.kernel, &case_options(case, case.target)).unwrap();
        let text = program.to_string();
        let depths: Vec<usize> = text
            .lines()
            .filter(|l| l.contains("shfl.sync.bfly") && l.ends_with(": f32"))
            .map(|l| l.len() - l.trim_start().len())
            .collect();
        let deepest = depths.iter().copied().max().unwrap_or(0);
        (
            depths.len(),
            depths.iter().filter(|&&d| d == deepest).count(),
        )
    };
    for (head_dim, target, fewer) in [
        (64, Target::Sm90a, 8),
        (128, Target::Sm90a, 8),
        (64, Target::Sm80, 0),
    ] {
        // Each of these entries takes it (the table).
        let table = attention_config("attention_fwd", head_dim, false, target);
        assert!(table.partial_sums, "{table}");
        let whole = KernelConfig {
            partial_sums: false,
            ..table
        };
        let without = attention_case_at("attention_fwd", BF16, head_dim, false, target, whole);
        let partial = table.with_partial_sums();
        let with = attention_case_at("attention_fwd", BF16, head_dim, false, target, partial);
        let ((before, before_loops), (after, after_loops)) = (shuffles(&without), shuffles(&with));
        assert_eq!(
            (before - after, before_loops),
            (fewer, 2 * after_loops),
            "D{head_dim} {target}: {before} ({before_loops} in loops) -> {after} ({after_loops})"
        );
        assert_emulator_agrees(&with, &format!("D{head_dim} {target}"));
    }
}

/// `resident_a` (the long D64 forward's table entry): a `wgmma`'s A operand that its loop does
/// not define is loaded into registers by `ldmatrix` once, before each loop (and at the `dot`
/// outside any loop), and every `wgmma` of the scores takes A from registers; without it none
/// loads A at all. One defined in its loop stays a descriptor: the fused D128 dK/dV's dS^T,
/// while its K and V (A of S^T and dP^T, the query loop's invariants) go to registers. After
/// each loop a use that never runs keeps the registers live for ptxas (which gave them away
/// inside the loop without it: the GPU cases' `_resident_a` dQ kernels). The emulator agrees
/// with the interpreter on each, the persistent D128 forward included (its Q copied by the
/// producer's TMA, read by `ldmatrix` from that tile; docs/PERF.md, twenty-fourth session).
#[test]
fn a_resident_a_operand_is_loaded_once_before_its_loops() {
    let seqlen = KeyLength::Long.example_seqlen(false);
    let long = cases::attention_params(BF16, 64, false, seqlen, seqlen);
    let table = long.config(Target::Sm90a).unwrap().forward;
    assert!(table.resident_a, "{table}");
    let with = call_case(&long, AttentionKernel::Forward, Target::Sm90a, table);
    let without_config = KernelConfig {
        resident_a: false,
        ..table
    };
    let without = call_case(
        &long,
        AttentionKernel::Forward,
        Target::Sm90a,
        without_config,
    );
    let layout_text = |case: &cases::Case| {
        compile(&case.kernel, &case_options(case, Target::Sm90a))
            .unwrap()
            .stage(Stage::Layout)
            .unwrap()
            .to_string()
    };
    let ptx = |case: &cases::Case| compile_case(case).ptx().to_string();
    // Three loads of Q (the first block's scores, then before each of the two key loops), four
    // `ldmatrix.x4` a warp each; the scores' `wgmma`s read no A descriptor.
    let (with_ptx, without_ptx) = (ptx(&with), ptx(&without));
    assert_eq!(with_ptx.matches("ldmatrix").count(), 12);
    assert_eq!(without_ptx.matches("ldmatrix").count(), 0);
    // A `wgmma` with A from shared memory ends in scale-d, both scales and both transposes.
    let by_descriptor = |ptx: &str| {
        ptx.lines()
            .filter(|l| l.starts_with("wgmma.mma_async"))
            .filter(|l| {
                let flags: Vec<&str> = l.trim_end_matches(';').rsplit(", ").take(5).collect();
                flags.len() == 5 && flags[..4].iter().all(|f| *f == "0" || *f == "1")
            })
            .count()
    };
    assert_eq!(by_descriptor(&with_ptx), 0);
    assert!(by_descriptor(&without_ptx) > 0);
    // After each key loop a store of its 16 registers that never runs keeps ptxas from giving
    // them away inside the loop (four `v4` stores a loop).
    assert_eq!(with_ptx.matches("@never st.shared.v4.b32").count(), 8);
    assert_eq!(without_ptx.matches("@never").count(), 0);
    let hoisted = layout_text(&with);
    assert_eq!(
        hoisted
            .matches("in registers converted before the loop")
            .count(),
        2,
        "{hoisted}"
    );
    // The fused D128 dK/dV: K and V before the query loop, dS^T by descriptor.
    let fused = fused_d128_params();
    let dkdv = KernelConfig {
        resident_a: true,
        ..fused.config(Target::Sm90a).unwrap().dkdv
    };
    let fused_case = call_case(&fused, AttentionKernel::DkDv, Target::Sm90a, dkdv);
    let text = layout_text(&fused_case);
    assert_eq!(
        text.matches("in registers converted before the loop")
            .count(),
        2,
        "{text}"
    );
    let fused_ptx = ptx(&fused_case);
    assert!(by_descriptor(&fused_ptx) > 0);
    // The persistent D128 forward, Q in registers from the producer's tile.
    let d128 = attention_config("attention_fwd", 128, false, Target::Sm90a);
    let persistent = KernelConfig {
        resident_a: true,
        ..d128
    };
    let persistent_case =
        attention_case_at("attention_fwd", BF16, 128, false, Target::Sm90a, persistent);
    let text = layout_text(&persistent_case);
    assert_eq!(
        text.matches("in registers converted before the loop")
            .count(),
        2,
        "{text}"
    );
    let dq = KernelConfig {
        resident_a: true,
        ..attention_config("attention_bwd_dq", 64, false, Target::Sm90a)
    };
    let dq_case = attention_case_at("attention_bwd_dq", BF16, 64, false, Target::Sm90a, dq);
    for case in [&dq_case, &with, &fused_case, &persistent_case] {
        assert_emulator_agrees(case, &case.name);
    }
    let refused = compile(
        &with.kernel,
        &CompileOptions::new(Target::Sm90a, 4).with_resident_a(true),
    )
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("A operands in registers are wgmma's"),
        "{refused}"
    );
}

/// A `dot` whose accumulator is zeros issues its first `wgmma` with `scale-d` false, reading no
/// accumulator, and sets no register to zero for it: in the forward the scores do (`=`), the
/// accumulating `P @ V` does not (`+=`), and the PTX passes the scores' accumulators in
/// undefined (no `mov.f32` of a zero before their statement; the fused D128 dK/dV had 64 such
/// moves an iteration, docs/PERF.md, nineteenth session).
#[test]
fn a_zero_accumulator_is_not_read_by_wgmma() {
    let case = attention_case("attention_fwd", BF16, 128, false, Target::Sm90a);
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm90a)).unwrap();
    let text = program.to_string();
    let wgmmas: Vec<&str> = text.lines().filter(|l| l.contains("wgmma.m64")).collect();
    let scores = wgmmas.iter().filter(|l| l.contains("} = ")).count();
    let products = wgmmas.iter().filter(|l| l.contains("} += ")).count();
    assert!(
        scores > 0 && products > 0,
        "{scores} scores, {products} products"
    );
    let ptx = compile_case(&case);
    let ptx = ptx.ptx();
    assert_eq!(
        ptx.matches("setp.eq.b32 z,").count(),
        scores,
        "one false scale-d a statement of zeros"
    );
    let statements: Vec<&str> = ptx.split("// begin inline asm").collect();
    for pair in statements.windows(2) {
        if pair[1].contains(", z, 1, 1") {
            let filled = pair[0].lines().rev().take(8).any(|l| l.contains("mov.f32"));
            assert!(!filled, "zeros set before {}", pair[1]);
        }
    }
}

/// `uniform_warpgroup` takes the warpgroup index of the `wgmma` descriptors of A from lane 0:
/// one `shfl.sync.idx` of `tid / 128` in the program's prelude, which the descriptors then
/// derive from, and nothing else changes: the D128 forward's table entry (which has it) in the
/// emulator writes what the interpreter does, and the same kernel without it differs from it
/// only by that broadcast and what derives from it (ptxas keeps such descriptors in uniform
/// registers: no `R2UR` before each `wgmma`, docs/PERF.md, seventeenth session).
#[test]
fn a_uniform_warpgroup_index_feeds_the_wgmma_descriptors() {
    let table = attention_config("attention_fwd", 128, false, Target::Sm90a);
    assert!(table.uniform_warpgroup, "{table}");
    let with = attention_case_at("attention_fwd", BF16, 128, false, Target::Sm90a, table);
    let without_config = KernelConfig {
        uniform_warpgroup: false,
        ..table
    };
    let without = attention_case_at(
        "attention_fwd",
        BF16,
        128,
        false,
        Target::Sm90a,
        without_config,
    );
    let broadcasts = |case: &cases::Case| {
        let program = thread_program(&case.kernel, &case_options(case, Target::Sm90a)).unwrap();
        program.to_string().matches("shfl.sync.idx").count()
    };
    assert_eq!(broadcasts(&with), broadcasts(&without) + 1);
    let runs = cases::runs(&with);
    assert!(!runs.is_empty());
    for run in runs {
        let outcome = emulate_run(&with, &run);
        assert_eq!(outcome.mismatches, 0, "{}: {:?}", run.label, outcome.first);
    }
}

/// A lean producer keeps 24 registers and leaves two consumer warpgroups 240
/// (FlashAttention-3's split): the fused D128 dK/dV's table entry, whose `wgmma`s ptxas
/// serializes at the usual 232 (C7512, which [`ptxas_assembles_every_kernel_within_its_spill_budget`]
/// refuses) and not at 240. Without a producer the option is refused by name.
#[test]
fn a_lean_producer_leaves_two_consumer_warpgroups_240_registers() {
    let eight = CompileOptions::new(Target::Sm90a, 8)
        .with_wgmma(true)
        .with_producer(true)
        .with_lean_producer(true);
    let split = eight.register_split().expect("a producer");
    assert_eq!(
        (split.launch, split.producer, split.consumer),
        (168, 24, 240)
    );
    let p = fused_d128_params();
    let table = p.config(Target::Sm90a).unwrap().dkdv;
    assert!(table.producer && table.lean_producer, "{table}");
    let lean = call_case(&p, AttentionKernel::DkDv, Target::Sm90a, table);
    let options = case_options(&lean, Target::Sm90a);
    let ptx = compile(&lean.kernel, &options).unwrap().ptx().to_string();
    assert!(ptx.contains("setmaxnreg.dec.sync.aligned.u32 24;"), "{ptx}");
    assert!(
        ptx.contains("setmaxnreg.inc.sync.aligned.u32 240;"),
        "{ptx}"
    );
    let err = compile(&lean.kernel, &options.clone().with_producer(false))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a lean producer") && err.contains("needs a producer"),
        "{err}"
    );
    if let Some(ptxas) = ptxas() {
        let serialized = |options: &CompileOptions, name: &str| {
            let ptx = compile(&lean.kernel, options).unwrap();
            let report = assemble(&ptxas, ptx.ptx(), name, "sm_90a").unwrap();
            report.contains("wgmma.mma_async instructions are serialized")
        };
        assert!(!serialized(&options, "lean_producer_240"));
        assert!(serialized(
            &options.clone().with_lean_producer(false),
            "producer_232"
        ));
    }
}

/// A producer feeds four consumer warpgroups (the D64 forward's long blocks, 256 x 64 of 16
/// warps): 640 threads launch with 96 registers each (what ptxas gives them, where it runs),
/// the producer keeps 40 and the consumers take what it gives back, 104, not more. The emulator
/// agrees with the interpreter on it, and finds the split that hung on the GPU (consumers
/// asking 120, docs/PERF.md, eleventh session) a deadlock on the block's register pool.
#[test]
fn a_producer_warpgroup_gives_four_consumer_warpgroups_only_what_it_has() {
    use kiln_codegen::thread::Op;
    let config = KernelConfig::new(256, 64, 16, 2).on_wgmma().with_producer();
    let case = attention_case_at("attention_fwd", BF16, 64, false, Target::Sm90a, config);
    let options = case_options(&case, Target::Sm90a);
    let split = options.register_split().expect("a producer");
    assert_eq!(
        (split.launch, split.producer, split.consumer),
        (96, 40, 104)
    );
    let eight = CompileOptions::new(Target::Sm90a, 8)
        .with_wgmma(true)
        .with_producer(true);
    let split = eight.register_split().expect("a producer");
    assert_eq!(
        (split.launch, split.producer, split.consumer),
        (168, 40, 232)
    );
    let program = thread_program(&case.kernel, &options).unwrap();
    assert_emulator_agrees(&case, "");
    let run = cases::runs(&case).swap_remove(0);
    let [x, y, z] = run.grid;
    let mut greedy = program.clone();
    edit_ops(&mut greedy.body, &mut |op| {
        if let Op::SetMaxNreg {
            increase: true,
            regs,
        } = op
        {
            *regs = 120;
        }
    });
    let err = emulate::run(&greedy, Grid::new(x, y, z), &run.host_args(&run.buffers))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("deadlock") && err.contains("setmaxnreg.inc 120"),
        "{err}"
    );
    if let Some(ptxas) = ptxas() {
        let compiled = compile(&case.kernel, &options).unwrap();
        let report = assemble(&ptxas, compiled.ptx(), "producer_w16", "sm_90a").unwrap();
        assert_eq!(registers(&report), 96, "{report}");
    }
}

/// The two warpgroups of the GEMM take turns issuing their `wgmma`s on named barriers; the
/// emulator replays every warp's waits apart and finds each way to get the turns wrong: no
/// first turn for warpgroup 0, a turn passed back to oneself, a block-wide barrier inside a
/// turn (all deadlocks), and the last turn never taken back.
#[test]
fn the_emulator_finds_turns_misused() {
    use kiln_codegen::thread::{Block, Inst, Op};
    // A turn counts two warpgroups (the GEMM's TMA store meets one on a barrier of its own).
    const TURN: u32 = 256;
    let (program, emulated) = two_warpgroup_gemm();
    emulated(&program).unwrap();
    let mut turns = Vec::new();
    edit_ops(&mut program.clone().body, &mut |op| {
        if let Op::NamedBarrier {
            wait,
            pred,
            threads: TURN,
            ..
        } = op
        {
            turns.push((*wait, pred.is_some()));
        }
    });
    // (wait, predicated): the first turn given, each iteration's taken and passed, the last
    // taken back.
    turns.sort();
    assert_eq!(
        turns,
        [(false, false), (false, true), (true, false), (true, true)],
        "{program}"
    );
    let deadlock = "deadlock once warps run apart";

    let mut no_first_turn = program.clone();
    drop_insts(&mut no_first_turn.body, &|op| {
        matches!(
            op,
            Op::NamedBarrier {
                wait: false,
                pred: Some(_),
                ..
            }
        )
    });
    let err = emulated(&no_first_turn).unwrap_err();
    assert!(err.to_string().contains(deadlock), "{err}");

    let mut not_taken_back = program.clone();
    drop_insts(&mut not_taken_back.body, &|op| {
        matches!(
            op,
            Op::NamedBarrier {
                wait: true,
                pred: Some(_),
                ..
            }
        )
    });
    let err = emulated(&not_taken_back).unwrap_err();
    assert!(
        err.to_string()
            .contains("ends with named barrier 1 at 128 of 256 threads arrived"),
        "{err}"
    );

    let mut own = None;
    edit_ops(&mut program.clone().body, &mut |op| {
        if let Op::NamedBarrier {
            id,
            wait: true,
            pred: None,
            threads: TURN,
        } = op
        {
            own = Some(*id);
        }
    });
    let mut passed_to_self = program.clone();
    edit_ops(&mut passed_to_self.body, &mut |op| {
        if let Op::NamedBarrier {
            id,
            wait: false,
            pred: None,
            threads: TURN,
        } = op
        {
            *id = own.expect("a turn taken");
        }
    });
    let err = emulated(&passed_to_self).unwrap_err();
    assert!(err.to_string().contains(deadlock), "{err}");

    fn barrier_in_turn(block: &mut Block) {
        let taken = block.insts.iter().position(|i| {
            matches!(
                i.op,
                Op::NamedBarrier {
                    wait: true,
                    pred: None,
                    threads: TURN,
                    ..
                }
            )
        });
        if let Some(at) = taken {
            let loc = block.insts[at].loc;
            let barrier = Inst {
                results: Vec::new(),
                op: Op::Barrier,
                loc,
            };
            block.insts.insert(at + 1, barrier);
        }
        for_each_block(block, &mut barrier_in_turn);
    }
    let mut waits_in_turn = program.clone();
    barrier_in_turn(&mut waits_in_turn.body);
    let err = emulated(&waits_in_turn).unwrap_err();
    assert!(err.to_string().contains(deadlock), "{err}");
}

/// A GEMM of two warpgroups whose A tile is doubled in registers and staged for its `wgmma`s
/// every iteration: the body writes shared memory, so its loop keeps a barrier at its top
/// though its buffers are freed on `empty` barriers.
#[kernel]
fn gemm_of_doubled_a(
    a: Ptr<f16>,
    b: Ptr<f16>,
    c: Ptr<f32>,
    k: i32,
    a_row_stride: i64,
    b_row_stride: i64,
) {
    let mut a_block = make_block_ptr(a, [128, k], [a_row_stride, 1], [0, 0], [128, 32], [1, 0]);
    let mut b_block = make_block_ptr(b, [k, 64], [b_row_stride, 1], [0, 0], [32, 64], [1, 0]);
    let mut acc = zeros([128, 64], f32);
    for _ in (0..k).step_by(32) {
        let doubled = (load(a_block, [0, 1]).to::<f32>() * 2.0).to::<f16>();
        acc = dot(doubled, load(b_block, [0, 1]), acc);
        a_block = advance(a_block, [0, 32]);
        b_block = advance(b_block, [32, 0]);
    }
    let c_block = make_block_ptr(c, [128, 64], [64, 1], [0, 0], [128, 64], [1, 0]);
    store(c_block, acc, [0, 1]);
}

/// Warp 0's wait on a buffer's `empty` barrier orders only what the arriving threads did before
/// arriving, and only for warp 0: without the barrier at the top of the body above, the next
/// iteration's staging of A races the other warpgroup's `wgmma`s reading the last one's.
#[test]
fn the_emulator_orders_by_empty_barriers_only_what_they_order() {
    use kiln_codegen::thread::{Block, Op};
    let kernel = gemm_of_doubled_a::build(&Spec::new()).unwrap();
    let options = ["a", "b"]
        .into_iter()
        .map(|p| (p, 16))
        .chain([("a_row_stride", 8), ("b_row_stride", 8)])
        .fold(
            CompileOptions::new(Target::Sm90a, 8)
                .with_stages(2)
                .with_wgmma(true),
            |options, (name, n)| options.with_divisibility(name, n),
        );
    let program = thread_program(&kernel, &options).unwrap();
    let k = 96;
    let a = HostBuffer::zeros(F16, 128 * k);
    let b = HostBuffer::zeros(F16, k * 64);
    let c = HostBuffer::zeros(F32, 128 * 64);
    let args = [
        KernelArg::Buffer(&a),
        KernelArg::Buffer(&b),
        KernelArg::Buffer(&c),
        KernelArg::I32(k as i32),
        KernelArg::I64(k as i64),
        KernelArg::I64(64),
    ];
    emulate::run(&program, Grid::new(1, 1, 1), &args).unwrap();
    fn body_barrier_dropped(block: &mut Block) -> bool {
        for inst in &mut block.insts {
            if let Op::For { body, .. } = &mut inst.op {
                let at = body.insts.iter().position(|i| matches!(i.op, Op::Barrier));
                let empty = body
                    .insts
                    .iter()
                    .any(|i| matches!(i.op, Op::MbarrierArrive { .. }));
                if let (Some(at), true) = (at, empty) {
                    body.insts.remove(at);
                    return true;
                }
            }
        }
        false
    }
    let mut unordered = program.clone();
    assert!(body_barrier_dropped(&mut unordered.body), "{program}");
    let err = emulate::run(&unordered, Grid::new(1, 1, 1), &args).unwrap_err();
    assert!(err.to_string().contains("race"), "{err}");
}

/// A GEMM whose B is one matrix of a batch (the batch dimension indexed at 0).
#[kernel]
fn first_of_batch_gemm(
    a: Ptr<f16>,
    b: Ptr<f16>,
    c: Ptr<f32>,
    batches: i32,
    m: i32,
    k: i32,
    a_row_stride: i64,
    b_batch_stride: i64,
    b_row_stride: i64,
) {
    let mut a_block = make_block_ptr(a, [m, k], [a_row_stride, 1], [0, 0], [64, 32], [1, 0]);
    let mut b_block = make_block_ptr(
        b,
        [batches, k, 64],
        [b_batch_stride, b_row_stride, 1],
        [0, 0, 0],
        [32, 64],
        [1, 0],
    );
    let mut acc = zeros([64, 64], f32);
    for _ in (0..k).step_by(32) {
        acc = dot(load(a_block, [0, 1]), load(b_block, [0, 1]), acc);
        a_block = advance(a_block, [0, 32]);
        b_block = advance(b_block, [32, 0]);
    }
    let c_block = make_block_ptr(c, [m, 64], [64, 1], [0, 0], [64, 64], [1, 0]);
    store(c_block, acc, [0, 1]);
}

/// sm_90a, 4 warps, 3 stages on `wgmma`, with `a` and `b` promised 16-byte aligned and their
/// row strides multiples of 8 elements: what a GEMM's A and B need to copy with TMA.
fn aligned_gemm_options() -> CompileOptions {
    ["a", "b"]
        .into_iter()
        .map(|p| (p, 16))
        .chain([("a_row_stride", 8), ("b_row_stride", 8)])
        .fold(
            CompileOptions::new(Target::Sm90a, 4)
                .with_stages(3)
                .with_wgmma(true),
            |options, (name, n)| options.with_divisibility(name, n),
        )
}

/// A GEMM whose K loop also loads, each iteration, what only registers read: a row vector of
/// f32 and one of i32, and a 2-D f16 tile, all added into the accumulator.
#[kernel]
fn gemm_plus_row_loads(
    a: Ptr<f16>,
    b: Ptr<f16>,
    c: Ptr<f32>,
    floats: Ptr<f32>,
    ints: Ptr<i32>,
    tiles: Ptr<f16>,
    m: i32,
    k: i32,
    a_row_stride: i64,
    b_row_stride: i64,
    tile_row_stride: i64,
) {
    let mut a_block = make_block_ptr(a, [m, k], [a_row_stride, 1], [0, 0], [64, 32], [1, 0]);
    let mut b_block = make_block_ptr(b, [k, 64], [b_row_stride, 1], [0, 0], [32, 64], [1, 0]);
    let mut float_block = make_block_ptr(floats, [k], [1], [0], [64], [0]);
    let mut int_block = make_block_ptr(ints, [k], [1], [0], [64], [0]);
    let mut tile_block = make_block_ptr(
        tiles,
        [k, 64],
        [tile_row_stride, 1],
        [0, 0],
        [64, 64],
        [1, 0],
    );
    let mut acc = zeros([64, 64], f32);
    for _ in (0..k).step_by(32) {
        acc = dot(load(a_block, [0, 1]), load(b_block, [0, 1]), acc);
        let floats = load(float_block, [0]);
        let ints = load(int_block, [0]).to::<f32>();
        acc = acc + (floats + ints).expand_dims(0) + load(tile_block, [0]).to::<f32>();
        a_block = advance(a_block, [0, 32]);
        b_block = advance(b_block, [32, 0]);
        float_block = advance(float_block, [32]);
        int_block = advance(int_block, [32]);
        tile_block = advance(tile_block, [32, 0]);
    }
    let c_block = make_block_ptr(c, [m, 64], [64, 1], [0, 0], [64, 64], [1, 0]);
    store(c_block, acc, [0, 1]);
}

/// A TMA loop takes the loads that only registers read where they are row vectors of 16- or
/// 32-bit floats (the f32 one: a tensor map of its own, unswizzled, read in registers); an i32
/// row vector and a 2-D tile stay loads from global memory.
#[test]
fn a_tma_loop_streams_only_float_row_vectors_that_registers_read() {
    let kernel = gemm_plus_row_loads::build(&Spec::new()).unwrap();
    let options = ["floats", "ints", "tiles"]
        .into_iter()
        .fold(aligned_gemm_options(), |options, p| {
            options.with_divisibility(p, 16)
        })
        .with_divisibility("tile_row_stride", 8);
    let compiled = compile(&kernel, &options).unwrap();
    let layout = compiled.dump("layout").unwrap();
    let floats = layout
        .lines()
        .find(|l| l.trim_start().starts_with("%floats") && l.contains("load_block"))
        .expect("the f32 load");
    assert!(
        floats.contains("tma map") && floats.contains("-> 3 x row-major, read in registers"),
        "{layout}"
    );
    let ints = layout
        .lines()
        .find(|l| l.contains("load_block") && l.contains("i32[64]"))
        .expect("the i32 load");
    let tile = layout
        .lines()
        .find(|l| l.contains("load_block") && l.contains("f16[64, 64]"))
        .expect("the 2-D tile's load");
    for load in [ints, tile] {
        assert!(!load.contains("tma map"), "{load}\n{layout}");
    }
    // B's (swizzled) and the f32 vector's (unswizzled, one box of the whole vector).
    let maps = compiled.tensor_maps();
    assert_eq!(maps.len(), 2, "{layout}");
    assert_eq!(
        (maps[1].swizzle_bytes, maps[1].box_shape.as_slice()),
        (0, &[64][..])
    );
    assert!(
        compiled.ptx().contains("ld.shared.v2.f32"),
        "{}",
        compiled.ptx()
    );
}

/// A loop copies with TMA only where what the launch guarantees proves what a tensor map needs
/// (every stride a multiple of 16 bytes): B's batch stride, which the 16-byte vectors never
/// need (its offset is 0), must be promised too; without it the loop stays on `cp.async`.
#[test]
fn tma_needs_every_stride_proved_aligned() {
    let kernel = first_of_batch_gemm::build(&Spec::new()).unwrap();
    let options = aligned_gemm_options();
    let cp_async = compile(&kernel, &options).unwrap();
    let layout = cp_async.dump("layout").unwrap();
    assert!(cp_async.tensor_maps().is_empty(), "{layout}");
    assert!(layout.contains("cp.async 16 B -> 3 x"), "{layout}");
    let tma = compile(&kernel, &options.with_divisibility("b_batch_stride", 8)).unwrap();
    assert_eq!(tma.tensor_maps().len(), 1);
    assert!(
        tma.ptx().contains("cp.async.bulk.tensor.3d"),
        "{}",
        tma.ptx()
    );
}

/// A launch that breaks what the kernel was compiled assuming (a row stride that is not a
/// multiple of 8) is refused by the emulator before it runs.
#[test]
fn the_emulator_checks_the_divisibility_a_kernel_assumes() {
    let case = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
    let mut run = cases::runs(&case).swap_remove(1);
    run.args[7] = cases::Arg::I64(33);
    let program = thread_program(&case.kernel, &case_options(&case, Target::Sm80)).unwrap();
    let [x, y, z] = run.grid;
    let err = emulate::run(&program, Grid::new(x, y, z), &run.host_args(&run.buffers)).unwrap_err();
    assert!(
        err.to_string().contains(
            "argument `a_row_stride` is 33, but the kernel was compiled assuming a multiple of 8"
        ),
        "{err}"
    );
}

/// The pipelined GEMM's K loop, as text: the layout stage marks the loop and its two loads
/// (cp.async into 3 buffers, no staging conversion) and C's conversion through the drained
/// buffers, the thread program shows the prologue, the wait, barrier, copies and commit at the
/// loop's top, the slot it carries, the drain after it and C's way out; unpipelined, C is
/// stored from its registers.
#[test]
fn a_pipelined_gemm_loop_dumps_its_stages() {
    let compiled = compile_case(&case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80"));
    check_file(
        &manifest_path("tests/golden/gemm_f16_aligned_s3.layout"),
        compiled.stage(Stage::Layout).unwrap(),
    );
    check_file(
        &manifest_path("tests/golden/gemm_f16_aligned_s3.thread-skeleton"),
        &skeleton(compiled.stage(Stage::Thread).unwrap()),
    );
    let ptx = compiled.ptx();
    for expected in [
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group 1",
        "cp.async.wait_group 0",
        // C goes through shared memory: the mma layout's f16 pairs in, rows' 16 bytes out.
        "st.shared.b32",
        "ld.shared.v4.b32",
        "st.global.v4.b32",
    ] {
        assert!(ptx.contains(expected), "no `{expected}` in\n{ptx}");
    }
    assert!(!ptx.contains("st.global.b16"), "{ptx}");
    assert!(!ptx.contains("st.global.b32"), "{ptx}");
    // Its addresses derive from the thread index read again, not from values kept live
    // across the loop.
    assert_eq!(ptx.matches("%tid.x").count(), 2, "{ptx}");
    // Unpipelined, the loop has no buffers to leave: C goes out from the mma layout, 4 bytes
    // a store, and takes no shared memory for it.
    let case = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
    let unpipelined = case_options(&case, Target::Sm80).with_stages(1);
    let compiled = compile(&case.kernel, &unpipelined).unwrap();
    let layout = compiled.stage(Stage::Layout).unwrap();
    assert!(
        !layout.contains("where the loops' buffers were"),
        "{layout}"
    );
    assert!(compiled.ptx().contains("st.global.b32"));
}

/// With `loop_tid` an `mma.sync` loop body reads `%tid.x` again at its top and computes its
/// `ldmatrix` and copy offsets from that read: the pipelined GEMM's K loop has a read of its
/// own beside C's conversion's after it, its offsets no longer kept across the loop (and the
/// emulator still agrees with the interpreter); on `wgmma`, whose operands go through
/// descriptors, the option changes nothing.
#[test]
fn loop_bodies_read_tid_again_with_loop_tid() {
    let reads = |case: &cases::Case| {
        let compiled = compile_case(case);
        let thread = compiled.stage(Stage::Thread).unwrap().to_string();
        (
            thread.matches("sreg tid.x again").count(),
            compiled.ptx().to_string(),
        )
    };
    let with_loop_tid = |case: cases::Case| cases::Case {
        knobs: CodegenKnobs {
            loop_tid: true,
            ..case.knobs
        },
        ..case
    };
    let gemm = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
    let (before, _) = reads(&gemm);
    assert_eq!(before, 1, "C's conversion after the loop reads it");
    let gemm = with_loop_tid(gemm);
    let (after, ptx) = reads(&gemm);
    assert_eq!(after, 2);
    assert_eq!(ptx.matches("%tid.x").count(), 3, "{ptx}");
    assert_emulator_agrees(&gemm, &gemm.name);
    let name = "gemm_f16_wgmma_m64_n64_k32_s3_w4_sm_90a";
    assert_eq!(reads(&case(name)).1, reads(&with_loop_tid(case(name))).1);
}

/// C goes through the drained buffers only where its tile fits there: 64 x 128 f16 (16 KiB)
/// after K steps of 16 has 12 KiB of buffers at 2 stages and stays in registers, 18 KiB at 3
/// and takes them; the emulator agrees with the interpreter either way (K loops of 0 to 13
/// steps, ragged M and N).
#[test]
fn a_store_goes_through_the_buffers_only_where_it_fits() {
    let spec = Spec::new()
        .dtype("T", F16)
        .dtype("B", F16)
        .int("BLOCK_M", 64)
        .int("BLOCK_N", 128)
        .int("BLOCK_K", 16);
    let kernel = kiln_kernels::general::gemm::gemm_bias_gelu::build(&spec).unwrap();
    for (stages, through) in [(2, false), (3, true)] {
        let base = case("gemm_f16_aligned_m64_n64_k32_s3_w4_sm_80");
        let case = cases::Case {
            name: format!("gemm_f16_aligned_m64_n128_k16_s{stages}"),
            kernel: kernel.clone(),
            knobs: CodegenKnobs {
                num_stages: stages,
                ..base.knobs
            },
            ..base
        };
        let compiled = compile_case(&case);
        let layout = compiled.stage(Stage::Layout).unwrap();
        let converted = layout.contains("where the loops' buffers were");
        assert_eq!(converted, through, "{} stages:\n{layout}", stages);
        assert_eq!(compiled.ptx().contains("st.global.b32"), !through);
        assert_emulator_agrees(&case, &case.name);
    }
}

/// The control flow, shared-memory traffic and tensor-core ops of a thread program, without
/// the address arithmetic between them: what shows its pipelining in a few dozen lines.
fn skeleton(thread: &str) -> String {
    let kept = [
        "cp.async", "bar.sync", "ldmatrix", "mma.", "st.v", "ld.v", "yield", "if ", "for ",
    ];
    let mut out = String::new();
    for line in thread.lines() {
        let indent = &line[..line.len() - line.trim_start().len()];
        let op = line.trim_start();
        let op = op.split_once(" = ").map_or(op, |(_, op)| op);
        if op.starts_with('}') {
            out.push_str(&format!("{indent}{op}\n"));
        } else if let Some(keyword) = kept.iter().find(|k| op.starts_with(*k)) {
            // The operands of a loop or a yield are long register lists.
            let shown = match *keyword {
                "for " | "yield" | "if " => format!("{}..", keyword.trim_end()),
                _ => op.to_string(),
            };
            let opens = if op.ends_with('{') { " {" } else { "" };
            out.push_str(&format!("{indent}{shown}{opens}\n"));
        }
    }
    out
}

/// The attention kernels as shipped, on both targets: the streaming loops copy with `cp.async`,
/// or with TMA where they run on `wgmma` (every kernel describes its streamed tensors whole),
/// and the tiles they load and store outside the loops in registers (the forward's Q for its
/// scale's sign, but for the persistent one; dQ's O and dO for delta, dK/dV's K and V) move 16
/// bytes per vector; on `wgmma` the forward's O and dQ are stored by TMA, every other output
/// tile through shared memory in 16-byte vectors.
#[test]
fn shipped_attention_kernels_pipeline_and_vectorise() {
    for name in ["attention_fwd", "attention_bwd_dq", "attention_bwd_dkdv"] {
        for head_dim in kiln_kernels::attention::HEAD_DIMS {
            for target in Target::ALL {
                let case = attention_case(name, F16, head_dim, false, target);
                assert!(case.knobs.num_stages > 1, "{} is not pipelined", case.name);
                let ptx = compile_case(&case).ptx().to_string();
                let copy = if case.knobs.wgmma {
                    "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                } else {
                    "cp.async.cg.shared.global"
                };
                assert!(ptx.contains(copy), "{}: no {copy}", case.name);
                // A persistent forward copies its Q by TMA too (it takes a scale >= 0).
                let persistent = matches!(
                    case.kernel.spec.get("PERSISTENT"),
                    Some(kiln_dsl::SpecValue::Bool(true))
                );
                assert_eq!(
                    ptx.contains("ld.global.v4.b32"),
                    !persistent,
                    "{}",
                    case.name
                );
                // On `wgmma` the forward's O and dQ go out by TMA; dK and dV do not.
                let stores = ptx.contains("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group")
                    && ptx.contains("cp.async.bulk.wait_group.read 0");
                let by_tma = case.knobs.wgmma && name != "attention_bwd_dkdv";
                assert_eq!(stores, by_tma, "{}: TMA stores", case.name);
                // Elsewhere they go out through the drained buffers, 16 bytes a store.
                if !by_tma {
                    assert!(ptx.contains("st.global.v4.b32"), "{}", case.name);
                }
                assert!(!ptx.contains("st.global.b32"), "{}", case.name);
            }
        }
    }
}

/// dK/dV's query loop streams each tile's row statistics (the LSE in base 2 and delta, which
/// registers read in the scores' column layout) with TMA beside Q and dO on `wgmma`: one
/// unswizzled 3-D copy each, read from shared memory in pairs, and no global load of them is
/// left; on sm_80 they stay global loads.
#[test]
fn dkdv_streams_its_row_statistics_with_its_tiles() {
    for head_dim in kiln_kernels::attention::HEAD_DIMS {
        for target in Target::ALL {
            let case = attention_case("attention_bwd_dkdv", F16, head_dim, true, target);
            let compiled = compile_case(&case);
            let layout = compiled.stage(Stage::Layout).unwrap().to_string();
            // By their names' stems (`%lse_row`, `%delta_row`).
            let streamed = ["%lse_", "%delta_"].map(|row| {
                layout.lines().any(|l| {
                    l.trim_start().starts_with(row)
                        && l.contains("load_block")
                        && l.contains("row-major, read in registers")
                })
            });
            assert_eq!(streamed, [case.knobs.wgmma; 2], "{}:\n{layout}", case.name);
            let ptx = compiled.ptx().to_string();
            let stats_copies = ptx
                .matches("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier")
                .count();
            let global_f32 = ptx
                .lines()
                .any(|l| l.contains("ld.global") && l.contains(".f32"));
            if case.knobs.wgmma {
                // Two per iteration and two in the prologue (the early one's or the loop's).
                assert!(stats_copies >= 4, "{}: {stats_copies} copies", case.name);
                assert!(ptx.contains("ld.shared.v2.f32"), "{}", case.name);
                assert!(!global_f32, "{}: statistics loaded from global", case.name);
            } else {
                assert_eq!(stats_copies, 0, "{}", case.name);
                assert!(global_f32, "{}", case.name);
            }
        }
    }
}

/// A kernel whose staged tiles exceed 48 KiB gets them as dynamic shared memory, which the
/// launch must size and opt into.
#[test]
fn shared_memory_above_48_kib_is_dynamic() {
    let compiled = compile_case(&case("attention_fwd_bf16_d128_signed_sm_90a"));
    // Q (128 x 128), the first K tile and the last V tile (128 x 128, before and after the loops
    // that overlap the softmax), and two buffers each of K and V (128 x 128), bf16; 1024-byte
    // aligned for `wgmma`'s swizzle; then the buffers' `full` and `empty` TMA barriers (8 bytes
    // each), padded to 128.
    assert_eq!(
        compiled.dynamic_shared_bytes(),
        (128 + 128 + 128 + 2 * (128 + 128)) * 128 * 2 + 128
    );
    // The persistent one: its first K and last V tiles in a slot of the ring, O's tile for its
    // TMA store instead, and Q in two tiles by turns.
    let persistent = compile_case(&case("attention_fwd_bf16_d128_sm_90a"));
    assert_eq!(
        persistent.dynamic_shared_bytes(),
        (2 * 128 + 2 * (128 + 128) + 128) * 128 * 2 + 128
    );
    assert!(
        compiled
            .ptx()
            .contains(".extern .shared .align 1024 .b8 kiln_shared[];"),
        "{}",
        compiled.ptx()
    );
    // Q (128 x 64) and two buffers each of K and V (64 x 64), f16: 48 KiB, still static (the
    // D64 forward's sm_80 blocks before 2026-11-26).
    let kernel = AttentionKernel::Forward;
    let p = cases::attention_params(F16, 64, true, 1, 1);
    let config = KernelConfig::new(128, 64, 4, 2);
    let ir = kernel.build(&p.spec(kernel, config)).unwrap();
    let small = compile(&ir, &attention_options(kernel, config, Target::Sm80)).unwrap();
    assert_eq!(small.dynamic_shared_bytes(), 0);
    assert!(
        small
            .ptx()
            .contains(".shared .align 16 .b8 kiln_shared[49152];")
    );
}

/// A thread program without its barriers races on shared memory: the emulator says so (where
/// lockstep execution alone would have given the right answer).
#[test]
fn the_emulator_finds_a_missing_barrier() {
    let case = case("transpose_f32_m32_n64_w4_sm_80");
    let mut program = thread_program(&case.kernel, &CompileOptions::new(Target::Sm80, 4)).unwrap();
    program
        .body
        .insts
        .retain(|inst| inst.op != kiln_codegen::thread::Op::Barrier);
    let run = cases::runs(&case).swap_remove(1);
    let [x, y, z] = run.grid;
    let err = emulate::run(&program, Grid::new(x, y, z), &run.host_args(&run.buffers)).unwrap_err();
    assert!(err.to_string().contains("race: shared byte"), "{err}");
    assert_eq!(
        err.loc.map(|l| l.file),
        Some("kernels/src/general/transpose.rs"),
        "{err}"
    );
}

#[kernel]
fn copy_unmasked<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    store(out + offs, load(x + offs));
}

/// An access outside a buffer is an error naming the buffer and the DSL line, as in the
/// interpreter.
#[test]
fn the_emulator_refuses_out_of_bounds_accesses() {
    let kernel = copy_unmasked::build(&Spec::new().int("BLOCK", 128)).unwrap();
    let program = thread_program(&kernel, &CompileOptions::default()).unwrap();
    let x = HostBuffer::zeros(F32, 100);
    let out = HostBuffer::zeros(F32, 128);
    let args = [KernelArg::Buffer(&x), KernelArg::Buffer(&out)];
    let err = emulate::run(&program, Grid::new(1, 1, 1), &args).unwrap_err();
    let rendered = err.to_string();
    assert!(
        rendered.contains("out-of-bounds access to byte 400 of `x`, which has 100 elements"),
        "{rendered}"
    );
    assert_eq!(
        err.loc.unwrap().line,
        line_of("store(out + offs, load(x + offs));")
    );
}

/// Every element of the tile has exactly one owner, and every register lies inside the tile.
fn check_coverage(layout: &Layout, warps: u32, shape: &[usize]) {
    let map = layout.thread_map(shape).unwrap();
    let total: usize = shape.iter().product();
    let mut owners = vec![0; total];
    for warp in 0..warps {
        for lane in 0..32 {
            for register in 0..map.registers.len() {
                let position = map.position(warp, lane, register);
                let linear = position.coords.iter().zip(shape).fold(0, |acc, (&c, &s)| {
                    assert!(c < s, "{layout} {shape:?}: {position:?}");
                    acc * s + c
                });
                owners[linear] += position.owner as usize;
            }
        }
    }
    assert!(
        owners.iter().all(|&n| n == 1),
        "{layout} {shape:?}: owners per element {owners:?}"
    );
}

#[test]
fn blocked_layouts_give_every_element_one_owner() {
    for size_per_thread in [1, 2, 4, 8] {
        for num_warps in [1, 4, 8] {
            for len in [1, 16, 64, 128, 512, 1024, 4096] {
                let layout = Layout::Blocked(BlockedLayout::one_dim(size_per_thread, num_warps));
                check_coverage(&layout, num_warps, &[len]);
            }
        }
    }
    let two_dim = Layout::Blocked(BlockedLayout {
        size_per_thread: vec![1, 4],
        threads_per_warp: vec![4, 8],
        warps_per_cta: vec![2, 2],
        order: vec![1, 0],
    });
    for shape in [[8, 32], [64, 64], [4, 16], [16, 128], [1, 64], [32, 1]] {
        check_coverage(&two_dim, 4, &shape);
        check_coverage(&two_dim.slice(0), 4, &shape[1..]);
        check_coverage(&two_dim.slice(1), 4, &shape[..1]);
    }
    // The coalescing layouts of every shape the general kernels use, and their slices.
    for num_warps in [1, 4, 8] {
        for shape in [
            [16, 128],
            [32, 64],
            [64, 32],
            [1, 1024],
            [2, 2048],
            [16, 4],
            [16, 1],
        ] {
            for bytes in [2, 4] {
                let layout = Layout::Blocked(BlockedLayout::coalesced(&shape, bytes, num_warps));
                check_coverage(&layout, num_warps, &shape);
                check_coverage(&layout.slice(0), num_warps, &shape[1..]);
                check_coverage(&layout.slice(1), num_warps, &shape[..1]);
                check_coverage(&layout.slice(1).slice(0), num_warps, &[]);
            }
        }
    }
}

#[test]
fn layouts_print_like_tritons_gpu_dialect() {
    let blocked = Layout::Blocked(BlockedLayout::one_dim(4, 8));
    assert_eq!(
        blocked.to_string(),
        "#blocked<{size_per_thread = [4], threads_per_warp = [32], warps_per_cta = [8], order = [0]}>"
    );
    let mma = Layout::Mma(kiln_codegen::layout::MmaLayout {
        version: kiln_codegen::layout::MmaVersion::V2,
        warps_per_cta: vec![4, 1],
        instr_shape: vec![16, 8],
    });
    let operand = Layout::DotOperand(kiln_codegen::layout::DotOperandLayout {
        parent: Box::new(mma.clone()),
        op_index: 0,
        k_width: 2,
    });
    assert_eq!(
        operand.to_string(),
        "#dot_op<{op_index = 0, parent = #mma<{version = 2, warps_per_cta = [4, 1], instr_shape = [16, 8]}>, k_width = 2}>"
    );
    let row = Layout::Slice(kiln_codegen::layout::SliceLayout {
        parent: Box::new(mma),
        dim: 1,
    });
    assert_eq!(
        row.to_string(),
        "#slice<{dim = 1, parent = #mma<{version = 2, warps_per_cta = [4, 1], instr_shape = [16, 8]}>}>"
    );
    let shared = Layout::Shared(kiln_codegen::layout::SharedLayout {
        vec: 8,
        per_phase: 1,
        max_phase: 8,
        order: vec![1, 0],
        slab: None,
    });
    assert_eq!(
        shared.to_string(),
        "#shared<{vec = 8, per_phase = 1, max_phase = 8, order = [1, 0]}>"
    );
    assert!(!shared.is_distributed());
    let slabbed = Layout::Shared(kiln_codegen::layout::SharedLayout {
        vec: 8,
        per_phase: 1,
        max_phase: 8,
        order: vec![1, 0],
        slab: Some(64),
    });
    assert_eq!(
        slabbed.to_string(),
        "#shared<{vec = 8, per_phase = 1, max_phase = 8, order = [1, 0], slab = 64}>"
    );
    let wgmma = Layout::Mma(kiln_codegen::layout::MmaLayout::v3(8));
    assert_eq!(
        wgmma.to_string(),
        "#mma<{version = 3, warps_per_cta = [8, 1], instr_shape = [16, 8]}>"
    );
}

// ---- the lowering and the ptx stage ----

/// A compile for a launch keeps the PTX, byte for byte what every stage's compile gives, and
/// refuses the other stages by name rather than giving empty text.
#[test]
fn a_compile_keeping_the_ptx_gives_the_same_ptx_and_refuses_the_rest() {
    let case = case("vector_add_f16_b1024_w4_sm_90a");
    let options = case_options(&case, case.target);
    let full = compile(&case.kernel, &options).unwrap();
    let lean = compile_keeping(&case.kernel, &options, Keep::Ptx).unwrap();
    assert_eq!(lean.ptx(), full.ptx());
    assert_eq!(lean.stage(Stage::Ptx).unwrap(), full.ptx());
    assert_eq!(lean.dynamic_shared_bytes(), full.dynamic_shared_bytes());
    assert_eq!(lean.program(), full.program());
    for stage in Stage::ALL.into_iter().filter(|&s| s != Stage::Ptx) {
        let message = lean.stage(stage).unwrap_err().to_string();
        assert!(
            message.contains(&format!("the {stage} stage of `vector_add` was not kept")),
            "{message}"
        );
    }
}

#[test]
fn every_stage_dumps_by_name() {
    let compiled = compile_case(&case("vector_add_f16_b1024_w4_sm_90a"));
    for stage in Stage::ALL {
        assert_eq!(
            compiled.dump(stage.name()).unwrap(),
            compiled.stage(stage).unwrap()
        );
    }
    assert!(
        compiled
            .stage(Stage::Tile)
            .unwrap()
            .starts_with("kernel @vector_add<")
    );
    assert!(
        compiled
            .stage(Stage::Layout)
            .unwrap()
            .starts_with("#blocked = ")
    );
    assert!(
        compiled
            .stage(Stage::Thread)
            .unwrap()
            .starts_with("thread @vector_add(%0: ptr.global x, ")
    );
    let llir = compiled.stage(Stage::Llir).unwrap();
    assert!(
        llir.contains(r#"!{ptr @vector_add, !"kernel", i32 1}"#),
        "{llir}"
    );
    let ptx = compiled.ptx();
    assert!(ptx.contains(".target sm_90a"), "{ptx}");
    assert!(ptx.contains(".version 8.1"), "{ptx}");
    assert!(ptx.contains(".visible .entry vector_add("), "{ptx}");
    assert!(ptx.contains(".maxntid 128, 1, 1"), "{ptx}");
    assert_eq!(compiled.threads_per_block(), 128);
    let err = compiled.dump("ttgir").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid compile options: expected a stage of tile, layout, thread, llir, llir-opt or ptx, got `ttgir`"
    );
}

#[test]
fn the_same_kernel_gives_byte_identical_ptx() {
    for name in [
        "vector_add_f16_b1024_w4_sm_80",
        "scale_loop_bf16_b256_w4_sm_90a",
        "gemm_bf16_aligned_m64_n64_k32_s3_w4_sm_90a",
        "attention_bwd_dkdv_f16_d64_causal_sm_80",
    ] {
        let first = compile_case(&case(name));
        let again = compile_case(&case(name));
        let elsewhere = std::thread::spawn(move || compile_case(&case(name)))
            .join()
            .unwrap();
        for stage in Stage::ALL {
            assert_eq!(first.stage(stage), again.stage(stage), "{name} {stage}");
            assert_eq!(first.stage(stage), elsewhere.stage(stage), "{name} {stage}");
        }
    }
}

/// The `.file` directives of `ptx`: each file's index and path.
fn ptx_files(ptx: &str) -> Vec<(u32, String)> {
    ptx.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix(".file")?;
            let (index, path) = rest.trim().split_once(char::is_whitespace)?;
            Some((
                index.parse().ok()?,
                path.trim().trim_matches('"').to_string(),
            ))
        })
        .collect()
}

/// The file index and line of a `.loc file line column` directive.
fn loc_line(line: &str) -> Option<(u32, usize)> {
    let mut fields = line.trim().strip_prefix(".loc")?.split_whitespace();
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// The forward attention kernel's PTX leads from its instructions to the DSL source: `.loc`
/// lines in files named relative to the workspace, each `mma.sync` at a line with a `dot` call
/// of the loop it runs (not the one that overlaps the softmax, for `wgmma`),
/// and nothing else of debug info (no DWARF sections, no `.target ..., debug`).
#[test]
fn attention_forward_ptx_has_loc_lines_at_the_dsl_source() {
    let compiled = compile_case(&case("attention_fwd_f16_d128_sm_80"));
    let ptx = compiled.ptx();
    assert!(ptx.contains("\n.target sm_80\n"), "{ptx}");
    assert!(!ptx.contains(".debug_info"), "{ptx}");
    let files = ptx_files(ptx);
    let workspace = manifest_path("..");
    for (_, path) in &files {
        assert!(
            Path::new(path).is_relative() && workspace.join(path).is_file(),
            "`.file` names {path}, not a file of the workspace"
        );
    }
    let forward = "kernels/src/attention/forward.rs";
    let source = std::fs::read_to_string(workspace.join(forward)).unwrap();
    let lines: Vec<&str> = source.lines().collect();
    let dot_lines: Vec<usize> = (1..=lines.len())
        .filter(|&n| lines[n - 1].contains("dot("))
        .collect();
    // The overlapped forward's (the first block's QK^T and the last block's PV, then the next
    // block's and PV in each of the unmasked and the masked loop), the persistent one's (this
    // block's first QK^T, the block before's last PV before or after it by head dim) and the
    // plain loop's, which reads the tiles it loads by name.
    assert_eq!(dot_lines.len(), 11, "the forward's dot lines");
    let plain: Vec<usize> = dot_lines
        .iter()
        .copied()
        .filter(|&n| lines[n - 1].contains("k_tile") || lines[n - 1].contains("v_tile"))
        .collect();
    assert_eq!(plain.len(), 2, "the plain loop's dot lines");
    let mut at = None;
    let mut mma_lines = Vec::new();
    for line in ptx.lines() {
        if let Some(loc) = loc_line(line) {
            at = Some(loc);
        }
        if line.contains("mma.sync") {
            let (file, number) = at.expect("a .loc before the first mma.sync");
            let path = files.iter().find(|(i, _)| *i == file).map(|(_, p)| p);
            assert_eq!(path.map(String::as_str), Some(forward), "{line}");
            mma_lines.push(number);
        }
    }
    mma_lines.sort();
    mma_lines.dedup();
    assert_eq!(
        mma_lines, plain,
        "the lines of the mma.syncs' .loc: the plain loop's"
    );
    // The ops inlined from `#[kernel_fn]`s point at their own file.
    assert!(
        files
            .iter()
            .any(|(_, path)| path == "kernels/src/attention/common.rs"),
        "{files:?}"
    );
}

#[test]
fn staged_tiles_beyond_the_targets_shared_memory_are_refused() {
    // dK/dV at head dim 128, 128 x 128, 3 stages: 320 KiB; sm_90a gives a block 227.
    let kernel = AttentionKernel::DkDv;
    let p = cases::attention_params(F16, 128, false, 1, 1);
    let config = KernelConfig::new(128, 128, 8, 3);
    let ir = kernel.build(&p.spec(kernel, config)).unwrap();
    let message = match compile(&ir, &attention_options(kernel, config, Target::Sm90a)) {
        Err(CodegenError::Options { message }) => message,
        Err(other) => panic!("expected an options error, got {other}"),
        Ok(compiled) => panic!(
            "compiled, with {} bytes of shared memory",
            compiled.dynamic_shared_bytes()
        ),
    };
    for part in [
        "327680 bytes",
        "3 stages",
        "sm_90a",
        "232448",
        "fewer stages",
    ] {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }
}

#[test]
fn line_info_can_be_turned_off() {
    let case = case("attention_fwd_f16_d128_sm_80");
    let options = CompileOptions {
        line_info: false,
        ..case_options(&case, case.target)
    };
    let compiled = compile(&case.kernel, &options).unwrap();
    assert!(!compiled.ptx().contains(".loc"), "{}", compiled.ptx());
    assert!(!compiled.ptx().contains(".file"), "{}", compiled.ptx());
    assert!(!compiled.stage(Stage::Llir).unwrap().contains("!dbg"));
}

#[test]
fn float_math_is_not_contracted_into_fma() {
    // `acc * scale + v` must round twice, as the interpreter does.
    let ptx = compile_case(&case("scale_loop_f32_b256_w4_sm_80"))
        .ptx()
        .to_string();
    assert!(ptx.contains("mul.rn.f32"), "{ptx}");
    assert!(!ptx.contains("fma"), "{ptx}");
}

#[test]
fn masked_accesses_are_predicated_not_speculated() {
    let ptx = compile_case(&case("vector_add_f32_b1024_w4_sm_80"))
        .ptx()
        .to_string();
    // Every global access sits behind a branch on its mask: as many guarded branches as loads
    // and stores (8 registers per thread: 16 loads, 8 stores).
    let accesses = ptx.matches("ld.global").count() + ptx.matches("st.global").count();
    assert_eq!(accesses, 24, "{ptx}");
    assert!(ptx.matches("bra").count() >= accesses, "{ptx}");
}

/// Every elementwise op, cast and control-flow form the lowering knows, in f16, bf16 and f32:
/// the verifier accepts each module, and ptxas its PTX (in the ptxas test below).
#[kernel]
fn every_op<T, const BLOCK: usize>(
    x: Ptr<T>,
    ints: Ptr<i32>,
    wide: Ptr<i64>,
    flags: Ptr<bool>,
    out: Ptr<T>,
    n: i32,
    s: f32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask).to::<f32>();
    let i = load(ints + offs, mask, 7);
    let w = load(wide + offs, mask);
    let f = load(flags + offs, mask);
    let math =
        exp(v) + exp2(v) + log(abs(v)) + log2(abs(v)) + tanh(v) + sqrt(abs(v)) + rsqrt(abs(v));
    let arith =
        maximum(-v, v * s) - minimum(v / s, v) + (v * 2.0).to::<T>().to::<f32>() + fma(v, s, 1.0);
    let int_math = (i / 3 + i % 5 - abs(i) * (i << 2) + (i >> 1)) ^ (i & 12) | (!i);
    let int_minmax = maximum(i, 0) + minimum(i, 10) + (w / 2 + w % 3 - w).to::<i32>();
    let logic = (f && (v > 0.0)) || (f ^ (i == 3)) || !(v <= 1.0) || (i != 2) && (v >= -1.0);
    let casts =
        v.to::<i32>() + v.to::<i64>().to::<i32>() + logic.to::<i32>() + i.to::<f32>().to::<i32>();
    let mut total =
        where_(logic, math + arith, arith) + (int_math + int_minmax + casts).to::<f32>();
    for k in (0..n).step_by(BLOCK) {
        if k > 4 * BLOCK {
            total = total + 1.0;
        } else {
            total = total * 0.5;
        }
    }
    store(out + offs, total.to::<T>(), mask);
    store(flags + offs, logic, mask);
    store(wide + offs, w + offs.to::<i64>() * (1 << 40), mask);
    store(ints + program_id(0), num_programs(0));
}

fn every_op_kernels() -> Vec<(String, Kernel)> {
    [F16, BF16, F32]
        .into_iter()
        .map(|dtype| {
            let spec = Spec::new().dtype("T", dtype).int("BLOCK", 512);
            (format!("every_op_{dtype}"), every_op::build(&spec).unwrap())
        })
        .collect()
}

#[test]
fn every_lowered_op_passes_the_verifier_on_both_targets() {
    for (name, kernel) in every_op_kernels() {
        for target in Target::ALL {
            for num_warps in [1, 4, 8] {
                let compiled = compile(&kernel, &CompileOptions::new(target, num_warps))
                    .unwrap_or_else(|e| panic!("{name} {target} {num_warps}: {e}"));
                assert!(compiled.ptx().contains(".entry every_op("), "{name}");
            }
        }
    }
}

// ---- errors ----

#[kernel]
fn square<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>) {
    let i = arange(0, BLOCK);
    let tile = load(x + i.expand_dims(1) * BLOCK + i.expand_dims(0));
    store(
        out + i.expand_dims(1) * BLOCK + i.expand_dims(0),
        dot(tile, tile, zeros([BLOCK, BLOCK], f32)),
    );
}

#[kernel]
fn float_rem(x: Ptr<f32>, out: Ptr<f32>) {
    let i = arange(0, 128);
    store(out + i, load(x + i) % 2.0);
}

/// The 1-based line of this file that contains `text`.
fn line_of(text: &str) -> u32 {
    let line = include_str!("codegen.rs")
        .lines()
        .position(|l| l.contains(text));
    line.expect("the text is in this file") as u32 + 1
}

#[test]
fn a_dot_without_an_mma_names_the_op_and_its_line() {
    let kernel = square::build(&Spec::new().int("BLOCK", 16)).unwrap();
    let err = compile(&kernel, &CompileOptions::default()).unwrap_err();
    let CodegenError::Unsupported { stage, op, loc, .. } = &err else {
        panic!("expected an unsupported op, got {err}")
    };
    assert_eq!((*stage, *op), (Stage::Layout, "dot"));
    assert_eq!(
        loc.line,
        line_of("        dot(tile, tile, zeros([BLOCK, BLOCK], f32)),"),
        "{err}"
    );
    let rendered = err.to_string();
    assert!(
        rendered.starts_with(
            "layout stage cannot handle `dot` yet: expected f16 or bf16 operands (mma.sync \
             m16n8k16), got f32"
        ),
        "{rendered}"
    );
    assert!(
        rendered.contains(&format!("\n  --> {}:{}:", loc.file, loc.line)),
        "{rendered}"
    );
}

#[test]
fn an_op_the_lowering_lacks_names_the_op_and_its_line() {
    let kernel = float_rem::build(&Spec::new()).unwrap();
    let err = compile(&kernel, &CompileOptions::default()).unwrap_err();
    let CodegenError::Unsupported { stage, op, loc, .. } = &err else {
        panic!("expected an unsupported op, got {err}")
    };
    assert_eq!((*stage, *op), (Stage::Thread, "rem"));
    assert_eq!(
        loc.line,
        line_of("store(out + i, load(x + i) % 2.0);"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("float remainder is not lowered yet"),
        "{err}"
    );
}

#[test]
fn num_warps_must_be_a_power_of_two() {
    let kernel = case("vector_add_f16_b64_w4_sm_80").kernel;
    let err = compile(&kernel, &CompileOptions::new(Target::Sm80, 3)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid compile options: expected num_warps to be a power of two from 1 to 32, got 3"
    );
}

/// `wgmma` is refused where it cannot run, naming why: another target, warps that are not
/// whole warpgroups, a `dot` whose rows do not give every warp 16.
#[test]
fn wgmma_refusals_name_the_reason() {
    let gemm = case("gemm_f16_wgmma_m64_n64_k32_s3_w4_sm_90a");
    let options = case_options(&gemm, Target::Sm90a);
    let refused =
        |options: CompileOptions| compile(&gemm.kernel, &options).unwrap_err().to_string();
    assert_eq!(
        refused(case_options(&gemm, Target::Sm80)),
        "invalid compile options: wgmma needs the sm_90a target, got sm_80"
    );
    assert_eq!(
        refused(CompileOptions {
            num_warps: 2,
            ..options.clone()
        }),
        "invalid compile options: wgmma needs whole warpgroups: num_warps a multiple of 4, got 2"
    );
    // 64 rows at 8 warps are one warpgroup's, which computes a `dot` only into an `atomic_add`
    // right after it, from zeros: not a GEMM's accumulator.
    let message = refused(CompileOptions {
        num_warps: 8,
        ..options
    });
    assert!(
        message.contains("`dot`")
            && message.contains("one warpgroup computes it only from zeros")
            && message.contains("zeros: false, added so: false"),
        "{message}"
    );
}

// ---- the GPU test's PTX, and ptxas ----

/// kiln-runtime's GPU test carries the PTX of its cases (so that it needs no LLVM), but of the
/// shipped attention specialisations, which run from kiln-kernels' PTX: each file is exactly
/// what codegen makes of its case today, and `ptx/mod.rs` lists them all.
#[test]
fn the_gpu_tests_ptx_is_up_to_date() {
    // Shipped by the table, not by kiln-kernels' compiled list of PTX, which a bless that adds a
    // specialisation writes only after this binary was built.
    let shipped: Vec<String> = prebuilt::shipped().into_iter().map(|s| s.name).collect();
    let cases: Vec<cases::Case> = cases::cases()
        .into_iter()
        .filter(|c| !shipped.contains(&c.name))
        .collect();
    let compiled: Vec<(String, Compiled)> = cases
        .iter()
        .map(|case| (case.name.clone(), compile_case(case)))
        .collect();
    check_ptx_dir(
        &manifest_path("../runtime/tests/gpu/ptx"),
        "the PTX\n//! of every GPU test case but the attention specialisations kiln-kernels ships",
        &compiled,
    );
}

/// kiln-kernels ships the PTX of every attention specialisation (`attention::prebuilt`): each
/// file is exactly what codegen makes of the DSL today, compiled as the config table says, with
/// the divisibility its launchers check.
#[test]
fn the_shipped_attention_ptx_is_what_the_dsl_gives() {
    let shipped = prebuilt::shipped();
    let compiled = parallel_map(&shipped, |s| {
        let kernel = s.kernel.build(&s.spec).expect("a shipped kernel builds");
        let options = attention_options(s.kernel, s.config, s.target);
        let compiled = compile(&kernel, &options).unwrap_or_else(|e| panic!("{}: {e}", s.name));
        (s.name.clone(), compiled)
    });
    check_ptx_dir(
        &manifest_path("../kernels/ptx"),
        "the PTX\n//! of every attention specialisation kiln ships (`attention::prebuilt::shipped`)",
        &compiled,
    );
}

/// Checks (or, blessing, writes) one `.ptx` file per compiled kernel in `dir` and the `mod.rs`
/// that lists them, sorted by name, with the dynamic shared memory a launch gives each; a file
/// of no kernel fails (blessing removes it).
fn check_ptx_dir(dir: &Path, what: &str, compiled: &[(String, Compiled)]) {
    if blessing() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let mut sorted: Vec<&(String, Compiled)> = compiled.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let mut index = format!(
        "//! Generated by kiln-codegen's tests (`KILN_BLESS=1 cargo test -p kiln-codegen`): {what},\n\
         //! by name, with the dynamic shared memory a launch gives each, sorted by name.\n\n\
         #[rustfmt::skip]\n\
         pub const PTX: &[(&str, &str, u32)] = &[\n",
    );
    for (name, compiled) in &sorted {
        check_file(&dir.join(format!("{name}.ptx")), compiled.ptx());
        let _ = writeln!(
            index,
            "    (\"{name}\", include_str!(\"{name}.ptx\"), {}),",
            compiled.dynamic_shared_bytes()
        );
    }
    index.push_str("];\n");
    check_file(&dir.join("mod.rs"), &index);
    let mut stale: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|file| {
            file != "mod.rs"
                && !sorted
                    .iter()
                    .any(|(name, _)| *file == format!("{name}.ptx"))
        })
        .collect();
    stale.sort();
    if blessing() {
        for file in &stale {
            std::fs::remove_file(dir.join(file)).unwrap();
        }
    } else {
        assert!(
            stale.is_empty(),
            "files of no kernel in {}: {stale:?}",
            dir.display()
        );
    }
}

/// ptxas from `KILN_PTXAS` (which must then run) or `PATH`.
fn ptxas() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("KILN_PTXAS") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("ptxas"))
        .find(|candidate| candidate.is_file())
}

/// Assembles `ptx` for `arch`; returns ptxas's resource report, or its errors with a command
/// that reproduces them.
fn assemble(ptxas: &Path, ptx: &str, name: &str, arch: &str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("kiln-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("{name}.ptx"));
    let output = dir.join(format!("{name}.cubin"));
    std::fs::write(&input, ptx).unwrap();
    let result = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg("--warn-on-spills")
        .arg(&input)
        .arg("-o")
        .arg(&output)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ptxas at {}: {e}", ptxas.display()));
    let report = String::from_utf8_lossy(&result.stderr).into_owned()
        + &String::from_utf8_lossy(&result.stdout);
    if result.status.success() {
        let _ = std::fs::remove_file(&input);
        Ok(report)
    } else {
        Err(format!(
            "ptxas failed on {name} for {arch}:\n{report}\nreproduce: {} -arch={arch} -v {}",
            ptxas.display(),
            input.display()
        ))
    }
}

/// The contents of the section called `name` of the 64-bit little-endian ELF file `elf`.
fn elf_section<'e>(elf: &'e [u8], name: &str) -> Option<&'e [u8]> {
    let u16_at = |at: usize| u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()) as usize;
    let u32_at = |at: usize| u32::from_le_bytes(elf[at..at + 4].try_into().unwrap()) as usize;
    let u64_at = |at: usize| u64::from_le_bytes(elf[at..at + 8].try_into().unwrap()) as usize;
    assert!(
        elf.starts_with(b"\x7fELF\x02\x01"),
        "not a 64-bit little-endian ELF file"
    );
    let (table, entry_size, count) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let header = |index: usize| table + index * entry_size;
    // A section header: its name's offset at 0, its contents' offset at 24 and size at 32.
    let contents = |index: usize| {
        let (offset, size) = (u64_at(header(index) + 24), u64_at(header(index) + 32));
        &elf[offset..offset + size]
    };
    let names = contents(u16_at(0x3e));
    (0..count).find_map(|index| {
        let start = u32_at(header(index));
        let end = start + names[start..].iter().position(|&b| b == 0)?;
        (&names[start..end] == name.as_bytes()).then(|| contents(index))
    })
}

/// What ptxas makes of `compiled` for its target: the registers per thread and the machine
/// code (the `.text.<kernel>` section of the cubin).
fn sass(ptxas: &Path, compiled: &Compiled, name: &str) -> (u32, Vec<u8>) {
    let arch = compiled.options.target.name();
    let report = assemble(ptxas, compiled.ptx(), name, arch).unwrap_or_else(|e| panic!("{e}"));
    let cubin = std::env::temp_dir()
        .join(format!("kiln-ptxas-{}", std::process::id()))
        .join(format!("{name}.cubin"));
    let elf = std::fs::read(&cubin).unwrap();
    let _ = std::fs::remove_file(&cubin);
    let text = elf_section(&elf, &format!(".text.{}", compiled.name))
        .unwrap_or_else(|| panic!("{name}: no .text.{} in the cubin", compiled.name));
    (registers(&report), text.to_vec())
}

/// The `.loc` lines change nothing ptxas makes of the forward attention kernel's code (for
/// sm_80 and sm_90a): the registers and the machine code are byte for byte the same without
/// them (the cubin gains line tables).
#[test]
fn line_info_leaves_the_machine_code_unchanged() {
    let Some(ptxas) = ptxas() else {
        eprintln!("ptxas not found (set KILN_PTXAS): skipping the SASS comparison");
        return;
    };
    let jobs: Vec<(Target, bool)> = Target::ALL
        .into_iter()
        .flat_map(|target| [(target, true), (target, false)])
        .collect();
    let code = parallel_map(&jobs, |&(target, line_info)| {
        let case = attention_case("attention_fwd", DType::F16, 128, false, target);
        let options = CompileOptions {
            line_info,
            ..case_options(&case, target)
        };
        let compiled = compile(&case.kernel, &options).unwrap();
        assert_eq!(compiled.ptx().contains(".loc"), line_info);
        let name = format!("{}_line_info={line_info}", case.name);
        sass(&ptxas, &compiled, &name)
    });
    for (pair, target) in code.chunks(2).zip(Target::ALL) {
        let ((registers, code), (registers_without, code_without)) = (&pair[0], &pair[1]);
        assert!(!code.is_empty(), "{target}: no machine code");
        assert_eq!(registers, registers_without, "{target}: registers");
        assert!(
            code == code_without,
            "{target}: line info changes the machine code"
        );
    }
}

/// The sum of the `N bytes stack frame, N bytes spill stores, N bytes spill loads` figures of
/// a ptxas `-v` report.
fn spill_and_stack_bytes(report: &str) -> u64 {
    report
        .lines()
        .filter(|line| line.contains("bytes stack frame"))
        .flat_map(|line| line.split(','))
        .filter_map(|part| part.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// The registers per thread of a ptxas `-v` report.
fn registers(report: &str) -> u32 {
    report
        .lines()
        .find_map(|l| {
            l.split("Used ")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// One kernel for ptxas: its name, what to compile, and whether a spill fails the test (it
/// only records it otherwise: head dim 256).
/// The most an attention kernel at head dim 128 or less may spill: its stack frame, spill stores
/// and spill loads together, as [`spill_and_stack_bytes`] counts them. The tuned table's worst
/// is the sm_80 D64 dK/dV, causal (without `loop_tid`, which measured slower there): 352 bytes
/// (ptxas 13.0.88; the D128 one spilled 432 before `loop_tid`, docs/PERF.md, twenty-ninth
/// session).
const TUNED_SPILL_BYTES: u64 = 512;

/// The same for the fused backward's dK/dV, which holds a dQ tile beside dK and dV: the sm_80
/// D64 one, the split entry's, 556 bytes; on sm_90a tens (docs/PERF.md, twenty-ninth session).
const FUSED_SPILL_BYTES: u64 = 768;

struct Assembly<'k> {
    name: String,
    kernel: &'k Kernel,
    options: CompileOptions,
    /// The most bytes it may spill or keep on the stack; `None`: any, printed.
    max_spilled: Option<u64>,
}

/// Runs `f` on every item on all cores (compiling and ptxas dominate CI time), results in order.
fn parallel_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut results: Vec<(usize, R)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(item) = items.get(i) else {
                            return done;
                        };
                        done.push((i, f(item)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a ptxas worker panicked"))
            .collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// ptxas assembles, for sm_80 and sm_90a, the PTX of every GPU case, of every op the lowering
/// knows, and of every attention specialisation kiln ships (the forward and both backwards'
/// kernels; f16 and bf16; head dims 32 to 256; causal or not) as the config table compiles it.
/// It fails on any error, on a warp-specialised kernel whose registers are not what its
/// `setmaxnreg` split assumes, and on any spill or stack frame beyond the kernel's budget: none for
/// the GPU cases and the ops; up to [`TUNED_SPILL_BYTES`] ([`FUSED_SPILL_BYTES`] for the fused
/// backward's dK/dV) for attention at head dims up to 128, whose tuned configurations spill a few values and
/// measured faster so (docs/PERF.md); any at head dim 256, printed.
#[test]
fn ptxas_assembles_every_kernel_within_its_spill_budget() {
    let Some(ptxas) = ptxas() else {
        eprintln!("ptxas not found (set KILN_PTXAS): skipping PTX assembly");
        return;
    };
    let cases = cases::cases();
    let every_op = every_op_kernels();
    // The attention cases are every shipped specialisation, compiled as the config table says.
    let mut jobs: Vec<Assembly<'_>> = cases
        .iter()
        .map(|case| Assembly {
            name: format!(
                "{}_w{}_s{}",
                case.name, case.knobs.num_warps, case.knobs.num_stages
            ),
            kernel: &case.kernel,
            options: case_options(case, case.target),
            max_spilled: match (is_attention(case), head_dim(case)) {
                (false, _) => Some(0),
                (true, ..=128) if accumulates_dq(case) => Some(FUSED_SPILL_BYTES),
                (true, ..=128) => Some(TUNED_SPILL_BYTES),
                (true, _) => None,
            },
        })
        .collect();
    for (name, kernel) in &every_op {
        for target in Target::ALL {
            jobs.push(Assembly {
                name: format!("{name}_{target}"),
                kernel,
                options: CompileOptions::new(target, 4),
                max_spilled: Some(0),
            });
        }
    }
    let reports = parallel_map(&jobs, |job| {
        let compiled =
            compile(job.kernel, &job.options).map_err(|e| format!("{}: {e}", job.name))?;
        assemble(&ptxas, compiled.ptx(), &job.name, job.options.target.name())
    });
    let mut failures = Vec::new();
    for (job, report) in jobs.iter().zip(reports) {
        match report {
            Ok(report) => {
                let spilled = spill_and_stack_bytes(&report);
                println!(
                    "{:56} {:3} registers, {spilled:5} bytes spilled or on the stack",
                    job.name,
                    registers(&report)
                );
                // A producer's split (`setmaxnreg`) assumes what the block launches with.
                if let Some(split) = job.options.register_split()
                    && registers(&report) != split.launch
                {
                    failures.push(format!(
                        "{}: ptxas gives {} registers a thread, the producer's split assumes {}",
                        job.name,
                        registers(&report),
                        split.launch
                    ));
                }
                if job.max_spilled.is_some_and(|max| spilled > max) {
                    failures.push(format!(
                        "{} spills or keeps on the stack {spilled} bytes, more than its \
                         budget of {:?}:\n{report}",
                        job.name, job.max_spilled
                    ));
                }
                // ptxas fixes what `wgmma` code gets wrong (a missing fence, an accumulator
                // touched in flight) by serializing, and says so, as a warning; short of
                // registers it serializes too and says so as information (C7512): kiln's code
                // must need neither, nor cost speed ptxas can name otherwise.
                for line in kiln_runtime::performance_warnings(&report) {
                    failures.push(format!("{}: ptxas: {line}", job.name));
                }
            }
            Err(message) => failures.push(message),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

// ---- the JIT's disk cache ----

/// A fresh directory under the system's temporary one.
fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The cache gives back exactly what it stored, and rebuilds anything it cannot trust: a
/// corrupt file, a file whose header names another key, a truncated one.
#[test]
fn the_disk_cache_is_used_only_when_sound() {
    let case = case("softmax_f16_m4_n1024_w4_sm_80");
    let options = case_options(&case, case.target);
    let dir = scratch_dir("cache");
    let first = cache::compile_cached(&case.kernel, &options, Some(&dir), None).unwrap();
    assert!(!first.hit);
    assert_eq!(first.ptx, compile_case(&case).ptx());
    let again = cache::compile_cached(&case.kernel, &options, Some(&dir), None).unwrap();
    assert!(again.hit);
    assert_eq!(
        (again.ptx.as_str(), again.shared_bytes),
        (first.ptx.as_str(), first.shared_bytes)
    );

    let file = dir.join(format!("{}.ptx", first.key));
    let sound = std::fs::read_to_string(&file).unwrap();
    let damaged = [
        sound.replacen("mov.", "mav.", 1),
        sound.replacen(&first.key, &"0".repeat(32), 1),
        sound[..sound.len() / 2].to_string(),
        String::new(),
    ];
    for text in damaged {
        std::fs::write(&file, &text).unwrap();
        let rebuilt = cache::compile_cached(&case.kernel, &options, Some(&dir), None).unwrap();
        assert!(!rebuilt.hit, "a damaged entry was trusted");
        assert_eq!(rebuilt.ptx, first.ptx);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            sound,
            "the entry is rewritten"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cache_keys_follow_the_kernel_and_the_options() {
    let softmax = case("softmax_f16_m4_n1024_w4_sm_80");
    let other = case("softmax_f32_m16_n128_w4_sm_80");
    let options = case_options(&softmax, softmax.target);
    let key = cache::key(&softmax.kernel, &options);
    assert_eq!(key.len(), 32);
    assert_eq!(key, cache::key(&softmax.kernel, &options.clone()));
    assert_ne!(
        key,
        cache::key(&softmax.kernel, &CompileOptions::new(Target::Sm90a, 4))
    );
    assert_ne!(
        key,
        cache::key(&softmax.kernel, &options.clone().with_stages(2))
    );
    assert_ne!(key, cache::key(&other.kernel, &options));
}

/// `KILN_DUMP`'s folder gets every stage, even when the cache holds the PTX.
#[test]
fn a_dump_writes_every_stage() {
    let case = case("vector_add_f16_b64_w4_sm_80");
    let options = case_options(&case, case.target);
    let (dir, dump) = (scratch_dir("dump-cache"), scratch_dir("dump"));
    cache::compile_cached(&case.kernel, &options, Some(&dir), None).unwrap();
    let dumped = cache::compile_cached(&case.kernel, &options, Some(&dir), Some(&dump)).unwrap();
    assert!(!dumped.hit);
    let folder = dump.join(format!("vector_add-{}", &dumped.key[..16]));
    for stage in Stage::ALL {
        let ext = if stage == Stage::Ptx { "ptx" } else { "txt" };
        let text = std::fs::read_to_string(folder.join(format!("{}.{ext}", stage.name())))
            .unwrap_or_else(|e| panic!("{stage}: {e}"));
        assert!(!text.is_empty(), "{stage}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&dump).unwrap();
}

/// Two spellings that spare LLVM 19's proxy registers, whose erasure walks the whole function
/// once per proxy (docs/PERF.md, thirty-fifth session), in what the shipped kernels are:
/// `ldmatrix` words for an f16 `mma.sync` come from inline PTX into f32 registers (no bitcast
/// from `i32`), those for a bf16 `mma.sync` or a `wgmma` from LLVM's intrinsic into `%r`; and a
/// vector load's bf16 elements widen by a shift or mask of their 32-bit words, not an `fpext`
/// (LLVM's starts with a bitcast to `i16` on sm_80, and unpacks the words on sm_90a).
#[test]
fn f16_mma_words_and_bf16_widening_spare_llvm_proxy_registers() {
    let ptx = |name: &str| {
        std::fs::read_to_string(manifest_path(&format!("../kernels/ptx/{name}.ptx")))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    // The register kind of every `ldmatrix` destination: `f` or `r`.
    let word_kinds = |name: &str| -> Vec<String> {
        let text = ptx(name);
        let kinds: Vec<String> = text
            .lines()
            .filter(|l| l.trim_start().starts_with("ldmatrix"))
            .flat_map(|l| {
                let words = &l[l.find('{').unwrap() + 1..l.find('}').unwrap()];
                words
                    .split(", ")
                    .map(|w| w.trim_start_matches('%')[..1].to_string())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(!kinds.is_empty(), "{name} has no ldmatrix");
        kinds
    };
    for (name, kind) in [
        ("attention_bwd_dkdv_f16_d128_causal_fused_sm_80", "f"),
        ("attention_bwd_dq_f16_d64_sm_80", "f"),
        ("attention_fwd_f16_d128_sm_80", "f"),
        ("attention_bwd_dkdv_f16_d256_causal_fused_sm_90a", "f"),
        ("attention_bwd_dkdv_bf16_d128_causal_fused_sm_80", "r"),
        ("attention_fwd_f16_d64_long_sm_90a", "r"),
    ] {
        let kinds = word_kinds(name);
        assert!(kinds.iter().all(|k| k == kind), "{name}: {kinds:?}");
        if kind == "f" {
            // Each f32 word reaches the `mma` as a `mov.b32`, which ptxas folds away; constant
            // offsets are in the statements, as LLVM puts them in the intrinsic's.
            let text = ptx(name);
            assert!(text.matches("mov.b32").count() >= kinds.len(), "{name}");
            assert!(
                text.lines()
                    .any(|l| l.trim_start().starts_with("ldmatrix") && l.contains("+")),
                "{name}"
            );
        }
    }
    let llir = |target: Target| {
        let s = prebuilt::shipped()
            .into_iter()
            .find(|s| s.name == format!("attention_bwd_dq_bf16_d128_{target}"))
            .unwrap();
        let kernel = s.kernel.build(&s.spec).unwrap();
        let options = attention_options(s.kernel, s.config, s.target);
        let compiled = compile_keeping(&kernel, &options, Keep::EveryStage).unwrap();
        compiled.stage(Stage::Llir).unwrap().to_string()
    };
    // The elements of dO and O a thread widens (for their rows' dot products), two to a 32-bit
    // word of their vector loads: the low ones shifted up, the high ones masked.
    for (target, masked) in [(Target::Sm80, 128), (Target::Sm90a, 64)] {
        let llir = llir(target);
        assert_eq!(llir.matches("fpext bfloat").count(), 0, "{target}");
        assert_eq!(llir.matches(", -65536,").count(), masked, "{target}");
        assert!(llir.matches(", 16,").count() >= masked, "{target}");
    }
}

/// Compile cost, DSL to PTX, of every attention specialisation kiln ships, one after the
/// other, as a launch compiles them ([`Keep::Ptx`]): building the IR from the DSL, then every
/// stage to PTX. The ten slowest are timed again (best of 3), the five slowest of those split
/// by stage. Printed for
/// docs/PERF.md (kiln aims under 100 ms a kernel); the bound here only catches a blow-up on a
/// slow CI machine.
#[test]
fn attention_kernels_compile_in_well_under_a_second() {
    let ms = |start: std::time::Instant| start.elapsed().as_secs_f64() * 1e3;
    let compile_ms = |s: &prebuilt::Specialisation| {
        let start = std::time::Instant::now();
        let built = s.kernel.build(&s.spec).unwrap();
        let options = attention_options(s.kernel, s.config, s.target);
        compile_keeping(&built, &options, Keep::Ptx).unwrap();
        ms(start)
    };
    let shipped = prebuilt::shipped();
    let mut costs: Vec<(f64, &prebuilt::Specialisation)> =
        shipped.iter().map(|s| (compile_ms(s), s)).collect();
    costs.sort_by(|a, b| b.0.total_cmp(&a.0));
    let median = costs[costs.len() / 2].0;
    println!(
        "compile cost of the {} shipped specialisations: median {median:.1} ms, slowest {:.1} ms",
        costs.len(),
        costs[0].0
    );
    for target in Target::ALL {
        if let Some((cost, s)) = costs.iter().find(|(_, s)| s.target == target) {
            println!("slowest on {target}: {} {cost:.1} ms", s.name);
        }
    }
    // Best of 3 of the ten slowest, whole and by part: building the IR from the DSL, the
    // layout and thread stages, and the rest (LLVM IR, passes, NVPTX). Ten, not five: one
    // reading on a busy machine spreads by up to 30%, more than the slowest kernels differ.
    let mut slowest = Vec::new();
    for &(_, s) in costs.iter().take(10) {
        let options = attention_options(s.kernel, s.config, s.target);
        let (mut best, mut build, mut thread) = (f64::INFINITY, f64::INFINITY, f64::INFINITY);
        for _ in 0..3 {
            let start = std::time::Instant::now();
            let built = s.kernel.build(&s.spec).unwrap();
            build = build.min(ms(start));
            compile_keeping(&built, &options, Keep::Ptx).unwrap();
            best = best.min(ms(start));
            let start = std::time::Instant::now();
            thread_program(&built, &options).unwrap();
            thread = thread.min(ms(start));
        }
        assert!(best < 1000.0, "{} took {best:.0} ms to compile", s.name);
        slowest.push((best, build, thread, &s.name));
    }
    slowest.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (best, build, thread, name) in slowest.into_iter().take(5) {
        println!(
            "compile cost {name}: {best:.1} ms (DSL -> PTX, best of 3): build {build:.1} ms, \
             layout + thread {thread:.1} ms, LLVM (IR, passes, NVPTX) {:.1} ms",
            best - build - thread
        );
    }
}
