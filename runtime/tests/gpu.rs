//! The GPU test: runs the PTX kiln-codegen made for each case in `gpu/cases.rs` (carried in
//! `gpu/ptx/`, so that this binary links no LLVM) and compares every element of every buffer
//! with the interpreter's run on the same inputs. Outputs start poisoned (NaN, `0x5a5a5a5a`), so
//! an element the GPU fails to write is a mismatch. Prints a table; exits non-zero on a mismatch.
//!
//! Run it on a machine with a GPU: `cargo test --release -p kiln-runtime --features gpu --test gpu`,
//! or build it here and run it there with `scripts/device-gpu-tests.sh` (then `.device/kiln-gpu-tests`).

#[path = "gpu/cases.rs"]
mod cases;
#[path = "gpu/ptx/mod.rs"]
mod ptx;

use std::process::ExitCode;

use kiln_dsl::{DType, Grid, HostBuffer, KernelArg, SpecValue};
use kiln_runtime::{Device, Function, LaunchArg, LaunchConfig, ParamType, RuntimeError};

use cases::Case;

/// One argument of a run, shared by the interpreter's and the GPU's launch.
enum Arg {
    /// An index into the run's buffers.
    Buffer(usize),
    I32(i32),
    F32(f32),
}

/// A launch of a case: its buffers (inputs filled, outputs poisoned), arguments and grid.
struct Run {
    label: String,
    buffers: Vec<HostBuffer>,
    args: Vec<Arg>,
    programs: u32,
}

/// Deterministic inputs in [-4, 4), rounded to `dtype` by the host buffer.
fn inputs(dtype: DType, len: usize, seed: u64) -> HostBuffer {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let values: Vec<f32> = (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % 8192) as f32 / 1024.0 - 4.0
        })
        .collect();
    HostBuffer::from_f32(dtype, &values)
}

fn block_of(case: &Case) -> u32 {
    match case.kernel.spec.get("BLOCK") {
        Some(SpecValue::Int(block)) => block as u32,
        other => panic!("case {} has no BLOCK, got {other:?}", case.name),
    }
}

fn dtype_of(case: &Case) -> DType {
    case.kernel
        .spec
        .dtype_param("T")
        .unwrap_or_else(|| panic!("case {} has no T", case.name))
}

/// The runs of a case: a few sizes with ragged tails (and, for `scale_loop`, loop counts).
fn runs(case: &Case) -> Vec<Run> {
    let (block, dtype) = (block_of(case), dtype_of(case));
    let programs = |n: usize| (n as u32).div_ceil(block);
    match case.kernel.name() {
        "vector_add" => [1usize, 1000, 4097, 1_000_003]
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
                programs: programs(n),
            })
            .collect(),
        "scale_loop" => [(1usize, 0), (1000, 2), (65_537, 5)]
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
                programs: programs(n),
            })
            .collect(),
        other => panic!("no runs for kernel {other}"),
    }
}

/// What comparing one run found.
struct Outcome {
    elements: usize,
    mismatches: usize,
    max_diff: f64,
    first: Vec<String>,
}

/// Every element of every buffer, GPU against interpreter: equal, or both NaN.
fn compare(expected: &[HostBuffer], actual: &[HostBuffer]) -> Outcome {
    let mut outcome = Outcome {
        elements: 0,
        mismatches: 0,
        max_diff: 0.0,
        first: Vec::new(),
    };
    for (buffer, (want, got)) in expected.iter().zip(actual).enumerate() {
        let (want, got) = (want.to_f64(), got.to_f64());
        for (i, (&w, &g)) in want.iter().zip(&got).enumerate() {
            outcome.elements += 1;
            if w == g || (w.is_nan() && g.is_nan()) {
                continue;
            }
            outcome.mismatches += 1;
            outcome.max_diff = outcome.max_diff.max((w - g).abs());
            if outcome.first.len() < 5 {
                outcome.first.push(format!(
                    "buffer {buffer} element {i}: gpu {g}, interpreter {w}"
                ));
            }
        }
    }
    outcome
}

/// Loads a case's PTX and finds its kernel.
fn load(device: &Device, case: &Case) -> Result<Function, String> {
    let source = ptx::PTX
        .iter()
        .find(|(name, _)| *name == case.name)
        .map(|(_, text)| *text)
        .ok_or_else(|| format!("no PTX for case {} in gpu/ptx/mod.rs", case.name))?;
    let module = device
        .load_module(&case.name, source)
        .map_err(|e| e.to_string())?;
    module
        .function(case.kernel.name(), ParamType::of_kernel(&case.kernel))
        .map_err(|e| e.to_string())
}

fn run_case(
    device: &Device,
    case: &Case,
    function: &Function,
    run: &Run,
) -> Result<Outcome, String> {
    let runtime = |e: RuntimeError| e.to_string();
    // The device gets the inputs and the poison before the interpreter writes its outputs.
    let device_buffers = run
        .buffers
        .iter()
        .map(|b| device.upload(b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(runtime)?;
    let host_args: Vec<KernelArg<'_>> = run
        .args
        .iter()
        .map(|arg| match *arg {
            Arg::Buffer(i) => KernelArg::Buffer(&run.buffers[i]),
            Arg::I32(v) => KernelArg::I32(v),
            Arg::F32(v) => KernelArg::F32(v),
        })
        .collect();
    kiln_dsl::run(&case.kernel, Grid::new(run.programs, 1, 1), &host_args)
        .map_err(|e| format!("interpreter: {e}"))?;
    let launch_args: Vec<LaunchArg<'_>> = run
        .args
        .iter()
        .map(|arg| match *arg {
            Arg::Buffer(i) => LaunchArg::Buffer(&device_buffers[i]),
            Arg::I32(v) => LaunchArg::I32(v),
            Arg::F32(v) => LaunchArg::F32(v),
        })
        .collect();
    let config = LaunchConfig::new([run.programs, 1, 1], case.num_warps * 32);
    // Safety: the PTX is this case's kernel, whose parameters `ParamType::of_kernel` lists, and
    // the interpreter just ran it on buffers of the same sizes without an out-of-bounds access.
    unsafe { device.launch(function, config, &launch_args) }.map_err(runtime)?;
    device.synchronize().map_err(runtime)?;
    let results = device_buffers
        .iter()
        .map(|b| b.to_host(device))
        .collect::<Result<Vec<_>, _>>()
        .map_err(runtime)?;
    let mut outcome = compare(&run.buffers, &results);
    // A poisoned element the interpreter left is a test bug: every output must be written.
    for (i, buffer) in run.buffers.iter().enumerate() {
        let left = buffer.poisoned_indices();
        if !left.is_empty() {
            outcome.mismatches += left.len();
            outcome.first.push(format!(
                "buffer {i}: the interpreter left {} elements poisoned",
                left.len()
            ));
        }
    }
    Ok(outcome)
}

fn main() -> ExitCode {
    let device = match Device::current_or_default() {
        Ok(device) => device,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let capability = device.compute_capability().unwrap_or((0, 0));
    println!(
        "device {}: {} (compute capability {}.{})",
        device.ordinal(),
        device.name().unwrap_or_else(|e| e.to_string()),
        capability.0,
        capability.1
    );
    println!(
        "{:34} {:22} {:>8} {:>10} {:>10} {:>10}  result",
        "case", "run", "programs", "elements", "mismatches", "max |diff|"
    );
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for case in cases::cases() {
        // `sm_90a` PTX runs on compute capability 9.0 only.
        if case.target == "sm_90a" && capability != (9, 0) {
            println!(
                "{:34} {:22} skipped: needs compute capability 9.0",
                case.name, ""
            );
            skipped += 1;
            continue;
        }
        let function = match load(&device, &case) {
            Ok(function) => function,
            Err(message) => {
                println!("{:34} {:22} FAILED: {message}", case.name, "");
                failed += 1;
                continue;
            }
        };
        for run in runs(&case) {
            match run_case(&device, &case, &function, &run) {
                Ok(outcome) => {
                    let ok = outcome.mismatches == 0;
                    println!(
                        "{:34} {:22} {:>8} {:>10} {:>10} {:>10.3e}  {}",
                        case.name,
                        run.label,
                        run.programs,
                        outcome.elements,
                        outcome.mismatches,
                        outcome.max_diff,
                        if ok { "ok" } else { "MISMATCH" }
                    );
                    for line in &outcome.first {
                        println!("    {line}");
                    }
                    if ok {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
                Err(message) => {
                    println!("{:34} {:22} FAILED: {message}", case.name, run.label);
                    failed += 1;
                }
            }
        }
    }
    println!("{passed} runs agree with the interpreter, {failed} do not, {skipped} cases skipped");
    if failed == 0 && passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
