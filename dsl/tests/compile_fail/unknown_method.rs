use kiln_dsl::kernel;

#[kernel]
fn norm(x: Ptr<f32>) {
    let offs = arange(0, 16);
    let tile = load(x + offs);
    store(x, tile.exp().norm(0));
}

fn main() {}
