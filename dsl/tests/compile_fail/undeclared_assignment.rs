use kiln_dsl::kernel;

#[kernel]
fn accumulate(x: Ptr<f32>, n: i32) {
    for i in 0..n {
        total = load(x + i);
    }
}

fn main() {}
