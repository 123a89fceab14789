use kiln_dsl::kernel;

#[kernel]
fn signed(x: Ptr<f32>) {
    let SIGNATURE = load(x);
    store(x, SIGNATURE * 2.0);
}

fn main() {}
