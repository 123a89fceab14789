//! kiln-tests: integration tests that cross crates (the DSL, the kernels, the facade), and the
//! one helper they share: golden-text comparison with a line diff.

/// Compares `actual` with the golden `expected` text, printing a line diff on mismatch.
#[track_caller]
pub fn check_text(actual: &str, expected: &str) {
    if actual.trim_end() == expected.trim_end() {
        return;
    }
    let mut diff = String::new();
    let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
    for i in 0..a.len().max(e.len()) {
        match (e.get(i), a.get(i)) {
            (Some(x), Some(y)) if x == y => diff.push_str(&format!("  {x}\n")),
            (x, y) => {
                if let Some(x) = x {
                    diff.push_str(&format!("- {x}\n"));
                }
                if let Some(y) = y {
                    diff.push_str(&format!("+ {y}\n"));
                }
            }
        }
    }
    panic!("text differs from the golden text (- expected, + actual):\n{diff}");
}
