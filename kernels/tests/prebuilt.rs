//! The prebuilt attention kernels as they ship, without a GPU: every specialisation a call can
//! plan has its PTX, for its target, with its kernel's entry and parameters; and linking
//! kiln-kernels pulls in no LLVM. (That each PTX file is exactly what the DSL gives today is
//! kiln-codegen's test `the_shipped_attention_ptx_is_what_the_dsl_gives`, which links LLVM.)

use std::collections::BTreeSet;
use std::process::Command;

use kiln_dsl::{DType, Target};
use kiln_kernels::attention::plan::{self, BackwardLayouts, ForwardLayouts};
use kiln_kernels::attention::{
    AttentionParams, DECODE_ROWS, HEAD_DIMS, KeyLength, Layout, config, prebuilt,
};
use kiln_runtime::{ParamType, waits_for_prior_grids};

#[test]
fn every_shipped_specialisation_has_its_ptx_and_nothing_else_ships() {
    let shipped = prebuilt::shipped();
    // Forward, dQ, dK/dV, the fused pass, the forward in the decode blocks, the split forward
    // and its decode blocks with and without the mask; the split forward's combine and the fused backward's preprocessing and
    // dQ conversion without; each forward whose blocks for short or long sequences are not its entry's own;
    // and the forward a negative scale runs where the long range's entry is persistent
    // (`_signed`).
    let by_length = Target::ALL
        .into_iter()
        .flat_map(|t| HEAD_DIMS.map(move |d| (t, d)))
        .flat_map(|(t, d)| [false, true].map(move |c| (t, d, c)))
        .flat_map(|(t, d, c)| [KeyLength::Short, KeyLength::Long].map(move |k| (t, d, c, k)))
        .filter(|&(t, d, c, k)| {
            let forward = |k| config(d, c, false, t, k).unwrap().forward;
            forward(k) != forward(KeyLength::Medium)
        })
        .count();
    assert!(by_length > 0, "the table has blocks by sequence length");
    let signed = Target::ALL
        .into_iter()
        .flat_map(|t| HEAD_DIMS.map(move |d| (t, d)))
        .flat_map(|(t, d)| [false, true].map(move |c| (t, d, c)))
        .filter(|&(t, d, c)| {
            config(d, c, false, t, KeyLength::Long)
                .unwrap()
                .forward
                .persistent
        })
        .count();
    assert!(
        signed > 0,
        "D64's causal forward is persistent at long sequences"
    );
    assert_eq!(
        shipped.len(),
        prebuilt::DTYPES.len()
            * (Target::ALL.len() * HEAD_DIMS.len() * (7 * 2 + 3) + by_length + signed)
    );
    assert!(
        shipped
            .iter()
            .filter(|s| s.name.contains("_signed"))
            .all(|s| !s.config.persistent),
        "a forward for negative scales is not persistent"
    );
    let names: BTreeSet<&str> = shipped.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names.len(),
        shipped.len(),
        "specialisation names are unique"
    );
    let files: BTreeSet<&str> = prebuilt::all().map(|(name, _)| name).collect();
    assert_eq!(names, files);
    for s in &shipped {
        let ptx = prebuilt::ptx(&s.name).expect("shipped PTX");
        let kernel = s.kernel.build(&s.spec).expect("a shipped kernel builds");
        assert!(
            ptx.text
                .contains(&format!(".visible .entry {}(", kernel.name())),
            "{}: no entry {}",
            s.name,
            kernel.name()
        );
        assert!(
            ptx.text.contains(&format!(".target {}", s.target)),
            "{}",
            s.name
        );
        assert_eq!(
            ParamType::of_signature(s.kernel.signature(), &s.spec),
            Some(ParamType::of_kernel(&kernel)),
            "{}",
            s.name
        );
    }
}

/// Ragged lengths in each range the table tells apart: short, medium, long (and long causal);
/// a negative scale too, with the split backward and the fused one, which a persistent forward
/// does not take: the long range's entry runs instead, or where that one is persistent too its
/// `_signed` twin.
#[test]
fn every_planned_launch_finds_its_ptx() {
    for target in Target::ALL {
        for dtype in [DType::F16, DType::BF16] {
            for head_dim in HEAD_DIMS {
                for causal in [false, true] {
                    for (fused_backward, softmax_scale) in
                        [(false, 0.1), (true, 0.1), (false, -0.1), (true, -0.1)]
                    {
                        for (seqlen_q, seqlen_k) in
                            [(333, 1000), (100, 300), (333, 9000), (9000, 17000)]
                        {
                            let p = AttentionParams {
                                dtype,
                                batch: 3,
                                seqlen_q,
                                seqlen_k,
                                heads_q: 8,
                                heads_kv: 2,
                                head_dim,
                                causal,
                                softmax_scale,
                                fused_backward,
                            };
                            let q = Layout::contiguous(p.seqlen_q, p.heads_q, head_dim);
                            let k = Layout::contiguous(p.seqlen_k, p.heads_kv, head_dim);
                            let forward =
                                plan::forward(&p, &ForwardLayouts { q, k, v: k, o: q }, target)
                                    .expect("a valid call");
                            assert!(
                                !forward.config.persistent || softmax_scale >= 0.0,
                                "{}",
                                forward.name
                            );
                            let layouts = BackwardLayouts {
                                q,
                                k,
                                v: k,
                                o: q,
                                d_o: q,
                                dq: q,
                                dk: k,
                                dv: k,
                            };
                            let backward =
                                plan::backward(&p, &layouts, target).expect("a valid call");
                            let split = plan::forward_split(
                                &p,
                                &ForwardLayouts { q, k, v: k, o: q },
                                target,
                                plan::MAX_SPLITS,
                            )
                            .expect("a valid call");
                            for launch in std::iter::once(forward).chain(backward).chain(split) {
                                assert!(prebuilt::ptx(&launch.name).is_some(), "{}", launch.name);
                            }
                        }
                    }
                }
            }
        }
    }
    // D128 without a mask at 1k: persistent, and with a negative scale the long range's kernel.
    let p = AttentionParams {
        dtype: DType::BF16,
        batch: 1,
        seqlen_q: 1000,
        seqlen_k: 1000,
        heads_q: 2,
        heads_kv: 2,
        head_dim: 128,
        causal: false,
        softmax_scale: 0.1,
        fused_backward: false,
    };
    let q = Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim);
    let layouts = ForwardLayouts {
        q,
        k: q,
        v: q,
        o: q,
    };
    let plan = |softmax_scale| {
        let p = AttentionParams { softmax_scale, ..p };
        let launch = plan::forward(&p, &layouts, Target::Sm90a).expect("a valid call");
        (launch.name, launch.config.persistent)
    };
    assert_eq!(plan(0.1), ("attention_fwd_bf16_d128_sm_90a".into(), true));
    assert_eq!(
        plan(-0.1),
        ("attention_fwd_bf16_d128_signed_sm_90a".into(), false)
    );
}

#[test]
fn linking_kiln_kernels_needs_no_llvm() {
    let output = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            "kiln-kernels",
            "-e",
            "normal,build",
            "--prefix",
            "none",
            "--format",
            "{p}",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    let tree = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(tree.contains("kiln-runtime"), "{tree}");
    for crate_name in ["llvm-sys", "inkwell", "kiln-codegen"] {
        assert!(
            !tree
                .lines()
                .any(|line| line.starts_with(&format!("{crate_name} "))),
            "{crate_name} is in kiln-kernels' dependency tree:\n{tree}"
        );
    }
}

#[test]
fn the_forward_splits_its_keys_only_where_its_blocks_leave_sms_idle() {
    let decode = AttentionParams {
        dtype: DType::BF16,
        batch: 1,
        seqlen_q: 1,
        seqlen_k: 32768,
        heads_q: 32,
        heads_kv: 8,
        head_dim: 128,
        causal: false,
        softmax_scale: 0.1,
        fused_backward: false,
    };
    let splits = |p: &AttentionParams, programs| {
        plan::forward_splits(p, Target::Sm90a, programs).expect("a valid call")
    };
    // 32 heads of one query row each on 132 SMs: four splits fill 128 of them (97%, within 95%
    // of the best).
    let mha = AttentionParams {
        heads_kv: 32,
        ..decode
    };
    assert_eq!(splits(&mha, 132), 4);
    // With 8 kv heads the 4 query heads of each are the rows of one block: 8 blocks, and 16
    // splits the fewest that fill 95% of the SMs (128 programs).
    assert_eq!(splits(&decode, 132), 16);
    let layout = Layout::contiguous(1, 32, 128);
    let keys = Layout::contiguous(32768, 8, 128);
    let layouts = ForwardLayouts {
        q: layout,
        k: keys,
        v: keys,
        o: layout,
    };
    let causal = AttentionParams {
        causal: true,
        ..decode
    };
    let launch = plan::forward(&causal, &layouts, Target::Sm90a).expect("a valid call");
    // One row sees every key: the decode blocks without a mask, of 4 rows a head apart.
    assert_eq!(launch.name, "attention_fwd_bf16_d128_decode_sm_90a");
    assert!(
        launch.args.contains(&plan::Arg::I32(4)),
        "{:?}",
        launch.args
    );
    let [split, combine] =
        plan::forward_split(&causal, &layouts, Target::Sm90a, 16).expect("a valid call");
    assert_eq!(split.name, "attention_fwd_bf16_d128_split_decode_sm_90a");
    assert_eq!(split.grid, [1, 8, 16]);
    // The combine takes one of the 4 rows a program.
    assert_eq!(combine.grid, [4, 8, 1]);
    // As many blocks of 128 rows as SMs, or 80% of them, or one SM: no split.
    let chunk = AttentionParams {
        seqlen_q: 128,
        ..mha
    };
    for heads in [132, 106] {
        let p = AttentionParams {
            heads_q: heads,
            heads_kv: heads,
            ..chunk
        };
        assert_eq!(splits(&p, 132), 1, "{heads} heads");
    }
    // Decode steps that fill the SMs do not split, and run unsplit in the decode blocks, not in
    // blocks of 128 rows or more: 132 heads, or a batch of 32 x 32 at D64.
    let many = AttentionParams {
        heads_q: 132,
        heads_kv: 132,
        ..mha
    };
    assert_eq!(splits(&many, 132), 1);
    let batch = AttentionParams {
        batch: 32,
        seqlen_k: 4096,
        heads_q: 32,
        heads_kv: 32,
        head_dim: 64,
        ..decode
    };
    assert_eq!(splits(&batch, 132), 1);
    let (q, k) = (
        Layout::contiguous(1, 32, 64),
        Layout::contiguous(4096, 32, 64),
    );
    let batch_layouts = ForwardLayouts { q, k, v: k, o: q };
    let unsplit = plan::forward(&batch, &batch_layouts, Target::Sm90a).expect("a valid call");
    assert_eq!(unsplit.name, "attention_fwd_bf16_d64_decode_sm_90a");
    assert_eq!(unsplit.grid, [1, 32 * 32, 1]);
    assert_eq!(unsplit.config.block_m, DECODE_ROWS);
    let [split, _] =
        plan::forward_split(&batch, &batch_layouts, Target::Sm90a, 2).expect("a valid call");
    assert_eq!(split.name, "attention_fwd_bf16_d64_split_decode_sm_90a");
    assert_eq!(splits(&decode, 1), 1);
    // compare.py's shapes (2048 blocks of 128 rows at head dim 128) never split.
    let long = AttentionParams {
        batch: 4,
        seqlen_q: 4096,
        seqlen_k: 4096,
        heads_q: 16,
        heads_kv: 16,
        ..decode
    };
    assert_eq!(splits(&long, 132), 1);
    // No more splits than key blocks (of 64 keys in D128's decode blocks): one key block, one
    // split; two, two.
    for (seqlen_k, most) in [(64, 1), (100, 2)] {
        assert_eq!(splits(&AttentionParams { seqlen_k, ..decode }, 132), most);
    }
    // One block of one head against many keys: many splits, at most MAX_SPLITS.
    let one = AttentionParams {
        heads_q: 1,
        heads_kv: 1,
        seqlen_k: 1 << 20,
        ..decode
    };
    assert!((100..=plan::MAX_SPLITS).contains(&splits(&one, 132)));
    // A split count outside 2..=MAX_SPLITS is refused, naming it.
    for bad in [0, 1, plan::MAX_SPLITS + 1] {
        let err = plan::forward_split(&decode, &layouts, Target::Sm90a, bad)
            .expect_err("a bad split count")
            .to_string();
        assert!(err.contains(&format!("got {bad}")), "{err}");
    }
}

/// The split forward's combine is the one kernel launched as a programmatic dependent (of the
/// split kernel, on sm_90a): its PTX waits for the split kernel before any memory access, the
/// split kernel lets it launch early, and nothing on sm_80 does either.
#[test]
fn only_the_combine_waits_for_the_kernel_before_it() {
    let mut combines = 0;
    let mut splits = 0;
    for (name, ptx) in prebuilt::all() {
        let lines: Vec<&str> = ptx.text.lines().map(str::trim_start).collect();
        let first = |prefixes: &[&str]| {
            lines
                .iter()
                .position(|line| prefixes.iter().any(|p| line.starts_with(p)))
        };
        let wait = first(&["griddepcontrol.wait"]);
        let launch = first(&["griddepcontrol.launch_dependents"]);
        assert_eq!(wait.is_some(), waits_for_prior_grids(ptx.text), "{name}");
        let sm_90a = name.ends_with("_sm_90a");
        let combine = name.starts_with("attention_fwd_combine");
        let split = name.contains("_split");
        assert_eq!(wait.is_some(), sm_90a && combine, "{name} waits");
        assert_eq!(
            launch.is_some(),
            sm_90a && split,
            "{name} lets dependents launch"
        );
        if let Some(wait) = wait {
            let access = first(&[
                "ld.global",
                "st.global",
                "ld.shared",
                "st.shared",
                "cp.",
                "red.",
            ]);
            assert!(
                access.is_some_and(|a| wait < a),
                "{name} waits before it reads"
            );
            combines += 1;
        }
        splits += usize::from(launch.is_some());
    }
    assert_eq!(
        combines,
        2 * HEAD_DIMS.len(),
        "a combine a dtype and head dim"
    );
    assert!(
        splits > combines,
        "split and decode forwards, causal or not"
    );
}
