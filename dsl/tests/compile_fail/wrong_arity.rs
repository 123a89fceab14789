use kiln_dsl::kernel;

#[kernel]
fn copy(x: Ptr<f32>, y: Ptr<f32>) {
    let offs = arange(0, 16);
    let mask = offs < 10;
    store(y + offs, load(x + offs, mask, 0.0, 1.0));
}

fn main() {}
