//! Transpose: `y[c, r] = x[r, c]` for a `[rows, cols]` matrix `x` and a `[cols, rows]` matrix `y`.
//!
//! One program moves one `BLOCK_M x BLOCK_N` tile: a boundary-checked block load, `trans`, and a
//! boundary-checked block store at the mirrored offsets. The tile is not square so that a swapped
//! pair of block dims or offsets cannot pass the tests.

use kiln_dsl::{DType, Grid, KernelArg, Spec, kernel};

use super::{GeneralError, Matrix, programs};

/// Grid: `(cdiv(rows, BLOCK_M), cdiv(cols, BLOCK_N))`, one program per tile of `x`.
#[kernel]
pub fn transpose<T, const BLOCK_M: usize, const BLOCK_N: usize>(
    x: Ptr<T>,
    y: Ptr<T>,
    rows: i32,
    cols: i32,
    x_row_stride: i64,
    y_row_stride: i64,
) {
    let row0 = program_id(0) * BLOCK_M;
    let col0 = program_id(1) * BLOCK_N;
    let src = make_block_ptr(
        x,
        [rows, cols],
        [x_row_stride, 1],
        [row0, col0],
        [BLOCK_M, BLOCK_N],
        [1, 0],
    );
    let dst = make_block_ptr(
        y,
        [cols, rows],
        [y_row_stride, 1],
        [col0, row0],
        [BLOCK_N, BLOCK_M],
        [1, 0],
    );
    store(dst, trans(load(src, [0, 1])), [0, 1]);
}

/// Rows of `x` per tile.
pub const BLOCK_M: usize = 32;

/// Columns of `x` per tile.
pub const BLOCK_N: usize = 64;

/// Writes the transpose of `x` into `y` (`[x.cols, x.rows]`, same dtype; any number dtype).
pub fn launch(x: Matrix<'_>, y: Matrix<'_>) -> Result<(), GeneralError> {
    x.check(
        "x",
        &[DType::F16, DType::BF16, DType::F32, DType::I32, DType::I64],
    )?;
    y.check("y", &[x.buffer.dtype()])?;
    y.check_shape("y", x.cols, x.rows)?;
    let spec = Spec::new()
        .dtype("T", x.buffer.dtype())
        .int("BLOCK_M", BLOCK_M as i64)
        .int("BLOCK_N", BLOCK_N as i64);
    let kernel = transpose::build(&spec)?;
    let args = [
        KernelArg::Buffer(x.buffer),
        KernelArg::Buffer(y.buffer),
        x.rows_i32(),
        x.cols_i32(),
        x.stride_i64(),
        y.stride_i64(),
    ];
    let grid = Grid::new(programs(x.rows, BLOCK_M), programs(x.cols, BLOCK_N), 1);
    kiln_dsl::run(&kernel, grid, &args)?;
    Ok(())
}
