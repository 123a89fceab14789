use kiln_dsl::kernel;

#[kernel]
fn pick(x: Ptr<f32>, n: i32) {
    let value = if n > 0 { 1.0 };
    store(x, value);
}

fn main() {}
