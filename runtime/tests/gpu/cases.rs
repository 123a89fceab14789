//! The GPU test's kernels and cases, shared by two test binaries: kiln-codegen's tests compile
//! each case and keep its PTX under `ptx/` up to date (they link LLVM), and kiln-runtime's GPU
//! test loads that PTX, runs it and compares with the interpreter (it needs no LLVM).

use kiln_dsl::prelude::*;
use kiln_dsl::{Kernel, kernel};

/// `out = x + y`, masked past `n`: the first kernel to run end to end.
#[kernel]
pub fn vector_add<T, const BLOCK: usize>(x: Ptr<T>, y: Ptr<T>, out: Ptr<T>, n: i32) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(
        out + offs,
        load(x + offs, mask) + load(y + offs, mask),
        mask,
    );
}

/// Casts, scalar arguments, a loop carrying a tile, a scalar `if`, compares, selects, integer
/// remainders, a bool store: every exactly-rounded op the first lowering handles, masked past `n`.
#[kernel]
pub fn scale_loop<T, const BLOCK: usize>(
    x: Ptr<T>,
    out: Ptr<T>,
    flags: Ptr<i32>,
    n: i32,
    scale: f32,
    rounds: i32,
) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    let v = load(x + offs, mask, 1.0).to::<f32>();
    let mut acc = v;
    for i in 0..rounds {
        acc = maximum(acc * scale + v, v - i.to::<f32>());
    }
    let mut bias = 0.0;
    if rounds > 2 {
        bias = 0.25;
    }
    store(out + offs, where_(acc > 1.0, acc, acc + bias), mask);
    store(flags + offs, (v < 0.0).to::<i32>() * 10 + offs % 3, mask);
}

/// One compiled kernel the GPU test runs: the PTX file `ptx/{name}.ptx` holds it.
#[derive(Debug)]
pub struct Case {
    pub name: String,
    pub kernel: Kernel,
    pub num_warps: u32,
    /// `sm_80` or `sm_90a`.
    pub target: &'static str,
}

pub const TARGETS: [&str; 2] = ["sm_80", "sm_90a"];

/// Every case, in a fixed order: each kernel at a large block (several registers per thread) and
/// a block smaller than its 128 threads (threads hold copies; only the owner stores).
pub fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for target in TARGETS {
        for (dtype, block) in [(F32, 1024), (F16, 1024), (F32, 64), (F16, 64)] {
            let spec = Spec::new().dtype("T", dtype).int("BLOCK", block);
            cases.push(Case {
                name: format!("vector_add_{dtype}_b{block}_w4_{target}"),
                kernel: vector_add::build(&spec).expect("vector_add builds"),
                num_warps: 4,
                target,
            });
        }
        for dtype in [F32, BF16] {
            let spec = Spec::new().dtype("T", dtype).int("BLOCK", 256);
            cases.push(Case {
                name: format!("scale_loop_{dtype}_b256_w4_{target}"),
                kernel: scale_loop::build(&spec).expect("scale_loop builds"),
                num_warps: 4,
                target,
            });
        }
    }
    cases
}
