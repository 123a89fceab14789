use kiln_dsl::kernel;

#[kernel]
fn scale(x: Ptr<f32>, factors: &[f32]) {
    store(x, load(x));
}

fn main() {}
