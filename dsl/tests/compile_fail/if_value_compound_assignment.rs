use kiln_dsl::kernel;

#[kernel]
fn accumulate(x: Ptr<f32>, n: i32) {
    let mut total = load(x);
    total += if n > 0 {
        total = total * 2.0;
        1.0
    } else {
        0.0
    };
    store(x, total);
}

fn main() {}
