use kiln_dsl::{kernel, kernel_fn};

#[kernel_fn]
fn axpy(a: f32, x: Tile, y: Tile) -> Tile {
    a * x + y
}

#[kernel_fn]
fn rows<const BLOCK: usize>(start: i32) -> Tile<i32> {
    start * BLOCK + arange(0, BLOCK)
}

#[kernel]
fn saxpy(x: Ptr<f32>, y: Ptr<f32>, a: f32) {
    let offs = rows::<16, 2>(program_id(0));
    let sum = axpy(a, load(x + offs));
    store(y + offs, sum);
}

fn main() {}
