//! A user's kernel JIT-compiled for the GPU on its first launch (feature `jit`), and the same
//! typed `launch` call on the CPU interpreter, whose result the GPU's must match:
//!
//! ```sh
//! cargo run --release -p kiln --features jit --example jit
//! ```
//!
//! The first run compiles (kiln-codegen, about a tenth of a second) and fills the disk cache
//! (`$KILN_CACHE_DIR`, default `~/.cache/kiln`); the next process finds the PTX there.
//! `KILN_DUMP=dir` writes every stage of the kernel.

use std::process::ExitCode;
use std::time::Instant;

use kiln::prelude::*;
use kiln::runtime::jit::Jit;
use kiln::runtime::{Device, RuntimeError};

/// Row softmax of a `[rows, cols]` f16/bf16 matrix with `cols <= BLOCK_N`, then `* gain`.
#[kiln::kernel]
fn softmax_gain<T, const BLOCK_M: usize, const BLOCK_N: usize>(
    x: Ptr<T>,
    y: Ptr<T>,
    rows: i32,
    cols: i32,
    gain: f32,
) {
    let row = (program_id(0) * BLOCK_M + arange(0, BLOCK_M)).expand_dims(1);
    let col = arange(0, BLOCK_N).expand_dims(0);
    let inside = row < rows && col < cols;
    let z = load(x + row * cols + col, inside, f32::NEG_INFINITY).to::<f32>() * f32::consts::LOG2_E;
    let p = exp2(z - z.max(1).expand_dims(1));
    store(
        y + row * cols + col,
        p / p.sum(1).expand_dims(1) * gain,
        inside,
    );
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, RuntimeError> {
    let device = Device::current_or_default()?;
    // Safety: the kernel masks every access at `rows` x `cols`; the interpreter run below
    // checks that too.
    let jit = unsafe { Jit::new(device) }?;
    let (rows, cols, block_m, block_n) = (1000usize, 300usize, 4usize, 512usize);
    let spec = Spec::new()
        .dtype("T", BF16)
        .int("BLOCK_M", block_m as i64)
        .int("BLOCK_N", block_n as i64);
    let start = Instant::now();
    let compiled = jit.compile(&softmax_gain::KERNEL, &spec)?;
    println!(
        "{} for {}: {} in {:.1} ms (cache key {})",
        softmax_gain::SIGNATURE.name,
        jit.target(),
        if compiled.hit {
            "found in the disk cache"
        } else {
            "compiled"
        },
        start.elapsed().as_secs_f64() * 1e3,
        compiled.key
    );

    let values: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
        .collect();
    let x = HostBuffer::from_f32(BF16, &values);
    let grid = Grid::new(rows.div_ceil(block_m) as u32, 1, 1);
    let want = HostBuffer::poisoned(BF16, rows * cols);
    softmax_gain::launch(
        &Interpreter,
        &spec,
        grid,
        &x,
        &want,
        rows as i32,
        cols as i32,
        2.0,
    )?;

    let x_gpu = jit.device().upload(&x)?;
    // On the GPU into a poisoned output, read back.
    let on_gpu = |jit: &Jit| -> Result<Vec<f64>, RuntimeError> {
        let y_gpu = jit
            .device()
            .upload(&HostBuffer::poisoned(BF16, rows * cols))?;
        softmax_gain::launch(
            jit,
            &spec,
            grid,
            &x_gpu,
            &y_gpu,
            rows as i32,
            cols as i32,
            2.0,
        )?;
        Ok(y_gpu.to_host(jit.device())?.to_f64())
    };
    let want = want.to_f64();
    let ok = agrees(&want, &on_gpu(&jit)?, "4 warps");
    // The same kernel and spec with other options is another compile, loaded beside the first
    // (a launch of 8 warps must not find the 4-warp kernel).
    let jit = jit.with_options(8, 2);
    Ok(agrees(&want, &on_gpu(&jit)?, "8 warps, 2 stages") && ok)
}

/// Whether the GPU's `got` is one bf16 rounding from the interpreter's `want` at most (the
/// GPU's exp2 and sums differ in the last f32 bits); says so.
fn agrees(want: &[f64], got: &[f64], what: &str) -> bool {
    let worst = want
        .iter()
        .zip(got)
        .map(|(w, g)| (w - g).abs() / w.abs().max(1e-3))
        .fold(
            0.0f64,
            |a, b| if b.is_nan() { f64::INFINITY } else { a.max(b) },
        );
    let ok = worst <= 2f64.powi(-7);
    println!(
        "GPU ({what}) vs interpreter over {} elements: worst relative difference {worst:.2e} ({})",
        want.len(),
        if ok { "ok" } else { "FAILED" }
    );
    ok
}
