//! Layernorm over the last dim: `y = (x - mean) / sqrt(var + eps) * weight + bias` per row, with
//! the biased variance (PyTorch's `layer_norm`).
//!
//! One program owns `BLOCK_M` rows and walks them in `BLOCK_N`-column chunks, so a row may be any
//! width. Statistics are f32 whatever `T` is, in two passes (the mean, then the variance around
//! it), which avoids the cancellation of `E[x^2] - E[x]^2` on rows with a large mean; a third pass
//! normalises and stores.

use kiln_dsl::{Grid, HostBuffer, KernelArg, Spec, kernel};

use super::{FLOATS, GeneralError, Matrix, check_vector, invalid, programs};

/// Grid: `cdiv(rows, BLOCK_M)`; any `cols`.
#[kernel]
pub fn layernorm<T, const BLOCK_M: usize, const BLOCK_N: usize>(
    x: Ptr<T>,
    weight: Ptr<T>,
    bias: Ptr<T>,
    y: Ptr<T>,
    rows: i32,
    cols: i32,
    x_row_stride: i64,
    y_row_stride: i64,
    eps: f32,
) {
    // i64 row indices: `row * stride` and the last block's padding rows cannot wrap.
    let row = (program_id(0).to::<i64>() * BLOCK_M + arange(0, BLOCK_M)).expand_dims(1);
    let x_rows = x + row * x_row_stride;
    let y_rows = y + row * y_row_stride;
    let n = cols.to::<f32>();

    let mut sum = zeros([BLOCK_M], f32);
    for start in (0..cols).step_by(BLOCK_N) {
        let col = (start + arange(0, BLOCK_N)).expand_dims(0);
        sum += load(x_rows + col, row < rows && col < cols)
            .to::<f32>()
            .sum(1);
    }
    let mean = (sum / n).expand_dims(1);

    let mut squares = zeros([BLOCK_M], f32);
    for start in (0..cols).step_by(BLOCK_N) {
        let col = (start + arange(0, BLOCK_N)).expand_dims(0);
        let inside = row < rows && col < cols;
        // Padding lanes would contribute `(0 - mean)^2`: zero them after the subtraction.
        let centred = where_(inside, load(x_rows + col, inside).to::<f32>() - mean, 0.0);
        squares += (centred * centred).sum(1);
    }
    let rstd = rsqrt(squares / n + eps).expand_dims(1);

    for start in (0..cols).step_by(BLOCK_N) {
        let col = start + arange(0, BLOCK_N);
        let w = load(weight + col, col < cols).to::<f32>();
        let b = load(bias + col, col < cols).to::<f32>();
        let col = col.expand_dims(0);
        let inside = row < rows && col < cols;
        let x_tile = load(x_rows + col, inside).to::<f32>();
        // `w` and `b` ([BLOCK_N]) broadcast along the rows.
        store(y_rows + col, (x_tile - mean) * rstd * w + b, inside);
    }
}

/// Columns per chunk at most; narrower rows take one chunk of their width rounded up.
pub const MAX_BLOCK_N: usize = 256;

/// Elements per program's tile: rows per program shrink as chunks widen.
const TILE_ELEMENTS: usize = 2048;

/// Rows per program at most: narrow rows still leave enough programs to fill a GPU.
const MAX_BLOCK_M: usize = 16;

/// The rows per program and the chunk width the launcher picks for `cols` columns.
pub fn block_sizes(cols: usize) -> (usize, usize) {
    let block_n = cols.next_power_of_two().min(MAX_BLOCK_N);
    ((TILE_ELEMENTS / block_n).min(MAX_BLOCK_M), block_n)
}

/// Writes the layernorm of `x`'s rows into `y` (same shape and dtype); `weight` and `bias` hold
/// `cols` elements of the same dtype; `eps` must be positive and finite.
pub fn launch(
    x: Matrix<'_>,
    weight: &HostBuffer,
    bias: &HostBuffer,
    y: Matrix<'_>,
    eps: f32,
) -> Result<(), GeneralError> {
    x.check("x", &FLOATS)?;
    let dtype = x.buffer.dtype();
    y.check("y", &[dtype])?;
    y.check_shape("y", x.rows, x.cols)?;
    check_vector("weight", weight, &[dtype], x.cols)?;
    check_vector("bias", bias, &[dtype], x.cols)?;
    // eps = 0 turns a constant row into 0 * inf = NaN.
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(invalid(format!(
            "eps must be positive and finite, got {eps}"
        )));
    }
    let (block_m, block_n) = block_sizes(x.cols);
    let spec = Spec::new()
        .dtype("T", dtype)
        .int("BLOCK_M", block_m as i64)
        .int("BLOCK_N", block_n as i64);
    let kernel = layernorm::build(&spec)?;
    let args = [
        KernelArg::Buffer(x.buffer),
        KernelArg::Buffer(weight),
        KernelArg::Buffer(bias),
        KernelArg::Buffer(y.buffer),
        x.rows_i32(),
        x.cols_i32(),
        x.stride_i64(),
        y.stride_i64(),
        KernelArg::F32(eps),
    ];
    kiln_dsl::run(&kernel, Grid::new(programs(x.rows, block_m), 1, 1), &args)?;
    Ok(())
}
