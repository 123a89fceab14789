use kiln_dsl::kernel;

#[kernel]
fn scaled<const SCALE: f32>(x: Ptr<f32>) {
    store(x, load(x) * SCALE);
}

fn main() {}
