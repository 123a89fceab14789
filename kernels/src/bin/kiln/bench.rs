//! `kiln bench`: the prebuilt attention kernels on this machine's GPU at the FlashAttention
//! benchmark setup (`kiln_kernels::bench`), as a Markdown table of TFLOP/s; `--check` also
//! compares one head of each shape with the f64 reference.

use std::time::Duration;

use kiln_dsl::DType;
use kiln_kernels::bench::{self, Sampling};
use kiln_kernels::reference::Rng;
use kiln_runtime::Device;

pub const USAGE: &str = "kiln bench [--dtype bf16|f16] [--head-dims 64,128] [--seqs 1024,...,16384]
                 [--samples N] [--warm SECONDS] [--check]";

/// The dtype `--dtype` names.
pub fn parse_dtype(text: &str) -> Result<DType, String> {
    match text {
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        other => Err(format!("--dtype expects bf16 or f16, got `{other}`")),
    }
}

/// A comma-separated list of positive numbers.
pub fn numbers(flag: &str, text: &str) -> Result<Vec<usize>, String> {
    text.split(',')
        .map(|n| match n.trim().parse() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{flag} expects positive numbers separated by commas, got `{text}`"
            )),
        })
        .collect()
}

/// A duration in seconds, zero or more (`--warm`).
pub fn seconds(flag: &str, text: &str) -> Result<Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{flag} expects seconds, zero or more, got `{text}`"))
}

pub fn run(args: &[String]) -> Result<(), String> {
    let mut dtype = DType::BF16;
    let mut head_dims = vec![64, 128];
    let mut seqlens = vec![1024, 2048, 4096, 8192, 16384];
    let mut sampling = Sampling::burst(20);
    let mut check = false;
    let mut args = args.iter();
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{flag} expects a value\nusage: {USAGE}"))
        };
        match flag.as_str() {
            "--dtype" => dtype = parse_dtype(value()?)?,
            "--head-dims" => head_dims = numbers(flag, value()?)?,
            "--seqs" => seqlens = numbers(flag, value()?)?,
            "--samples" => sampling.samples = numbers(flag, value()?)?[0],
            "--warm" => sampling.warm = seconds(flag, value()?)?,
            "--check" => check = true,
            other => return Err(format!("unknown flag `{other}`\nusage: {USAGE}")),
        }
    }
    let device = Device::current_or_default().map_err(|e| e.to_string())?;
    eprintln!(
        "kiln bench on {}: {dtype}, batch = 16384 / seqlen, heads = 2048 / head dim, {sampling}; \
         TFLOP/s with the FlashAttention convention",
        device.name().unwrap_or_default()
    );
    let rows = bench::measure(
        &device,
        dtype,
        &head_dims,
        &seqlens,
        sampling,
        check,
        &mut Rng::new(Rng::fresh_seed()),
    )
    .map_err(|e| e.to_string())?;
    crate::emit(&bench::table(&rows))?;
    let failed = rows
        .iter()
        .filter(|r| r.failures.as_ref().is_some_and(|f| !f.is_empty()))
        .count();
    if failed == 0 {
        Ok(())
    } else {
        Err(format!("{failed} shapes disagree with f64"))
    }
}
