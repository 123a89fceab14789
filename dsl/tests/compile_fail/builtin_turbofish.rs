use kiln_dsl::kernel;

#[kernel]
fn widen(x: Ptr<f16>, out: Ptr<f32>) {
    let offs = arange(0, 16);
    store(out + offs, load::<f32>(x + offs));
}

fn main() {}
