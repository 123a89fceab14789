//! The CUDA context a launch runs in, at the level of the driver's handles: what the prebuilt
//! kernels' C interface and Rust API use, so that kiln cooperates with whoever owns the context
//! (PyTorch makes its device's primary context current; so does [`crate::Device`]).

use std::ffi::c_void;
use std::ptr;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{result, sys};

use crate::RuntimeError;

type Result<T> = std::result::Result<T, RuntimeError>;

/// A CUDA context and its device. The handle is an opaque address the driver owns; kiln never
/// destroys it (a primary context it had to open stays retained for the process), but its
/// owner may (the last [`crate::Device`] of a device releases its primary context), and a
/// context made later may get the same handle. Contexts compare by the driver's unique id
/// too, so that what kiln keeps for one (loaded modules, the tensor maps' zero page) is never
/// found for another; before CUDA 12.0, which has no ids, by the handle alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Context {
    raw: usize,
    device: sys::CUdevice,
    unique: u64,
}

impl Context {
    /// The context current on the calling thread; with none, device 0's primary context, retained
    /// and made current on this thread.
    pub fn current_or_primary() -> Result<Context> {
        init()?;
        let current = result::ctx::get_current()
            .map_err(|e| RuntimeError::driver("reading the current context", e))?;
        let raw = match current {
            Some(raw) => raw,
            None => {
                let device = result::device::get(0)
                    .map_err(|e| RuntimeError::driver("opening device 0", e))?;
                // Safety: `device` is a valid device handle; the retained context is never
                // released, so it outlives every module and launch made in it.
                let raw = unsafe { result::primary_ctx::retain(device) }
                    .map_err(|e| RuntimeError::driver("retaining device 0's primary context", e))?;
                // Safety: `raw` is the valid context retained above.
                unsafe { result::ctx::set_current(raw) }.map_err(|e| {
                    RuntimeError::driver("making device 0's primary context current", e)
                })?;
                raw
            }
        };
        let mut device: sys::CUdevice = 0;
        // Safety: a context is current (found or set above); `device` is a valid out-pointer.
        unsafe { sys::cuCtxGetDevice(&mut device) }
            .result()
            .map_err(|e| RuntimeError::driver("reading the current context's device", e))?;
        // Safety: `raw` is the current context.
        let unique = unsafe { unique_of(raw) }?;
        Ok(Context {
            raw: raw as usize,
            device,
            unique,
        })
    }

    /// The context `raw` of `device`, as a [`crate::Device`] holds it, with `unique` from
    /// [`unique_of`].
    pub(crate) fn from_raw(raw: sys::CUcontext, device: sys::CUdevice, unique: u64) -> Context {
        Context {
            raw: raw as usize,
            device,
            unique,
        }
    }

    pub fn raw(&self) -> sys::CUcontext {
        self.raw as sys::CUcontext
    }

    /// The driver's id of the context, unique among the contexts of the process's lifetime
    /// (unlike its handle, which a context made later may reuse); an error before CUDA 12.0.
    pub fn id(&self) -> Result<u64> {
        let version = driver_version()?;
        if version < 12000 {
            return Err(RuntimeError::Driver {
                action: "reading the context's id".to_string(),
                message: format!("needs a CUDA 12.0 driver or later, this one is {version}"),
            });
        }
        Ok(self.unique)
    }

    /// The device's compute capability, `(major, minor)`.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        let attribute = |a| {
            // Safety: `self.device` is the valid device handle the driver gave with the context.
            unsafe { result::device::get_attribute(self.device, a) }
                .map_err(|e| RuntimeError::driver("reading the compute capability", e))
        };
        Ok((
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// The device's streaming multiprocessors: how many programs of one an SM run at once.
    pub fn multiprocessor_count(&self) -> Result<u32> {
        // Safety: `self.device` is the valid device handle the driver gave with the context.
        let count = unsafe {
            result::device::get_attribute(
                self.device,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
        }
        .map_err(|e| RuntimeError::driver("reading the multiprocessor count", e))?;
        Ok(count.max(1) as u32)
    }

    /// Runs `f` with this context current on the calling thread, restoring what was current
    /// (nothing to do where it is current already, as for every C call).
    pub(crate) fn with_current<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let current = result::ctx::get_current()
            .map_err(|e| RuntimeError::driver("reading the current context", e))?;
        if current == Some(self.raw()) {
            return f();
        }
        // Safety: the context is valid for the process (see the type's docs).
        unsafe { sys::cuCtxPushCurrent_v2(self.raw()) }
            .result()
            .map_err(|e| RuntimeError::driver("making the context current", e))?;
        // Popped on every way out of `f`, a panic too (one caught at the C interface must not
        // leave the caller's thread in kiln's context).
        let pushed = Pushed;
        let out = f();
        std::mem::forget(pushed);
        let pop = pop_current();
        let out = out?;
        pop.map_err(|e| RuntimeError::driver("restoring the current context", e))?;
        Ok(out)
    }
}

/// Pops the context [`Context::with_current`] pushed.
fn pop_current() -> std::result::Result<(), cudarc::driver::DriverError> {
    let mut popped: sys::CUcontext = ptr::null_mut();
    // Safety: `with_current` pushed a context; `popped` is an out-pointer.
    unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result()
}

/// A context [`Context::with_current`] pushed, popped if `f` unwinds (where a failure to pop
/// has nowhere to go).
struct Pushed;

impl Drop for Pushed {
    fn drop(&mut self) {
        let _ = pop_current();
    }
}

/// What tells context `raw` from every other of the process: the driver's id of it (CUDA 12.0
/// on), else its handle.
///
/// # Safety
/// `raw` is a valid context.
pub(crate) unsafe fn unique_of(raw: sys::CUcontext) -> Result<u64> {
    if driver_version()? < 12000 {
        return Ok(raw as u64);
    }
    let mut id = 0;
    // Safety: `raw` is valid, as the caller vouches; `id` is an out-pointer.
    unsafe { sys::cuCtxGetId(raw, &mut id) }
        .result()
        .map_err(|e| RuntimeError::driver("reading the context's id", e))?;
    Ok(id)
}

/// Whether the NVIDIA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // Safety: only probes whether the library can be loaded.
    unsafe { sys::is_culib_present() }
}

/// Loads the driver library and initialises it, once a process (every C call comes here, and
/// probing for the library opens it by each of its candidate names); an error without one.
pub(crate) fn init() -> Result<()> {
    static DONE: OnceLock<()> = OnceLock::new();
    if DONE.get().is_some() {
        return Ok(());
    }
    if !driver_present() {
        return Err(RuntimeError::NoDriver);
    }
    result::init().map_err(|e| RuntimeError::driver("initialising the driver", e))?;
    let _ = DONE.set(());
    Ok(())
}

/// A stream handle as C callers pass it (`CUstream`; null is the legacy default stream).
pub type RawStream = *mut c_void;

/// Device memory kept between calls, one allocation per (context, stream), for kernels that need
/// a workspace the caller does not give (the split forward's parts in the C interface). A call's
/// kernels run in its stream's order, after the kernels of the call before on that stream, so
/// they may use the same memory; a call that needs more frees the old allocation in the
/// stream's order and keeps a larger one. Against allocating and freeing each call
/// (`cuMemAllocAsync`, `cuMemFreeAsync`) this saves about 1 us of the GPU's time a call and more
/// of the host's (docs/PERF.md, thirty-second session). A stream keeps twice its largest need,
/// up to 64 MiB. Keys are the driver's unique ids of the context and stream, so that a stream or
/// context made anew never finds another's memory; entries are never dropped (a destroyed
/// stream's, or context's, memory stays kept, or went with its context).
///
/// A call allocates and frees its own, in the stream's order, where the driver has no such ids
/// (before CUDA 12.0), where the stream is being captured into a graph (the graph would keep
/// the address of memory a later call may free; its own allocation becomes the graph's), where
/// it needs more than 64 MiB, and on streams past the first 16 (a program that makes a stream a
/// request would otherwise keep memory for each). Calls that use kept memory wait for each
/// other, on any stream: one lock, held while they queue their work.
#[derive(Debug, Default)]
pub struct StreamWorkspaces {
    kept: Mutex<Vec<Kept>>,
}

/// The most streams a [`StreamWorkspaces`] keeps memory for.
const KEPT_STREAMS: usize = 16;

/// The most bytes a [`StreamWorkspaces`] keeps for one stream.
const KEPT_BYTES: usize = 64 << 20;

#[derive(Debug)]
struct Kept {
    context: u64,
    stream: u64,
    address: sys::CUdeviceptr,
    bytes: usize,
}

impl StreamWorkspaces {
    pub const fn new() -> StreamWorkspaces {
        StreamWorkspaces {
            kept: Mutex::new(Vec::new()),
        }
    }

    /// Runs `queue`, with `context` current, with the address of `bytes` of uninitialised device
    /// memory that work it queues on `stream` may use.
    ///
    /// # Safety
    /// `stream` is a valid stream of `context` (or null), and `queue` uses the memory only in
    /// work it queues on `stream`.
    pub unsafe fn with<T, E: From<RuntimeError>>(
        &self,
        context: &Context,
        stream: RawStream,
        bytes: usize,
        queue: impl FnOnce(u64) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        // The body, run with the context current.
        let in_context = || -> std::result::Result<T, E> {
            // Safety (here and below): as the caller vouches.
            let key = match bytes <= KEPT_BYTES {
                true => unsafe { kept_key(context, stream) }?,
                false => None,
            };
            let Some(key) = key else {
                return unsafe { with_own(stream, bytes, queue) };
            };
            // A poisoned lock only means a panic elsewhere; every update below is one assignment.
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let at = kept.iter().position(|k| (k.context, k.stream) == key);
            if at.is_none() && kept.len() >= KEPT_STREAMS {
                drop(kept);
                return unsafe { with_own(stream, bytes, queue) };
            }
            let address = match at {
                Some(at) if kept[at].bytes >= bytes => kept[at].address,
                _ => {
                    // Twice the need, so that a stream whose calls grow reallocates seldom.
                    let keep = (2 * bytes).clamp(1, KEPT_BYTES);
                    let address = unsafe { malloc_on(stream, keep) }?;
                    let fresh = Kept {
                        context: key.0,
                        stream: key.1,
                        address,
                        bytes: keep,
                    };
                    if let Some(at) = at {
                        let old = std::mem::replace(&mut kept[at], fresh);
                        // Ordered after all work on the stream that used it.
                        unsafe { free_on(stream, old.address) };
                    } else {
                        kept.push(fresh);
                    }
                    address
                }
            };
            queue(address)
        };
        context.with_current(|| Ok(in_context()))?
    }
}

/// The driver's ids of `context` and `stream` to keep a workspace under, or `None` where a call
/// allocates its own ([`StreamWorkspaces`]).
///
/// # Safety
/// As [`StreamWorkspaces::with`].
unsafe fn kept_key(context: &Context, stream: RawStream) -> Result<Option<(u64, u64)>> {
    if driver_version()? < 12000 {
        return Ok(None);
    }
    let mut capture = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // Safety: `stream` is valid or null, as the caller vouches; `capture` is an out-pointer.
    unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut capture) }
        .result()
        .map_err(|e| RuntimeError::driver("asking whether the stream is being captured", e))?;
    if capture != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Ok(None);
    }
    let mut stream_id = 0;
    // Safety: as above; `stream_id` is an out-pointer.
    unsafe { sys::cuStreamGetId(stream as sys::CUstream, &mut stream_id) }
        .result()
        .map_err(|e| RuntimeError::driver("reading the stream's id", e))?;
    Ok(Some((context.id()?, stream_id)))
}

/// Runs `queue` with `bytes` of memory allocated on `stream` for it and freed after the work it
/// queues.
///
/// # Safety
/// As [`StreamWorkspaces::with`].
unsafe fn with_own<T, E: From<RuntimeError>>(
    stream: RawStream,
    bytes: usize,
    queue: impl FnOnce(u64) -> std::result::Result<T, E>,
) -> std::result::Result<T, E> {
    // Safety: as the caller vouches.
    let address = unsafe { malloc_on(stream, bytes.max(1)) }?;
    let out = queue(address);
    // Safety: ordered after what `queue` queued on `stream`.
    unsafe { free_on(stream, address) };
    out
}

/// `bytes` of device memory allocated in the order of `stream` (`cuMemAllocAsync`).
///
/// # Safety
/// `stream` is a valid stream (or null) of the context current on the calling thread.
unsafe fn malloc_on(stream: RawStream, bytes: usize) -> Result<sys::CUdeviceptr> {
    // Safety: as the caller vouches.
    unsafe { result::malloc_async(stream as sys::CUstream, bytes) }
        .map_err(|e| RuntimeError::driver("allocating a workspace on the stream", e))
}

/// Frees `address` in the order of `stream` (`cuMemFreeAsync`); a failure leaks it.
///
/// # Safety
/// `address` came from [`malloc_on`] in the context current on the calling thread, and no
/// work queued after this on any stream uses it.
unsafe fn free_on(stream: RawStream, address: sys::CUdeviceptr) {
    // Safety: as the caller vouches.
    let _ = unsafe { result::free_async(address, stream as sys::CUstream) };
}

/// Whether the driver launches kernels as programmatic dependents of the kernel before them on
/// their stream, captured into graphs too (CUDA 12.3; `cuLaunchKernelEx` since 12.0).
pub(crate) fn programmatic_launches() -> Result<bool> {
    Ok(driver_version()? >= 12030)
}

/// A driver's CUDA version as `cuDriverGetVersion` gives it (12010), as people write it
/// (`CUDA 12.1`).
pub fn cuda_release(version: i32) -> String {
    format!("CUDA {}.{}", version / 1000, version % 1000 / 10)
}

/// The driver's CUDA version (12000 for 12.0), read once a process; [`RuntimeError::NoDriver`]
/// without a driver.
pub fn driver_version() -> Result<i32> {
    static VERSION: OnceLock<i32> = OnceLock::new();
    if let Some(&version) = VERSION.get() {
        return Ok(version);
    }
    // Loads the library first: without one, the driver's bindings would panic.
    init()?;
    let mut version = 0;
    // Safety: `version` is an out-pointer.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| RuntimeError::driver("reading the driver's version", e))?;
    Ok(*VERSION.get_or_init(|| version))
}

#[cfg(test)]
mod tests {
    use super::{cuda_release, driver_present, driver_version};
    use crate::RuntimeError;

    #[test]
    fn without_a_driver_its_version_is_an_error() {
        if driver_present() {
            assert!(driver_version().unwrap() >= 11000);
        } else {
            assert!(matches!(driver_version(), Err(RuntimeError::NoDriver)));
        }
    }

    #[test]
    fn driver_versions_read_as_cuda_releases() {
        assert_eq!(cuda_release(12010), "CUDA 12.1");
        assert_eq!(cuda_release(12080), "CUDA 12.8");
        assert_eq!(cuda_release(13000), "CUDA 13.0");
        assert_eq!(cuda_release(11000), "CUDA 11.0");
    }
}
