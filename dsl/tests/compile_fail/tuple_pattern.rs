use kiln_dsl::kernel;

#[kernel]
fn swap(x: Ptr<f32>, y: Ptr<f32>) {
    let (a, b) = (load(y), load(x));
    store(x, a);
    store(y, b);
}

fn main() {}
