use kiln_dsl::kernel;

#[kernel]
fn count(x: Ptr<i32>, n: i32) {
    let mut i = 0;
    while i < n {
        i += 1;
    }
    store(x, i);
}

fn main() {}
