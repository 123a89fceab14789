//! The typed `launch` function `#[kernel]` generates, on the CPU interpreter: arguments typed at
//! compile time where Rust can (scalars; see `compile_fail/launch_argument_types.rs`), buffers'
//! dtypes checked at launch against the spec.

use kiln_dsl::prelude::*;
use kiln_dsl::{Grid, HostBuffer, Interpreter};

/// `out = x * factor + offset`, where `offset` has the kernel's element type.
#[kernel]
fn scale<T, const BLOCK: usize>(x: Ptr<T>, out: Ptr<T>, n: i32, factor: f32, offset: T) {
    let offs = program_id(0) * BLOCK + arange(0, BLOCK);
    let mask = offs < n;
    store(out + offs, load(x + offs, mask) * factor + offset, mask);
}

#[test]
fn a_typed_launch_runs_on_the_interpreter() {
    let spec = Spec::new().dtype("T", F32).int("BLOCK", 4);
    let x = HostBuffer::from_f32(F32, &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let out = HostBuffer::poisoned(F32, 5);
    scale::launch(
        &Interpreter,
        &spec,
        Grid::new(2, 1, 1),
        &x,
        &out,
        5,
        0.5,
        1.0f32,
    )
    .unwrap();
    assert_eq!(out.to_f32(), [1.5, 2.0, 2.5, 3.0, 3.5]);
}

#[test]
fn a_buffer_of_another_dtype_is_refused_at_launch() {
    let spec = Spec::new().dtype("T", F16).int("BLOCK", 4);
    let x = HostBuffer::from_f32(F32, &[1.0; 4]);
    let out = HostBuffer::poisoned(F16, 4);
    let err = scale::launch(
        &Interpreter,
        &spec,
        Grid::new(1, 1, 1),
        &x,
        &out,
        4,
        0.5,
        0.0f32,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "cannot launch `scale`: argument `x` is ptr<f16>, got a buffer of f32"
    );
}
