//! PTX modules loaded once per context, and launches on raw device pointers and streams: the
//! path the prebuilt kernels take from the C interface and the Rust API. The driver compiles PTX
//! to SASS when a module loads (tens of milliseconds for an attention kernel), so each
//! (context, module) pair loads once per process and every later launch finds it here.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{result, sys};
use kiln_dsl::{DType, TensorMapSpec};

use crate::context::{Context, RawStream, programmatic_launches};
use crate::device::{jit_error_log, jit_load, performance_warnings};
use crate::error::{c_text, driver_message};
use crate::tensor_map::{TensorMap, encode_all, specs_in_ptx};
use crate::{ParamType, RuntimeError};

type Result<T> = std::result::Result<T, RuntimeError>;

/// What a module to load is: its PTX, the entry to launch and how.
#[derive(Clone, Copy, Debug)]
pub struct ModuleSource<'a> {
    /// The cache key within a context: a name that identifies the PTX (a specialisation name).
    pub name: &'a str,
    pub ptx: &'a str,
    /// The kernel's entry name in the PTX.
    pub entry: &'a str,
    /// The entry's parameters, which every launch is checked against.
    pub params: &'a [ParamType],
    /// Dynamic shared memory every launch gives it (opted into at load when above 48 KiB).
    pub shared_bytes: u32,
    /// Compiled afresh (past the driver's JIT cache) and ptxas's performance warnings kept
    /// ([`LoadedKernel::performance_warnings`]): what `kiln tune` reports of a candidate.
    pub report: bool,
}

/// A kernel loaded in one context, ready to launch.
#[derive(Debug)]
pub struct LoadedKernel {
    name: String,
    context: Context,
    function: usize,
    params: Vec<ParamType>,
    shared_bytes: u32,
    /// The tensor maps every launch encodes and passes after the arguments (its PTX's).
    tensor_maps: Vec<TensorMapSpec>,
    /// What ptxas said costs it speed, where its source asked ([`ModuleSource::report`]).
    warnings: Vec<String>,
    /// Whether it waits for the kernel before it at its start ([`waits_for_prior_grids`]), and
    /// so launches as that kernel's programmatic dependent.
    waits_for_prior_grids: bool,
}

/// Loaded kernels by (context, name). Modules are never unloaded: the prebuilt set is bounded
/// (one module per specialisation a process uses).
#[derive(Debug, Default)]
pub struct ModuleCache {
    loaded: Mutex<HashMap<(Context, String), Loaded>>,
}

/// A loaded kernel and a hash of the PTX it came from.
#[derive(Debug)]
struct Loaded {
    kernel: Arc<LoadedKernel>,
    ptx_hash: u64,
}

fn ptx_hash(ptx: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    ptx.hash(&mut hasher);
    hasher.finish()
}

impl ModuleCache {
    pub fn new() -> ModuleCache {
        ModuleCache::default()
    }

    /// The kernel called `name` in `context`, if loaded.
    pub fn get(&self, context: Context, name: &str) -> Option<Arc<LoadedKernel>> {
        let loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        loaded
            .get(&(context, name.to_string()))
            .map(|l| l.kernel.clone())
    }

    /// The kernel of `source` in `context`, loading its module on first use. A name already
    /// loaded from other PTX is an error: a cached module must never stand in for another.
    pub fn get_or_load(
        &self,
        context: Context,
        source: ModuleSource<'_>,
    ) -> Result<Arc<LoadedKernel>> {
        let key = (context, source.name.to_string());
        // A poisoned lock only means another thread panicked while holding it; the map itself
        // is never left half-updated (one insert), so it is still sound to use.
        let mut loaded = self.loaded.lock().unwrap_or_else(|e| e.into_inner());
        let hash = ptx_hash(source.ptx);
        if let Some(hit) = loaded.get(&key) {
            // Compared by hash, not by where the text is: a heap string freed and another
            // allocated at its address may hold other PTX.
            if hit.ptx_hash != hash {
                return Err(RuntimeError::Launch {
                    kernel: source.name.to_string(),
                    message: "a module of this name is loaded already, from other PTX; a module \
                              name must identify its PTX"
                        .to_string(),
                });
            }
            return Ok(hit.kernel.clone());
        }
        let kernel = Arc::new(context.with_current(|| load(context, source))?);
        loaded.insert(
            key,
            Loaded {
                kernel: kernel.clone(),
                ptx_hash: hash,
            },
        );
        Ok(kernel)
    }
}

fn load(context: Context, source: ModuleSource<'_>) -> Result<LoadedKernel> {
    let action = |what: &str| format!("{what} module `{}`", source.name);
    let ptx = c_text(source.ptx, "the PTX", || action("loading"))?;
    let (module, warnings) = if source.report {
        // `jit_load` refuses only text with a NUL byte, which `c_text` has refused.
        let load = jit_load(source.ptx, true).ok_or_else(|| RuntimeError::Driver {
            action: action("loading"),
            message: "the PTX holds a NUL byte".to_string(),
        })?;
        let module = load.module.ok_or_else(|| RuntimeError::Driver {
            action: action("loading"),
            message: format!("the driver refused the PTX; jit log:\n{}", load.error),
        })?;
        (module, performance_warnings(&load.info))
    } else {
        // Safety: `ptx` is NUL-terminated PTX text, alive for the call.
        let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }.map_err(|e| {
            let mut message = driver_message(e);
            if let Some(log) = jit_error_log(source.ptx) {
                message.push_str(&format!("; jit log:\n{log}"));
            }
            RuntimeError::Driver {
                action: action("loading"),
                message,
            }
        })?;
        (module, Vec::new())
    };
    // A module whose kernel cannot be made ready is unloaded again: a caller that retries must
    // not leak one a try.
    let ready = ready(context, source, module, warnings);
    if ready.is_err() {
        // Safety: `module` was loaded above and nothing of it is kept.
        let _ = unsafe { result::module::unload(module) };
    }
    ready
}

/// The kernel of `source` in `module`, just loaded: its entry found and opted into the dynamic
/// shared memory it takes.
fn ready(
    context: Context,
    source: ModuleSource<'_>,
    module: sys::CUmodule,
    warnings: Vec<String>,
) -> Result<LoadedKernel> {
    let action = |what: &str| format!("{what} module `{}`", source.name);
    let entry = c_text(source.entry, "the entry name", || {
        action("finding the entry of")
    })?;
    // Safety: `module` was just loaded and is unloaded only if this fails.
    let function = unsafe { result::module::get_function(module, entry) }.map_err(|e| {
        RuntimeError::driver(
            format!(
                "finding kernel `{}` in module `{}`",
                source.entry, source.name
            ),
            e,
        )
    })?;
    if source.shared_bytes > 48 * 1024 {
        // Safety: `function` is valid; the value is a byte count the kernel was compiled for.
        unsafe {
            result::function::set_function_attribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                source.shared_bytes as i32,
            )
        }
        .map_err(|e| {
            RuntimeError::driver(
                format!(
                    "opting `{}` into {} bytes of dynamic shared memory",
                    source.name, source.shared_bytes
                ),
                e,
            )
        })?;
    }
    Ok(LoadedKernel {
        name: source.name.to_string(),
        context,
        function: function as usize,
        params: source.params.to_vec(),
        shared_bytes: source.shared_bytes,
        tensor_maps: specs_in_ptx(source.name, source.ptx)?,
        warnings,
        waits_for_prior_grids: waits_for_prior_grids(source.ptx),
    })
}

/// `cuLaunchKernelEx` with programmatic stream serialization: the kernel's programs may start
/// before the kernel before it on `stream` ends, and must wait for that kernel before they touch
/// memory ([`waits_for_prior_grids`]).
///
/// # Safety
/// As [`result::launch_kernel`]'s: `function` takes the parameters `params` points to.
unsafe fn launch_programmatic(
    function: sys::CUfunction,
    [x, y, z]: [u32; 3],
    threads: u32,
    shared_bytes: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> std::result::Result<(), cudarc::driver::DriverError> {
    // Safety: a union of plain integers, all zero before the one field set.
    let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
    value.programmaticStreamSerializationAllowed = 1;
    let mut attribute = sys::CUlaunchAttribute {
        id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
        pad: [0; 4],
        value,
    };
    let config = sys::CUlaunchConfig {
        gridDimX: x,
        gridDimY: y,
        gridDimZ: z,
        blockDimX: threads,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared_bytes,
        hStream: stream,
        attrs: &mut attribute,
        numAttrs: 1,
    };
    // Safety: as the caller vouches; `config` and its attribute live through the call.
    unsafe { sys::cuLaunchKernelEx(&config, function, params.as_mut_ptr(), std::ptr::null_mut()) }
        .result()
}

/// Whether `ptx` waits for the kernels it depends on (`griddepcontrol.wait`, the DSL's
/// `wait_for_prior_grids()`, which kiln-codegen puts before any memory access): such a kernel
/// may start while the kernel before it on its stream still runs.
pub fn waits_for_prior_grids(ptx: &str) -> bool {
    ptx.lines()
        .any(|line| line.trim_start().starts_with("griddepcontrol.wait"))
}

/// One argument of a raw launch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RawArg {
    /// A device address.
    Ptr(u64),
    I32(i32),
    I64(i64),
    F32(f32),
}

impl LoadedKernel {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameters every launch is checked against.
    pub fn params(&self) -> &[ParamType] {
        &self.params
    }

    /// What ptxas said of its PTX that costs speed (`wgmma`s serialized, other "Potential
    /// Performance Loss" notes), where it was loaded to report them; else none.
    pub fn performance_warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Queues the kernel on `stream` (of this kernel's context; null: the legacy default
    /// stream) over `grid` programs of `threads` threads.
    ///
    /// # Safety
    /// Every pointer must address device memory of this context that holds whatever the kernel
    /// reads and writes at these arguments, until the launch completes.
    pub unsafe fn launch(
        &self,
        stream: RawStream,
        grid: [u32; 3],
        threads: u32,
        args: &[RawArg],
    ) -> Result<()> {
        self.check_args(args)?;
        let mut maps = encode_all(
            &self.name,
            self.context,
            &self.tensor_maps,
            |i| match args[i] {
                RawArg::Ptr(address) => address,
                _ => 0,
            },
            |i| match args[i] {
                RawArg::I32(v) => Some(v as i64),
                RawArg::I64(v) => Some(v),
                RawArg::Ptr(_) | RawArg::F32(_) => None,
            },
        )?;
        let mut values: Vec<RawArg> = args.to_vec();
        let mut pointers: Vec<*mut c_void> = values
            .iter_mut()
            .map(|arg| match arg {
                RawArg::Ptr(v) => (v as *mut u64).cast(),
                RawArg::I32(v) => (v as *mut i32).cast(),
                RawArg::I64(v) => (v as *mut i64).cast(),
                RawArg::F32(v) => (v as *mut f32).cast(),
            })
            .collect();
        pointers.extend(
            maps.iter_mut()
                .map(|m| (m as *mut TensorMap).cast::<c_void>()),
        );
        let programmatic = self.waits_for_prior_grids && programmatic_launches()?;
        self.context.with_current(|| {
            let [x, y, z] = grid;
            let function = self.function as sys::CUfunction;
            let stream = stream as sys::CUstream;
            // Safety: the arguments match the parameters (checked above) and live in `values`
            // until the call returns (the driver copies them); the caller vouches for memory.
            unsafe {
                if programmatic {
                    launch_programmatic(
                        function,
                        grid,
                        threads,
                        self.shared_bytes,
                        stream,
                        &mut pointers,
                    )
                } else {
                    result::launch_kernel(
                        function,
                        (x, y, z),
                        (threads, 1, 1),
                        self.shared_bytes,
                        stream,
                        &mut pointers,
                    )
                }
            }
            .map_err(|e| RuntimeError::driver(format!("launching `{}`", self.name), e))
        })
    }

    fn check_args(&self, args: &[RawArg]) -> Result<()> {
        let error = |message: String| RuntimeError::Launch {
            kernel: self.name.clone(),
            message,
        };
        if args.len() != self.params.len() {
            return Err(error(format!(
                "it takes {} arguments, got {}",
                self.params.len(),
                args.len()
            )));
        }
        for (i, (arg, param)) in args.iter().zip(&self.params).enumerate() {
            let fits = matches!(
                (arg, param),
                (RawArg::Ptr(_), ParamType::Ptr(_))
                    | (RawArg::I32(_), ParamType::Scalar(DType::I32))
                    | (RawArg::I64(_), ParamType::Scalar(DType::I64))
                    | (RawArg::F32(_), ParamType::Scalar(DType::F32))
            );
            if !fits {
                return Err(error(format!(
                    "argument {i} expects {param:?}, got {arg:?}"
                )));
            }
        }
        Ok(())
    }
}
