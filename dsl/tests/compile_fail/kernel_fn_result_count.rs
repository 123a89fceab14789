use kiln_dsl::{kernel, kernel_fn};

#[kernel_fn]
fn min_max(a: Tile, b: Tile) -> (Tile, Tile) {
    (minimum(a, b), maximum(a, b))
}

#[kernel_fn]
fn write(out: Ptr<f32>, x: Tile<f32>) {
    store(out + arange(0, 16), x);
}

#[kernel]
fn sort_pairs(x: Ptr<f32>, y: Ptr<f32>) {
    let offs = arange(0, 16);
    let low = min_max(load(x + offs), load(y + offs));
    let (a, b) = write(x, low);
}

fn main() {}
