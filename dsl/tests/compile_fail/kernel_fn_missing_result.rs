use kiln_dsl::kernel_fn;

#[kernel_fn]
fn clamp(x: Tile<f32>, limit: f32) -> Tile<f32> {
    minimum(x, limit);
}

fn main() {}
