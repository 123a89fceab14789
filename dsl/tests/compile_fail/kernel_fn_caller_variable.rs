use kiln_dsl::{kernel, kernel_fn};

// A `#[kernel_fn]` has its own scope: it sees its arguments, not its caller's variables.
#[kernel_fn]
fn shifted(x: Ptr<f32>) -> Tile<f32> {
    load(x + offs)
}

#[kernel]
fn copy_shifted(x: Ptr<f32>, out: Ptr<f32>) {
    let offs = arange(0, 16);
    store(out + offs, shifted(x));
}

fn main() {}
