//! `kiln tune`: searches block sizes, warps and stages of the attention kernels on this machine's
//! GPU (`kiln_kernels::tune`): each candidate compiled from the DSL with kiln-codegen, checked
//! against f64, timed at the benchmark setup; prints every trial and the winners, which belong in
//! `kernels/src/attention/config.rs` for this GPU's target.

use std::time::Duration;

use kiln_dsl::DType;
use kiln_kernels::attention::AttentionKernel;
use kiln_kernels::bench::Sampling;
use kiln_kernels::reference::Rng;
use kiln_kernels::tune::{self, Outcome, Setup};
use kiln_runtime::Device;

use crate::bench::{numbers, parse_dtype, seconds};

pub const USAGE: &str = concat!(
    "kiln tune [--dtype bf16|f16] [--head-dims 64,128] [--causal both|yes|no]
                [--seqlen 4096] [--kernels attention_fwd,attention_bwd_dq,attention_bwd_dkdv]
                [--backward split|fused] [--decode] [--samples N] [--warm SECONDS]
                [--configs ",
    kiln_kernels::kernel_config_grammar!(),
    ",...]"
);

pub fn run(args: &[String]) -> Result<(), String> {
    let mut dtype = DType::BF16;
    let mut head_dims = vec![64, 128];
    let mut masks = vec![false, true];
    let mut seqlen = 4096;
    let mut kernels = None;
    let mut fused_backward = false;
    // A second of calls before each candidate's samples: timed from a cold start, the first
    // candidate (the table's) read 11% slower than in an interleaved run (docs/PERF.md, run 349).
    let mut sampling = Sampling {
        samples: 10,
        warm: Duration::from_secs(1),
    };
    let mut configs = None;
    let mut decode = false;
    let mut flags = args.iter();
    while let Some(flag) = flags.next() {
        let mut value = || {
            flags
                .next()
                .ok_or_else(|| format!("{flag} expects a value\nusage: {USAGE}"))
        };
        match flag.as_str() {
            "--dtype" => dtype = parse_dtype(value()?)?,
            "--head-dims" => head_dims = numbers(flag, value()?)?,
            "--causal" => {
                masks = match value()?.as_str() {
                    "both" => vec![false, true],
                    "yes" => vec![true],
                    "no" => vec![false],
                    other => {
                        return Err(format!("--causal expects both, yes or no, got `{other}`"));
                    }
                }
            }
            "--seqlen" => seqlen = numbers(flag, value()?)?[0],
            "--kernels" => {
                kernels = value()?
                    .split(',')
                    .map(|name| match AttentionKernel::from_name(name.trim()) {
                        // The row-wise kernels have no key block to tune.
                        Some(k) if k.reads_keys() => Ok(k),
                        _ => Err(format!(
                            "--kernels expects attention_fwd, attention_bwd_dq or \
                             attention_bwd_dkdv, got `{name}`"
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map(Some)?
            }
            "--backward" => {
                fused_backward = match value()?.as_str() {
                    "split" => false,
                    "fused" => true,
                    other => {
                        return Err(format!("--backward expects split or fused, got `{other}`"));
                    }
                }
            }
            "--decode" => decode = true,
            "--samples" => sampling.samples = numbers(flag, value()?)?[0],
            "--warm" => sampling.warm = seconds(flag, value()?)?,
            "--configs" => {
                configs = Some(
                    value()?
                        .split(',')
                        .map(|c| c.parse().map_err(|e| format!("--configs: {e}")))
                        .collect::<Result<Vec<_>, String>>()?,
                )
            }
            other => return Err(format!("unknown flag `{other}`\nusage: {USAGE}")),
        }
    }
    // The decode blocks are the forward's.
    if decode {
        if fused_backward {
            return Err(
                "--decode tunes the forward's decode blocks, not `--backward fused`".to_string(),
            );
        }
        if let Some(other) = kernels
            .iter()
            .flatten()
            .find(|&&k| k != AttentionKernel::Forward)
        {
            return Err(format!(
                "--decode tunes the forward's decode blocks: --kernels attention_fwd alone, got \
                 `{}`",
                other.name()
            ));
        }
    }
    // The fused backward runs no dQ kernel: only its dK/dV (and the forward) have anything to tune.
    let kernels = match kernels {
        None if decode => vec![AttentionKernel::Forward],
        None if fused_backward => vec![AttentionKernel::DkDv],
        None => vec![
            AttentionKernel::Forward,
            AttentionKernel::Dq,
            AttentionKernel::DkDv,
        ],
        Some(kernels) if fused_backward && kernels.contains(&AttentionKernel::Dq) => {
            return Err(
                "--backward fused runs no attention_bwd_dq: tune attention_bwd_dkdv".to_string(),
            );
        }
        Some(kernels) => kernels,
    };
    let backward = if fused_backward { "fused" } else { "split" };
    // What the winners are: blocks of the table's `decode`, or of its kernels.
    let what = if decode {
        "decode blocks".to_string()
    } else {
        format!("{backward} backward")
    };
    compile::ready(args)?;
    let device = Device::current_or_default().map_err(|e| e.to_string())?;
    let target = kiln_kernels::attention::gpu::target(&device).map_err(|e| e.to_string())?;
    let timed = if decode {
        format!(
            "the forward's decode blocks, timed at 16 decode steps against {seqlen} keys (heads = \
             2048 / head dim)"
        )
    } else {
        format!(
            "{backward} backward, timed at seqlen {seqlen} (batch = 16384 / seqlen, heads = 2048 \
             / head dim)"
        )
    };
    eprintln!(
        "kiln tune on {} ({target}): {dtype}, {timed}, {sampling}; each candidate checked \
         against f64 first",
        device.name().unwrap_or_default()
    );
    let mut rng = Rng::new(Rng::fresh_seed());
    let mut winners = Vec::new();
    for &head_dim in &head_dims {
        for &causal in &masks {
            let setup = Setup {
                dtype,
                head_dim,
                causal,
                seqlen,
                kernels: kernels.clone(),
                fused_backward,
                sampling,
                configs: configs.clone(),
                decode,
            };
            let trials = tune::tune(
                &device,
                &setup,
                &mut compile::candidate,
                &mut rng,
                &mut |t| {
                    eprintln!("  {} {}: {:?}", t.kernel.name(), t.config, t.outcome);
                    for warning in &t.warnings {
                        eprintln!("    {warning}");
                    }
                },
            )
            .map_err(|e| e.to_string())?;
            crate::say!(
                "\n### {dtype}, head dim {head_dim}, {}, {what}\n",
                if causal { "causal" } else { "not causal" }
            );
            crate::emit(&tune::table(&trials))?;
            for &kernel in &kernels {
                let shipped = trials.iter().find(|t| t.kernel == kernel && t.shipped);
                let line = match (tune::winner(&trials, kernel), shipped) {
                    (Some(best), Some(shipped)) => {
                        let speedup = match (&best.outcome, &shipped.outcome) {
                            (Outcome::Timed { ms: b, .. }, Outcome::Timed { ms: s, .. }) => {
                                format!("{:.3}x the table's", s / b)
                            }
                            _ => "the table's did not run".to_string(),
                        };
                        format!(
                            "{} d{head_dim}{}{}: {} ({speedup}: {})",
                            kernel.name(),
                            if causal { " causal" } else { "" },
                            if decode { " decode" } else { "" },
                            best.config,
                            shipped.config
                        )
                    }
                    _ => format!(
                        "{} d{head_dim}{}{}: no candidate ran correctly",
                        kernel.name(),
                        if causal { " causal" } else { "" },
                        if decode { " decode" } else { "" },
                    ),
                };
                winners.push(line);
            }
        }
    }
    crate::say!("\n### winners on {target}, {what}\n");
    for line in winners {
        crate::say!("- {line}");
    }
    Ok(())
}

#[cfg(feature = "codegen")]
mod compile {
    use kiln_dsl::Target;
    use kiln_kernels::attention::gpu::Candidate;
    use kiln_kernels::attention::{AttentionKernel, AttentionParams, KernelConfig, plan, prebuilt};

    /// With kiln-codegen every candidate compiles.
    pub fn ready(_args: &[String]) -> Result<(), String> {
        Ok(())
    }

    /// `kernel` of `p` at `config` for `target`, compiled as kiln compiles what it ships.
    pub fn candidate(
        kernel: AttentionKernel,
        p: &AttentionParams,
        config: KernelConfig,
        target: Target,
    ) -> Result<Candidate, String> {
        let ir = kernel
            .build(&p.spec(kernel, config))
            .map_err(|e| e.to_string())?;
        let options = config
            .knobs()
            .options(target, prebuilt::divisibility(kernel));
        let compiled = kiln_codegen::compile_keeping(&ir, &options, kiln_codegen::Keep::Ptx)
            .map_err(|e| e.to_string())?;
        Ok(Candidate {
            name: plan::specialisation_name(kernel, p, target),
            kernel,
            config,
            ptx: compiled.ptx().to_string(),
            shared_bytes: compiled.dynamic_shared_bytes(),
        })
    }
}

#[cfg(not(feature = "codegen"))]
mod compile {
    use kiln_dsl::Target;
    use kiln_kernels::attention::gpu::Candidate;
    use kiln_kernels::attention::{AttentionKernel, AttentionParams, KernelConfig};

    /// Without kiln-codegen there is nothing to compile candidates with: `kiln tune` refuses once
    /// its flags are read, before it opens the GPU, rather than failing every candidate.
    pub fn ready(args: &[String]) -> Result<(), String> {
        let command: Vec<String> = std::iter::once("tune".to_string())
            .chain(args.iter().cloned())
            .collect();
        Err(format!(
            "`kiln tune`: {}",
            crate::inspect::needs_codegen(&command)
        ))
    }

    /// Unreached: [`ready`] refuses first.
    pub fn candidate(
        _: AttentionKernel,
        _: &AttentionParams,
        _: KernelConfig,
        _: Target,
    ) -> Result<Candidate, String> {
        Err(
            "kiln tune compiles its candidates with kiln-codegen (LLVM), which this kiln was \
             built without: cargo run --release -p kiln-kernels --features codegen --bin kiln -- \
             tune"
                .to_string(),
        )
    }
}
