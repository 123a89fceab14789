use kiln_dsl::prelude::*;
use kiln_dsl::{Grid, HostBuffer, Interpreter};

#[kernel]
fn scale<T, const BLOCK: usize>(x: Ptr<T>, n: i32, factor: f32) {
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs, offs < n) * factor, offs < n);
}

fn main() {
    let x = HostBuffer::zeros(F16, 4);
    let spec = Spec::new().dtype("T", F16).int("BLOCK", 4);
    // `n` is an i32 and `factor` an f32: a float for `n` does not compile.
    let _ = scale::launch(&Interpreter, &spec, Grid::new(1, 1, 1), &x, 4.0, 0.5);
}
