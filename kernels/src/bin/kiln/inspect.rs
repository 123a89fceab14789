//! `kiln <stage> <kernel> [flags]`: which specialisation the flags name, compiled how, and its
//! text at one stage. Attention kernels default to exactly what kiln ships, so that what the CLI
//! shows is what a launch runs.

use std::fmt;

use kiln_dsl::{Kernel, Spec, SpecValue, Target};
use kiln_kernels::attention::{
    self, AttentionKernel, CodegenKnobs, HEAD_DIMS, KernelConfig, KeyLength, prebuilt,
};
use kiln_kernels::registry::{self, KernelEntry};

use crate::{emit, params, tools};

/// What `kiln <stage>` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Show {
    Ir,
    Layout,
    Thread,
    Llvm,
    LlvmOpt,
    Ptx,
    Sass,
    Resources,
}

impl Show {
    const ALL: [Show; 8] = [
        Show::Ir,
        Show::Layout,
        Show::Thread,
        Show::Llvm,
        Show::LlvmOpt,
        Show::Ptx,
        Show::Sass,
        Show::Resources,
    ];

    fn name(self) -> &'static str {
        match self {
            Show::Ir => "ir",
            Show::Layout => "layout",
            Show::Thread => "thread",
            Show::Llvm => "llvm",
            Show::LlvmOpt => "llvm-opt",
            Show::Ptx => "ptx",
            Show::Sass => "sass",
            Show::Resources => "resources",
        }
    }

    pub fn from_name(name: &str) -> Option<Show> {
        Show::ALL.into_iter().find(|s| s.name() == name)
    }
}

/// Flags the stage commands take, for error messages.
const FLAGS: &str = "--spec K=V,..., --arch sm_80|sm_90a, --warps N, --stages N, \
                     --wgmma yes|no, --divisibility ARG=N,...";

/// One specialisation, built, and how to compile it.
#[derive(Debug)]
struct Request {
    entry: KernelEntry,
    spec: Spec,
    kernel: Kernel,
    target: Target,
    /// Warps, stages and `wgmma` as the flags give them, else as the table has them; the
    /// other knobs as the table has them.
    knobs: CodegenKnobs,
    /// kiln-codegen's divisibility: `(argument, n)`, the argument a multiple of `n`. Without
    /// codegen it only tells whether the request is shipped.
    #[cfg(feature = "codegen")]
    divisibility: Vec<(String, u64)>,
    /// The shipped specialisation these exact options compile, whose PTX kiln-kernels holds.
    shipped: Option<prebuilt::Specialisation>,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {} for {}, {}",
            self.entry.name(),
            self.spec,
            self.target,
            self.knobs
        )?;
        match &self.shipped {
            Some(s) => write!(f, " (shipped as {})", s.name),
            None => Ok(()),
        }
    }
}

/// Runs `kiln <show> <kernel> [flags]`; `args` is the whole command line, the command first.
pub fn run(show: Show, args: &[String]) -> Result<(), String> {
    let request = parse(show, &args[1..])?;
    // What is being shown, beside stdout's text; `resources` puts it in its table.
    if show != Show::Resources {
        eprintln!("kiln: {request}");
    }
    match show {
        Show::Ir => emit(&request.kernel.to_string()),
        Show::Sass | Show::Resources => {
            let ptx = ptx(&request, args)?;
            let name = request.entry.name();
            if show == Show::Sass {
                emit(&tools::sass(&ptx.text, name, request.target)?)
            } else {
                let report = tools::resources(&ptx.text, name, request.target)?;
                emit(&format!(
                    "{request}\n  threads           {} per block\n{}",
                    request.knobs.threads(),
                    report.table(ptx.shared_bytes)
                ))
            }
        }
        _ => stage(&request, show, args),
    }
}

/// What the command line gives; the rest comes from the kernel's defaults and kiln's table.
struct Flags {
    given: Spec,
    target: Target,
    warps: Option<u32>,
    stages: Option<u32>,
    wgmma: Option<bool>,
    divisibility: Option<Vec<(String, u64)>>,
}

/// Reads `<kernel> [flags]`.
fn read(show: Show, args: &[String]) -> Result<(KernelEntry, Flags), String> {
    let Some((name, args)) = args
        .split_first()
        .filter(|(name, _)| !name.starts_with('-'))
    else {
        return Err(format!(
            "`kiln {}` needs a kernel name (see `kiln list`)",
            show.name()
        ));
    };
    let entry = registry::find(name)?;
    let mut flags = Flags {
        given: Spec::new(),
        target: Target::Sm90a,
        warps: None,
        stages: None,
        wgmma: None,
        divisibility: None,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        // `--flag value` or `--flag=value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| args.next().cloned())
                .ok_or_else(|| format!("`{flag}` needs a value"))
        };
        match flag {
            "--spec" => {
                flags.given = std::mem::take(&mut flags.given)
                    .with_assignments(&value()?, entry.signature)
                    .map_err(|e| format!("{e}\n`{}` takes: {}", entry.name(), params(&entry)))?;
            }
            "--arch" => flags.target = value()?.parse().map_err(|e| format!("{e}"))?,
            "--warps" => flags.warps = Some(number(flag, &value()?)?),
            "--stages" => flags.stages = Some(number(flag, &value()?)?),
            "--wgmma" => {
                flags.wgmma = Some(match value()?.as_str() {
                    "yes" => true,
                    "no" => false,
                    other => return Err(format!("`--wgmma` expects yes or no, got `{other}`")),
                })
            }
            "--divisibility" => {
                flags.divisibility = Some(parse_divisibility(&entry, &value()?)?);
            }
            other => return Err(format!("unexpected argument `{other}`; expected {FLAGS}")),
        }
    }
    Ok((entry, flags))
}

/// Reads `<kernel> [flags]` and settles the spec and the compile options: what the flags give,
/// else for attention kernels what kiln ships, else 4 warps and 1 stage.
fn parse(show: Show, args: &[String]) -> Result<Request, String> {
    let (entry, flags) = read(show, args)?;
    let target = flags.target;
    let mut spec = flags
        .given
        .iter()
        .fold((entry.default_spec)(), |spec, (name, value)| {
            spec.set(name, value)
        });
    let attention = AttentionKernel::from_name(entry.name());
    let table = attention.and_then(|kernel| table_entry(kernel, &mut spec, &flags.given, target));
    let wgmma = flags.wgmma.or(table.map(|c| c.wgmma)).unwrap_or(false);
    let producer = wgmma && table.is_some_and(|c| c.producer);
    let knobs = CodegenKnobs {
        num_warps: flags.warps.or(table.map(|c| c.num_warps)).unwrap_or(4),
        num_stages: flags.stages.or(table.map(|c| c.num_stages)).unwrap_or(1),
        wgmma,
        producer,
        lean_producer: producer && table.is_some_and(|c| c.lean_producer),
        uniform_warpgroup: wgmma && table.is_some_and(|c| c.uniform_warpgroup),
        descriptors_at_issue: wgmma && table.is_some_and(|c| c.descriptors_at_issue),
        resident_a: wgmma && table.is_some_and(|c| c.resident_a),
        partial_sums: table.is_some_and(|c| c.partial_sums),
        loop_tid: table.is_some_and(|c| c.loop_tid),
    };
    let divisibility = flags.divisibility.unwrap_or_else(|| {
        let assumed = attention.map(prebuilt::divisibility).unwrap_or_default();
        assumed
            .into_iter()
            .map(|(name, n)| (name.to_string(), n))
            .collect()
    });
    // Shipped: the same spec and exactly the options kiln compiled it with.
    let shipped = attention.and_then(|kernel| {
        let assumed = prebuilt::divisibility(kernel);
        let same_divisibility = divisibility.len() == assumed.len()
            && divisibility
                .iter()
                .zip(&assumed)
                .all(|((a, n), (b, m))| a == b && n == m);
        prebuilt::shipped().into_iter().find(|s| {
            s.kernel == kernel
                && s.target == target
                && s.spec == spec
                && s.config.knobs() == knobs
                && same_divisibility
        })
    });
    let kernel = (entry.build)(&spec)
        .map_err(|e| format!("`{}` does not build at {spec}:\n{e}", entry.name()))?;
    Ok(Request {
        entry,
        spec,
        kernel,
        target,
        knobs,
        #[cfg(feature = "codegen")]
        divisibility,
        shipped,
    })
}

/// kiln's table entry for an attention kernel at the spec's head dim on `target`. Block sizes
/// the flags did not give come from it; those they gave that differ from it are noted.
fn table_entry(
    kernel: AttentionKernel,
    spec: &mut Spec,
    given: &Spec,
    target: Target,
) -> Option<KernelConfig> {
    let head_dim = match spec.get("HEAD_DIM") {
        Some(SpecValue::Int(d)) => usize::try_from(d).unwrap_or(0),
        _ => 0,
    };
    // The fused backward's preprocessing and dQ conversion have no mask: their configuration is
    // the same either way. dK/dV adding dQ runs in the fused backward, whose table may differ.
    // The table's own entries (medium sequences): the forward's `_short`, `_long`, `_decode`
    // and `_split_decode` blocks are given as a spec.
    let flag = |name| matches!(spec.get(name), Some(SpecValue::Bool(true)));
    let (causal, fused) = (flag("CAUSAL"), flag("ACCUMULATE_DQ"));
    let Some(config) = attention::config(head_dim, causal, fused, target, KeyLength::Medium) else {
        eprintln!(
            "note: kiln's table has no attention configuration at head dims other than {HEAD_DIMS:?}"
        );
        return None;
    };
    // The forward split over the keys runs its own blocks (`plan::forward_split`).
    let split = kernel == AttentionKernel::Forward && flag("SPLIT");
    let config = if split {
        config.split_forward()
    } else {
        config.kernel(kernel)
    };
    let block = |b: usize| SpecValue::Int(b as i64);
    let mut from_table = vec![(kernel.block_m_param(), Some(block(config.block_m)))];
    from_table.push(("BLOCK_N", config.block_n.map(block)));
    if kernel == AttentionKernel::Forward {
        for (flag, on) in attention::forward_flags(head_dim, config) {
            from_table.push((flag, Some(SpecValue::Bool(on))));
        }
        // Unsplit unless asked; its output dtype follows T.
        let out = match spec.get("T") {
            Some(SpecValue::DType(t)) => Some(SpecValue::DType(attention::forward_out(t, split))),
            _ => None,
        };
        from_table.push(("SPLIT", Some(SpecValue::Bool(split))));
        from_table.push(("OUT", out));
    }
    if kernel == AttentionKernel::DkDv {
        for (flag, on) in attention::dkdv_flags(fused, config) {
            from_table.push((flag, Some(SpecValue::Bool(on))));
        }
    }
    for (param, shipped) in from_table {
        let Some(shipped) = shipped else { continue };
        match given.get(param) {
            None => *spec = std::mem::take(spec).set(param, shipped),
            Some(value) if value != shipped => eprintln!(
                "note: kiln ships {} at head dim {head_dim} on {target} with {param} = {shipped} \
                 (for medium sequences), not {value}; compiling with {value}",
                kernel.name(),
            ),
            Some(_) => {}
        }
    }
    Some(config)
}

fn number(flag: &str, value: &str) -> Result<u32, String> {
    value
        .parse()
        .map_err(|_| format!("`{flag}` expects a number, got `{value}`"))
}

/// `ARG=N,...`: each a kernel argument and what it is a multiple of.
fn parse_divisibility(entry: &KernelEntry, text: &str) -> Result<Vec<(String, u64)>, String> {
    let args: Vec<&str> = entry.signature.args.iter().map(|a| a.name).collect();
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, n) = pair
                .split_once('=')
                .ok_or_else(|| format!("`--divisibility` expects ARG=N, got `{pair}`"))?;
            let (name, n) = (name.trim(), n.trim());
            if !args.contains(&name) {
                return Err(format!(
                    "`{}` has no argument `{name}`; its arguments are: {}",
                    entry.name(),
                    args.join(", ")
                ));
            }
            let n = n
                .parse()
                .map_err(|_| format!("`--divisibility {name}=` expects a number, got `{n}`"))?;
            Ok((name.to_string(), n))
        })
        .collect()
}

/// PTX and the dynamic shared memory a launch gives it.
struct Ptx {
    text: String,
    shared_bytes: u32,
}

/// How to get what this binary cannot make without kiln-codegen.
#[cfg(not(feature = "codegen"))]
pub fn needs_codegen(args: &[String]) -> String {
    format!(
        "this needs kiln-codegen (LLVM), which this kiln was built without; rebuild with the \
         `codegen` feature:\n  cargo run --release -p kiln-kernels --features codegen --bin kiln -- {}",
        args.iter()
            .map(|arg| quoted(arg))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// `arg` as a shell reads it back: single-quoted unless it is plain.
#[cfg(not(feature = "codegen"))]
fn quoted(arg: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-=,.:/".contains(c);
    if !arg.is_empty() && arg.chars().all(plain) {
        arg.to_string()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

/// The layout, thread, LLVM and PTX stages.
#[cfg(feature = "codegen")]
fn stage(request: &Request, show: Show, _args: &[String]) -> Result<(), String> {
    use kiln_codegen::Stage;
    let stage = match show {
        Show::Layout => Stage::Layout,
        Show::Thread => Stage::Thread,
        Show::Llvm => Stage::Llir,
        Show::LlvmOpt => Stage::LlirOpt,
        _ => Stage::Ptx,
    };
    emit(compile(request)?.stage(stage).map_err(|e| e.to_string())?)
}

/// Only the PTX kiln ships, without kiln-codegen.
#[cfg(not(feature = "codegen"))]
fn stage(request: &Request, show: Show, args: &[String]) -> Result<(), String> {
    if show != Show::Ptx {
        return Err(format!("`kiln {}`: {}", show.name(), needs_codegen(args)));
    }
    emit(&ptx(request, args)?.text)
}

#[cfg(feature = "codegen")]
fn ptx(request: &Request, _args: &[String]) -> Result<Ptx, String> {
    let compiled = compile(request)?;
    Ok(Ptx {
        text: compiled.ptx().to_string(),
        shared_bytes: compiled.dynamic_shared_bytes(),
    })
}

#[cfg(not(feature = "codegen"))]
fn ptx(request: &Request, args: &[String]) -> Result<Ptx, String> {
    let shipped = request
        .shipped
        .as_ref()
        .and_then(|s| prebuilt::ptx(&s.name));
    let shipped = shipped.ok_or_else(|| {
        format!(
            "{} at this spec and these options is not a specialisation kiln ships (`kiln list`), \
             so its PTX must be compiled: {}",
            request.entry.name(),
            needs_codegen(args)
        )
    })?;
    Ok(Ptx {
        text: shipped.text.to_string(),
        shared_bytes: shipped.shared_bytes,
    })
}

/// Compiles the request; a shipped specialisation whose PTX differs from what ships is reported
/// loudly (the shipped files are stale) but still printed as compiled.
#[cfg(feature = "codegen")]
fn compile(request: &Request) -> Result<kiln_codegen::Compiled, String> {
    let divisibility = request
        .divisibility
        .iter()
        .map(|(name, n)| (name.as_str(), *n));
    let options = request.knobs.options(request.target, divisibility);
    let compiled = kiln_codegen::compile(&request.kernel, &options)
        .map_err(|e| format!("cannot compile {request}:\n{e}"))?;
    let stale = request.shipped.as_ref().and_then(|s| {
        let shipped = prebuilt::ptx(&s.name)?;
        (shipped.text != compiled.ptx() || shipped.shared_bytes != compiled.dynamic_shared_bytes())
            .then_some(&s.name)
    });
    if let Some(name) = stale {
        eprintln!(
            "WARNING: the DSL compiles {name} to PTX that differs from the PTX kiln ships \
             (kernels/ptx/{name}.ptx): the shipped kernels are stale; \
             `KILN_BLESS=1 cargo test --release -p kiln-codegen` regenerates them"
        );
    }
    Ok(compiled)
}
