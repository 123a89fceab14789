use kiln_dsl::kernel;

#[kernel]
fn running(x: Ptr<f32>, n: i32) {
    let acc = 0.0;
    for i in 0..n {
        acc = acc + load(x + i);
    }
    store(x, acc);
}

fn main() {}
