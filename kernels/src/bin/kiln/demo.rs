//! `kiln demo`, kiln's main job: attention forward and backward on the CPU interpreter, checked
//! against the f64 reference, and the forward kernel's shipped PTX with the `.loc` lines that
//! lead back to its DSL source; then, where a GPU and its driver are, the prebuilt kernels at
//! the FlashAttention benchmark setup, checked against f64, in TFLOP/s (`kiln bench` runs more
//! shapes).

use kiln_dsl::{DType, Target};
use kiln_kernels::attention::check::{Case, Draw, LayoutKind, Tolerance, run_on_interpreter};
use kiln_kernels::attention::{AttentionKernel, AttentionParams, plan, prebuilt};
use kiln_kernels::bench;
use kiln_kernels::reference::Rng;
use kiln_runtime::Device;

use crate::say;

/// The target whose block sizes the demo's interpreter runs use.
const TARGET: Target = Target::Sm90a;

pub fn demo() -> Result<(), String> {
    let params = AttentionParams {
        dtype: DType::BF16,
        batch: 2,
        seqlen_q: 200,
        seqlen_k: 173,
        heads_q: 4,
        heads_kv: 2,
        head_dim: 64,
        causal: true,
        softmax_scale: AttentionParams::default_scale(64),
        fused_backward: false,
    };
    let seed = Rng::fresh_seed();
    say!(
        "kiln demo: attention forward + backward on the CPU interpreter\n  {params} (seed {seed})\n"
    );
    let start = std::time::Instant::now();
    let case = Case {
        params,
        draw: Draw::PLAIN,
        layout: LayoutKind::Packed,
        splits: 1,
    };
    let report =
        run_on_interpreter(&case, TARGET, &mut Rng::new(seed)).map_err(|e| e.to_string())?;
    let tolerance = Tolerance::for_dtype(params.dtype);
    let [dq_terms, dk_terms, dv_terms] = report.conditioned;
    say!("  output                 worst-row error vs f64   bar");
    for (name, err, bar) in [
        ("O", report.o, tolerance.o),
        ("LSE", report.lse, tolerance.lse),
        ("dQ", report.dq, tolerance.grad),
        ("dK", report.dk, tolerance.grad),
        ("dV", report.dv, tolerance.grad),
        ("dQ against its terms", dq_terms, tolerance.grad_terms),
        ("dK against its terms", dk_terms, tolerance.grad_terms),
        ("dV against its terms", dv_terms, tolerance.grad_terms),
    ] {
        say!("  {name:<22} {err:<24.3e} {bar:.1e}");
    }
    say!("  ({:.2} s)\n", start.elapsed().as_secs_f64());

    let failures = report.failures(tolerance);
    if !failures.is_empty() {
        return Err(format!(
            "outputs off the reference: {}",
            failures.join("; ")
        ));
    }
    say!("kiln demo: every output is within its bar\n");
    show_ptx(&params)?;
    on_gpu()
}

/// The forward kernel's shipped PTX for `params` around its first tensor-core instruction
/// (`mma.sync`, or `wgmma.mma_async` on sm_90a), with the DSL source line its `.loc` names (read
/// from the workspace when it is there).
fn show_ptx(params: &AttentionParams) -> Result<(), String> {
    let name = plan::specialisation_name(AttentionKernel::Forward, params, TARGET);
    let ptx = prebuilt::ptx(&name).ok_or_else(|| format!("kiln ships no {name}"))?;
    let lines: Vec<&str> = ptx.text.lines().collect();
    let files: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.trim_start().starts_with(".file"))
        .collect();
    let mma = lines
        .iter()
        .position(|l| l.contains("mma.sync") || l.contains("wgmma.mma_async"))
        .ok_or("the forward PTX has no mma.sync or wgmma.mma_async")?;
    let loc = lines[..mma]
        .iter()
        .rposition(|l| l.trim_start().starts_with(".loc"))
        .ok_or("the forward PTX has no .loc line")?;
    say!(
        "The forward kernel's PTX as kiln ships it ({name}; `kiln ptx attention_fwd` prints all of it):\n"
    );
    // The `.loc` line, then the instructions that end in the mma (address arithmetic elided).
    let tail = &lines[(mma - 2).max(loc + 1)..mma + 5];
    for line in files
        .iter()
        .chain(&["\t..."])
        .chain(&lines[loc..=loc])
        .chain(&["\t..."])
        .chain(tail)
    {
        // A `wgmma` names every accumulator register: its first 100 characters say enough.
        match line.char_indices().nth(100) {
            Some((end, _)) => say!("  {} ...", &line[..end]),
            None => say!("  {line}"),
        }
    }
    // `.loc <file> <line> <col>`: the source line, when the source is at hand.
    let fields: Vec<&str> = lines[loc].split_whitespace().collect();
    if let [_, file, line, ..] = fields[..] {
        let path = files
            .iter()
            .find_map(|f| f.strip_prefix(&format!("\t.file\t{file} ")))
            .map(|p| p.trim_matches('"').to_string());
        let source = path
            .as_ref()
            .zip(line.parse::<usize>().ok())
            .and_then(|(path, n)| {
                let text = std::fs::read_to_string(path).ok()?;
                Some(text.lines().nth(n.checked_sub(1)?)?.trim().to_string())
            });
        if let (Some(path), Some(source)) = (path, source) {
            say!("\n  .loc {file} {line} is {path}:{line}: {source}");
        }
    }
    // On TMA: the tensor maps the launch encodes from its arguments, and a copy through one.
    let maps: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|l| l.starts_with(kiln_dsl::tensor_map::PTX_LINE))
        .collect();
    if let Some(copy) = lines.iter().find(|l| l.contains("cp.async.bulk.tensor")) {
        say!(
            "\nThe tensor maps each launch encodes from its arguments, and a TMA copy through one:"
        );
        for line in maps.iter().chain([copy]) {
            say!("  {}", line.trim_start());
        }
    }
    say!();
    Ok(())
}

/// The prebuilt kernels on the GPU, when there is one: the FlashAttention setup at seqlen 2048,
/// bf16, head dims 64 and 128, causal and not, each checked against f64 on one head.
fn on_gpu() -> Result<(), String> {
    let device = match Device::current_or_default() {
        Ok(device) => device,
        Err(e) => {
            say!("No GPU here ({e}): on a machine with one, this runs the prebuilt kernels.");
            return Ok(());
        }
    };
    say!(
        "The prebuilt kernels on {} at the FlashAttention benchmark setup (bf16; checking one \
         head of each against f64 takes a few seconds):\n",
        device.name().unwrap_or_default()
    );
    let rows = bench::measure(
        &device,
        DType::BF16,
        &[64, 128],
        &[2048],
        bench::Sampling::burst(10),
        true,
        &mut Rng::new(Rng::fresh_seed()),
    )
    .map_err(|e| e.to_string())?;
    say!("{}", bench::table(&rows));
    if rows
        .iter()
        .all(|r| r.failures.as_ref().is_some_and(Vec::is_empty))
    {
        say!("kiln demo: the prebuilt kernels agree with f64");
        Ok(())
    } else {
        Err("the prebuilt kernels disagree with f64 (see the table)".to_string())
    }
}
