//! The attention kernels on the CPU interpreter against the f64 reference, over a designed set of
//! shapes: batch 1 and 3, seqlen 1, one below and above every block size, 1000, seqlen_q != seqlen_k
//! both ways, causal and not, GQA 1:1, 4:1, 8:1 and MQA, f16 and bf16 (and f32), all four head
//! dims, strided layouts, and scores of |s| ~ 100 that overflow without the max subtraction.
//!
//! Inputs are fresh random draws each run (the seed is printed on failure); outputs start
//! poisoned and must be written everywhere, and the padding of strided outputs must stay untouched
//! (see `kiln_kernels::attention::check`, which holds the shape set and states the error bars
//! and why; the GPU check runs the same set against the interpreter).

use kiln_dsl::{DType, Target};
use kiln_kernels::attention::check::{Tolerance, designed_cases, run_on_interpreter};
use kiln_kernels::attention::{AttentionParams, Layout, MAX_SEQLEN, Tensor, config, cpu};
use kiln_kernels::reference::Rng;

#[test]
fn attention_matches_the_f64_reference() {
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    let cases = designed_cases();
    assert!(
        cases.len() >= 30,
        "the designed set has {} cases",
        cases.len()
    );
    let mut failures = Vec::new();
    let mut worst = std::collections::BTreeMap::<(&str, bool), [f64; 8]>::new();
    for (i, c) in cases.iter().enumerate() {
        // Both targets' block sizes, alternately (they differ for dK/dV at head dim 128).
        let target = Target::ALL[i % Target::ALL.len()];
        let report =
            run_on_interpreter(c, target, &mut rng).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        let w = worst
            .entry((c.params.dtype.name(), c.draw.conditioned()))
            .or_default();
        let [cq, ck, cv] = report.conditioned;
        for (slot, err) in w.iter_mut().zip([
            report.o, report.lse, report.dq, report.dk, report.dv, cq, ck, cv,
        ]) {
            *slot = slot.max(err);
        }
        for failure in report.failures(Tolerance::for_dtype(c.params.dtype)) {
            failures.push(format!("{c:?} on {target}: {failure}"));
        }
    }
    for ((dtype, large), [o, lse, dq, dk, dv, cq, ck, cv]) in &worst {
        println!(
            "{dtype} {}: worst o {o:.2e}, lse {lse:.2e}, dq {dq:.2e}, dk {dk:.2e}, dv {dv:.2e}; against terms dq {cq:.2e}, dk {ck:.2e}, dv {cv:.2e}",
            if *large { "|s|~100" } else { "|s|~1" }
        );
    }
    assert!(failures.is_empty(), "seed {seed}:\n{}", failures.join("\n"));
}

#[test]
fn the_shape_set_steps_around_every_block_size() {
    let cases = designed_cases();
    let seqlens: Vec<usize> = cases
        .iter()
        .flat_map(|c| [c.params.seqlen_q, c.params.seqlen_k])
        .collect();
    for block in config::all_block_sizes() {
        for n in [block - 1, block + 1] {
            assert!(
                seqlens.contains(&n),
                "no case has seqlen {n} (block {block})"
            );
        }
    }
    assert!(seqlens.contains(&1) && seqlens.contains(&1000));
    for d in config::HEAD_DIMS {
        for dtype in [DType::F16, DType::BF16] {
            assert!(
                cases
                    .iter()
                    .any(|c| c.params.head_dim == d && c.params.dtype == dtype),
                "no {dtype} case at head dim {d}"
            );
        }
    }
}

#[test]
fn bad_calls_are_refused_with_the_field_named() {
    let p = AttentionParams {
        dtype: DType::F16,
        batch: 1,
        seqlen_q: 8,
        seqlen_k: 8,
        heads_q: 3,
        heads_kv: 2,
        head_dim: 64,
        causal: false,
        softmax_scale: 0.125,
        fused_backward: false,
    };
    let err = p.validate().unwrap_err().to_string();
    assert!(
        err.contains("heads_q (3) must be a multiple of heads_kv (2)"),
        "{err}"
    );
    let err = AttentionParams {
        head_dim: 96,
        heads_q: 2,
        ..p
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("unsupported: head_dim 96"), "{err}");
    let err = AttentionParams {
        seqlen_k: 0,
        heads_q: 2,
        ..p
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(err.contains("seqlen_k must be in 1..=2^30"), "{err}");
    assert!(err.ends_with("got 0"), "{err}");
    // Past 2^30 rows the kernels' 32-bit row arithmetic could wrap.
    let err = AttentionParams {
        seqlen_q: MAX_SEQLEN + 1,
        ..p
    }
    .validate()
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("seqlen_q must be in 1..=2^30 (the kernels count rows in 32-bit integers)"),
        "{err}"
    );
    assert!(
        AttentionParams {
            seqlen_k: MAX_SEQLEN,
            heads_q: 2,
            ..p
        }
        .check_fields()
        .is_ok()
    );

    // A buffer too short for its shape and strides, or of the wrong dtype, is refused before
    // anything runs.
    let p = AttentionParams { heads_q: 2, ..p };
    let l = Layout::contiguous(8, 2, 64);
    let short = kiln_dsl::HostBuffer::zeros(DType::F16, 8 * 2 * 64 - 1);
    let full = kiln_dsl::HostBuffer::zeros(DType::F16, 8 * 2 * 64);
    let lse = kiln_dsl::HostBuffer::zeros(DType::F32, 16);
    let t = |b| Tensor::new(b, l);
    let err = cpu::forward(
        &p,
        Target::Sm80,
        t(&short),
        t(&full),
        t(&full),
        t(&full),
        &lse,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("q has 1023 elements but its shape and strides address 1024"),
        "{err}"
    );
    let wrong_dtype = kiln_dsl::HostBuffer::zeros(DType::BF16, 8 * 2 * 64);
    let err = cpu::forward(
        &p,
        Target::Sm80,
        t(&full),
        t(&wrong_dtype),
        t(&full),
        t(&full),
        &lse,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("k holds bf16, expected f16"), "{err}");
    let negative = Layout {
        seq_stride: -128,
        ..l
    };
    let err = cpu::forward(
        &p,
        Target::Sm80,
        Tensor::new(&full, negative),
        t(&full),
        t(&full),
        t(&full),
        &lse,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("q.seq_stride must not be negative, got -128"),
        "{err}"
    );
}
