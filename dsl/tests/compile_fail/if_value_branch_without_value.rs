use kiln_dsl::kernel;

#[kernel]
fn pick(x: Ptr<f32>, n: i32) {
    let mut y = 0.0;
    let value = if n > 0 {
        y = 1.0;
    } else {
        2.0
    };
    store(x, value + y);
}

fn main() {}
