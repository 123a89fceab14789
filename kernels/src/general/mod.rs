//! General tile kernels: GEMM + bias + GELU, row softmax, layernorm, column sums and transpose,
//! each written in the DSL with a host-side launcher on the CPU interpreter.
//!
//! They exist to keep the DSL honest as a tile language rather than an attention template: between
//! them they use `dot` accumulation over a K loop, block pointers with boundary checks, masked
//! pointer tiles, row and column reductions, loop-carried tiles, `trans` and runtime scalar
//! arguments, on sizes that are not multiples of any block.
//!
//! A matrix is a [`Matrix`]: a buffer with rows, columns and a row stride in elements (columns are
//! contiguous). Every launcher checks dtypes, sizes and buffer lengths before it builds a kernel,
//! and reports a mismatch as [`GeneralError::InvalidArgument`] naming the argument.

pub mod gemm;
pub mod layernorm;
pub mod reduce;
pub mod softmax;
pub mod transpose;

use std::fmt;

use kiln_dsl::{DType, HostBuffer};

/// Why a launch was refused or failed.
#[derive(Clone, Debug, PartialEq)]
pub enum GeneralError {
    /// Sizes, strides, dtypes or buffer lengths that do not fit; the message names the argument.
    InvalidArgument(String),
    /// A kernel failed to build or to run.
    Kernel(kiln_dsl::Error),
}

impl fmt::Display for GeneralError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GeneralError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            GeneralError::Kernel(e) => write!(f, "kernel error: {e}"),
        }
    }
}

impl std::error::Error for GeneralError {}

impl From<kiln_dsl::Error> for GeneralError {
    fn from(e: kiln_dsl::Error) -> Self {
        GeneralError::Kernel(e)
    }
}

fn invalid(message: String) -> GeneralError {
    GeneralError::InvalidArgument(message)
}

/// The float dtypes every kernel here takes (f32 mostly for the interpreter).
const FLOATS: [DType; 3] = [DType::F16, DType::BF16, DType::F32];

/// A row-major `[rows, cols]` matrix in a host buffer; `row_stride >= cols` elements.
#[derive(Clone, Copy, Debug)]
pub struct Matrix<'a> {
    pub buffer: &'a HostBuffer,
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
}

impl<'a> Matrix<'a> {
    /// A packed matrix (`row_stride == cols`).
    pub fn new(buffer: &'a HostBuffer, rows: usize, cols: usize) -> Matrix<'a> {
        Matrix::with_row_stride(buffer, rows, cols, cols)
    }

    pub fn with_row_stride(
        buffer: &'a HostBuffer,
        rows: usize,
        cols: usize,
        row_stride: usize,
    ) -> Matrix<'a> {
        Matrix {
            buffer,
            rows,
            cols,
            row_stride,
        }
    }

    /// The elements a buffer needs: `(rows - 1) * row_stride + cols`, or `None` on overflow.
    pub fn required_len(&self) -> Option<usize> {
        (self.rows.checked_sub(1)?)
            .checked_mul(self.row_stride)?
            .checked_add(self.cols)
    }

    /// Checks the dtype, that both sizes fit the kernels' i32 indices, the stride and the length.
    fn check(&self, name: &str, dtypes: &[DType]) -> Result<(), GeneralError> {
        check_dtype(name, self.buffer, dtypes)?;
        check_size(&format!("{name}.rows"), self.rows)?;
        check_size(&format!("{name}.cols"), self.cols)?;
        if self.row_stride < self.cols || self.row_stride > i64::MAX as usize {
            return Err(invalid(format!(
                "{name}.row_stride must be in {}..=2^63-1 (at least cols), got {}",
                self.cols, self.row_stride
            )));
        }
        let need = self.required_len().ok_or_else(|| {
            invalid(format!(
                "{name} is {} x {} with row stride {}, which overflows the address space",
                self.rows, self.cols, self.row_stride
            ))
        })?;
        if self.buffer.len() < need {
            return Err(invalid(format!(
                "{name} has {} elements but {} x {} with row stride {} addresses {need}",
                self.buffer.len(),
                self.rows,
                self.cols,
                self.row_stride
            )));
        }
        Ok(())
    }

    /// Checks that this matrix is `rows x cols`, as another argument requires.
    fn check_shape(&self, name: &str, rows: usize, cols: usize) -> Result<(), GeneralError> {
        if (self.rows, self.cols) != (rows, cols) {
            return Err(invalid(format!(
                "{name} must be {rows} x {cols}, got {} x {}",
                self.rows, self.cols
            )));
        }
        Ok(())
    }

    fn rows_i32(&self) -> kiln_dsl::KernelArg<'static> {
        kiln_dsl::KernelArg::I32(self.rows as i32)
    }

    fn cols_i32(&self) -> kiln_dsl::KernelArg<'static> {
        kiln_dsl::KernelArg::I32(self.cols as i32)
    }

    fn stride_i64(&self) -> kiln_dsl::KernelArg<'static> {
        kiln_dsl::KernelArg::I64(self.row_stride as i64)
    }
}

fn check_dtype(name: &str, buffer: &HostBuffer, dtypes: &[DType]) -> Result<(), GeneralError> {
    if dtypes.contains(&buffer.dtype()) {
        return Ok(());
    }
    let names: Vec<String> = dtypes.iter().map(|d| d.to_string()).collect();
    Err(invalid(format!(
        "{name} holds {}, expected {}",
        buffer.dtype(),
        names.join(" or ")
    )))
}

/// Kernels index rows and columns with i32, as Triton does, and a program's last row or column
/// is a block past its first: 2^30 leaves room for any block.
fn check_size(name: &str, value: usize) -> Result<(), GeneralError> {
    if value == 0 || value > 1 << 30 {
        return Err(invalid(format!(
            "{name} must be in 1..=2^30 (kernels index it with 32-bit integers), got {value}"
        )));
    }
    Ok(())
}

/// Checks a vector argument (a bias, a weight, an output) of at least `len` elements.
fn check_vector(
    name: &str,
    buffer: &HostBuffer,
    dtypes: &[DType],
    len: usize,
) -> Result<(), GeneralError> {
    check_dtype(name, buffer, dtypes)?;
    if buffer.len() < len {
        return Err(invalid(format!(
            "{name} has {} elements, needs {len}",
            buffer.len()
        )));
    }
    Ok(())
}

/// Programs along one grid axis: blocks of `block` covering `n` (n <= 2^30, so it fits).
fn programs(n: usize, block: usize) -> u32 {
    n.div_ceil(block) as u32
}
