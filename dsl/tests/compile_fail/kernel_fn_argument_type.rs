use kiln_dsl::kernel_fn;

#[kernel_fn]
fn total(values: Vec<f32>) -> f32 {
    values.sum(0)
}

fn main() {}
