//! The CUDA tools `kiln sass` and `kiln resources` run on a kernel's PTX: ptxas, then cuobjdump
//! or nvdisasm. kiln ships none of them: they come with the CUDA toolkit, or from PyPI
//! (nvidia-cuda-nvcc, nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm).

use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_dsl::Target;

/// ptxas: `$KILN_PTXAS`, else the first on PATH.
fn ptxas() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("KILN_PTXAS") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "KILN_PTXAS is `{}`, which is no file",
                path.display()
            ))
        };
    }
    on_path("ptxas").ok_or_else(|| {
        "ptxas not found: set KILN_PTXAS to its path or put it on PATH (it comes with the CUDA \
         toolkit, or `pip install nvidia-cuda-nvcc`)"
            .to_string()
    })
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// Runs `tool` with `args`; its output (stdout then stderr), or an error with both.
fn run(tool: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", tool.display()))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    if output.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "{} {} failed ({}):\n{text}",
            tool.display(),
            args.join(" "),
            output.status
        ))
    }
}

/// A directory of its own under the system's temp dir, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Result<Scratch, String> {
        let dir = std::env::temp_dir().join(format!("kiln-cli-{}", std::process::id()));
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// ptxas's report and the cubin, assembled with `-v` for `target` in `scratch`.
fn assemble(
    ptxas: &Path,
    ptx: &str,
    name: &str,
    target: Target,
    scratch: &Scratch,
) -> Result<(String, PathBuf), String> {
    let input = scratch.0.join(format!("{name}.ptx"));
    let cubin = scratch.0.join(format!("{name}.cubin"));
    std::fs::write(&input, ptx).map_err(|e| format!("cannot write {}: {e}", input.display()))?;
    let arch = format!("-arch={target}");
    let report = run(
        ptxas,
        &[
            &arch,
            "-v",
            "--warn-on-spills",
            &input.to_string_lossy(),
            "-o",
            &cubin.to_string_lossy(),
        ],
    )?;
    Ok((report, cubin))
}

/// The SASS of `ptx` for `target`: `cuobjdump -sass` of ptxas's cubin, or `nvdisasm` (with
/// line info) where cuobjdump is missing. Both are looked for on PATH, then beside ptxas, where
/// a CUDA toolkit keeps them.
pub fn sass(ptx: &str, name: &str, target: Target) -> Result<String, String> {
    let ptxas = ptxas()?;
    let beside_ptxas = |tool: &str| {
        let candidate = ptxas.parent()?.join(tool);
        candidate.is_file().then_some(candidate)
    };
    let find = |tool: &str| on_path(tool).or_else(|| beside_ptxas(tool));
    let (disassembler, flags): (PathBuf, &[&str]) = match (find("cuobjdump"), find("nvdisasm")) {
        (Some(cuobjdump), _) => (cuobjdump, &["-sass"]),
        (None, Some(nvdisasm)) => (nvdisasm, &["-c", "-g"]),
        (None, None) => {
            return Err(format!(
                "neither cuobjdump nor nvdisasm found on PATH or beside ptxas ({}): they come \
                 with the CUDA toolkit, or `pip install nvidia-cuda-cuobjdump`",
                ptxas.display()
            ));
        }
    };
    let scratch = Scratch::new()?;
    let (_, cubin) = assemble(&ptxas, ptx, name, target, &scratch)?;
    let mut args = flags.to_vec();
    let cubin = cubin.to_string_lossy();
    args.push(&cubin);
    run(&disassembler, &args)
}

/// What ptxas `-v` says of one kernel.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Resources {
    registers: u64,
    static_shared: u64,
    stack_frame: u64,
    spill_stores: u64,
    spill_loads: u64,
    /// ptxas's warnings (spills, mostly), kept whole.
    warnings: Vec<String>,
}

impl Resources {
    /// Reads `entry`'s lines of a ptxas `-v` report: comma-separated `N label` items such as
    /// `Used 168 registers`, `16384 bytes smem`, `0 bytes spill stores`, under the line that
    /// names the function (`Compiling entry function 'k'`, `Function properties for k`).
    fn parse(report: &str, entry: &str) -> Option<Resources> {
        let mut resources = Resources::default();
        let mut found_registers = false;
        let mut function = "";
        for line in report.lines() {
            if line.contains("warning") {
                resources.warnings.push(line.trim().to_string());
                continue;
            }
            if let Some(name) = line.split("Compiling entry function '").nth(1) {
                function = name.split('\'').next().unwrap_or_default();
            } else if let Some(name) = line.split("Function properties for ").nth(1) {
                function = name.trim();
            }
            if function != entry {
                continue;
            }
            for item in line.split(',') {
                let item = item.rsplit_once(": ").map_or(item, |(_, item)| item).trim();
                let item = item
                    .strip_prefix("Used ")
                    .or_else(|| item.strip_prefix("used "))
                    .unwrap_or(item);
                let Some((count, label)) = item.split_once(' ') else {
                    continue;
                };
                let Ok(count) = count.parse::<u64>() else {
                    continue;
                };
                match label {
                    "registers" => {
                        resources.registers = count;
                        found_registers = true;
                    }
                    "bytes smem" => resources.static_shared = count,
                    "bytes stack frame" => resources.stack_frame = count,
                    "bytes spill stores" => resources.spill_stores = count,
                    "bytes spill loads" => resources.spill_loads = count,
                    _ => {}
                }
            }
        }
        found_registers.then_some(resources)
    }

    /// A short table; `dynamic_shared` is what the launch gives on top of the static shared memory.
    pub fn table(&self, dynamic_shared: u32) -> String {
        let mut table = format!(
            "  registers         {} per thread\n  shared memory     {} bytes static + {dynamic_shared} \
             bytes dynamic (given at launch)\n  spills            {} bytes spill stores, {} bytes \
             spill loads\n  stack frame       {} bytes\n",
            self.registers,
            self.static_shared,
            self.spill_stores,
            self.spill_loads,
            self.stack_frame
        );
        for warning in &self.warnings {
            table.push_str(&format!("  {warning}\n"));
        }
        table
    }
}

/// ptxas's resource report for `ptx` on `target`.
pub fn resources(ptx: &str, name: &str, target: Target) -> Result<Resources, String> {
    let ptxas = ptxas()?;
    let scratch = Scratch::new()?;
    let (report, _) = assemble(&ptxas, ptx, name, target, &scratch)?;
    Resources::parse(&report, name)
        .ok_or_else(|| format!("no register count in ptxas's report:\n{report}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_ptxas_report() {
        let report = "ptxas warning : Registers are spilled to local memory in function 'k', \
            12 bytes spill stores, 16 bytes spill loads\n\
            ptxas info    : 0 bytes gmem\n\
            ptxas info    : Function properties for helper\n\
            \x20   4 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
            ptxas info    : Compiling entry function 'k' for 'sm_80'\n\
            ptxas info    : Function properties for k\n\
            \x20   8 bytes stack frame, 12 bytes spill stores, 16 bytes spill loads\n\
            ptxas info    : Used 168 registers, used 1 barriers, 1024 bytes smem, 464 bytes cmem[0]\n";
        assert_eq!(
            Resources::parse(report, "k"),
            Some(Resources {
                registers: 168,
                static_shared: 1024,
                stack_frame: 8,
                spill_stores: 12,
                spill_loads: 16,
                warnings: vec![report.lines().next().unwrap().to_string()],
            })
        );
        assert_eq!(Resources::parse(report, "helper"), None);
    }
}
