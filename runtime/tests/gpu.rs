//! The GPU test: runs the PTX kiln-codegen made for each case in `gpu/cases.rs` (carried in
//! `gpu/ptx/`, so that this binary links no LLVM) and compares every element of every buffer
//! with the interpreter's run on the same inputs, within the case's tolerance (exact for kernels
//! of correctly rounded ops; a few units of the output's last place where sums are reassociated
//! or `ex2.approx` is used: `cases::Tolerance`). Outputs start poisoned (NaN, `0x5a5a5a5a`), so
//! an element the GPU fails to write is a mismatch. Prints a table; exits non-zero on a mismatch.
//!
//! Run it on a machine with a GPU: `cargo test --release -p kiln-runtime --features gpu --test gpu`,
//! or build it here and run it there with `scripts/device-gpu-tests.sh` (then `.device/kiln-gpu-tests`).
//! An argument runs only the cases whose names contain it (`.device/kiln-gpu-tests attention_`).
//! Last, `stream_workspaces` checks kiln-runtime's `StreamWorkspaces` against the driver
//! (`gpu/workspaces.rs`).

#[path = "gpu/cases.rs"]
mod cases;
#[path = "gpu/ptx/mod.rs"]
mod ptx;
#[path = "gpu/workspaces.rs"]
mod workspaces;

use std::process::ExitCode;

use kiln_dsl::{Grid, Target};
use kiln_kernels::attention::prebuilt;
use kiln_runtime::{
    Device, Function, LaunchArg, LaunchConfig, ParamType, RuntimeError, cuda_release,
    driver_version,
};

use cases::{Arg, Case, Outcome, Run, Tolerance};

/// Loads a case's PTX and finds its kernel, opted into the dynamic shared memory it needs;
/// returns it with that many bytes.
fn load(device: &Device, case: &Case) -> Result<(Function, u32), String> {
    // The attention cases are the specialisations kiln-kernels ships, with their PTX.
    let (source, shared_bytes) = ptx::PTX
        .iter()
        .find(|(name, _, _)| *name == case.name)
        .map(|&(_, text, shared_bytes)| (text, shared_bytes))
        .or_else(|| prebuilt::ptx(&case.name).map(|ptx| (ptx.text, ptx.shared_bytes)))
        .ok_or_else(|| format!("no PTX for case {} in gpu/ptx/mod.rs", case.name))?;
    let module = device
        .load_module(&case.name, source)
        .map_err(|e| e.to_string())?;
    let function = module
        .function(case.kernel.name(), ParamType::of_kernel(&case.kernel))
        .map_err(|e| e.to_string())?;
    if shared_bytes > 0 {
        function
            .set_max_dynamic_shared_bytes(shared_bytes)
            .map_err(|e| e.to_string())?;
    }
    Ok((function, shared_bytes))
}

/// A module's PTX, and a kernel's name, holding a NUL byte: each an error naming it.
fn nul_refused(device: &Device) -> Result<(), String> {
    let refused = |what: &str, outcome: Result<(), RuntimeError>| match outcome {
        Err(e) if e.to_string().contains("NUL byte") => Ok(()),
        other => Err(format!("{what}: {other:?}")),
    };
    refused("load_module", device.load_module("nul", "\0").map(drop))?;
    let (name, source, _) = ptx::PTX[0];
    let module = device
        .load_module(name, source)
        .map_err(|e| e.to_string())?;
    refused("function", module.function("a\0b", Vec::new()).map(drop))
}

fn run_case(
    device: &Device,
    case: &Case,
    (function, shared_bytes): &(Function, u32),
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
    let [x, y, z] = run.grid;
    kiln_dsl::run(
        &case.kernel,
        Grid::new(x, y, z),
        &run.host_args(&run.buffers),
    )
    .map_err(|e| format!("interpreter: {e}"))?;
    let launch_args: Vec<LaunchArg<'_>> = run
        .args
        .iter()
        .map(|arg| match *arg {
            Arg::Buffer(i) => LaunchArg::Buffer(&device_buffers[i]),
            Arg::I32(v) => LaunchArg::I32(v),
            Arg::I64(v) => LaunchArg::I64(v),
            Arg::F32(v) => LaunchArg::F32(v),
        })
        .collect();
    let config =
        LaunchConfig::new(run.grid, case.knobs.threads()).with_dynamic_shared_bytes(*shared_bytes);
    // Safety: the PTX is this case's kernel, whose parameters `ParamType::of_kernel` lists, and
    // the interpreter just ran it on buffers of the same sizes without an out-of-bounds access.
    unsafe { device.launch(function, config, &launch_args) }.map_err(runtime)?;
    device.synchronize().map_err(runtime)?;
    let results = device_buffers
        .iter()
        .map(|b| b.to_host(device))
        .collect::<Result<Vec<_>, _>>()
        .map_err(runtime)?;
    // Elements the interpreter leaves poisoned (row-stride padding) must stay poisoned on the GPU:
    // `compare` matches NaN with NaN only, so a stray write or a missed one is a mismatch.
    let outcome: Outcome = cases::compare(&run.buffers, &results, case.tolerance);
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
    let driver = driver_version().unwrap_or(0);
    let best = Target::for_device(capability.0, capability.1, driver);
    println!(
        "device {}: {} (compute capability {}.{})",
        device.ordinal(),
        device.name().unwrap_or_else(|e| e.to_string()),
        capability.0,
        capability.1
    );
    println!(
        "{:40} {:18} {:>10} {:>10} {:>10} {:>10}  result",
        "case", "run", "tolerance", "elements", "mismatches", "max |diff|"
    );
    // An argument keeps the cases whose names contain it (for the sanitizers' slower runs).
    let filter = std::env::args().nth(1).unwrap_or_default();
    let (mut passed, mut failed, mut skipped) = (0, 0, 0);
    for case in cases::cases()
        .into_iter()
        .filter(|c| c.name.contains(&filter))
    {
        // A case runs where its target does: `sm_90a` on compute capability 9.0 only, each
        // under a driver that reads its PTX ISA (`Target::for_device`).
        if best.is_none_or(|best| case.target > best) {
            println!(
                "{:40} {:18} skipped: this device runs {} ({})",
                case.name,
                "",
                best.map_or("no target".to_string(), |t| t.to_string()),
                cuda_release(driver)
            );
            skipped += 1;
            continue;
        }
        let function = match load(&device, &case) {
            Ok(function) => function,
            Err(message) => {
                println!("{:40} {:18} FAILED: {message}", case.name, "");
                failed += 1;
                continue;
            }
        };
        for run in cases::runs(&case) {
            match run_case(&device, &case, &function, &run) {
                Ok(outcome) => {
                    let ok = outcome.mismatches == 0;
                    let tolerance = match case.tolerance {
                        Tolerance::Exact => "exact".to_string(),
                        Tolerance::Relative(rtol) => format!("{rtol:.0e}"),
                    };
                    println!(
                        "{:40} {:18} {:>10} {:>10} {:>10} {:>10.3e}  {}",
                        case.name,
                        run.label,
                        tolerance,
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
                    println!("{:40} {:18} FAILED: {message}", case.name, run.label);
                    failed += 1;
                }
            }
        }
    }
    // The split forward's kept workspaces, by the driver, and text the driver cannot take
    // refused as an error (cudarc would panic on it).
    let (mut workspaces_passed, mut workspaces_failed) = (0, 0);
    if "stream_workspaces".contains(&filter) {
        let mut checks = workspaces::check(&device);
        checks.push(("PTX with a NUL byte", nul_refused(&device)));
        for (name, outcome) in checks {
            match outcome {
                Ok(()) => {
                    println!("{:40} {name:18} ok", "stream_workspaces");
                    workspaces_passed += 1;
                }
                Err(message) => {
                    println!("{:40} {name:18} FAILED: {message}", "stream_workspaces");
                    workspaces_failed += 1;
                }
            }
        }
    }
    println!(
        "{passed} runs agree with the interpreter, {failed} do not, {skipped} cases skipped; \
         stream workspaces: {workspaces_passed} checks pass, {workspaces_failed} fail"
    );
    if failed + workspaces_failed == 0 && passed + workspaces_passed > 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
