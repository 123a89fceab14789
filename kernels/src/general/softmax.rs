//! Row softmax of a `[rows, cols]` matrix: `y[r, c] = exp(x[r, c] - max_r) / sum_c exp(x[r, c] - max_r)`.
//!
//! One program owns `BLOCK_M` whole rows: a row fits one tile (`cols <= BLOCK_N`), columns past
//! `cols` load `-inf` and so weigh nothing. Exponentials are base 2 on pre-scaled inputs (exp2 is
//! the GPU's native instruction); statistics are f32 whatever `T` is, and the store rounds to `T`.

use kiln_dsl::{Grid, KernelArg, Spec, kernel};

use super::{FLOATS, GeneralError, Matrix, invalid, programs};

/// Grid: `cdiv(rows, BLOCK_M)`; needs `cols <= BLOCK_N`.
#[kernel]
pub fn softmax_rows<T, const BLOCK_M: usize, const BLOCK_N: usize>(
    x: Ptr<T>,
    y: Ptr<T>,
    rows: i32,
    cols: i32,
    x_row_stride: i64,
    y_row_stride: i64,
) {
    // i64 row indices: `row * stride` and the last block's padding rows cannot wrap.
    let row = (program_id(0).to::<i64>() * BLOCK_M + arange(0, BLOCK_M)).expand_dims(1);
    let col = arange(0, BLOCK_N).expand_dims(0);
    let inside = row < rows && col < cols;
    let z = load(x + row * x_row_stride + col, inside, f32::NEG_INFINITY).to::<f32>()
        * f32::consts::LOG2_E;
    // Padding rows are all -inf and come out NaN; the store masks them.
    let p = exp2(z - z.max(1).expand_dims(1));
    store(
        y + row * y_row_stride + col,
        p / p.sum(1).expand_dims(1),
        inside,
    );
}

/// The widest row one tile holds; wider rows need a looped (online) softmax.
pub const MAX_COLS: usize = 16384;

/// Elements per program's tile: rows per program shrink as rows widen.
const TILE_ELEMENTS: usize = 4096;

/// Rows per program at most: narrow rows still leave enough programs to fill a GPU.
const MAX_BLOCK_M: usize = 16;

/// Writes the row softmax of `x` into `y` (same shape and dtype) on the interpreter.
pub fn launch(x: Matrix<'_>, y: Matrix<'_>) -> Result<(), GeneralError> {
    x.check("x", &FLOATS)?;
    y.check("y", &[x.buffer.dtype()])?;
    y.check_shape("y", x.rows, x.cols)?;
    if x.cols > MAX_COLS {
        return Err(invalid(format!(
            "softmax takes rows of at most {MAX_COLS} columns (one tile), got {}",
            x.cols
        )));
    }
    let (block_m, block_n) = block_sizes(x.cols);
    let spec = Spec::new()
        .dtype("T", x.buffer.dtype())
        .int("BLOCK_M", block_m as i64)
        .int("BLOCK_N", block_n as i64);
    let kernel = softmax_rows::build(&spec)?;
    let args = [
        KernelArg::Buffer(x.buffer),
        KernelArg::Buffer(y.buffer),
        x.rows_i32(),
        x.cols_i32(),
        x.stride_i64(),
        y.stride_i64(),
    ];
    kiln_dsl::run(&kernel, Grid::new(programs(x.rows, block_m), 1, 1), &args)?;
    Ok(())
}

/// The rows per program and the tile width the launcher picks for `cols` columns (for tests that
/// step around them).
pub fn block_sizes(cols: usize) -> (usize, usize) {
    let block_n = cols.next_power_of_two();
    ((TILE_ELEMENTS / block_n).clamp(1, MAX_BLOCK_M), block_n)
}
