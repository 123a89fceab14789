//! `kiln demo`: attention forward and backward on the CPU interpreter, checked against the f64
//! reference, with the forward kernel's tile IR.

use kiln_dsl::{DType, Target};
use kiln_kernels::attention::AttentionParams;
use kiln_kernels::attention::check::{LayoutKind, Tolerance, run_on_interpreter};
use kiln_kernels::reference::Rng;
use kiln_kernels::registry;

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
    };
    let seed = Rng::fresh_seed();
    println!(
        "kiln demo: attention forward + backward on the CPU interpreter\n  {} batch {} seqlen_q {} seqlen_k {} heads {}/{} head_dim {} causal {} (seed {seed})\n",
        params.dtype,
        params.batch,
        params.seqlen_q,
        params.seqlen_k,
        params.heads_q,
        params.heads_kv,
        params.head_dim,
        params.causal
    );
    let start = std::time::Instant::now();
    let report = run_on_interpreter(
        &params,
        TARGET,
        LayoutKind::Packed,
        1.0,
        &mut Rng::new(seed),
    )
    .map_err(|e| e.to_string())?;
    let tolerance = Tolerance::for_dtype(params.dtype);
    let [dq_terms, dk_terms, dv_terms] = report.conditioned;
    println!("  output                 worst-row error vs f64   bar");
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
        println!("  {name:<22} {err:<24.3e} {bar:.1e}");
    }
    println!("  ({:.2} s)\n", start.elapsed().as_secs_f64());

    let fwd = registry::find("attention_fwd")?;
    let config = params.config(TARGET).map_err(|e| e.to_string())?;
    let spec = params.spec(config.forward);
    let kernel = (fwd.build)(&spec).map_err(|e| e.to_string())?;
    println!("The forward kernel's tile IR at this specialisation:\n\n{kernel}");

    let failures = report.failures(tolerance);
    if failures.is_empty() {
        println!("kiln demo: every output is within its bar");
        Ok(())
    } else {
        Err(format!(
            "outputs off the reference: {}",
            failures.join("; ")
        ))
    }
}
