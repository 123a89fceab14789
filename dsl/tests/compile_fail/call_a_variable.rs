use kiln_dsl::kernel;

#[kernel]
fn indexed(x: Ptr<f32>) {
    let offs = arange(0, 16);
    store(x + offs(1), 0.0);
}

fn main() {}
