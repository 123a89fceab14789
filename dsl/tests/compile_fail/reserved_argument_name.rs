use kiln_dsl::kernel;

#[kernel]
fn fill<const BLOCK: usize>(x: Ptr<f32>, grid: i32) {
    let offs = arange(0, BLOCK);
    store(x + offs, zeros([BLOCK], f32), offs < grid);
}

fn main() {}
