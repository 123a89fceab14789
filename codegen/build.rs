//! Fingerprints kiln-codegen's source, so that a JIT cache entry made by another version of the
//! compiler is never taken for this one's (`cache::COMPILER_VERSION`).

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::path::{Path, PathBuf};

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("codegen/src is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=src");
    let mut paths = Vec::new();
    files(Path::new("src"), &mut paths);
    paths.sort();
    let mut hasher = DefaultHasher::new();
    for path in paths {
        hasher.write(path.to_string_lossy().as_bytes());
        hasher.write(&std::fs::read(&path).expect("a source file is readable"));
    }
    println!(
        "cargo:rustc-env=KILN_CODEGEN_SOURCE_HASH={:016x}",
        hasher.finish()
    );
}
