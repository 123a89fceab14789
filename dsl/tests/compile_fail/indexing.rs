use kiln_dsl::kernel;

#[kernel]
fn first<const BLOCK: usize>(x: Ptr<f32>) {
    let tile = load(x + arange(0, BLOCK));
    store(x, tile[0]);
}

fn main() {}
