//! `kiln`: kiln's command line.
//!
//! - `kiln demo`, kiln's main job: attention on the CPU interpreter against f64, the forward's PTX
//!   with its `.loc` lines, and on a GPU the prebuilt kernels checked and timed ([`demo`]).
//! - `kiln bench`: the prebuilt kernels at the FlashAttention benchmark setup ([`bench`]).
//! - `kiln tune`: searches the attention kernels' block sizes, warps and stages on this GPU
//!   ([`tune`]; needs the `codegen` feature to compile candidates).
//! - `kiln list`: the kernels, their specialisation parameters and default specs, and the
//!   attention specialisations kiln ships as PTX.
//! - `kiln <stage> <kernel> [flags]`: one specialisation at one stage of the compiler, from the
//!   tile IR to PTX, then SASS and ptxas's resource report ([`inspect`], [`tools`]).
//!
//! Without the `codegen` feature the binary links no LLVM: it prints the tile IR and the PTX kiln
//! ships, and hands shipped PTX to ptxas; every other stage says how to rebuild with the feature.

mod bench;
mod demo;
mod inspect;
mod tools;
mod tune;

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;

use kiln_kernels::attention::{AttentionKernel, prebuilt};
use kiln_kernels::registry::{self, KernelEntry};

const USAGE: &str = concat!(
    "usage:
  kiln demo       kiln's main job: attention forward + backward on the CPU interpreter,
                  checked against f64, and the forward's PTX with its .loc lines; with a GPU,
                  the prebuilt kernels at the benchmark setup, checked, in TFLOP/s
  kiln list       the kernels, their specialisation parameters and default specs, and the
                  attention specialisations kiln ships
  kiln bench      the prebuilt attention kernels on this GPU at the FlashAttention setup:
                  [--dtype bf16|f16] [--head-dims 64,128] [--seqs 1024,...] [--samples N]
                  [--warm SECONDS] [--check]
  kiln tune       searches block sizes, warps and stages of the attention kernels on this GPU,
                  each candidate compiled from the DSL (needs --features codegen), checked
                  against f64 and timed: [--dtype bf16|f16] [--head-dims 64,128]
                  [--causal both|yes|no] [--seqlen N] [--kernels attention_fwd,...]
                  [--backward split|fused] [--decode] [--samples N] [--warm SECONDS]
                  [--configs ",
    kiln_kernels::kernel_config_grammar!(),
    ",...]
                  (these instead of the search)
  kiln <stage> <kernel> [--spec K=V,...] [--arch sm_80|sm_90a] [--warps N] [--stages N]
                        [--wgmma yes|no] [--divisibility ARG=N,...]
                  one specialisation of a kernel at one stage:
    ir            the tile IR
    layout        the tile IR with a layout on every value
    thread        the thread program: what one thread runs
    llvm          LLVM IR as translated, verified
    llvm-opt      LLVM IR after kiln's LLVM pass pipeline
    ptx           PTX
    sass          the machine code: ptxas, then cuobjdump -sass (or nvdisasm)
    resources     ptxas -v: registers, shared memory, spills, stack frame

  --spec overrides the kernel's default spec (`kiln list`); --arch defaults to sm_90a.
  Attention kernels compile as kiln ships them: block sizes (unless --spec gives them),
  warps, stages and divisibility from kiln's table for the spec's HEAD_DIM and the arch.
  Other kernels: 4 warps, 1 stage, nothing assumed of the arguments.
  layout, thread, llvm and llvm-opt, and the PTX of a specialisation kiln does not ship,
  need kiln built with `--features codegen` (LLVM 19). ptxas is $KILN_PTXAS or on PATH;
  cuobjdump or nvdisasm on PATH or beside ptxas."
);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo::demo(),
        Some("bench") => bench::run(&args[1..]),
        Some("tune") => tune::run(&args[1..]),
        Some("list") => emit(&list()),
        Some("help" | "--help" | "-h") => emit(&format!("{USAGE}\n")),
        Some(command) => match inspect::Show::from_name(command) {
            Some(show) => inspect::run(show, &args),
            None => Err(format!("unknown command `{command}`\n{USAGE}")),
        },
        None => Err(USAGE.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `println!` for the commands: through [`emit`], so that a reader that stops early is no
/// panic; the enclosing function returns the error of any other failed write.
macro_rules! say {
    () => {
        crate::emit("\n")?
    };
    ($($arg:tt)*) => {
        crate::emit(&format!("{}\n", format_args!($($arg)*)))?
    };
}
pub(crate) use say;

/// Writes `text` to stdout; a reader that stops early (`kiln ptx ... | head`) is no error.
fn emit(text: &str) -> Result<(), String> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(format!("cannot write to stdout: {e}"))
        }
        _ => Ok(()),
    }
}

/// A kernel's specialisation parameters with their kinds: `T (a dtype), BLOCK_M (an integer)`.
fn params(kernel: &KernelEntry) -> String {
    let params: Vec<String> = kernel
        .signature
        .params
        .iter()
        .map(|p| format!("{} ({})", p.name, p.kind))
        .collect();
    params.join(", ")
}

fn list() -> String {
    let mut out = String::new();
    for kernel in registry::kernels() {
        let _ = writeln!(out, "{:<28} {}", kernel.name(), params(&kernel));
        let _ = writeln!(out, "{:<28} default: {}", "", (kernel.default_spec)());
        if let Some(attention) = AttentionKernel::from_name(kernel.name()) {
            let _ = writeln!(out, "{:<28} ships {}", "", shipped_summary(attention));
        }
    }
    out.push_str(
        "\nShipped specialisations take block sizes, warps and stages from kiln's table\n\
         (kernels/src/attention/config.rs); `kiln ptx attention_fwd --spec T=bf16,HEAD_DIM=128 \
         --arch sm_80`\nprints one.\n",
    );
    out
}

/// The specialisations of `kernel` that kiln ships, grouped by parameter: `32 specialisations:
/// T = f16, bf16;
/// HEAD_DIM = 32, 64, 128, 256; ...; on sm_80, sm_90a`.
fn shipped_summary(kernel: AttentionKernel) -> String {
    let shipped: Vec<prebuilt::Specialisation> = prebuilt::shipped()
        .into_iter()
        .filter(|s| s.kernel == kernel)
        .collect();
    // Distinct values in the order the table lists them.
    fn distinct<T: PartialEq + ToString>(values: impl Iterator<Item = T>) -> String {
        let mut seen: Vec<T> = Vec::new();
        for value in values {
            if !seen.contains(&value) {
                seen.push(value);
            }
        }
        let seen: Vec<String> = seen.iter().map(T::to_string).collect();
        seen.join(", ")
    }
    let mut groups: Vec<String> = ["T", "HEAD_DIM", "CAUSAL"]
        .into_iter()
        .filter(|&param| kernel.signature().param(param).is_some())
        .map(|param| {
            let values = shipped.iter().filter_map(|s| s.spec.get(param));
            format!("{param} = {}", distinct(values))
        })
        .collect();
    groups.push(format!("on {}", distinct(shipped.iter().map(|s| s.target))));
    format!("{} specialisations: {}", shipped.len(), groups.join("; "))
}
