//! `C = gelu(A @ B + bias)`: a tiled GEMM with a fused bias and GELU epilogue.
//!
//! A is `[M, K]`, B `[K, N]` and C `[M, N]`, all in `T` (f16 or bf16; f32 on the interpreter)
//! with row strides; the bias is `[N]`, f32 or `T`. One program computes a `BLOCK_M x BLOCK_N`
//! tile of C, accumulating `dot`s over K in f32. Boundary checks zero-pad ragged M, N and K, so a
//! partial K tile adds nothing. GELU is the tanh approximation
//! `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`, evaluated in f32 before the store rounds
//! to `T`.

use kiln_dsl::{DType, Grid, HostBuffer, KernelArg, Spec, kernel};

use super::{FLOATS, GeneralError, Matrix, check_vector, invalid, programs};

/// Grid: `(cdiv(m, BLOCK_M), cdiv(n, BLOCK_N))`, one program per tile of C.
#[kernel]
pub fn gemm_bias_gelu<T, B, const BLOCK_M: usize, const BLOCK_N: usize, const BLOCK_K: usize>(
    a: Ptr<T>,
    b: Ptr<T>,
    bias: Ptr<B>,
    c: Ptr<T>,
    m: i32,
    n: i32,
    k: i32,
    a_row_stride: i64,
    b_row_stride: i64,
    c_row_stride: i64,
) {
    let row0 = program_id(0) * BLOCK_M;
    let col0 = program_id(1) * BLOCK_N;
    let mut a_block = make_block_ptr(
        a,
        [m, k],
        [a_row_stride, 1],
        [row0, 0],
        [BLOCK_M, BLOCK_K],
        [1, 0],
    );
    let mut b_block = make_block_ptr(
        b,
        [k, n],
        [b_row_stride, 1],
        [0, col0],
        [BLOCK_K, BLOCK_N],
        [1, 0],
    );
    let mut acc = zeros([BLOCK_M, BLOCK_N], f32);
    for _ in (0..k).step_by(BLOCK_K) {
        acc = dot(load(a_block, [0, 1]), load(b_block, [0, 1]), acc);
        a_block = advance(a_block, [0, BLOCK_K]);
        b_block = advance(b_block, [BLOCK_K, 0]);
    }
    let cols = col0 + arange(0, BLOCK_N);
    // The bias ([BLOCK_N]) broadcasts along the rows.
    let x = acc + load(bias + cols, cols < n).to::<f32>();
    let y = 0.5 * x * (1.0 + tanh(sqrt(2.0 / f32::consts::PI) * (x + 0.044715 * x * x * x)));
    let c_block = make_block_ptr(
        c,
        [m, n],
        [c_row_stride, 1],
        [row0, col0],
        [BLOCK_M, BLOCK_N],
        [1, 0],
    );
    store(c_block, y, [0, 1]);
}

/// The tile of C one program computes, and the K step; each a power of two of at least 16
/// (`dot`'s tensor-core shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmBlocks {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Default for GemmBlocks {
    /// A 64 x 64 f32 accumulator per program and 32-deep K steps: a middle-of-the-road f16
    /// tile; tuning it per GPU is the performance work's business.
    fn default() -> Self {
        GemmBlocks {
            m: 64,
            n: 64,
            k: 32,
        }
    }
}

/// Computes `c = gelu(a @ b + bias)` on the interpreter.
pub fn launch(
    a: Matrix<'_>,
    b: Matrix<'_>,
    bias: &HostBuffer,
    c: Matrix<'_>,
    blocks: GemmBlocks,
) -> Result<(), GeneralError> {
    a.check("a", &FLOATS)?;
    let dtype = a.buffer.dtype();
    b.check("b", &[dtype])?;
    c.check("c", &[dtype])?;
    b.check_shape("b", a.cols, b.cols)?;
    c.check_shape("c", a.rows, b.cols)?;
    check_vector("bias", bias, &[DType::F32, dtype], b.cols)?;
    for (name, block) in [("m", blocks.m), ("n", blocks.n), ("k", blocks.k)] {
        if block < 16 || !block.is_power_of_two() {
            return Err(invalid(format!(
                "blocks.{name} must be a power of two of at least 16, got {block}"
            )));
        }
    }
    let spec = Spec::new()
        .dtype("T", dtype)
        .dtype("B", bias.dtype())
        .int("BLOCK_M", blocks.m as i64)
        .int("BLOCK_N", blocks.n as i64)
        .int("BLOCK_K", blocks.k as i64);
    let kernel = gemm_bias_gelu::build(&spec)?;
    let args = [
        KernelArg::Buffer(a.buffer),
        KernelArg::Buffer(b.buffer),
        KernelArg::Buffer(bias),
        KernelArg::Buffer(c.buffer),
        a.rows_i32(),
        b.cols_i32(),
        a.cols_i32(),
        a.stride_i64(),
        b.stride_i64(),
        c.stride_i64(),
    ];
    let grid = Grid::new(programs(a.rows, blocks.m), programs(b.cols, blocks.n), 1);
    kiln_dsl::run(&kernel, grid, &args)?;
    Ok(())
}
