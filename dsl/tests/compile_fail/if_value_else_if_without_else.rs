use kiln_dsl::kernel;

#[kernel]
fn pick(x: Ptr<f32>, n: i32) {
    let value = if n > 8 {
        1.0
    } else if n > 0 {
        2.0
    };
    store(x, value);
}

fn main() {}
