//! Compiled kernels on disk, for JIT compilation: `$KILN_CACHE_DIR` (default `~/.cache/kiln`)
//! holds one PTX file per (kernel IR with its source locations, compile options, compiler
//! version), named by a 128-bit hash of those. A file is used only if its header names that same
//! key and its checksum matches its PTX; anything else (absent, truncated, corrupt, from another
//! compiler) is compiled again and rewritten. `KILN_DUMP=<dir>` also writes every stage of every
//! kernel compiled, under `<dir>/<kernel>-<key>/`, and compiles even when the cache has the PTX.

use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;
use std::path::{Path, PathBuf};

use kiln_dsl::Kernel;

use crate::{CodegenError, CompileOptions, Keep, Stage, compile_keeping};

/// This compiler: kiln-codegen's version and a fingerprint of its source.
pub const COMPILER_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "+",
    env!("KILN_CODEGEN_SOURCE_HASH")
);

/// The first line of a cache file, before its key and checksum.
const HEADER: &str = "// kiln-cache v1";

/// Where the JIT keeps compiled kernels: `$KILN_CACHE_DIR`, else `~/.cache/kiln`; `None` when
/// neither is set (no home directory).
pub fn default_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("KILN_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("kiln"))
}

/// `KILN_DUMP`, where every stage of every compiled kernel goes.
pub fn dump_dir() -> Option<PathBuf> {
    std::env::var_os("KILN_DUMP").map(PathBuf::from)
}

/// A kernel's PTX, from the cache or compiled now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPtx {
    /// The cache key: 32 hex digits.
    pub key: String,
    pub ptx: String,
    /// Dynamic shared memory a launch must give.
    pub shared_bytes: u32,
    /// Whether the cache had it.
    pub hit: bool,
}

/// The cache key of `kernel` compiled with `options` by this compiler.
pub fn key(kernel: &Kernel, options: &CompileOptions) -> String {
    // The Debug form holds the whole IR with every op's source location (the PTX's `.loc`
    // lines depend on them); both halves hash everything, seeded apart.
    let text = format!("{kernel:?}\n{options:?}\n{COMPILER_VERSION}");
    let half = |seed: &[u8]| {
        let mut hasher = DefaultHasher::new();
        hasher.write(seed);
        hasher.write(text.as_bytes());
        hasher.finish()
    };
    format!("{:016x}{:016x}", half(b"kiln-a"), half(b"kiln-b"))
}

/// `kernel`'s PTX for `options`: from the cache in `dir` when it holds a sound entry, else
/// compiled (and written there, and every stage written under `dump`).
pub fn compile_cached(
    kernel: &Kernel,
    options: &CompileOptions,
    dir: Option<&Path>,
    dump: Option<&Path>,
) -> Result<CachedPtx, CodegenError> {
    let key = key(kernel, options);
    if dump.is_none()
        && let Some((ptx, shared_bytes)) =
            dir.and_then(|dir| read(&dir.join(file_name(&key)), &key))
    {
        return Ok(CachedPtx {
            key,
            ptx,
            shared_bytes,
            hit: true,
        });
    }
    let keep = if dump.is_some() {
        Keep::EveryStage
    } else {
        Keep::Ptx
    };
    let compiled = compile_keeping(kernel, options, keep)?;
    if let Some(dump) = dump {
        let folder = dump.join(format!("{}-{}", kernel.name(), &key[..16]));
        write_stages(&folder, &compiled).map_err(|e| CodegenError::Options {
            message: format!("KILN_DUMP: cannot write {}: {e}", folder.display()),
        })?;
    }
    let shared_bytes = compiled.dynamic_shared_bytes();
    if let Some(dir) = dir {
        // A cache that cannot be written only costs the next process a compile.
        let _ = write(dir, &key, compiled.ptx(), shared_bytes);
    }
    Ok(CachedPtx {
        key,
        ptx: compiled.ptx().to_string(),
        shared_bytes,
        hit: false,
    })
}

fn file_name(key: &str) -> String {
    format!("{key}.ptx")
}

/// A checksum of a cache file's PTX.
fn checksum(ptx: &str) -> String {
    let mut hasher = DefaultHasher::new();
    hasher.write(ptx.as_bytes());
    format!("{:016x}", hasher.finish())
}

/// The value of `name=value`.
fn field<'a>(field: Option<&'a str>, name: &str) -> Option<&'a str> {
    field?.strip_prefix(name)?.strip_prefix('=')
}

/// The PTX and shared bytes of a sound cache file for `key`; `None` for anything else.
fn read(path: &Path, key: &str) -> Option<(String, u32)> {
    let text = std::fs::read_to_string(path).ok()?;
    let (header, ptx) = text.split_once('\n')?;
    let mut fields = header.strip_prefix(HEADER)?.split_whitespace();
    let (file_key, shared, sum) = (
        field(fields.next(), "key")?,
        field(fields.next(), "shared")?,
        field(fields.next(), "checksum")?,
    );
    if file_key != key || sum != checksum(ptx) || fields.next().is_some() {
        return None;
    }
    Some((ptx.to_string(), shared.parse().ok()?))
}

/// Writes a cache file whole or not at all: to a temporary name, then renamed over.
fn write(dir: &Path, key: &str, ptx: &str, shared_bytes: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{key}.{}.tmp", std::process::id()));
    let header = format!(
        "{HEADER} key={key} shared={shared_bytes} checksum={}\n",
        checksum(ptx)
    );
    std::fs::write(&tmp, header + ptx)?;
    std::fs::rename(&tmp, dir.join(file_name(key)))
}

/// Every stage's text of `compiled` (compiled keeping [`Keep::EveryStage`]).
fn write_stages(folder: &Path, compiled: &crate::Compiled) -> std::io::Result<()> {
    std::fs::create_dir_all(folder)?;
    for stage in Stage::ALL {
        let ext = if stage == Stage::Ptx { "ptx" } else { "txt" };
        let text = compiled.stage(stage).map_err(std::io::Error::other)?;
        std::fs::write(folder.join(format!("{}.{ext}", stage.name())), text)?;
    }
    Ok(())
}
