//! `#[kiln_dsl::kernel]` end to end: kernels written in the DSL, built at a spec, compared with
//! their expected IR text; their signatures; the locations semantic errors report; how loops and
//! branches carry variables; `if` used as a value, built and run; and `#[kiln_dsl::kernel_fn]`s,
//! inlined into the kernels that call them, with the checks and error locations of their calls.

use std::fmt::Write;

use kiln_dsl::prelude::*;
use kiln_dsl::{
    ArgDecl, ArgType, DTypeRef, Error, Grid, HostBuffer, KernelArg, SpecKind, SpecParam, run,
};

/// Compares IR texts, printing a line-by-line diff when they differ.
#[track_caller]
fn check(actual: &str, expected: &str) {
    let actual_lines: Vec<&str> = actual.trim().lines().collect();
    let expected_lines: Vec<&str> = expected.trim().lines().collect();
    if actual_lines == expected_lines {
        return;
    }
    let mut diff = String::new();
    for index in 0..actual_lines.len().max(expected_lines.len()) {
        match (expected_lines.get(index), actual_lines.get(index)) {
            (Some(expected), Some(actual)) if expected == actual => {
                let _ = writeln!(diff, "  {expected}");
            }
            (expected, actual) => {
                if let Some(expected) = expected {
                    let _ = writeln!(diff, "- {expected}");
                }
                if let Some(actual) = actual {
                    let _ = writeln!(diff, "+ {actual}");
                }
            }
        }
    }
    panic!("the IR differs from the expected text (- expected, + actual):\n{diff}");
}

/// The `file:line:col` of the first occurrence of `needle` in this file, as `Loc` prints it.
fn location_of(needle: &str) -> String {
    let source = include_str!("macro_expansion.rs");
    let (line_index, line) = source
        .lines()
        .enumerate()
        .find(|(_, line)| line.contains(needle))
        .unwrap_or_else(|| panic!("`{needle}` is not in this file"));
    let column = line.find(needle).expect("found above") + 1;
    format!("dsl/tests/macro_expansion.rs:{}:{column}", line_index + 1)
}

#[track_caller]
fn semantic_error(result: kiln_dsl::Result<kiln_dsl::Kernel>) -> Error {
    match result {
        Ok(kernel) => panic!("expected a semantic error, built:\n{kernel}"),
        Err(error @ Error::Semantic { .. }) => error,
        Err(other) => panic!("expected a semantic error, got: {other}"),
    }
}

/// Vector addition, as in the macro's docs.
#[kiln_dsl::kernel]
pub fn add<T, const BLOCK: usize>(x: Ptr<T>, y: Ptr<T>, out: Ptr<T>, n: i32) {
    let pid = program_id(0);
    let offs = pid * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let a = load(x + offs, mask, 0.0);
    let b = load(y + offs, mask);
    store(out + offs, a + b, mask);
}

#[test]
fn add_builds_the_expected_ir() {
    let kernel = add::build(&Spec::new().dtype("T", F16).int("BLOCK", 64)).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @add<BLOCK = 64, T = f16>(%x.0: ptr<f16>, %y.1: ptr<f16>, %out.2: ptr<f16>, %n.3: i32) {
  %BLOCK.4 = const 64 : i32
  %pid.6 = program_id 0 : i32
  %7 = mul %pid.6, %BLOCK.4 : i32
  %9 = arange 0, 64 : i32[64]
  %10 = splat %7 : i32[64]
  %offs.11 = add %10, %9 : i32[64]
  %12 = splat %n.3 : i32[64]
  %mask.13 = cmp_lt %offs.11, %12 : i1[64]
  %14 = splat %x.0 : ptr<f16>[64]
  %15 = add_ptr %14, %offs.11 : ptr<f16>[64]
  %17 = const 0.0 : f16
  %18 = splat %17 : f16[64]
  %a.19 = load %15, mask %mask.13, other %18 : f16[64]
  %20 = splat %y.1 : ptr<f16>[64]
  %21 = add_ptr %20, %offs.11 : ptr<f16>[64]
  %b.22 = load %21, mask %mask.13 : f16[64]
  %23 = splat %out.2 : ptr<f16>[64]
  %24 = add_ptr %23, %offs.11 : ptr<f16>[64]
  %25 = add %a.19, %b.22 : f16[64]
  store %24, %25, mask %mask.13
}
",
    );
}

#[test]
fn signature_records_params_and_args_as_written() {
    assert_eq!(add::SIGNATURE.name, "add");
    assert_eq!(add::SIGNATURE.file, "dsl/tests/macro_expansion.rs");
    assert_eq!(
        add::SIGNATURE.params,
        [
            SpecParam {
                name: "T",
                kind: SpecKind::DType
            },
            SpecParam {
                name: "BLOCK",
                kind: SpecKind::Int
            },
        ]
    );
    let ptr_t = ArgType::Ptr(DTypeRef::Param("T"));
    assert_eq!(
        add::SIGNATURE.args,
        [
            ArgDecl {
                name: "x",
                ty: ptr_t
            },
            ArgDecl {
                name: "y",
                ty: ptr_t
            },
            ArgDecl {
                name: "out",
                ty: ptr_t
            },
            ArgDecl {
                name: "n",
                ty: ArgType::Scalar(DTypeRef::Fixed(I32))
            },
        ]
    );
    assert_eq!(
        mixed_signature::SIGNATURE.params,
        [
            SpecParam {
                name: "S",
                kind: SpecKind::DType
            },
            SpecParam {
                name: "A",
                kind: SpecKind::Int
            },
            SpecParam {
                name: "B",
                kind: SpecKind::Int
            },
            SpecParam {
                name: "C",
                kind: SpecKind::Int
            },
            SpecParam {
                name: "FLAG",
                kind: SpecKind::Bool
            },
        ]
    );
    assert_eq!(
        mixed_signature::SIGNATURE.args,
        [
            ArgDecl {
                name: "bits",
                ty: ArgType::Ptr(DTypeRef::Fixed(I1))
            },
            ArgDecl {
                name: "halves",
                ty: ArgType::Ptr(DTypeRef::Fixed(BF16))
            },
            ArgDecl {
                name: "wide",
                ty: ArgType::Scalar(DTypeRef::Fixed(I64))
            },
            ArgDecl {
                name: "factor",
                ty: ArgType::Scalar(DTypeRef::Fixed(F32))
            },
            ArgDecl {
                name: "generic",
                ty: ArgType::Scalar(DTypeRef::Param("S"))
            },
        ]
    );
}

/// Every kind of parameter and argument; bounds on type parameters are ignored.
#[kiln_dsl::kernel]
fn mixed_signature<S: Copy, const A: usize, const B: u32, const C: i64, const FLAG: bool>(
    bits: Ptr<bool>,
    halves: Ptr<bf16>,
    wide: i64,
    factor: f32,
    generic: S,
) {
    store(halves, factor + generic.to::<f32>());
}

/// A row sum: `acc` is carried through the loop, `for` with `step_by`.
#[kiln_dsl::kernel]
fn row_sum<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let offs = arange(0, BLOCK);
    let mut acc = zeros([BLOCK], f32);
    for start in (0..n).step_by(BLOCK) {
        let mask = start + offs < n;
        acc += load(x + start + offs, mask, 0.0);
    }
    store(out, acc.sum(0));
}

#[test]
fn a_loop_carries_the_variables_its_body_assigns() {
    let kernel = row_sum::build(&Spec::new().int("BLOCK", 32)).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @row_sum<BLOCK = 32>(%x.0: ptr<f32>, %out.1: ptr<f32>, %n.2: i32) {
  %BLOCK.3 = const 32 : i32
  %offs.5 = arange 0, 32 : i32[32]
  %6 = const 0.0 : f32
  %acc.7 = splat %6 : f32[32]
  %8 = const 0 : i32
  %acc.22 = for %start.9 = %8 to %n.2 step %BLOCK.3 carry (%acc.10 = %acc.7) : f32[32] {
    %11 = splat %start.9 : i32[32]
    %12 = add %11, %offs.5 : i32[32]
    %13 = splat %n.2 : i32[32]
    %mask.14 = cmp_lt %12, %13 : i1[32]
    %15 = add_ptr %x.0, %start.9 : ptr<f32>
    %16 = splat %15 : ptr<f32>[32]
    %17 = add_ptr %16, %offs.5 : ptr<f32>[32]
    %18 = const 0.0 : f32
    %19 = splat %18 : f32[32]
    %20 = load %17, mask %mask.14, other %19 : f32[32]
    %acc.21 = add %acc.10, %20 : f32[32]
    yield %acc.21
  }
  %24 = reduce_sum %acc.22, axis 0 : f32
  store %out.1, %24
}
",
    );
}

/// The inner loop carries `row`; the outer carries `total` but not `row`, declared inside it.
#[kiln_dsl::kernel]
fn nested_loops(x: Ptr<f32>, out: Ptr<f32>, rows: i32, cols: i32) {
    let mut total = 0.0;
    for i in 0..rows {
        let mut row = 0.0;
        for j in 0..cols {
            row = row + load(x + i * cols + j);
        }
        total = total + row;
        store(out + i, row);
    }
    store(out + rows, total);
}

#[test]
fn nested_loops_carry_what_each_assigns_from_outside() {
    let kernel = nested_loops::build(&Spec::new()).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @nested_loops<>(%x.0: ptr<f32>, %out.1: ptr<f32>, %rows.2: i32, %cols.3: i32) {
  %total.4 = const 0.0 : f32
  %5 = const 0 : i32
  %6 = const 1 : i32
  %total.22 = for %i.7 = %5 to %rows.2 step %6 carry (%total.8 = %total.4) : f32 {
    %row.9 = const 0.0 : f32
    %10 = const 0 : i32
    %11 = const 1 : i32
    %row.19 = for %j.12 = %10 to %cols.3 step %11 carry (%row.13 = %row.9) : f32 {
      %14 = mul %i.7, %cols.3 : i32
      %15 = add_ptr %x.0, %14 : ptr<f32>
      %16 = add_ptr %15, %j.12 : ptr<f32>
      %17 = load %16 : f32
      %row.18 = add %row.13, %17 : f32
      yield %row.18
    }
    %total.20 = add %total.8, %row.19 : f32
    %21 = add_ptr %out.1, %i.7 : ptr<f32>
    store %21, %row.19
    yield %total.20
  }
  %23 = add_ptr %out.1, %rows.2 : ptr<f32>
  store %23, %total.22
}
",
    );
}

/// A runtime `if` / `else if` / `else`: each `if` carries what any of its branches assigns.
#[kiln_dsl::kernel]
fn branches(x: Ptr<f32>, n: i32, limit: f32) {
    let offs = arange(0, 16);
    let mut y = load(x + offs);
    let mut scale = 1.0;
    if n > 16 {
        y = minimum(y, limit);
    } else if n > 8 {
        scale = 2.0;
    } else {
        y = -y;
    }
    store(x + offs, y * scale);
}

#[test]
fn if_else_carries_the_variables_its_branches_assign() {
    let kernel = branches::build(&Spec::new()).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @branches<>(%x.0: ptr<f32>, %n.1: i32, %limit.2: f32) {
  %offs.5 = arange 0, 16 : i32[16]
  %6 = splat %x.0 : ptr<f32>[16]
  %7 = add_ptr %6, %offs.5 : ptr<f32>[16]
  %y.8 = load %7 : f32[16]
  %scale.9 = const 1.0 : f32
  %10 = const 16 : i32
  %11 = cmp_gt %n.1, %10 : i1
  %y.20, %scale.21 = if %11 : f32[16], f32 {
    %12 = splat %limit.2 : f32[16]
    %y.13 = min %y.8, %12 : f32[16]
    yield %y.13, %scale.9
  } else {
    %14 = const 8 : i32
    %15 = cmp_gt %n.1, %14 : i1
    %scale.18, %y.19 = if %15 : f32, f32[16] {
      %scale.16 = const 2.0 : f32
      yield %scale.16, %y.8
    } else {
      %y.17 = neg %y.8 : f32[16]
      yield %scale.9, %y.17
    }
    yield %y.19, %scale.18
  }
  %22 = splat %x.0 : ptr<f32>[16]
  %23 = add_ptr %22, %offs.5 : ptr<f32>[16]
  %24 = splat %scale.21 : f32[16]
  %25 = mul %y.20, %24 : f32[16]
  store %23, %25
}
",
    );
}

/// `if` on a bool parameter or a folded comparison builds only the branch taken.
#[kiln_dsl::kernel]
fn static_branch<const CHECKED: bool, const BLOCK: usize>(x: Ptr<f32>) {
    let offs = arange(0, BLOCK);
    let mut y = load(x + offs);
    if CHECKED {
        static_assert(BLOCK >= 32, "a checked kernel needs BLOCK >= 32");
        y = y * 2.0;
    } else {
        y = y + 1.0;
    }
    if BLOCK > 64 {
        static_assert(false, "BLOCK > 64 is never built in these tests");
    }
    store(x + offs, y);
}

#[test]
fn a_static_if_builds_only_the_branch_taken() {
    let unchecked = static_branch::build(&Spec::new().flag("CHECKED", false).int("BLOCK", 16));
    check(
        &unchecked.unwrap().to_string(),
        r"
kernel @static_branch<BLOCK = 16, CHECKED = false>(%x.0: ptr<f32>) {
  %offs.4 = arange 0, 16 : i32[16]
  %5 = splat %x.0 : ptr<f32>[16]
  %6 = add_ptr %5, %offs.4 : ptr<f32>[16]
  %y.7 = load %6 : f32[16]
  %8 = const 1.0 : f32
  %9 = splat %8 : f32[16]
  %y.10 = add %y.7, %9 : f32[16]
  %13 = splat %x.0 : ptr<f32>[16]
  %14 = add_ptr %13, %offs.4 : ptr<f32>[16]
  store %14, %y.10
}
",
    );
    let checked = static_branch::build(&Spec::new().flag("CHECKED", true).int("BLOCK", 32));
    check(
        &checked.unwrap().to_string(),
        r"
kernel @static_branch<BLOCK = 32, CHECKED = true>(%x.0: ptr<f32>) {
  %offs.4 = arange 0, 32 : i32[32]
  %5 = splat %x.0 : ptr<f32>[32]
  %6 = add_ptr %5, %offs.4 : ptr<f32>[32]
  %y.7 = load %6 : f32[32]
  %10 = const 2.0 : f32
  %11 = splat %10 : f32[32]
  %y.12 = mul %y.7, %11 : f32[32]
  %15 = splat %x.0 : ptr<f32>[32]
  %16 = add_ptr %15, %offs.4 : ptr<f32>[32]
  store %16, %y.12
}
",
    );
    // The branch taken is built, so its static assertion fires.
    let too_small = static_branch::build(&Spec::new().flag("CHECKED", true).int("BLOCK", 16));
    let error = semantic_error(too_small);
    assert_eq!(
        error.to_string(),
        format!(
            "static assertion failed: a checked kernel needs BLOCK >= 32\n  --> {}",
            location_of("static_assert(BLOCK >= 32")
        )
    );
    let too_large = static_branch::build(&Spec::new().flag("CHECKED", false).int("BLOCK", 128));
    assert!(
        semantic_error(too_large)
            .message()
            .contains("BLOCK > 64 is never built")
    );
}

/// Two semantic errors at spec-dependent places: one in a call, one in a method call.
#[kiln_dsl::kernel]
fn misplaced<const BLOCK: usize, const TRANSPOSE: bool>(x: Ptr<f32>) {
    let offs = arange(0, 16);
    let tile = load(x + offs) * 2.0 + arange(0, BLOCK).to::<f32>();
    if TRANSPOSE {
        store(x + offs, tile.exp2().trans());
    }
}

#[test]
fn semantic_errors_point_at_the_offending_expression() {
    let not_pow2 = misplaced::build(&Spec::new().int("BLOCK", 12).flag("TRANSPOSE", false));
    let error = semantic_error(not_pow2);
    assert!(error.message().contains("power-of-two length"), "{error}");
    assert!(
        error
            .to_string()
            .ends_with(&location_of("arange(0, BLOCK).to")),
        "{error}"
    );
    // A method call's location is its method's name: `trans` fails, not `exp2` before it.
    let rank_1 = misplaced::build(&Spec::new().int("BLOCK", 16).flag("TRANSPOSE", true));
    let error = semantic_error(rank_1);
    assert!(
        error.message().contains("`trans` expects a 2-D tile"),
        "{error}"
    );
    assert!(
        error.to_string().ends_with(&location_of("trans()")),
        "{error}"
    );
}

/// Block pointers, reductions, math, casts and float constants.
#[kiln_dsl::kernel]
fn softmax_rows<T, const BLOCK_M: usize, const BLOCK_N: usize>(
    x: Ptr<T>,
    out: Ptr<T>,
    rows: i32,
    cols: i32,
    stride: i64,
) {
    let row_start = program_id(0) * BLOCK_M;
    let block = make_block_ptr(
        x,
        [rows, cols],
        [stride, 1],
        [row_start, 0],
        [BLOCK_M, BLOCK_N],
        [1, 0],
    );
    let tile = load(block, [0, 1]).to::<f32>();
    let col = arange(0, BLOCK_N).expand_dims(0);
    let scores = where_(col < cols, tile * f32::consts::LOG2_E, f32::NEG_INFINITY);
    let p = exp2(scores - scores.max(1).expand_dims(1));
    let result = (p / sum(p, 1).expand_dims(1)) as T;
    store(
        advance(
            make_block_ptr(
                out,
                [rows, cols],
                [stride, 1],
                [0, 0],
                [BLOCK_M, BLOCK_N],
                [1, 0],
            ),
            [row_start, 0],
        ),
        result,
        [0],
    );
}

#[test]
fn block_pointers_reductions_and_casts() {
    let spec = Spec::new()
        .dtype("T", BF16)
        .int("BLOCK_M", 2)
        .int("BLOCK_N", 8);
    let kernel = softmax_rows::build(&spec).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @softmax_rows<BLOCK_M = 2, BLOCK_N = 8, T = bf16>(%x.0: ptr<bf16>, %out.1: ptr<bf16>, %rows.2: i32, %cols.3: i32, %stride.4: i64) {
  %BLOCK_M.5 = const 2 : i32
  %8 = program_id 0 : i32
  %row_start.9 = mul %8, %BLOCK_M.5 : i32
  %14 = cast %rows.2 : i64
  %15 = cast %cols.3 : i64
  %16 = const 1 : i64
  %17 = cast %row_start.9 : i64
  %18 = const 0 : i64
  %block.19 = make_block_ptr %x.0, shape [%14, %15], strides [%stride.4, %16], offsets [%17, %18], order [1, 0] : block_ptr<bf16>[2, 8]
  %22 = load_block %block.19, check [0, 1] : bf16[2, 8]
  %tile.23 = cast %22 : f32[2, 8]
  %25 = arange 0, 8 : i32[8]
  %col.27 = expand_dims %25, axis 0 : i32[1, 8]
  %28 = splat %cols.3 : i32[1, 8]
  %29 = cmp_lt %col.27, %28 : i1[1, 8]
  %30 = const 1.4426950216293335 : f32
  %31 = splat %30 : f32[2, 8]
  %32 = mul %tile.23, %31 : f32[2, 8]
  %33 = const -inf : f32
  %34 = splat %33 : f32[2, 8]
  %35 = broadcast %29 : i1[2, 8]
  %scores.36 = select %35, %32, %34 : f32[2, 8]
  %38 = reduce_max %scores.36, axis 1 : f32[2]
  %40 = expand_dims %38, axis 1 : f32[2, 1]
  %41 = broadcast %40 : f32[2, 8]
  %42 = sub %scores.36, %41 : f32[2, 8]
  %p.43 = exp2 %42 : f32[2, 8]
  %45 = reduce_sum %p.43, axis 1 : f32[2]
  %47 = expand_dims %45, axis 1 : f32[2, 1]
  %48 = broadcast %47 : f32[2, 8]
  %49 = div %p.43, %48 : f32[2, 8]
  %result.50 = cast %49 : bf16[2, 8]
  %56 = cast %rows.2 : i64
  %57 = cast %cols.3 : i64
  %58 = const 1 : i64
  %59 = const 0 : i64
  %60 = const 0 : i64
  %61 = make_block_ptr %out.1, shape [%56, %57], strides [%stride.4, %58], offsets [%59, %60], order [1, 0] : block_ptr<bf16>[2, 8]
  %63 = cast %row_start.9 : i64
  %64 = const 0 : i64
  %65 = advance %61, [%63, %64] : block_ptr<bf16>[2, 8]
  store_block %65, %result.50, check [0]
}
",
    );
}

/// A runtime `if` used as a value whose then-branch also assigns a variable declared before it:
/// the IR `if` gives the carried variable, then the value; the else-branch's literal is converted
/// and broadcast to the then-branch's tile.
#[kiln_dsl::kernel]
fn soft_capped(x: Ptr<f32>, out: Ptr<f32>, count: Ptr<i32>, softcap: i32, cap: f32) {
    let offs = arange(0, 8);
    let qk = load(x + offs);
    let mut capped = 0;
    let s = if softcap != 0 {
        capped = capped + 1;
        cap * tanh(qk / cap)
    } else {
        0.0
    };
    store(out + offs, s);
    store(count, capped);
}

/// `if` used as a value on a bool parameter: only the branch taken is built, and its tail is the
/// value.
#[kiln_dsl::kernel]
fn scores<const SOFTCAP: bool>(x: Ptr<f32>, out: Ptr<f32>, cap: f32, scale: f32) {
    let offs = arange(0, 8);
    let qk = load(x + offs);
    let s = if SOFTCAP {
        cap * tanh(qk / cap)
    } else {
        qk * scale
    };
    store(out + offs, s);
}

/// An `else if` chain used as a value, and as an operand: each `if` gives the value of its branch
/// taken. The first branch's literal is converted to the tile the others give, in its own region.
#[kiln_dsl::kernel]
fn pick_mode(x: Ptr<f32>, out: Ptr<f32>, mode: i32, window_left: i32) {
    let offs = arange(0, 8);
    let v = load(x + offs);
    let y = if mode == 0 {
        0.0
    } else if mode == 1 {
        v * 2.0
    } else {
        let w = -v;
        maximum(w, 1.0)
    };
    let lo = 1 + if window_left >= 0 { window_left } else { 0 };
    store(out + offs, y + lo.to::<f32>());
}

#[test]
fn a_runtime_if_value_gives_its_carried_variables_then_its_value() {
    let kernel = soft_capped::build(&Spec::new()).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @soft_capped<>(%x.0: ptr<f32>, %out.1: ptr<f32>, %count.2: ptr<i32>, %softcap.3: i32, %cap.4: f32) {
  %offs.7 = arange 0, 8 : i32[8]
  %8 = splat %x.0 : ptr<f32>[8]
  %9 = add_ptr %8, %offs.7 : ptr<f32>[8]
  %qk.10 = load %9 : f32[8]
  %capped.11 = const 0 : i32
  %12 = const 0 : i32
  %13 = cmp_ne %softcap.3, %12 : i1
  %capped.23, %s.24 = if %13 : i32, f32[8] {
    %capped.15 = const 1 : i32
    %16 = splat %cap.4 : f32[8]
    %17 = div %qk.10, %16 : f32[8]
    %18 = tanh %17 : f32[8]
    %19 = splat %cap.4 : f32[8]
    %20 = mul %19, %18 : f32[8]
    yield %capped.15, %20
  } else {
    %21 = const 0.0 : f32
    %22 = splat %21 : f32[8]
    yield %capped.11, %22
  }
  %25 = splat %out.1 : ptr<f32>[8]
  %26 = add_ptr %25, %offs.7 : ptr<f32>[8]
  store %26, %s.24
  store %count.2, %capped.23
}
",
    );
}

#[test]
fn a_static_if_value_builds_only_the_branch_taken() {
    let softcap = scores::build(&Spec::new().flag("SOFTCAP", true)).unwrap();
    check(
        &softcap.to_string(),
        r"
kernel @scores<SOFTCAP = true>(%x.0: ptr<f32>, %out.1: ptr<f32>, %cap.2: f32, %scale.3: f32) {
  %offs.7 = arange 0, 8 : i32[8]
  %8 = splat %x.0 : ptr<f32>[8]
  %9 = add_ptr %8, %offs.7 : ptr<f32>[8]
  %qk.10 = load %9 : f32[8]
  %11 = splat %cap.2 : f32[8]
  %12 = div %qk.10, %11 : f32[8]
  %13 = tanh %12 : f32[8]
  %14 = splat %cap.2 : f32[8]
  %s.15 = mul %14, %13 : f32[8]
  %16 = splat %out.1 : ptr<f32>[8]
  %17 = add_ptr %16, %offs.7 : ptr<f32>[8]
  store %17, %s.15
}
",
    );
    let scaled = scores::build(&Spec::new().flag("SOFTCAP", false)).unwrap();
    check(
        &scaled.to_string(),
        r"
kernel @scores<SOFTCAP = false>(%x.0: ptr<f32>, %out.1: ptr<f32>, %cap.2: f32, %scale.3: f32) {
  %offs.7 = arange 0, 8 : i32[8]
  %8 = splat %x.0 : ptr<f32>[8]
  %9 = add_ptr %8, %offs.7 : ptr<f32>[8]
  %qk.10 = load %9 : f32[8]
  %11 = splat %scale.3 : f32[8]
  %s.12 = mul %qk.10, %11 : f32[8]
  %13 = splat %out.1 : ptr<f32>[8]
  %14 = add_ptr %13, %offs.7 : ptr<f32>[8]
  store %14, %s.12
}
",
    );
}

#[test]
fn an_else_if_chain_is_a_value_and_an_operand() {
    let kernel = pick_mode::build(&Spec::new()).unwrap();
    check(
        &kernel.to_string(),
        r"
kernel @pick_mode<>(%x.0: ptr<f32>, %out.1: ptr<f32>, %mode.2: i32, %window_left.3: i32) {
  %offs.6 = arange 0, 8 : i32[8]
  %7 = splat %x.0 : ptr<f32>[8]
  %8 = add_ptr %7, %offs.6 : ptr<f32>[8]
  %v.9 = load %8 : f32[8]
  %10 = const 0 : i32
  %11 = cmp_eq %mode.2, %10 : i1
  %y.24 = if %11 : f32[8] {
    %12 = const 0.0 : f32
    %23 = splat %12 : f32[8]
    yield %23
  } else {
    %13 = const 1 : i32
    %14 = cmp_eq %mode.2, %13 : i1
    %22 = if %14 : f32[8] {
      %15 = const 2.0 : f32
      %16 = splat %15 : f32[8]
      %17 = mul %v.9, %16 : f32[8]
      yield %17
    } else {
      %w.18 = neg %v.9 : f32[8]
      %19 = const 1.0 : f32
      %20 = splat %19 : f32[8]
      %21 = max %w.18, %20 : f32[8]
      yield %21
    }
    yield %22
  }
  %25 = const 1 : i32
  %26 = const 0 : i32
  %27 = cmp_ge %window_left.3, %26 : i1
  %29 = if %27 : i32 {
    yield %window_left.3
  } else {
    %28 = const 0 : i32
    yield %28
  }
  %lo.30 = add %25, %29 : i32
  %31 = splat %out.1 : ptr<f32>[8]
  %32 = add_ptr %31, %offs.6 : ptr<f32>[8]
  %33 = cast %lo.30 : f32
  %34 = splat %33 : f32[8]
  %35 = add %y.24, %34 : f32[8]
  store %32, %35
}
",
    );
}

const INPUT: [f32; 8] = [-4.0, -2.0, -1.0, 0.0, 0.5, 1.0, 2.0, 4.0];

#[track_caller]
fn assert_close(actual: &[f32], expected: &[f64]) {
    assert_eq!(actual.len(), expected.len());
    for (index, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        assert!(
            (f64::from(a) - e).abs() <= 1e-6 * e.abs().max(1.0),
            "element {index}: {a} != {e}\n  actual: {actual:?}\nexpected: {expected:?}"
        );
    }
}

#[test]
fn the_interpreter_runs_both_branches_of_a_value_if() {
    let x = HostBuffer::from_f32(F32, &INPUT);
    let cap = 2.0_f32;
    let capped = |v: f32| f64::from(cap) * (f64::from(v) / f64::from(cap)).tanh();

    // Runtime condition, with a carried variable: both paths of one kernel.
    let kernel = soft_capped::build(&Spec::new()).unwrap();
    for softcap in [1, 0] {
        let out = HostBuffer::poisoned(F32, 8);
        let count = HostBuffer::poisoned(I32, 1);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::Buffer(&count),
            KernelArg::I32(softcap),
            KernelArg::F32(cap),
        ];
        run(&kernel, Grid::new(1, 1, 1), &args).unwrap();
        let expected: Vec<f64> = if softcap != 0 {
            INPUT.iter().map(|&v| capped(v)).collect()
        } else {
            vec![0.0; 8]
        };
        assert_close(&out.to_f32(), &expected);
        assert_eq!(count.to_i64(), [i64::from(softcap)]);
    }

    // Constant condition: each specialisation computes its branch.
    for softcap in [true, false] {
        let kernel = scores::build(&Spec::new().flag("SOFTCAP", softcap)).unwrap();
        let out = HostBuffer::poisoned(F32, 8);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::F32(cap),
            KernelArg::F32(0.5),
        ];
        run(&kernel, Grid::new(1, 1, 1), &args).unwrap();
        let expected: Vec<f64> = INPUT
            .iter()
            .map(|&v| {
                if softcap {
                    capped(v)
                } else {
                    f64::from(v) * 0.5
                }
            })
            .collect();
        assert_close(&out.to_f32(), &expected);
    }

    // An `else if` chain: every branch of the chain, and both of the operand `if`.
    let kernel = pick_mode::build(&Spec::new()).unwrap();
    for (mode, window_left) in [(0, -3), (1, 2), (2, 0), (7, -1)] {
        let out = HostBuffer::poisoned(F32, 8);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::I32(mode),
            KernelArg::I32(window_left),
        ];
        run(&kernel, Grid::new(1, 1, 1), &args).unwrap();
        let lo = 1.0 + f64::from(window_left.max(0));
        let expected: Vec<f64> = INPUT
            .iter()
            .map(|&v| {
                let v = f64::from(v);
                let y = match mode {
                    0 => 0.0,
                    1 => v * 2.0,
                    _ => (-v).max(1.0),
                };
                y + lo
            })
            .collect();
        assert_close(&out.to_f32(), &expected);
    }
}

/// Branches of an `if` used as a value that give different types at some specialisations.
#[kiln_dsl::kernel]
fn mismatched_branches<T>(x: Ptr<f32>, y: Ptr<T>, n: i32) {
    let offs = arange(0, 64);
    let a = load(x + offs);
    let v = if n > 0 { a } else { load(y + offs) };
    store(x + offs, v);
}

/// A literal converts to the other branch's type only where it fits its kind: not `0.5` to i32.
#[kiln_dsl::kernel]
fn mismatched_literal(x: Ptr<i32>, n: i32) {
    let offs = arange(0, 16);
    let v = if n > 0 { 0.5 } else { load(x + offs) };
    store(x + offs, v);
}

#[test]
fn the_branches_of_a_value_if_must_give_one_type() {
    assert!(mismatched_branches::build(&Spec::new().dtype("T", F32)).is_ok());
    let error = semantic_error(mismatched_branches::build(&Spec::new().dtype("T", F16)));
    assert_eq!(
        error.to_string(),
        format!(
            "the branches of this `if` give different types: f32[64] and f16[64]; convert one \
             with `.to::<D>()` so that both give the same dtype\n  --> {}",
            location_of("if n > 0 { a } else { load(y + offs) }")
        )
    );
    let error = semantic_error(mismatched_literal::build(&Spec::new()));
    assert_eq!(
        error.to_string(),
        format!(
            "the branches of this `if` give different types: f32 and i32[16]\n  --> {}",
            location_of("if n > 0 { 0.5 }")
        )
    );
}

// ---- `#[kernel_fn]`: DSL functions, inlined where they are called ---------------------------

/// Where the block of program `pid` starts, and where it ends: at `n` at the latest.
#[kiln_dsl::kernel_fn]
fn block_range<const BLOCK: usize>(pid: i32, n: i32) -> (i32, i32) {
    let start = pid * BLOCK;
    (start, minimum(start + BLOCK, n))
}

/// `start + [0, BLOCK)`, and which of those are below `end`.
#[kiln_dsl::kernel_fn]
fn offsets<const BLOCK: usize>(start: i32, end: i32) -> (Tile<i32>, Tile<bool>) {
    let offs = start + arange(0, BLOCK);
    (offs, offs < end)
}

/// `x * factor`, computed in f32.
#[kiln_dsl::kernel_fn]
fn scaled<T>(x: Tile<T>, factor: f32) -> Tile<T> {
    (x.to::<f32>() * factor).to::<T>()
}

/// Stores `value` where `mask` is set: a function that gives nothing.
#[kiln_dsl::kernel_fn]
fn store_masked<T>(ptr: Ptr<T>, value: Tile<T>, mask: Tile<bool>) {
    store(ptr, value, mask);
}

/// Tuple and single results, a generic const and a dtype passed on, a function called as a
/// statement.
#[kiln_dsl::kernel]
fn scale_blocks<T, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32, factor: f32) {
    let (start, end) = block_range::<BLOCK>(program_id(0), n);
    let (offs, mask) = offsets::<BLOCK>(start, end);
    let y = scaled::<T>(load(x + offs, mask), factor);
    store_masked::<T>(out + offs, y, mask);
}

/// The sum of `x[0..n)`, `BLOCK` elements at a time: a loop inside a function, which calls
/// another function.
#[kiln_dsl::kernel_fn]
fn total<const BLOCK: usize>(x: Ptr<f32>, n: i32) -> f32 {
    let mut acc = zeros([BLOCK], f32);
    for start in (0..n).step_by(BLOCK) {
        let (offs, mask) = offsets::<BLOCK>(start, n);
        acc += load(x + offs, mask, 0.0);
    }
    acc.sum(0)
}

/// `n`, at most `limit`: the function assigns its own argument, not its caller's variable.
#[kiln_dsl::kernel_fn]
fn clamped(mut n: i32, limit: i32) -> i32 {
    if n > limit {
        n = limit;
    }
    n
}

/// Nested calls, a `{ expr }` generic value, a literal converted to a declared `f32`.
#[kiln_dsl::kernel]
fn row_totals<const BLOCK: usize>(x: Ptr<f32>, totals: Ptr<f32>, n: i32, limit: i32) {
    let row = program_id(0);
    let len = clamped(n, limit);
    let sum = total::<{ BLOCK * 2 }>(x + row * n, len);
    store(totals + row, scaled::<f32>(sum, 2));
}

#[test]
fn a_kernel_fn_is_inlined_where_it_is_called() {
    let kernel = scale_blocks::build(&Spec::new().dtype("T", F16).int("BLOCK", 16)).unwrap();
    // Values the caller did not name take the names the function gives them (`pid`, `ptr`).
    check(
        &kernel.to_string(),
        r"
kernel @scale_blocks<BLOCK = 16, T = f16>(%x.0: ptr<f16>, %out.1: ptr<f16>, %n.2: i32, %factor.3: f32) {
  %BLOCK.4 = const 16 : i32
  %pid.6 = program_id 0 : i32
  %start.7 = mul %pid.6, %BLOCK.4 : i32
  %8 = add %start.7, %BLOCK.4 : i32
  %end.9 = min %8, %n.2 : i32
  %11 = arange 0, 16 : i32[16]
  %12 = splat %start.7 : i32[16]
  %offs.13 = add %12, %11 : i32[16]
  %14 = splat %end.9 : i32[16]
  %mask.15 = cmp_lt %offs.13, %14 : i1[16]
  %16 = splat %x.0 : ptr<f16>[16]
  %17 = add_ptr %16, %offs.13 : ptr<f16>[16]
  %x.18 = load %17, mask %mask.15 : f16[16]
  %19 = cast %x.18 : f32[16]
  %20 = splat %factor.3 : f32[16]
  %21 = mul %19, %20 : f32[16]
  %y.22 = cast %21 : f16[16]
  %23 = splat %out.1 : ptr<f16>[16]
  %ptr.24 = add_ptr %23, %offs.13 : ptr<f16>[16]
  store %ptr.24, %y.22, mask %mask.15
}
",
    );
}

#[test]
fn kernel_fns_nest_loop_and_keep_their_own_scope() {
    let kernel = row_totals::build(&Spec::new().int("BLOCK", 8)).unwrap();
    // `clamped` assigns its `n`: the caller's `%n.2` is unchanged (`x + row * n` reads it).
    // `total::<{ BLOCK * 2 }>` gets the constant 16, which it passes on to `offsets`; the literal
    // `2` becomes the `f32` that `scaled` declares.
    check(
        &kernel.to_string(),
        r"
kernel @row_totals<BLOCK = 8>(%x.0: ptr<f32>, %totals.1: ptr<f32>, %n.2: i32, %limit.3: i32) {
  %row.6 = program_id 0 : i32
  %7 = cmp_gt %n.2, %limit.3 : i1
  %n.8 = if %7 : i32 {
    yield %limit.3
  } else {
    yield %n.2
  }
  %BLOCK.10 = const 16 : i32
  %11 = mul %row.6, %n.2 : i32
  %x.12 = add_ptr %x.0, %11 : ptr<f32>
  %13 = const 0.0 : f32
  %acc.14 = splat %13 : f32[16]
  %15 = const 0 : i32
  %acc.30 = for %start.16 = %15 to %n.8 step %BLOCK.10 carry (%acc.17 = %acc.14) : f32[16] {
    %19 = arange 0, 16 : i32[16]
    %20 = splat %start.16 : i32[16]
    %offs.21 = add %20, %19 : i32[16]
    %22 = splat %n.8 : i32[16]
    %mask.23 = cmp_lt %offs.21, %22 : i1[16]
    %24 = splat %x.12 : ptr<f32>[16]
    %25 = add_ptr %24, %offs.21 : ptr<f32>[16]
    %26 = const 0.0 : f32
    %27 = splat %26 : f32[16]
    %28 = load %25, mask %mask.23, other %27 : f32[16]
    %acc.29 = add %acc.17, %28 : f32[16]
    yield %acc.29
  }
  %sum.32 = reduce_sum %acc.30, axis 0 : f32
  %33 = add_ptr %totals.1, %row.6 : ptr<f32>
  %factor.35 = const 2.0 : f32
  %36 = mul %sum.32, %factor.35 : f32
  store %33, %36
}
",
    );
}

#[test]
fn the_interpreter_runs_kernels_that_call_kernel_fns() {
    // 37 elements in blocks of 16: the last block is partial, and `out` past 37 stays untouched.
    let values: Vec<f32> = (0..40).map(|i| i as f32 * 0.25 - 3.0).collect();
    for dtype in [F16, F32] {
        let kernel = scale_blocks::build(&Spec::new().dtype("T", dtype).int("BLOCK", 16)).unwrap();
        let x = HostBuffer::from_f32(dtype, &values);
        let out = HostBuffer::from_f32(dtype, &[7.0; 40]);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::I32(37),
            KernelArg::F32(-1.5),
        ];
        run(&kernel, Grid::new(3, 1, 1), &args).unwrap();
        let expected: Vec<f64> = (0..40)
            .map(|i| {
                if i < 37 {
                    f64::from(values[i]) * -1.5
                } else {
                    7.0
                }
            })
            .collect();
        assert_close(&out.to_f32(), &expected);
    }

    // Rows of 21: each row sums its first min(21, limit) elements, 16 at a time, and doubles it.
    let kernel = row_totals::build(&Spec::new().int("BLOCK", 8)).unwrap();
    let matrix: Vec<f32> = (0..63).map(|i| (i % 7) as f32 - 2.5).collect();
    let x = HostBuffer::from_f32(F32, &matrix);
    for limit in [100, 21, 5] {
        let totals = HostBuffer::poisoned(F32, 3);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&totals),
            KernelArg::I32(21),
            KernelArg::I32(limit),
        ];
        run(&kernel, Grid::new(3, 1, 1), &args).unwrap();
        let len = limit.min(21) as usize;
        let expected: Vec<f64> = matrix
            .chunks(21)
            .map(|row| 2.0 * row[..len].iter().map(|&v| f64::from(v)).sum::<f64>())
            .collect();
        assert_close(&totals.to_f32(), &expected);
    }
}

/// `start + [0, BLOCK)`: not a tile at every `BLOCK`.
#[kiln_dsl::kernel_fn]
fn ramp<const BLOCK: usize>(start: i32) -> Tile<i32> {
    arange(0, BLOCK) + start
}

#[kiln_dsl::kernel_fn]
fn two_ramps<const BLOCK: usize>(start: i32) -> Tile<i32> {
    ramp::<BLOCK>(start) + ramp::<BLOCK>(start + BLOCK)
}

#[kiln_dsl::kernel]
fn ramps<const BLOCK: usize>(out: Ptr<i32>) {
    let offs = two_ramps::<BLOCK>(0);
    store(out + offs, offs);
}

#[test]
fn an_error_inside_a_kernel_fn_is_located_in_it_and_at_its_calls() {
    assert!(ramps::build(&Spec::new().int("BLOCK", 16)).is_ok());
    let error = semantic_error(ramps::build(&Spec::new().int("BLOCK", 12)));
    assert!(error.message().contains("power-of-two length"), "{error}");
    assert!(
        error.message().ends_with(&format!(
            " (in `ramp`, called at {}) (in `two_ramps`, called at {})",
            location_of("ramp::<BLOCK>(start) +"),
            location_of("two_ramps::<BLOCK>(0)")
        )),
        "{error}"
    );
    assert!(
        error.to_string().ends_with(&format!(
            "\n  --> {}",
            location_of("arange(0, BLOCK) + start")
        )),
        "{error}"
    );
}

/// A result declared `Tile<T>`: not what `x` is at every `T`.
#[kiln_dsl::kernel_fn]
fn as_declared<T>(x: Tile) -> Tile<T> {
    x * 1
}

/// One misuse of a function per `MODE`, each refused when the call is built.
#[kiln_dsl::kernel]
fn misused_fns<const MODE: usize>(x: Ptr<f32>, n: i32, wide: i64) {
    let offs = arange(0, 16);
    if MODE == 0 {
        let (start, end) = block_range::<16>(0, wide);
        store(x + start, end.to::<f32>());
    }
    if MODE == 1 {
        let (offs_n, mask) = offsets::<n>(0, n);
        store(x + offs_n, 1.0, mask);
    }
    if MODE == 2 {
        store(x + offs, scaled::<f32>(load(x + offs), true));
    }
    if MODE == 3 {
        store(x + offs, as_declared::<f16>(load(x + offs)));
    }
}

#[test]
fn arguments_constants_and_results_are_checked_against_the_declaration() {
    let build = |mode| semantic_error(misused_fns::build(&Spec::new().int("MODE", mode)));
    // An argument: at the call.
    assert_eq!(
        build(0).to_string(),
        format!(
            "argument `n` of `block_range` is declared `i32`, got i64\n  --> {}",
            location_of("block_range::<16>(0, wide)")
        )
    );
    // A `const` parameter takes a constant.
    assert_eq!(
        build(1).to_string(),
        format!(
            "`const` parameter `BLOCK` of `offsets` takes an integer constant (a literal or a \
             specialisation parameter), got a runtime i32\n  --> {}",
            location_of("offsets::<n>(0, n)")
        )
    );
    // A literal converts to a declared scalar dtype where it fits: `2` to f32, not `true`.
    assert_eq!(
        build(2).to_string(),
        format!(
            "argument `factor` of `scaled` is declared `f32`, got i1\n  --> {}",
            location_of("scaled::<f32>(load(x + offs), true)")
        )
    );
    // A result: at the value the function ends with, called from the kernel.
    assert_eq!(
        build(3).to_string(),
        format!(
            "the result of `as_declared` is declared `Tile<f16>`, got f32[16] (in `as_declared`, \
             called at {})\n  --> {}",
            location_of("as_declared::<f16>(load"),
            location_of("x * 1")
        )
    );
}

/// `x` to the power `N`: a function may call itself where a constant condition ends it.
#[kiln_dsl::kernel_fn]
fn power<const N: usize>(x: Tile<f32>) -> Tile<f32> {
    if N == 0 {
        1.0
    } else {
        x * power::<{ N - 1 }>(x)
    }
}

/// Never ends: each call calls itself again.
#[kiln_dsl::kernel_fn]
fn endless<const N: usize>(x: Tile<f32>) -> Tile<f32> {
    endless::<{ N + 1 }>(x)
}

#[kiln_dsl::kernel]
fn powers<const N: usize, const ENDLESS: bool>(x: Ptr<f32>) {
    let offs = arange(0, 8);
    let v = load(x + offs);
    let y = if ENDLESS {
        endless::<N>(v)
    } else {
        power::<N>(v)
    };
    store(x + offs, y);
}

#[test]
fn a_kernel_fn_may_call_itself_until_a_constant_condition_stops_it() {
    let kernel = powers::build(&Spec::new().int("N", 3).flag("ENDLESS", false)).unwrap();
    let x = HostBuffer::from_f32(F32, &INPUT);
    run(&kernel, Grid::new(1, 1, 1), &[KernelArg::Buffer(&x)]).unwrap();
    let cubes: Vec<f64> = INPUT.iter().map(|&v| f64::from(v).powi(3)).collect();
    assert_close(&x.to_f32(), &cubes);

    // The depth is counted, not overflowed; the call repeated inside `endless` is counted too.
    let error = semantic_error(powers::build(
        &Spec::new().int("N", 0).flag("ENDLESS", true),
    ));
    let depth = kiln_dsl::builder::MAX_CALL_DEPTH;
    assert_eq!(
        error.to_string(),
        format!(
            "`endless` is called {depth} calls deep: a `#[kernel_fn]` is inlined where it is \
             called, so one that calls itself must stop on a constant condition (in `endless`, \
             called at {inner}, {} times) (in `endless`, called at {outer})\n  --> {inner}",
            depth - 1,
            inner = location_of("endless::<{ N + 1 }>(x)"),
            outer = location_of("endless::<N>(v)"),
        )
    );
}

/// Calls itself twice a level: within the depth limit, but doubling its calls at each.
#[kiln_dsl::kernel_fn]
fn twice<const N: usize>(x: Tile<f32>) -> Tile<f32> {
    if N == 0 {
        x
    } else {
        twice::<{ N - 1 }>(x) + twice::<{ N - 1 }>(x)
    }
}

#[kiln_dsl::kernel]
fn doubling<const N: usize>(x: Ptr<f32>) {
    let offs = arange(0, 8);
    store(x + offs, twice::<N>(load(x + offs)));
}

#[test]
fn a_kernel_fn_that_doubles_its_calls_is_refused_at_the_call_limit() {
    let kernel = doubling::build(&Spec::new().int("N", 3)).unwrap();
    let x = HostBuffer::from_f32(F32, &INPUT);
    run(&kernel, Grid::new(1, 1, 1), &[KernelArg::Buffer(&x)]).unwrap();
    let eightfold: Vec<f64> = INPUT.iter().map(|&v| f64::from(v) * 8.0).collect();
    assert_close(&x.to_f32(), &eightfold);
    // 2^17 calls at 16 levels: refused, not built for ever.
    let error = semantic_error(doubling::build(&Spec::new().int("N", 16))).to_string();
    let limit = kiln_dsl::builder::MAX_CALLS;
    assert!(
        error.starts_with(&format!(
            "`twice` would be the kernel's call number {}: a `#[kernel_fn]` is inlined where it \
             is called, so one that calls itself twice a level doubles its calls with each",
            limit + 1
        )),
        "{error}"
    );
}

#[kiln_dsl::kernel]
fn oversized<const WHICH: usize, const A: usize, const B: usize>(x: Ptr<i32>, s: i32) {
    let offs = arange(0, 8);
    if WHICH == 0 {
        store(
            x + offs,
            zeros([1 << 13, 1 << 12], i32).sum(0).sum(0) + offs,
        );
    } else if WHICH == 1 {
        let rows = arange(0, 1 << 13).expand_dims(1);
        let cols = arange(0, 1 << 12).expand_dims(0);
        store(x + offs, (rows + cols).sum(0).sum(0) + offs);
    } else if WHICH == 2 {
        store(x + offs, arange(A, B));
    } else if WHICH == 3 {
        let m = offs < 2;
        store(x + offs, (m << m).to::<i32>());
    } else {
        // Shifts by the width or more: folded as they run (0 to the left, the sign to the right).
        store(
            x + offs,
            where_(
                offs == 0,
                1 << 64,
                where_(offs == 1, 1 << s, where_(offs == 2, 8 >> 64, -8 >> s)),
            ),
        );
    }
}

#[test]
fn tiles_past_2_24_elements_shifts_of_bools_and_wide_aranges_are_refused() {
    let build = |which: i64, a: i64, b: i64| {
        oversized::build(&Spec::new().int("WHICH", which).int("A", a).int("B", b))
    };
    let error = semantic_error(build(0, 0, 8)).to_string();
    assert!(
        error.contains("a tile of shape [8192, 4096] would hold more than 2^24 elements")
            && 8192 * 4096 > kiln_dsl::builder::MAX_TILE_ELEMENTS,
        "{error}"
    );
    let error = semantic_error(build(1, 0, 8)).to_string();
    assert!(
        error.contains(
            "the result of `add` of shape [8192, 4096] would hold more than 2^24 elements"
        ),
        "{error}"
    );
    let error = semantic_error(build(2, 1 << 32, (1 << 32) + 8)).to_string();
    assert!(
        error.contains("the start of `arange(4294967296, 4294967304)` must fit in i32"),
        "{error}"
    );
    let error = semantic_error(build(3, 0, 8)).to_string();
    assert!(
        error.contains("expects integer operands, got bools (i1)"),
        "{error}"
    );
    let kernel = build(4, 0, 8).unwrap();
    let x = HostBuffer::from_i64(I32, &[7; 8]);
    run(
        &kernel,
        Grid::new(1, 1, 1),
        &[KernelArg::Buffer(&x), KernelArg::I32(64)],
    )
    .unwrap();
    assert_eq!(&x.to_i64()[..4], &[0, 0, 0, -1]);
    // A grid no GPU launches is refused before any program runs (not 2^64 programs).
    let error = run(
        &kernel,
        Grid::new(u32::MAX, u32::MAX, u32::MAX),
        &[KernelArg::Buffer(&x), KernelArg::I32(64)],
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains(
            "a grid of 4294967295 x 4294967295 x 4294967295 programs is past CUDA's limits"
        ),
        "{error}"
    );
}

mod helpers {
    /// `x * 2`, in a module of its own.
    #[kiln_dsl::kernel_fn]
    pub fn doubled(x: Tile) -> Tile {
        x * 2
    }

    /// Calls a function of its parent module by a `super::` path.
    #[kiln_dsl::kernel_fn]
    pub fn quadrupled(x: Tile) -> Tile {
        super::helpers::doubled(doubled(x))
    }
}

/// A function is called by any path that names it from the caller's module.
#[kiln_dsl::kernel]
fn by_paths(x: Ptr<f32>) {
    let v = load(x);
    let a = helpers::doubled(v);
    let b = self::helpers::doubled(a);
    let c = crate::helpers::quadrupled(b);
    store(x, c);
}

#[test]
fn a_kernel_fn_is_called_by_its_path() {
    let kernel = by_paths::build(&Spec::new()).unwrap();
    let x = HostBuffer::from_f32(F32, &[1.5]);
    run(&kernel, Grid::new(1, 1, 1), &[KernelArg::Buffer(&x)]).unwrap();
    assert_eq!(x.to_f32(), [24.0]);
}

/// A kernel that reads what the kernel before it wrote: it waits for that kernel first, and lets
/// the one after it launch.
#[kiln_dsl::kernel]
fn after_prior<const BLOCK: usize>(x: Ptr<f32>) {
    wait_for_prior_grids();
    launch_dependent_grids();
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs) + 1.0);
}

/// A wait after the program has read memory, or inside a loop, would leave reads before it.
#[kiln_dsl::kernel]
fn wait_too_late<const IN_LOOP: bool>(x: Ptr<f32>, n: i32) {
    if IN_LOOP {
        for _i in 0..n {
            launch_dependent_grids();
        }
    } else {
        let y = load(x); // read before the wait
        wait_for_prior_grids(); // after a read
        store(x, y);
    }
}

#[test]
fn grid_controls_come_before_any_memory_access() {
    let kernel = after_prior::build(&Spec::new().int("BLOCK", 4)).unwrap();
    let text = kernel.to_string();
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    assert_eq!(
        lines[1..3],
        ["wait_for_prior_grids", "launch_dependent_grids"],
        "{text}"
    );
    // The interpreter runs one launch at a time: both are nothing there.
    let x = HostBuffer::from_f32(F32, &[1.0, 2.0, 3.0, 4.0]);
    run(&kernel, Grid::new(1, 1, 1), &[KernelArg::Buffer(&x)]).unwrap();
    assert_eq!(x.to_f32(), [2.0, 3.0, 4.0, 5.0]);

    let late = semantic_error(wait_too_late::build(&Spec::new().flag("IN_LOOP", false)));
    assert_eq!(
        late.to_string(),
        format!(
            "`wait_for_prior_grids()` must come before any memory access, loop or branch (it \
             is the program's first instruction), but follows a `load` at {}\n  --> {}",
            location_of("load(x); // read before the wait"),
            location_of("wait_for_prior_grids(); // after a read")
        )
    );
    let in_loop = semantic_error(wait_too_late::build(&Spec::new().flag("IN_LOOP", true)));
    assert_eq!(
        in_loop.message(),
        "`launch_dependent_grids()` must be in the kernel body, not inside a loop or branch"
    );
}

/// An arrival counts in one i32: not in a float, not at a tile of counters.
#[kiln_dsl::kernel]
fn bad_arrival<const TILE: bool>(floats: Ptr<f32>, counters: Ptr<i32>) {
    if TILE {
        let count = atomic_arrive(counters + arange(0, 4));
        store(counters, count);
    } else {
        let count = atomic_arrive(floats);
        store(counters, count);
    }
}

#[test]
fn an_arrival_counts_in_one_i32() {
    let float = semantic_error(bad_arrival::build(&Spec::new().flag("TILE", false)));
    assert_eq!(
        float.message(),
        "`atomic_arrive` counts in one i32: it expects a scalar pointer to i32, got ptr<f32>"
    );
    let tile = semantic_error(bad_arrival::build(&Spec::new().flag("TILE", true)));
    assert!(tile.message().ends_with("got ptr<i32>[4]"), "{tile}");
}
