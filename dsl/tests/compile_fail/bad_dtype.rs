use kiln_dsl::kernel;

#[kernel]
fn fill<const BLOCK: usize>(x: Ptr<f32>) {
    let offs = arange(0, BLOCK);
    store(x + offs, zeros([BLOCK], f64));
}

fn main() {}
