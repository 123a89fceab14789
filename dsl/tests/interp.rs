//! The interpreter's semantics, one property a test: GPU rounding, IEEE infinities, f32 `dot`
//! accumulation, block-pointer padding, control flow, and faults that name their op and line.

use kiln_dsl::prelude::*;
use kiln_dsl::{Error, Grid, HostBuffer, KernelArg, run};

/// The 1-based line of this file that contains `text`.
fn line_of(text: &str) -> u32 {
    let line = include_str!("interp.rs")
        .lines()
        .position(|l| l.contains(text));
    line.expect("the text is in this file") as u32 + 1
}

fn one_program() -> Grid {
    Grid::new(1, 1, 1)
}

#[kernel]
fn copy<T, const BLOCK: usize, const MASKED: bool>(x: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    if MASKED {
        store(out + offs, load(x + offs, offs < n), offs < n);
    } else {
        store(out + offs, load(x + offs));
    }
}

fn copy_spec(dtype: DType, block: i64, masked: bool) -> Spec {
    Spec::new()
        .dtype("T", dtype)
        .int("BLOCK", block)
        .flag("MASKED", masked)
}

#[test]
fn an_unmasked_out_of_bounds_load_names_the_op_and_its_line() {
    let kernel = copy::build(&copy_spec(F32, 16, false)).unwrap();
    let x = HostBuffer::zeros(F32, 10);
    let out = HostBuffer::zeros(F32, 16);
    let args = [
        KernelArg::Buffer(&x),
        KernelArg::Buffer(&out),
        KernelArg::I32(10),
    ];
    let err = run(&kernel, one_program(), &args).unwrap_err();
    let Error::Runtime { op, loc, .. } = &err else {
        panic!("expected a runtime fault, got {err}")
    };
    assert_eq!(*op, "load");
    assert_eq!(
        loc.line,
        line_of("store(out + offs, load(x + offs));"),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("unmasked access to element 10 of `x`, which has 10 elements"),
        "{err}"
    );
}

#[test]
fn masked_lanes_touch_no_memory() {
    let kernel = copy::build(&copy_spec(F16, 16, true)).unwrap();
    let x = HostBuffer::from_f32(F16, &[1.5; 10]);
    let out = HostBuffer::poisoned(F16, 10);
    let args = [
        KernelArg::Buffer(&x),
        KernelArg::Buffer(&out),
        KernelArg::I32(10),
    ];
    run(&kernel, Grid::new(1, 1, 1), &args).unwrap();
    assert_eq!(out.to_f32(), vec![1.5; 10]);
}

#[kernel]
fn arithmetic<T>(x: Ptr<f32>, out: Ptr<T>, wide: Ptr<f32>, ints: Ptr<i32>) {
    let i = arange(0, 4);
    let v = load(x + i);
    // The product rounds to T before the division, and the result rounds to T again at the store.
    store(out + i, (v.to::<T>() * 3.0) / 7.0);
    store(wide + i, exp2(v * 0.0 - v.abs() * f32::INFINITY));
    let big = full([4], 2147483647, i32);
    store(ints + i, big + i);
}

#[test]
fn arithmetic_rounds_like_the_gpu() {
    for dtype in [F16, BF16] {
        let kernel = arithmetic::build(&Spec::new().dtype("T", dtype)).unwrap();
        let xs = [0.1f32, 1.0 / 3.0, 1000.1, -2.7];
        let x = HostBuffer::from_f32(F32, &xs);
        let out = HostBuffer::poisoned(dtype, 4);
        let wide = HostBuffer::poisoned(F32, 4);
        let ints = HostBuffer::poisoned(I32, 4);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::Buffer(&wide),
            KernelArg::Buffer(&ints),
        ];
        run(&kernel, one_program(), &args).unwrap();
        let round = |v: f32| HostBuffer::from_f32(dtype, &[v]).read_float(0);
        let expected: Vec<f32> = xs
            .iter()
            .map(|&v| round(round(round(v) * 3.0) / 7.0))
            .collect();
        assert_eq!(out.to_f32(), expected, "{dtype}");
        // exp2(0 * x - |x| * inf) = exp2(-inf) = 0 for nonzero x: IEEE infinities, no NaN.
        assert_eq!(wide.to_f32(), vec![0.0; 4]);
        // i32 wraps as on the GPU.
        assert_eq!(
            ints.to_i64(),
            vec![2147483647, -2147483648, -2147483647, -2147483646]
        );
    }
}

#[kernel]
fn fused(x: Ptr<f32>, out: Ptr<f32>, twice: Ptr<f32>, s: f32) {
    let i = arange(0, 4);
    let v = load(x + i);
    // Row broadcast of a scalar into a tile: `fma` broadcasts all three operands.
    store(out + i, fma(v, v, -1.0));
    store(twice + i, v * v - 1.0 + s);
}

#[test]
fn fma_rounds_once() {
    let kernel = fused::build(&Spec::new()).unwrap();
    // (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24: the square rounds the 2^-24 away, a fused op keeps it.
    let e = 2f32.powi(-12);
    let xs = [1.0 + e, 3.0, -0.5, 1.0];
    let x = HostBuffer::from_f32(F32, &xs);
    let out = HostBuffer::poisoned(F32, 4);
    let twice = HostBuffer::poisoned(F32, 4);
    let args = [
        KernelArg::Buffer(&x),
        KernelArg::Buffer(&out),
        KernelArg::Buffer(&twice),
        KernelArg::F32(0.0),
    ];
    run(&kernel, one_program(), &args).unwrap();
    let fused = out.to_f32();
    assert_eq!(fused, xs.map(|v| v.mul_add(v, -1.0)).to_vec());
    assert_eq!(fused[0], 2f32.powi(-11) + 2f32.powi(-24));
    assert_eq!(twice.to_f32()[0], 2f32.powi(-11));
    assert_eq!(&fused[1..], &twice.to_f32()[1..]);
}

#[kernel]
fn half_fma<T>(x: Ptr<T>) {
    let v = load(x + arange(0, 4));
    let w = fma(v, v, v);
}

#[test]
fn fma_takes_f32_only() {
    let err = half_fma::build(&Spec::new().dtype("T", F16))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("`fma` expects f32 operands, got f16[4]"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "dsl/tests/interp.rs:{}:",
            line_of("let w = fma(v, v, v)")
        )),
        "{err}"
    );
    half_fma::build(&Spec::new().dtype("T", F32)).unwrap();
}

/// Every program adds its `BLOCK` elements of `x`, and 1 per element, into the same `BLOCK`
/// bins, but for the last bin.
#[kernel]
fn binned_sums<T, const BLOCK: usize>(x: Ptr<f32>, bins: Ptr<T>, counts: Ptr<f32>) {
    let lanes = arange(0, BLOCK);
    let v = load(x + program_id(0) * BLOCK + lanes);
    atomic_add(bins + lanes, v, lanes < BLOCK - 1);
    atomic_add(counts + lanes, 1.0);
}

#[test]
fn atomic_adds_from_parallel_programs_all_land() {
    let (block, programs) = (8usize, 4096usize);
    let kernel =
        binned_sums::build(&Spec::new().dtype("T", F32).int("BLOCK", block as i64)).unwrap();
    // Integers, so that every order of the f32 sums gives the same exact result.
    let values: Vec<f32> = (0..block * programs).map(|i| (i % 7) as f32).collect();
    let x = HostBuffer::from_f32(F32, &values);
    let bins = HostBuffer::from_f32(F32, &[0.5; 8]);
    let counts = HostBuffer::zeros(F32, block);
    let args = [
        KernelArg::Buffer(&x),
        KernelArg::Buffer(&bins),
        KernelArg::Buffer(&counts),
    ];
    run(&kernel, Grid::new(programs as u32, 1, 1), &args).unwrap();
    for (lane, &got) in bins.to_f32().iter().enumerate() {
        let sum: f32 = values.iter().skip(lane).step_by(block).sum();
        let want = if lane < block - 1 { 0.5 + sum } else { 0.5 };
        assert_eq!(got, want, "bin {lane}");
    }
    assert_eq!(counts.to_f32(), vec![programs as f32; block]);
}

#[test]
fn atomic_adds_flush_subnormals_like_the_gpu() {
    // `red.add.f32` flushes subnormal inputs and results to zero: adding half the smallest
    // normal changes nothing, and 1.5 - 1 of the smallest normal gives zero, not a subnormal.
    let kernel = binned_sums::build(&Spec::new().dtype("T", F32).int("BLOCK", 8)).unwrap();
    let normal = 1.5 * f32::MIN_POSITIVE;
    let bins = HostBuffer::from_f32(F32, &[normal; 8]);
    let counts = HostBuffer::zeros(F32, 8);
    for (added, want) in [(f32::MIN_POSITIVE / 2.0, normal), (-f32::MIN_POSITIVE, 0.0)] {
        let x = HostBuffer::from_f32(F32, &[added; 8]);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&bins),
            KernelArg::Buffer(&counts),
        ];
        run(&kernel, one_program(), &args).unwrap();
        assert_eq!(bins.to_f32()[0], want, "after adding {added:e}");
    }
}

#[test]
fn atomic_add_adds_into_f32_only() {
    let err = binned_sums::build(&Spec::new().dtype("T", BF16).int("BLOCK", 8))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("`atomic_add` adds into f32 only, got pointers to bf16"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "dsl/tests/interp.rs:{}:",
            line_of("atomic_add(bins + lanes, v, lanes < BLOCK - 1)")
        )),
        "{err}"
    );
}

#[kernel]
fn sum_of_products<const K: usize>(a: Ptr<f16>, b: Ptr<f16>, out: Ptr<f32>) {
    let rows = arange(0, 16);
    let ks = arange(0, K);
    let a_tile = load(a + rows.expand_dims(1) * K + ks.expand_dims(0));
    let b_tile = load(b + ks.expand_dims(1) * 16 + rows.expand_dims(0));
    store(
        out + rows.expand_dims(1) * 16 + rows.expand_dims(0),
        dot(a_tile, b_tile),
    );
}

#[test]
fn dot_accumulates_in_f32() {
    // 4096 products of 1 * 1: an f16 accumulator would stall at 2048.
    let k = 4096;
    let kernel = sum_of_products::build(&Spec::new().int("K", k)).unwrap();
    let a = HostBuffer::from_f32(F16, &vec![1.0; 16 * k as usize]);
    let b = HostBuffer::from_f32(F16, &vec![1.0; 16 * k as usize]);
    let out = HostBuffer::poisoned(F32, 256);
    run(
        &kernel,
        one_program(),
        &[
            KernelArg::Buffer(&a),
            KernelArg::Buffer(&b),
            KernelArg::Buffer(&out),
        ],
    )
    .unwrap();
    assert_eq!(out.to_f32(), vec![4096.0; 256]);
}

#[kernel]
fn block_copy(x: Ptr<f32>, out: Ptr<f32>, rows: i32, cols: i32) {
    let src = make_block_ptr(x, [rows, cols], [cols, 1], [0, 0], [4, 8], [1, 0]);
    let tile = load(src, [0, 1]);
    let dst = make_block_ptr(out, [4, 8], [8, 1], [0, 0], [4, 8], [1, 0]);
    store(dst, tile + 1.0, [0, 1]);
    // Only the in-bounds part of a moved window is written.
    let moved = advance(
        make_block_ptr(out, [4, 8], [8, 1], [0, 0], [4, 8], [1, 0]),
        [3, 6],
    );
    store(moved, zeros([4, 8], f32), [0, 1]);
}

#[test]
fn block_pointers_pad_with_zero_and_skip_out_of_bounds_stores() {
    let kernel = block_copy::build(&Spec::new()).unwrap();
    let x = HostBuffer::from_f32(F32, &(0..6).map(|v| v as f32).collect::<Vec<_>>());
    let out = HostBuffer::poisoned(F32, 32);
    let args = [
        KernelArg::Buffer(&x),
        KernelArg::Buffer(&out),
        KernelArg::I32(2),
        KernelArg::I32(3),
    ];
    run(&kernel, one_program(), &args).unwrap();
    let got = out.to_f32();
    for r in 0..4 {
        for c in 0..8 {
            let expected = if r == 3 && c >= 6 {
                0.0
            } else if r < 2 && c < 3 {
                (r * 3 + c) as f32 + 1.0
            } else {
                1.0
            };
            assert_eq!(got[r * 8 + c], expected, "row {r} col {c}");
        }
    }
}

/// A rank-2 block of a `[heads, rows, 4]` array: the head is indexed, rows past the end pad.
#[kernel]
fn head_block(x: Ptr<f32>, out: Ptr<f32>, heads: i32, rows: i32, head: i32, head_stride: i64) {
    let src = make_block_ptr(
        x,
        [heads, rows, 4],
        [head_stride, 4, 1],
        [head, 1, 0],
        [4, 4],
        [1, 0],
    );
    let dst = make_block_ptr(out, [4, 4], [4, 1], [0, 0], [4, 4], [1, 0]);
    store(dst, load(src, [0]));
}

#[test]
fn block_pointers_index_the_dimensions_before_the_block() {
    let kernel = head_block::build(&Spec::new()).unwrap();
    // Three heads of three rows, 16 floats apart.
    let x = HostBuffer::from_f32(F32, &(0..48).map(|v| v as f32).collect::<Vec<_>>());
    let launch = |head: i32| {
        let out = HostBuffer::poisoned(F32, 16);
        let args = [
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::I32(3),
            KernelArg::I32(3),
            KernelArg::I32(head),
            KernelArg::I64(16),
        ];
        run(&kernel, one_program(), &args).map(|()| out.to_f32())
    };
    let got = launch(2).unwrap();
    for r in 0..4 {
        for c in 0..4 {
            // Rows 1 and 2 of head 2, then padding.
            let expected = if r < 2 {
                (32 + (r + 1) * 4 + c) as f32
            } else {
                0.0
            };
            assert_eq!(got[r * 4 + c], expected, "row {r} col {c}");
        }
    }
    let err = launch(3).unwrap_err().to_string();
    assert!(
        err.contains("offset 3 indexes dimension 0 of an array of shape [3, 3, 4]"),
        "{err}"
    );
}

#[kernel]
fn block_of_a_smaller_array(x: Ptr<f32>, n: i32) {
    let block = make_block_ptr(x, [n], [1], [0], [4, 4], [1, 0]);
    store(block, zeros([4, 4], f32));
}

#[test]
fn a_block_pointer_refuses_an_array_of_lower_rank() {
    let err = block_of_a_smaller_array::build(&Spec::new())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`make_block_ptr` has a rank-2 block shape [4, 4] but a rank-1 array shape"),
        "{err}"
    );
}

#[kernel]
fn running_max(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
    let mut best = full([16], f32::NEG_INFINITY, f32);
    let mut count = 0;
    for start in (0..n).step_by(16) {
        let offs = start + arange(0, 16);
        let v = load(x + offs, offs < n, f32::NEG_INFINITY);
        best = maximum(best, v);
        if start + 16 > n {
            count = count + 100;
        } else {
            count = count + 1;
        }
    }
    store(out + arange(0, 16), best);
    store(out + 16, max(best, 0) + count.to::<f32>() * 0.0);
    store(out + 17, count.to::<f32>());
}

#[test]
fn loops_carry_tiles_and_branches_merge_values() {
    let kernel = running_max::build(&Spec::new()).unwrap();
    let n = 37;
    let xs: Vec<f32> = (0..n).map(|i| ((i * 7) % 23) as f32).collect();
    let x = HostBuffer::from_f32(F32, &xs);
    let out = HostBuffer::poisoned(F32, 18);
    run(
        &kernel,
        one_program(),
        &[
            KernelArg::Buffer(&x),
            KernelArg::Buffer(&out),
            KernelArg::I32(n),
        ],
    )
    .unwrap();
    let got = out.to_f32();
    for (lane, &value) in got[..16].iter().enumerate() {
        let expected = xs[lane..]
            .iter()
            .step_by(16)
            .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        assert_eq!(value, expected, "lane {lane}");
    }
    assert_eq!(got[16], 22.0);
    // Two whole blocks and one partial: 1 + 1 + 100.
    assert_eq!(got[17], 102.0);
}

#[kernel]
fn fill_ids(out: Ptr<i32>) {
    let id = program_id(0) + num_programs(0) * program_id(1);
    store(out + id, id * 10 + program_id(2));
}

#[test]
fn every_program_of_the_grid_runs() {
    let kernel = fill_ids::build(&Spec::new()).unwrap();
    let out = HostBuffer::poisoned(I32, 12);
    run(&kernel, Grid::new(4, 3, 1), &[KernelArg::Buffer(&out)]).unwrap();
    assert_eq!(out.to_i64(), (0..12).map(|i| i * 10).collect::<Vec<_>>());
}

#[kernel]
fn divide(out: Ptr<i32>, d: i32) {
    store(out, 7 / d);
}

#[test]
fn integer_division_by_zero_is_a_fault_not_a_panic() {
    let kernel = divide::build(&Spec::new()).unwrap();
    let out = HostBuffer::zeros(I32, 1);
    let err = run(
        &kernel,
        one_program(),
        &[KernelArg::Buffer(&out), KernelArg::I32(0)],
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("`div` failed in program (0, 0, 0): integer division by zero"),
        "{err}"
    );
    run(
        &kernel,
        one_program(),
        &[KernelArg::Buffer(&out), KernelArg::I32(2)],
    )
    .unwrap();
    assert_eq!(out.to_i64(), [3]);
}

#[test]
fn launches_with_the_wrong_arguments_are_refused() {
    let kernel = divide::build(&Spec::new()).unwrap();
    let floats = HostBuffer::zeros(F32, 1);
    let err = run(
        &kernel,
        one_program(),
        &[KernelArg::Buffer(&floats), KernelArg::I32(1)],
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot launch `divide`: argument `out` is ptr<i32>, got a buffer of f32"
    );
    let err = run(&kernel, one_program(), &[KernelArg::I32(1)]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cannot launch `divide`: it takes 2 arguments, got 1"
    );
}

#[kernel]
fn bad_dot<const K: usize>(a: Ptr<f16>) {
    let x = load(a + arange(0, 64).expand_dims(1) + arange(0, 128).expand_dims(0));
    let y = load(a + arange(0, K).expand_dims(1) + arange(0, 64).expand_dims(0));
    let z = dot(x, y);
}

#[test]
fn semantic_errors_say_expected_versus_found_at_the_dsl_line() {
    let err = bad_dot::build(&Spec::new().int("K", 64)).unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("`dot` expects [M, K] x [K, N] but got [64, 128] x [64, 64]"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "dsl/tests/interp.rs:{}:",
            line_of("let z = dot(x, y)")
        )),
        "{text}"
    );
    bad_dot::build(&Spec::new().int("K", 128)).unwrap();

    let err = copy::build(&copy_spec(F16, 48, true))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`arange(0, 48)` must have a power-of-two length, got 48"),
        "{err}"
    );
    let err = copy::build(&Spec::new().dtype("T", F16).int("BLOCK", 16))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "cannot specialise `copy`: kernel `copy` needs a value for specialisation parameter `MASKED` (a bool)"
    );
    let err = copy::build(&copy_spec(F16, 16, true).int("BLOCKS", 2))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "has no specialisation parameter `BLOCKS`; its parameters are: T, BLOCK, MASKED"
        ),
        "{err}"
    );
}

/// Each program writes its mark, arrives at one counter and keeps the count it read; the last
/// to arrive adds up every program's mark, which the arrivals before its own made visible.
#[kernel]
fn arrivals<const BLOCK: usize>(
    counter: Ptr<i32>,
    tickets: Ptr<i32>,
    marks: Ptr<i32>,
    total: Ptr<i32>,
) {
    let pid = program_id(0);
    let programs = num_programs(0);
    store(marks + pid, pid + 1);
    let before = atomic_arrive(counter);
    store(tickets + pid, before);
    if before == programs - 1 {
        let mut sum = zeros([BLOCK], i32);
        for first in (0..programs).step_by(BLOCK) {
            let at = first + arange(0, BLOCK);
            sum = sum + load(marks + at, at < programs, 0);
        }
        store(total, sum.sum(0));
    }
}

#[test]
fn arrivals_count_each_program_once_and_the_last_sees_every_write_before() {
    let kernel = arrivals::build(&Spec::new().int("BLOCK", 64)).unwrap();
    let programs = 257;
    let counter = HostBuffer::zeros(I32, 1);
    let tickets = HostBuffer::poisoned(I32, programs);
    let marks = HostBuffer::zeros(I32, programs);
    let total = HostBuffer::poisoned(I32, 1);
    let args = [&counter, &tickets, &marks, &total].map(KernelArg::Buffer);
    run(&kernel, Grid::new(programs as u32, 1, 1), &args).unwrap();
    assert_eq!(counter.to_i64(), [programs as i64]);
    // Every count from 0 to programs - 1 was read by exactly one program.
    let mut tickets = tickets.to_i64();
    tickets.sort_unstable();
    assert_eq!(tickets, (0..programs as i64).collect::<Vec<_>>());
    let n = programs as i64;
    assert_eq!(total.to_i64(), [n * (n + 1) / 2]);
}
