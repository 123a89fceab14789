use kiln_dsl::kernel;

#[kernel]
fn sum(x: Ptr<f32>) -> f32 {
    load(x)
}

fn main() {}
