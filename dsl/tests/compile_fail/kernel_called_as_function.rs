use kiln_dsl::kernel;

#[kernel]
fn scale(x: Ptr<f32>) {
    let offs = arange(0, 16);
    store(x + offs, load(x + offs) * 2.0);
}

// Only a `#[kernel_fn]` can be called from a kernel: `scale` is a kernel.
#[kernel]
fn scale_twice(x: Ptr<f32>) {
    scale(x);
    scale(x);
}

fn main() {}
