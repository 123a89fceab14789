use kiln_dsl::kernel;

#[kernel]
fn typed(x: Ptr<f32>) {
    let value: f32 = load(x);
    store(x, value);
}

fn main() {}
