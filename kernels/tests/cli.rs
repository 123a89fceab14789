//! The `kiln` CLI as a user runs it: listing, the tile IR, the shipped PTX, ptxas's resource
//! report and SASS (where the CUDA tools are), and errors that say what exists. Built with
//! default features these tests run the binary without LLVM; with `--features codegen` the
//! compiler stages succeed instead of pointing at the feature.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kiln_kernels::attention::{AttentionKernel, prebuilt};

const SHIPPED_SPEC: &str = "T=bf16,HEAD_DIM=128,CAUSAL=true";

fn kiln(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kiln"));
    command.args(args);
    command
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `kiln args`, which must succeed; its stdout.
fn succeeds(command: &mut Command) -> String {
    let output = command.output().expect("kiln runs");
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}",
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Runs `kiln args`, which must fail with an error, not a panic; its stderr.
fn fails(args: &[&str]) -> String {
    let Output { status, stderr, .. } = kiln(args).output().expect("kiln runs");
    let stderr = text(&stderr);
    assert_eq!(status.code(), Some(1), "kiln {args:?}: {stderr}");
    assert!(stderr.contains("error: "), "kiln {args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "kiln {args:?}: {stderr}");
    stderr
}

fn ptxas() -> Option<PathBuf> {
    std::env::var_os("KILN_PTXAS").map(PathBuf::from)
}

#[test]
fn list_shows_every_kernel_and_the_shipped_specialisations() {
    let out = succeeds(&mut kiln(&["list"]));
    assert!(
        out.contains(
            "attention_fwd                T (a dtype), OUT (a dtype), HEAD_DIM (an integer)"
        ),
        "{out}"
    );
    assert!(out.contains("gemm_bias_gelu"), "{out}");
    for kernel in AttentionKernel::ALL {
        let count = prebuilt::shipped()
            .iter()
            .filter(|s| s.kernel == kernel)
            .count();
        let masks = if kernel.reads_keys() {
            " CAUSAL = false, true;"
        } else {
            ""
        };
        let line = format!(
            "ships {count} specialisations: T = f16, bf16; HEAD_DIM = 32, 64, 128, 256;{masks} on sm_80, sm_90a"
        );
        assert!(out.contains(&line), "no `{line}` in:\n{out}");
    }
}

#[test]
fn ir_prints_the_tile_ir_at_the_spec_given() {
    let out = succeeds(&mut kiln(&[
        "ir",
        "attention_fwd",
        "--spec",
        "HEAD_DIM=128",
    ]));
    assert!(
        out.starts_with(
            "kernel @attention_fwd<BLOCK_M = 128, BLOCK_N = 128, CAUSAL = true, HEAD_DIM = 128, LAST_BLOCK_APART = true, OUT = f16, OVERLAP_SOFTMAX = true, PERSISTENT = true, SPLIT = false, T = f16>"
        ),
        "{out}"
    );
    // The spec syntax `kiln ir` always took, spaces and all, on a general kernel.
    let out = succeeds(&mut kiln(&[
        "ir",
        "softmax_rows",
        "--spec",
        "T=bf16, BLOCK_M=8",
    ]));
    assert!(
        out.starts_with("kernel @softmax_rows<BLOCK_M = 8, BLOCK_N = 1024, T = bf16>"),
        "{out}"
    );
}

#[test]
fn attention_block_sizes_come_from_the_table_for_the_arch() {
    // dK/dV at head dim 256 streams 32-row tiles on sm_80 and 64-row ones on sm_90a.
    for (arch, block_m) in [("sm_80", 32), ("sm_90a", 64)] {
        let out = succeeds(&mut kiln(&[
            "ir",
            "attention_bwd_dkdv",
            "--spec",
            "HEAD_DIM=256",
            "--arch",
            arch,
        ]));
        assert!(
            out.starts_with(&format!(
                "kernel @attention_bwd_dkdv<ACCUMULATE_DQ = false, BLOCK_M = {block_m},"
            )),
            "{out}"
        );
    }
    let output = kiln(&[
        "ir",
        "attention_bwd_dkdv",
        "--spec",
        "HEAD_DIM=256,BLOCK_M=64",
        "--arch",
        "sm_80",
    ])
    .output()
    .unwrap();
    assert!(output.status.success());
    let stderr = text(&output.stderr);
    assert!(
        stderr.contains("with BLOCK_M = 32 (for medium sequences), not 64; compiling with 64"),
        "{stderr}"
    );
}

#[test]
fn ptx_of_a_shipped_specialisation_is_the_shipped_file() {
    let shipped = prebuilt::ptx("attention_fwd_bf16_d128_causal_sm_80").expect("shipped");
    for spec in [
        vec!["--spec", SHIPPED_SPEC],
        vec!["--spec=T=bf16,CAUSAL=true,HEAD_DIM=128"],
    ] {
        let mut args = vec!["ptx", "attention_fwd", "--arch", "sm_80"];
        args.extend(spec);
        let out = succeeds(&mut kiln(&args));
        assert!(out == shipped.text, "kiln {args:?} is not the shipped PTX");
        assert!(out.contains("\t.loc\t"), "no line info");
    }
}

#[test]
fn compiler_stages_need_the_codegen_feature() {
    if cfg!(feature = "codegen") {
        let out = succeeds(&mut kiln(&["llvm", "attention_fwd"]));
        assert!(out.contains("define "), "{out}");
        let out = succeeds(&mut kiln(&["ptx", "softmax_rows"]));
        assert!(out.contains(".visible .entry softmax_rows("), "{out}");
        // The forward on wgmma, its softmax overlapped: the spec is the user's to give.
        let spec = "HEAD_DIM=64,OVERLAP_SOFTMAX=true,LAST_BLOCK_APART=true";
        let out = succeeds(&mut kiln(&[
            "ptx",
            "attention_fwd",
            "--spec",
            spec,
            "--wgmma",
            "yes",
        ]));
        assert!(out.contains("wgmma.mma_async.sync.aligned.m64n"), "{out}");
        assert!(out.contains("wgmma.wait_group.sync.aligned 1;"), "{out}");
        let err = fails(&["ptx", "attention_fwd", "--arch", "sm_80", "--wgmma", "yes"]);
        assert!(
            err.contains("wgmma needs the sm_90a target, got sm_80"),
            "{err}"
        );
        return;
    }
    let err = fails(&["llvm", "attention_fwd"]);
    assert!(
        err.contains(
            "cargo run --release -p kiln-kernels --features codegen --bin kiln -- llvm attention_fwd"
        ),
        "{err}"
    );
    // PTX without kiln-codegen: only what ships.
    let err = fails(&["ptx", "softmax_rows", "--arch", "sm_80"]);
    assert!(err.contains("not a specialisation kiln ships"), "{err}");
    assert!(err.contains("--features codegen"), "{err}");
    let err = fails(&["ptx", "attention_fwd", "--warps", "2"]);
    assert!(err.contains("not a specialisation kiln ships"), "{err}");
    let err = fails(&["ptx", "attention_fwd", "--wgmma", "no"]);
    assert!(err.contains("not a specialisation kiln ships"), "{err}");
    let err = fails(&["ptx", "attention_fwd", "--wgmma", "perhaps"]);
    assert!(
        err.contains("`--wgmma` expects yes or no, got `perhaps`"),
        "{err}"
    );
}

#[test]
fn errors_list_what_exists() {
    let err = fails(&["ir", "attention"]);
    assert!(
        err.contains("no kernel `attention`; kernels: attention_fwd, attention_fwd_combine, attention_bwd_preprocess"),
        "{err}"
    );
    let err = fails(&["ptx", "attention_fwd", "--spec", "HEAD=64"]);
    assert!(err.contains("no specialisation parameter `HEAD`"), "{err}");
    assert!(
        err.contains("`attention_fwd` takes: T (a dtype), OUT (a dtype), HEAD_DIM (an integer)"),
        "{err}"
    );
    let err = fails(&["ptx", "attention_fwd", "--spec", "CAUSAL=maybe"]);
    assert!(
        err.contains("`CAUSAL` expects a bool, got `maybe`"),
        "{err}"
    );
    assert!(err.contains("CAUSAL (a bool)"), "{err}");
    let err = fails(&["ptx", "attention_fwd", "--arch", "sm_70"]);
    assert!(err.contains("sm_80 or sm_90a, got `sm_70`"), "{err}");
    let err = fails(&["assemble", "attention_fwd"]);
    assert!(
        err.contains("unknown command `assemble`") && err.contains("usage:"),
        "{err}"
    );
    let err = fails(&["ir", "attention_fwd", "--warp", "4"]);
    assert!(
        err.contains("unexpected argument `--warp`; expected --spec"),
        "{err}"
    );
    let err = fails(&["ir", "attention_fwd", "--spec", "HEAD_DIM=96"]);
    assert!(err.contains("does not build"), "{err}");
    let err = fails(&["ir"]);
    assert!(err.contains("needs a kernel name"), "{err}");
}

/// The registers per thread in ptxas's `-v` report of the shipped file, assembled here.
fn registers_by_ptxas(ptxas: &Path, name: &str, arch: &str) -> u32 {
    let dir = std::env::temp_dir().join(format!("kiln-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join(format!("{name}.ptx"));
    std::fs::write(&input, prebuilt::ptx(name).unwrap().text).unwrap();
    let output = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .arg("-v")
        .arg(&input)
        .arg("-o")
        .arg(dir.join(format!("{name}.cubin")))
        .output()
        .expect("ptxas runs");
    let _ = std::fs::remove_dir_all(&dir);
    let report = text(&output.stderr) + &text(&output.stdout);
    let used = report.split("Used ").nth(1).expect("a register count");
    used.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn resources_reports_what_ptxas_says() {
    let Some(ptxas) = ptxas() else {
        eprintln!("KILN_PTXAS not set: skipping `kiln resources`");
        return;
    };
    // Eight warps and no spill: sm_80's dK/dV at head dim 256.
    let name = "attention_bwd_dkdv_bf16_d256_causal_sm_80";
    let out = succeeds(&mut kiln(&[
        "resources",
        "attention_bwd_dkdv",
        "--spec",
        "T=bf16,CAUSAL=true,HEAD_DIM=256",
        "--arch",
        "sm_80",
    ]));
    assert!(out.contains(&format!("(shipped as {name})")), "{out}");
    let registers: u32 = out
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("registers")?
                .split_whitespace()
                .next()
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no register count in:\n{out}"));
    assert!((1..=255).contains(&registers), "{out}");
    assert_eq!(
        registers,
        registers_by_ptxas(&ptxas, name, "sm_80"),
        "{out}"
    );
    let shared = prebuilt::ptx(name).unwrap().shared_bytes;
    assert!(out.contains(&format!("+ {shared} bytes dynamic")), "{out}");
    assert!(
        out.contains("0 bytes spill stores, 0 bytes spill loads"),
        "{out}"
    );
    assert!(out.contains("threads           256 per block"), "{out}");
}

#[test]
fn sass_disassembles_where_the_tools_are() {
    let Some(ptxas) = ptxas() else {
        eprintln!("KILN_PTXAS not set: skipping `kiln sass`");
        return;
    };
    let found = |tool: &str| {
        let beside = ptxas.parent().map(|dir| dir.join(tool));
        std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()))
            .unwrap_or(false)
            || beside.is_some_and(|path| path.is_file())
    };
    if !found("cuobjdump") && !found("nvdisasm") {
        let err = fails(&["sass", "attention_fwd", "--arch", "sm_80"]);
        assert!(
            err.contains("neither cuobjdump nor nvdisasm found"),
            "{err}"
        );
        return;
    }
    let out = succeeds(&mut kiln(&["sass", "attention_fwd", "--arch", "sm_80"]));
    assert!(
        out.contains("HMMA"),
        "no tensor-core instruction in:\n{out}"
    );
}

#[test]
fn a_missing_ptxas_is_named() {
    let output = kiln(&["resources", "attention_fwd"])
        .env_remove("KILN_PTXAS")
        .env("PATH", "")
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("ptxas not found: set KILN_PTXAS to its path or put it on PATH"),
        "{stderr}"
    );
}

#[test]
fn a_reader_that_stops_early_is_no_error() {
    let mut child = kiln(&[
        "ptx",
        "attention_fwd",
        "--spec",
        SHIPPED_SPEC,
        "--arch",
        "sm_80",
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
}

/// The main job without a GPU: the interpreter against f64, and the forward's shipped PTX with a
/// `.loc` line traced to its DSL source line (with a GPU it goes on to the prebuilt kernels).
#[test]
fn the_demo_checks_the_interpreter_and_shows_ptx_with_its_source_lines() {
    let out =
        succeeds(kiln(&["demo"]).current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")));
    assert!(out.contains("every output is within its bar"), "{out}");
    assert!(
        out.contains(".file\t1 \"kernels/src/attention/forward.rs\""),
        "{out}"
    );
    assert!(out.contains("wgmma.mma_async.sync.aligned.m64n"), "{out}");
    assert!(
        out.contains("is kernels/src/attention/forward.rs:") && out.contains("dot("),
        "{out}"
    );
    assert!(out.contains("// kiln.tensor_map arg1 bf16 shape="), "{out}");
    assert!(out.contains("@one cp.async.bulk.tensor.4d"), "{out}");
    if !kiln_runtime::driver_present() {
        assert!(out.contains("No GPU here"), "{out}");
    }
}

#[test]
fn bench_refuses_bad_flags_with_what_it_takes() {
    let err = fails(&["bench", "--seqs", "0,1024"]);
    assert!(
        err.contains("--seqs expects positive numbers separated by commas, got `0,1024`"),
        "{err}"
    );
    let err = fails(&["bench", "--dtype", "f32"]);
    assert!(
        err.contains("--dtype expects bf16 or f16, got `f32`"),
        "{err}"
    );
    let err = fails(&["bench", "--fast"]);
    assert!(err.contains("unknown flag `--fast`"), "{err}");
    for bad in ["-1", "soon", "NaN", "1e400"] {
        let err = fails(&["bench", "--warm", bad]);
        assert!(
            err.contains(&format!(
                "--warm expects seconds, zero or more, got `{bad}`"
            )),
            "{err}"
        );
    }
}

#[test]
fn tune_refuses_bad_flags_naming_the_value() {
    let err = fails(&[
        "tune",
        "--kernels",
        "attention_fwd,attention_bwd_preprocess",
    ]);
    assert!(err.contains("`attention_bwd_preprocess`"), "{err}");
    assert!(err.contains("attention_bwd_dkdv"), "{err}");
    let err = fails(&["tune", "--kernels", "attention_bwd_dq_convert"]);
    assert!(err.contains("`attention_bwd_dq_convert`"), "{err}");
    let err = fails(&["tune", "--backward", "atomic"]);
    assert!(err.contains("split or fused, got `atomic`"), "{err}");
    let err = fails(&["tune", "--warm", "-0.5"]);
    assert!(
        err.contains("--warm expects seconds, zero or more, got `-0.5`"),
        "{err}"
    );
    let err = fails(&[
        "tune",
        "--backward",
        "fused",
        "--kernels",
        "attention_bwd_dq",
    ]);
    assert!(err.contains("runs no attention_bwd_dq"), "{err}");
    let err = fails(&["tune", "--causal", "maybe"]);
    assert!(err.contains("both, yes or no, got `maybe`"), "{err}");
    let err = fails(&["tune", "--seqlen", "-5"]);
    assert!(err.contains("`-5`"), "{err}");
    let err = fails(&["tune", "--configs", "128x64:4:2,128x64:four:2"]);
    assert!(err.contains("got `128x64:four:2`"), "{err}");
    let err = fails(&[
        "tune",
        "--decode",
        "--kernels",
        "attention_fwd,attention_bwd_dkdv",
    ]);
    assert!(
        err.contains("attention_fwd alone, got `attention_bwd_dkdv`"),
        "{err}"
    );
    let err = fails(&["tune", "--decode", "--backward", "fused"]);
    assert!(err.contains("not `--backward fused`"), "{err}");
    let err = fails(&["tune", "--quick"]);
    assert!(err.contains("unknown flag `--quick`"), "{err}");
    assert!(err.contains("--head-dims"), "{err}");
}

#[test]
fn tune_without_codegen_refuses_before_its_search() {
    if cfg!(feature = "codegen") {
        return;
    }
    // Read flags first (a bad one is named as such), then one refusal that says how to rebuild,
    // not a failure for every candidate.
    let err = fails(&["tune", "--decode", "--head-dims", "32"]);
    assert!(
        err.contains(
            "cargo run --release -p kiln-kernels --features codegen --bin kiln -- tune --decode \
             --head-dims 32"
        ),
        "{err}"
    );
    assert!(!err.contains("attention_fwd"), "{err}");
}
