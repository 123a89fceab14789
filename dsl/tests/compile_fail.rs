//! Misuses of `#[kiln_dsl::kernel]` and `#[kiln_dsl::kernel_fn]` that must not compile, each with
//! the error it must give (`compile_fail/*.stderr`; regenerate with `TRYBUILD=overwrite` and read
//! the diff).

#[test]
fn misuse_is_a_compile_error() {
    trybuild::TestCases::new().compile_fail("tests/compile_fail/*.rs");
}
