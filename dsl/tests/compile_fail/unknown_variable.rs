use kiln_dsl::kernel;

#[kernel]
fn shift(x: Ptr<f32>) {
    let offs = arange(0, 16);
    store(x + offs + offset, 1.0);
}

fn main() {}
