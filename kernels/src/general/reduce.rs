//! Column sums: `out[c] = sum_r x[r, c]` of a `[rows, cols]` matrix, in f32.
//!
//! One program owns `BLOCK_N` columns and walks the rows in `BLOCK_M`-row blocks through a block
//! pointer whose boundary check zero-pads the ragged edges. It accumulates a whole
//! `[BLOCK_M, BLOCK_N]` tile (elementwise adds, no cross-lane work in the loop) and reduces it
//! across rows once, after the loop.

use kiln_dsl::{DType, Grid, HostBuffer, KernelArg, Spec, kernel};

use super::{FLOATS, GeneralError, Matrix, check_vector, programs};

/// Grid: `cdiv(cols, BLOCK_N)`; each program loops over all rows.
#[kernel]
pub fn column_sums<T, const BLOCK_M: usize, const BLOCK_N: usize>(
    x: Ptr<T>,
    out: Ptr<f32>,
    rows: i32,
    cols: i32,
    row_stride: i64,
) {
    let col0 = program_id(0) * BLOCK_N;
    let mut block = make_block_ptr(
        x,
        [rows, cols],
        [row_stride, 1],
        [0, col0],
        [BLOCK_M, BLOCK_N],
        [1, 0],
    );
    let mut acc = zeros([BLOCK_M, BLOCK_N], f32);
    for _ in (0..rows).step_by(BLOCK_M) {
        acc += load(block, [0, 1]).to::<f32>();
        block = advance(block, [BLOCK_M, 0]);
    }
    let col = col0 + arange(0, BLOCK_N);
    store(out + col, acc.sum(0), col < cols);
}

/// Rows per step of a program's loop.
pub const BLOCK_M: usize = 32;

/// Columns per program.
pub const BLOCK_N: usize = 64;

/// Writes the column sums of `x` into `out` (f32, at least `x.cols` elements) on the interpreter.
pub fn launch(x: Matrix<'_>, out: &HostBuffer) -> Result<(), GeneralError> {
    x.check("x", &FLOATS)?;
    check_vector("out", out, &[DType::F32], x.cols)?;
    let spec = Spec::new()
        .dtype("T", x.buffer.dtype())
        .int("BLOCK_M", BLOCK_M as i64)
        .int("BLOCK_N", BLOCK_N as i64);
    let kernel = column_sums::build(&spec)?;
    let args = [
        KernelArg::Buffer(x.buffer),
        KernelArg::Buffer(out),
        x.rows_i32(),
        x.cols_i32(),
        x.stride_i64(),
    ];
    kiln_dsl::run(&kernel, Grid::new(programs(x.cols, BLOCK_N), 1, 1), &args)?;
    Ok(())
}
