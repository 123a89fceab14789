use kiln_dsl::kernel;

#[kernel(verbose)]
fn copy(x: Ptr<f32>) {
    store(x, load(x));
}

fn main() {}
