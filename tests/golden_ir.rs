//! Golden IR text of the attention kernels at one specialisation each. The text is the
//! builder's output after folding and dead-code removal; a change to the DSL source, the builder
//! or the printer shows up here as a line diff. Regenerate with `KILN_BLESS=1 cargo test --test golden_ir`.

use kiln_dsl::{DType, Kernel, Spec};
use kiln_kernels::attention::{backward, forward};
use kiln_tests::check_text;

fn golden(name: &str, kernel: Kernel) {
    let path = format!("{}/golden/{name}.ir", env!("CARGO_MANIFEST_DIR"));
    let actual = kernel.to_string();
    if std::env::var_os("KILN_BLESS").is_some() {
        std::fs::write(&path, &actual).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{path}: {e} (run with KILN_BLESS=1 to create it)"));
    check_text(&actual, &expected);
}

fn spec(blocks: Option<(i64, i64)>, causal: bool) -> Spec {
    let spec = Spec::new().dtype("T", DType::F16).int("HEAD_DIM", 64);
    match blocks {
        Some((m, n)) => spec
            .int("BLOCK_M", m)
            .int("BLOCK_N", n)
            .flag("CAUSAL", causal),
        None => spec.int("BLOCK_M", 64),
    }
}

#[test]
fn forward_causal_f16_d64() {
    let spec = spec(Some((128, 64)), true)
        .flag("OVERLAP_SOFTMAX", false)
        .flag("LAST_BLOCK_APART", false)
        .flag("PERSISTENT", false)
        .dtype("OUT", DType::F16)
        .flag("SPLIT", false);
    golden(
        "attention_fwd",
        forward::attention_fwd::build(&spec).unwrap(),
    );
}

/// The forward as it runs on `wgmma`: the next block's scores issued beside `P @ V`, the last
/// block's `P @ V` after the loops.
#[test]
fn forward_overlapped_causal_f16_d64() {
    let spec = spec(Some((128, 64)), true)
        .flag("OVERLAP_SOFTMAX", true)
        .flag("LAST_BLOCK_APART", true)
        .flag("PERSISTENT", false)
        .dtype("OUT", DType::F16)
        .flag("SPLIT", false);
    golden(
        "attention_fwd_overlapped",
        forward::attention_fwd::build(&spec).unwrap(),
    );
}

/// The persistent forward: a loop over the query blocks of every head, each block's last
/// `P @ V` and output at the top of the next iteration.
#[test]
fn forward_persistent_causal_f16_d64() {
    let spec = spec(Some((128, 64)), true)
        .flag("OVERLAP_SOFTMAX", true)
        .flag("LAST_BLOCK_APART", true)
        .flag("PERSISTENT", true)
        .dtype("OUT", DType::F16)
        .flag("SPLIT", false);
    golden(
        "attention_fwd_persistent",
        forward::attention_fwd::build(&spec).unwrap(),
    );
}

/// The forward over one split of the keys (as on `wgmma`), writing its part of O in f32.
#[test]
fn forward_split_causal_f16_d64() {
    let spec = spec(Some((128, 64)), true)
        .flag("OVERLAP_SOFTMAX", true)
        .flag("LAST_BLOCK_APART", true)
        .flag("PERSISTENT", false)
        .dtype("OUT", DType::F32)
        .flag("SPLIT", true);
    golden(
        "attention_fwd_split",
        forward::attention_fwd::build(&spec).unwrap(),
    );
}

/// The split forward's combine: a row's parts, a tile of splits at a time, weighed by their
/// LSEs.
#[test]
fn forward_combine_f16_d64() {
    let spec = Spec::new()
        .dtype("T", DType::F16)
        .int("HEAD_DIM", 64)
        .int("SPLIT_BLOCK", 16);
    golden(
        "attention_fwd_combine",
        forward::attention_fwd_combine::build(&spec).unwrap(),
    );
}

/// The fused backward's: the row statistics, and the dQ accumulator zeroed.
#[test]
fn backward_preprocess_f16_d64() {
    golden(
        "attention_bwd_preprocess",
        backward::attention_bwd_preprocess::build(&spec(None, false)).unwrap(),
    );
}

/// The fused backward's: it also adds each tile's dQ into the accumulator, query-major.
#[test]
fn backward_dkdv_fused_causal_f16_d64() {
    let spec = spec(Some((64, 64)), true)
        .flag("ACCUMULATE_DQ", true)
        .flag("KEY_MAJOR", false)
        .flag("EARLY_DP", true)
        .flag("DQ_BY_TURNS", false);
    golden(
        "attention_bwd_dkdv_fused",
        backward::attention_bwd_dkdv::build(&spec).unwrap(),
    );
}

#[test]
fn backward_dq_convert_f16_d64() {
    golden(
        "attention_bwd_dq_convert",
        backward::attention_bwd_dq_convert::build(&spec(None, false)).unwrap(),
    );
}

#[test]
fn backward_dq_f16_d64() {
    golden(
        "attention_bwd_dq",
        backward::attention_bwd_dq::build(&spec(Some((64, 64)), false)).unwrap(),
    );
}

/// The split backward's on `wgmma`: key-major.
#[test]
fn backward_dkdv_causal_f16_d64() {
    let spec = spec(Some((64, 64)), true)
        .flag("ACCUMULATE_DQ", false)
        .flag("KEY_MAJOR", true)
        .flag("EARLY_DP", true)
        .flag("DQ_BY_TURNS", false);
    golden(
        "attention_bwd_dkdv",
        backward::attention_bwd_dkdv::build(&spec).unwrap(),
    );
}
