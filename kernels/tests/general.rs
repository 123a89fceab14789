//! The general tile kernels against f64 references, at ragged shapes (1, block - 1, block + 1 and
//! sizes that are multiples of nothing), on fresh random inputs: every assertion prints its seed.
//!
//! Inputs are rounded to their dtype first and the references read the rounded values, so the
//! thresholds only cover the kernels' own arithmetic. Padding between rows of strided inputs holds
//! NaN (a kernel that reads it fails), outputs start poisoned and must be written exactly on the
//! matrix, padding left alone.

use kiln_dsl::{DType, HostBuffer};
use kiln_kernels::general::{Matrix, gemm, layernorm, reduce, softmax, transpose};
use kiln_kernels::reference::{Rng, row_error};

/// f32's unit roundoff.
const U32: f64 = 1.0 / (1u64 << 24) as f64;

/// The unit roundoff of a float dtype: 2^-11 (f16), 2^-8 (bf16), 2^-24 (f32).
fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 1.0 / 2048.0,
        DType::BF16 => 1.0 / 256.0,
        _ => U32,
    }
}

/// A `[rows, cols]` matrix with `pad` NaN elements after each row, holding `value()` rounded to
/// `dtype`; returns it with its dense rounded values.
fn matrix(
    dtype: DType,
    rows: usize,
    cols: usize,
    pad: usize,
    mut value: impl FnMut() -> f64,
) -> (HostBuffer, Vec<f64>) {
    let stride = cols + pad;
    let mut data = vec![f64::NAN; (rows - 1) * stride + cols];
    for r in 0..rows {
        for c in 0..cols {
            data[r * stride + c] = value();
        }
    }
    let buffer = HostBuffer::from_f64(dtype, &data);
    let dense = read(&buffer, rows, cols, stride);
    (buffer, dense)
}

/// The dense `[rows, cols]` values of a strided matrix.
fn read(buffer: &HostBuffer, rows: usize, cols: usize, stride: usize) -> Vec<f64> {
    let all = buffer.to_f64();
    (0..rows)
        .flat_map(|r| all[r * stride..r * stride + cols].iter().copied())
        .collect()
}

/// A poisoned output buffer for a `[rows, cols]` matrix with `pad` elements after each row.
fn poisoned(dtype: DType, rows: usize, cols: usize, pad: usize) -> HostBuffer {
    HostBuffer::poisoned(dtype, (rows - 1) * (cols + pad) + cols)
}

/// Checks that a kernel wrote every element of the matrix and none of the padding; returns the
/// dense values.
fn written(buffer: &HostBuffer, rows: usize, cols: usize, pad: usize, case: &str) -> Vec<f64> {
    let stride = cols + pad;
    let padding: Vec<usize> = (0..buffer.len()).filter(|i| i % stride >= cols).collect();
    assert_eq!(
        buffer.poisoned_indices(),
        padding,
        "{case}: the output must be written exactly on the matrix (poisoned indices != padding)"
    );
    read(buffer, rows, cols, stride)
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
}

#[test]
fn gemm_bias_gelu_matches_f64() {
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    let default = gemm::GemmBlocks::default();
    let small = gemm::GemmBlocks {
        m: 16,
        n: 32,
        k: 16,
    };
    // (M, N, K, A's row padding, blocks): 1, block - 1, block + 1 and multiples of nothing.
    let cases = [
        (1, 1, 1, 0, default),
        (1, 65, 33, 3, default),
        (63, 1, 31, 0, default),
        (65, 63, 47, 5, default),
        (15, 33, 17, 0, small),
        (17, 31, 1, 2, small),
        (33, 47, 15, 0, small),
    ];
    for (i, &(m, n, k, pad, blocks)) in cases.iter().enumerate() {
        let dtype = [DType::F16, DType::BF16][i % 2];
        let bias_dtype = [DType::F32, dtype][(i / 2) % 2];
        let case = format!(
            "seed {seed}: gemm {m}x{k} @ {k}x{n} {dtype} bias {bias_dtype} blocks {blocks:?}"
        );
        // Scaling A by 1/sqrt(K) keeps A @ B near N(0, 1), where GELU is most curved.
        let a_scale = 1.0 / (k as f64).sqrt();
        let (a, a_ref) = matrix(dtype, m, k, pad, || rng.normal() * a_scale);
        let (b, b_ref) = matrix(dtype, k, n, 0, || rng.normal());
        let (bias, bias_ref) = matrix(bias_dtype, 1, n, 0, || rng.normal() * 0.5);
        let c = poisoned(dtype, m, n, 1);
        gemm::launch(
            Matrix::with_row_stride(&a, m, k, k + pad),
            Matrix::new(&b, k, n),
            &bias,
            Matrix::with_row_stride(&c, m, n, n + 1),
            blocks,
        )
        .unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = written(&c, m, n, 1, &case);
        let want: Vec<f64> = (0..m * n)
            .map(|at| {
                let (r, col) = (at / n, at % n);
                let x: f64 = (0..k).map(|j| a_ref[r * k + j] * b_ref[j * n + col]).sum();
                gelu(x + bias_ref[col])
            })
            .collect();
        // The store rounds each output once (relative error <= u of T); the f32 sums (about
        // sqrt(K) 2^-24) and GELU's f32 evaluation (a few 2^-24) are far below u. 2u leaves
        // room; a wrong tile, bias or activation is off by O(1).
        let error = row_error(&got, &want, n);
        let threshold = 2.0 * unit_roundoff(dtype);
        assert!(
            error <= threshold,
            "{case}: row error {error:.3e} > {threshold:.3e}"
        );
    }
}

#[test]
fn softmax_matches_f64() {
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    // (rows, cols, dtype): cols pick BLOCK_N and BLOCK_M (see `softmax::block_sizes`); rows step
    // around BLOCK_M.
    let cases = [
        (1, 1, DType::F32),
        (17, 1, DType::F16),
        (15, 17, DType::F32),
        (33, 100, DType::F16),
        (7, 257, DType::F32),
        (9, 257, DType::BF16),
        (3, 1000, DType::F16),
    ];
    for &(rows, cols, dtype) in &cases {
        let (block_m, block_n) = softmax::block_sizes(cols);
        let case = format!(
            "seed {seed}: softmax {rows}x{cols} {dtype} (BLOCK_M {block_m}, BLOCK_N {block_n})"
        );
        let (x, x_ref) = matrix(dtype, rows, cols, 2, || rng.normal() * 3.0);
        let y = poisoned(dtype, rows, cols, 0);
        softmax::launch(
            Matrix::with_row_stride(&x, rows, cols, cols + 2),
            Matrix::new(&y, rows, cols),
        )
        .unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = written(&y, rows, cols, 0, &case);
        let want: Vec<f64> = x_ref
            .chunks(cols)
            .flat_map(|row| {
                let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
                row.iter()
                    .map(move |v| (v - max).exp() / sum)
                    .collect::<Vec<_>>()
            })
            .collect();
        // Per element: |x| < 20 (normal * 3), so rounding `x log2(e)` in f32 costs at most
        // 30 2^-24 relative after exp2; the f32 row sum at most cols 2^-24; the store u of T.
        // f16 stores tiny probabilities as subnormals, off by up to 2^-25 each: at most
        // cols 2^-25 relative to a row's norm, which is at least 1 / sqrt(cols). Doubling the
        // f32 terms covers it.
        let error = row_error(&got, &want, cols);
        let threshold = unit_roundoff(dtype) + 2.0 * (cols as f64 + 32.0) * U32;
        assert!(
            error <= threshold,
            "{case}: row error {error:.3e} > {threshold:.3e}"
        );
    }
}

#[test]
fn layernorm_matches_f64() {
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    let max_n = layernorm::MAX_BLOCK_N;
    // (rows, cols, dtype): cols past MAX_BLOCK_N take several chunks; rows step around BLOCK_M.
    let cases = [
        (1, 1, DType::F32),
        (17, 3, DType::F16),
        (9, max_n - 1, DType::BF16),
        (7, max_n + 1, DType::F32),
        (5, 3 * max_n - 37, DType::F16),
        (33, 100, DType::F32),
    ];
    let eps = 1e-5;
    for &(rows, cols, dtype) in &cases {
        let (block_m, block_n) = layernorm::block_sizes(cols);
        let case = format!(
            "seed {seed}: layernorm {rows}x{cols} {dtype} (BLOCK_M {block_m}, BLOCK_N {block_n})"
        );
        // A mean of 3 against a spread of 1 makes a one-pass variance cancel visibly.
        let (x, x_ref) = matrix(dtype, rows, cols, 1, || 3.0 + rng.normal());
        let (weight, w_ref) = matrix(dtype, 1, cols, 0, || 1.0 + 0.5 * rng.normal());
        let (bias, b_ref) = matrix(dtype, 1, cols, 0, || 0.5 * rng.normal());
        let y = poisoned(dtype, rows, cols, 3);
        layernorm::launch(
            Matrix::with_row_stride(&x, rows, cols, cols + 1),
            &weight,
            &bias,
            Matrix::with_row_stride(&y, rows, cols, cols + 3),
            eps,
        )
        .unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = written(&y, rows, cols, 3, &case);
        let want: Vec<f64> = x_ref
            .chunks(cols)
            .flat_map(|row| {
                let n = cols as f64;
                let mean = row.iter().sum::<f64>() / n;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n;
                let rstd = 1.0 / (var + eps as f64).sqrt();
                (0..cols)
                    .map(|c| (row[c] - mean) * rstd * w_ref[c] + b_ref[c])
                    .collect::<Vec<_>>()
            })
            .collect();
        // The f32 sums err by at most cols 2^-24 sum|x|, and |x| / std <= 8 here: the mean and
        // the variance move the normalised values by at most 8 cols 2^-24 each; the store adds u.
        let error = row_error(&got, &want, cols);
        let threshold = unit_roundoff(dtype) + 16.0 * cols as f64 * U32;
        assert!(
            error <= threshold,
            "{case}: row error {error:.3e} > {threshold:.3e}"
        );
    }
}

#[test]
fn column_sums_match_f64() {
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    let (bm, bn) = (reduce::BLOCK_M, reduce::BLOCK_N);
    // (rows, cols, dtype): rows step around the loop's BLOCK_M, cols around a program's BLOCK_N.
    let cases = [
        (1, 1, DType::F32),
        (bm - 1, bn + 1, DType::F16),
        (bm + 1, bn - 1, DType::BF16),
        (3 * bm + 5, 1, DType::F32),
        (1, 2 * bn + 3, DType::F16),
        (97, 130, DType::F32),
    ];
    for &(rows, cols, dtype) in &cases {
        let case = format!("seed {seed}: column sums {rows}x{cols} {dtype}");
        let (x, x_ref) = matrix(dtype, rows, cols, 3, || rng.normal());
        let out = HostBuffer::poisoned(DType::F32, cols);
        reduce::launch(Matrix::with_row_stride(&x, rows, cols, cols + 3), &out)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = written(&out, 1, cols, 0, &case);
        let column = |c: usize| x_ref.iter().skip(c).step_by(cols);
        let want: Vec<f64> = (0..cols).map(|c| column(c).sum()).collect();
        let magnitude: Vec<f64> = (0..cols)
            .map(|c| column(c).map(|v| v.abs()).sum())
            .collect();
        // Any f32 summation order errs by at most rows 2^-24 sum|x| per column (the inputs are
        // exact in f32); as a norm over the columns, relative to the sums' norm:
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        let threshold = rows as f64 * U32 * norm(&magnitude) / norm(&want);
        let error = row_error(&got, &want, cols);
        assert!(
            error <= threshold,
            "{case}: error {error:.3e} > {threshold:.3e}"
        );
    }
}

#[test]
fn transpose_is_exact() {
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    let (bm, bn) = (transpose::BLOCK_M, transpose::BLOCK_N);
    // (rows, cols, dtype): both dims step around both block dims (the tile is not square).
    let cases = [
        (1, 1, DType::F32),
        (bm + 1, bn - 1, DType::F16),
        (bn + 1, bm - 1, DType::BF16),
        (1, 2 * bn + 1, DType::I32),
        (3 * bm - 1, 1, DType::F32),
        (70, 45, DType::I64),
    ];
    for &(rows, cols, dtype) in &cases {
        let case = format!("seed {seed}: transpose {rows}x{cols} {dtype}");
        let (x, x_ref) = if dtype.is_float() {
            matrix(dtype, rows, cols, 2, || rng.normal())
        } else {
            // Integers whose padding is 0 (not NaN): reading it still shows up as a wrong value.
            let mut data = vec![0.0; (rows - 1) * (cols + 2) + cols];
            let mut dense = Vec::with_capacity(rows * cols);
            for r in 0..rows {
                for c in 0..cols {
                    let v = (rng.next_u64() % 2001) as f64 - 1000.0;
                    data[r * (cols + 2) + c] = v;
                    dense.push(v);
                }
            }
            (HostBuffer::from_f64(dtype, &data), dense)
        };
        let y = poisoned(dtype, cols, rows, 1);
        transpose::launch(
            Matrix::with_row_stride(&x, rows, cols, cols + 2),
            Matrix::with_row_stride(&y, cols, rows, rows + 1),
        )
        .unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = written(&y, cols, rows, 1, &case);
        let want: Vec<f64> = (0..cols * rows)
            .map(|at| x_ref[(at % rows) * cols + at / rows])
            .collect();
        // A transpose moves values without arithmetic: it is exact.
        let error = row_error(&got, &want, rows);
        assert!(
            error == 0.0,
            "{case}: row error {error:.3e}, expected exactly 0"
        );
    }
}

#[test]
fn launchers_refuse_bad_arguments_clearly() {
    let a = HostBuffer::zeros(DType::F16, 12);
    let b = HostBuffer::zeros(DType::F16, 12);
    let c = HostBuffer::zeros(DType::F16, 12);
    let bias = HostBuffer::zeros(DType::F32, 3);
    let blocks = gemm::GemmBlocks::default();
    let message = |r: Result<(), kiln_kernels::general::GeneralError>| r.unwrap_err().to_string();
    // K mismatch: A is 3 x 4, B 3 x 4.
    let err = message(gemm::launch(
        Matrix::new(&a, 3, 4),
        Matrix::new(&b, 3, 4),
        &bias,
        Matrix::new(&c, 3, 4),
        blocks,
    ));
    assert!(err.contains("b must be 4 x 4"), "{err}");
    // A buffer too short for its stride.
    let err = message(softmax::launch(
        Matrix::with_row_stride(&a, 3, 4, 5),
        Matrix::new(&b, 3, 4),
    ));
    assert!(
        err.contains("x has 12 elements") && err.contains("addresses 14"),
        "{err}"
    );
    // Mixed dtypes.
    let y32 = HostBuffer::zeros(DType::F32, 12);
    let err = message(transpose::launch(
        Matrix::new(&a, 3, 4),
        Matrix::new(&y32, 4, 3),
    ));
    assert!(err.contains("y holds f32, expected f16"), "{err}");
    // eps must be positive.
    let w = HostBuffer::zeros(DType::F16, 4);
    let err = message(layernorm::launch(
        Matrix::new(&a, 3, 4),
        &w,
        &w,
        Matrix::new(&b, 3, 4),
        0.0,
    ));
    assert!(err.contains("eps must be positive"), "{err}");
    // An empty matrix.
    let out = HostBuffer::zeros(DType::F32, 4);
    let err = message(reduce::launch(Matrix::new(&a, 0, 4), &out));
    assert!(err.contains("x.rows must be in 1..=2^30"), "{err}");
    assert!(err.ends_with("got 0"), "{err}");
    // Past 2^30 a program's last row, a block on, could wrap in 32 bits.
    let err = message(reduce::launch(Matrix::new(&a, (1 << 30) + 1, 4), &out));
    assert!(
        err.contains(
            "x.rows must be in 1..=2^30 (kernels index it with 32-bit integers), got 1073741825"
        ),
        "{err}"
    );
}
