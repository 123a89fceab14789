//! A GPU as kiln uses it: one context, one stream, modules loaded from PTX text.

use std::ffi::{CString, c_void};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, result, sys};
use cudarc::nvrtc::Ptx;

use crate::RuntimeError;
use crate::context::{Context, RawStream};
use crate::error::{c_text, driver_message};
use crate::launch::ParamType;
use crate::tensor_map::specs_in_ptx;
use kiln_dsl::TensorMapSpec;

type Result<T> = std::result::Result<T, RuntimeError>;

/// A device's primary context and a stream on it; everything kiln-runtime does goes through one.
#[derive(Debug, Clone)]
pub struct Device {
    pub(crate) context: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// Its context's unique id ([`Context`]).
    unique: u64,
}

impl Device {
    /// The device of the context current on this thread (so that kiln shares a GPU with a host
    /// program such as PyTorch), else device 0. kiln uses that device's primary context, as the
    /// CUDA runtime does, and opening it makes that context current on this thread (cudarc sets
    /// it, `cuCtxSetCurrent`), in place of any other context a host program had current there.
    pub fn current_or_default() -> Result<Device> {
        crate::context::init()?;
        let ordinal = current_device_ordinal()?.unwrap_or(0);
        let context = CudaContext::new(ordinal).map_err(|e| {
            RuntimeError::driver(
                format!("opening the primary context of device {ordinal}"),
                e,
            )
        })?;
        let stream = context.default_stream();
        // Safety: the context was just opened.
        let unique = unsafe { crate::context::unique_of(context.cu_ctx()) }?;
        Ok(Device {
            context,
            stream,
            unique,
        })
    }

    pub fn ordinal(&self) -> usize {
        self.context.ordinal()
    }

    pub fn name(&self) -> Result<String> {
        self.context
            .name()
            .map_err(|e| RuntimeError::driver("reading the device name", e))
    }

    /// `(major, minor)`: `(9, 0)` on an H100 or H200.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        self.context
            .compute_capability()
            .map_err(|e| RuntimeError::driver("reading the compute capability", e))
    }

    /// Loads a module from PTX text; a PTX the driver refuses comes back with its JIT log.
    pub fn load_module(&self, name: &str, ptx: &str) -> Result<Module> {
        c_text(ptx, "the PTX", || format!("loading module `{name}`"))?;
        let module = self.context.load_module(Ptx::from_src(ptx)).map_err(|e| {
            let mut message = driver_message(e);
            if let Some(log) = jit_error_log(ptx) {
                message.push_str(&format!("; jit log:\n{log}"));
            }
            RuntimeError::Driver {
                action: format!("loading module `{name}`"),
                message,
            }
        })?;
        Ok(Module {
            name: name.to_string(),
            module,
            tensor_maps: specs_in_ptx(name, ptx)?,
            context: self.context(),
        })
    }

    /// The driver context this device's work runs in.
    pub fn context(&self) -> Context {
        Context::from_raw(self.context.cu_ctx(), self.context.cu_device(), self.unique)
    }

    /// This device's stream as the driver knows it, for raw launches.
    pub fn raw_stream(&self) -> RawStream {
        self.stream.cu_stream().cast()
    }

    /// Waits for everything queued on this device's stream; a fault in a kernel surfaces here.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| RuntimeError::driver("synchronizing", e))
    }
}

/// The ordinal of the device whose context is current on this thread, if one is.
fn current_device_ordinal() -> Result<Option<usize>> {
    let current = result::ctx::get_current()
        .map_err(|e| RuntimeError::driver("reading the current context", e))?;
    if current.is_none() {
        return Ok(None);
    }
    let mut device: sys::CUdevice = 0;
    // Safety: a context is current, and `device` is a valid place for the answer.
    unsafe { sys::cuCtxGetDevice(&mut device) }
        .result()
        .map_err(|e| RuntimeError::driver("reading the current context's device", e))?;
    // A device handle is not promised to equal its ordinal: look it up.
    let count =
        result::device::get_count().map_err(|e| RuntimeError::driver("counting devices", e))?;
    for ordinal in 0..count {
        let handle =
            result::device::get(ordinal).map_err(|e| RuntimeError::driver("listing devices", e))?;
        if handle == device {
            return Ok(Some(ordinal as usize));
        }
    }
    Ok(None)
}

/// Loads `ptx` again, asking the JIT for its error log: only called after a load failed.
pub(crate) fn jit_error_log(ptx: &str) -> Option<String> {
    let load = jit_load(ptx, false)?;
    if let Some(module) = load.module {
        // Safety: the module was just loaded and nothing else refers to it.
        let _ = unsafe { sys::cuModuleUnload(module) };
        return None;
    }
    Some(load.error)
}

/// A module the JIT compiled, with its logs.
pub(crate) struct JitLoad {
    /// The module, where the driver took the PTX; the caller owns it.
    pub module: Option<sys::CUmodule>,
    /// ptxas's information (verbose) and its errors.
    pub info: String,
    pub error: String,
}

/// Loads `ptx` in the current context with the JIT's logs; `None` if the PTX holds a NUL.
/// `afresh`: past the driver's JIT cache (on disk, across processes), where a hit would run no
/// ptxas and log nothing: the text gets a comment of its own, unique to this load, so that its
/// key is new (no JIT option turns that cache off for one load; `CU_JIT_CACHE_MODE` is the L1
/// caching of global loads, `-dlcm`).
pub(crate) fn jit_load(ptx: &str, afresh: bool) -> Option<JitLoad> {
    let source = if afresh {
        static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let load = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        CString::new(format!(
            "{ptx}\n// kiln: compiled afresh for ptxas's log ({}, {now}, {load})\n",
            std::process::id()
        ))
    } else {
        CString::new(ptx)
    }
    .ok()?;
    let mut info = vec![0u8; 1 << 16];
    let mut error = vec![0u8; 1 << 14];
    let mut options = [
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        sys::CUjit_option::CU_JIT_LOG_VERBOSE,
    ];
    // The driver reads a size, a flag or a mode passed as the option's pointer-sized value.
    let value = std::ptr::without_provenance_mut::<c_void>;
    let mut values: [*mut c_void; 5] = [
        info.as_mut_ptr().cast(),
        value(info.len()),
        error.as_mut_ptr().cast(),
        value(error.len()),
        value(1),
    ];
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // Safety: `source` is NUL-terminated PTX; the options name live buffers and their sizes.
    let status = unsafe {
        sys::cuModuleLoadDataEx(
            &mut module,
            source.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    let text = |log: &[u8]| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        String::from_utf8_lossy(&log[..end]).into_owned()
    };
    Some(JitLoad {
        module: status.result().is_ok().then_some(module),
        info: text(&info),
        error: text(&error),
    })
}

/// The lines of a ptxas log (the driver's, or `ptxas -v`'s) that say the code will run slower
/// than written: `wgmma`s serialized (a warning where the code needs it, information where
/// registers are short: C7512) and other "Potential Performance Loss" notes.
pub fn performance_warnings(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| {
            l.contains("Potential Performance Loss")
                || (l.contains("wgmma") && (l.contains("warning") || l.contains("serialized")))
        })
        .map(|l| l.trim().to_string())
        .collect()
}

/// A loaded PTX module.
#[derive(Debug, Clone)]
pub struct Module {
    name: String,
    module: Arc<CudaModule>,
    /// The tensor maps its kernel takes after its parameters (the PTX's).
    tensor_maps: Vec<TensorMapSpec>,
    context: Context,
}

impl Module {
    /// The kernel `name` of this module, which takes parameters as `params` says.
    pub fn function(&self, name: &str, params: Vec<ParamType>) -> Result<Function> {
        c_text(name, "the entry name", || {
            format!("finding kernel `{name}` in module `{}`", self.name)
        })?;
        let function = self.module.load_function(name).map_err(|e| {
            RuntimeError::driver(
                format!("finding kernel `{name}` in module `{}`", self.name),
                e,
            )
        })?;
        Ok(Function {
            name: name.to_string(),
            params,
            function,
            tensor_maps: self.tensor_maps.clone(),
            context: self.context,
        })
    }
}

/// A kernel entry of a loaded module, with the parameter types launches are checked against.
#[derive(Debug, Clone)]
pub struct Function {
    pub(crate) name: String,
    pub(crate) params: Vec<ParamType>,
    pub(crate) function: CudaFunction,
    /// What each launch encodes and passes after the arguments.
    pub(crate) tensor_maps: Vec<TensorMapSpec>,
    pub(crate) context: Context,
}

impl Function {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn params(&self) -> &[ParamType] {
        &self.params
    }

    /// Lets launches of this function give it up to `bytes` of dynamic shared memory
    /// (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): a kernel that needs more than the
    /// 48 KiB a block gets by default must opt in before its first launch.
    pub fn set_max_dynamic_shared_bytes(&self, bytes: u32) -> Result<()> {
        let bytes = i32::try_from(bytes).map_err(|_| RuntimeError::Launch {
            kernel: self.name.clone(),
            message: format!("{bytes} bytes of dynamic shared memory"),
        })?;
        self.function
            .set_attribute(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
            .map_err(|e| {
                RuntimeError::driver(
                    format!(
                        "opting `{}` into {bytes} bytes of dynamic shared memory",
                        self.name
                    ),
                    e,
                )
            })
    }

    /// Registers per thread, as the driver compiled the PTX for this GPU.
    pub fn num_registers(&self) -> Result<i32> {
        self.function
            .num_regs()
            .map_err(|e| RuntimeError::driver(format!("reading `{}`'s registers", self.name), e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The driver's ptxas log of a fused D128 dK/dV whose consumers had 232 registers (H200,
    /// docs/PERF.md, twenty-first session), and a warning of the kind a missing fence gives.
    #[test]
    fn performance_warnings_are_the_lines_that_say_so() {
        let log = "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async \
                   instructions are serialized due to insufficient register resources for the \
                   function 'attention_bwd_dkdv'\n\
                   ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'attention_bwd_dkdv' for 'sm_90a'\n\
                   ptxas         .     0 bytes stack frame, 0 bytes spill stores\n\
                   ptxas info    : Used 168 registers, used 16 barriers\n\
                   ptxas warning : wgmma.mma_async serialized due to a wgmma pipeline \
                   crossing the function boundary\n";
        let warnings = performance_warnings(log);
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].starts_with("ptxas info    : (C7512)"));
        assert!(warnings[1].starts_with("ptxas warning"));
        assert!(performance_warnings("ptxas info    : Used 232 registers").is_empty());
    }

    /// Without a driver (CI), opening a device is an error that says so, never a panic.
    #[test]
    fn no_driver_is_an_error() {
        // Safety: only probes whether the library loads.
        if unsafe { sys::is_culib_present() } {
            return;
        }
        let err = Device::current_or_default().unwrap_err();
        assert_eq!(
            err.to_string(),
            "no cuda driver: expected libcuda.so (the nvidia driver) on the library path"
        );
    }
}
