use kiln_dsl::kernel_fn;

#[kernel_fn]
fn exp(x: Tile<f32>) -> Tile<f32> {
    exp2(x * f32::consts::LOG2_E)
}

fn main() {}
