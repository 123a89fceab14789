//! The CUDA context a launch runs in, at the level of the driver's handles: what the prebuilt
//! kernels' C interface and Rust API use, so that kiln cooperates with whoever owns the context
//! (PyTorch makes its device's primary context current; so does [`crate::Device`]).

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::{result, sys};

use crate::RuntimeError;

type Result<T> = std::result::Result<T, RuntimeError>;

/// A CUDA context and its device. The handle is an opaque address the driver owns; kiln never
/// destroys it (a primary context it had to open stays retained for the process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Context {
    raw: usize,
    device: sys::CUdevice,
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
        Ok(Context {
            raw: raw as usize,
            device,
        })
    }

    /// The context `raw` of `device`, as a [`crate::Device`] holds it.
    pub(crate) fn from_raw(raw: sys::CUcontext, device: sys::CUdevice) -> Context {
        Context {
            raw: raw as usize,
            device,
        }
    }

    pub fn raw(&self) -> sys::CUcontext {
        self.raw as sys::CUcontext
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

    /// Runs `f` with this context current on the calling thread, restoring what was current.
    pub(crate) fn with_current<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        // Safety: the context is valid for the process (see the type's docs).
        unsafe { sys::cuCtxPushCurrent_v2(self.raw()) }
            .result()
            .map_err(|e| RuntimeError::driver("making the context current", e))?;
        let out = f();
        let mut popped: sys::CUcontext = ptr::null_mut();
        // Safety: pops exactly the context pushed above.
        let pop = unsafe { sys::cuCtxPopCurrent_v2(&mut popped) }.result();
        let out = out?;
        pop.map_err(|e| RuntimeError::driver("restoring the current context", e))?;
        Ok(out)
    }
}

/// Whether the NVIDIA driver library can be loaded on this machine.
pub fn driver_present() -> bool {
    // Safety: only probes whether the library can be loaded.
    unsafe { sys::is_culib_present() }
}

/// Loads the driver library and initialises it; an error without one.
pub(crate) fn init() -> Result<()> {
    if !driver_present() {
        return Err(RuntimeError::NoDriver);
    }
    result::init().map_err(|e| RuntimeError::driver("initialising the driver", e))
}

/// A stream handle as C callers pass it (`CUstream`; null is the legacy default stream).
pub type RawStream = *mut c_void;

/// Device memory allocated in the order of a caller's stream (`cuMemAllocAsync`) and freed in
/// it when dropped (`cuMemFreeAsync`): work queued on the stream before the drop may use it, as
/// the split forward's kernels use their workspace, where the C interface gives none.
#[derive(Debug)]
pub struct StreamScratch {
    address: sys::CUdeviceptr,
    stream: RawStream,
}

impl StreamScratch {
    /// `bytes` (at least 1) of uninitialised memory on `stream`.
    ///
    /// # Safety
    /// `stream` is a valid stream (or null) of the context current on the calling thread, and it
    /// outlives the scratch.
    pub unsafe fn new(stream: RawStream, bytes: usize) -> Result<StreamScratch> {
        // Safety: as the caller vouches; the memory is only ever used on `stream`.
        let address = unsafe { result::malloc_async(stream as sys::CUstream, bytes.max(1)) }
            .map_err(|e| RuntimeError::driver("allocating a workspace on the stream", e))?;
        Ok(StreamScratch { address, stream })
    }

    /// The memory's device address.
    pub fn address(&self) -> u64 {
        self.address
    }
}

impl Drop for StreamScratch {
    fn drop(&mut self) {
        // Safety: `address` came from `malloc_async` on `stream`, which is still valid; the free
        // is ordered after every use queued before it. A failure here leaks the memory, which is
        // all a destructor can do.
        let _ = unsafe { result::free_async(self.address, self.stream as sys::CUstream) };
    }
}
