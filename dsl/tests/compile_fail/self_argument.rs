use kiln_dsl::kernel;

struct Kernels;

impl Kernels {
    #[kernel]
    fn method(&self, x: Ptr<f32>) {
        store(x, 0.0);
    }
}

fn main() {}
