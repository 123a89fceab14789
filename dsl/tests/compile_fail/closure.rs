use kiln_dsl::kernel;

#[kernel]
fn apply(x: Ptr<f32>) {
    let double = |v| v * 2.0;
    store(x, double(load(x)));
}

fn main() {}
