use kiln_dsl::kernel;

#[kernel]
fn normalize(x: Ptr<f32>) {
    let offs = arange(0, 16);
    let y = softmax(load(x + offs));
    store(x + offs, y);
}

fn main() {}
