//! kiln-runtime: loads PTX through the CUDA driver (cudarc) and launches kernels with arguments
//! checked against their signatures.
//!
//! Where it sits: after kiln-codegen (which makes PTX) and under kiln-kernels' GPU API and C
//! interface. By default it links no LLVM and needs no CUDA toolkit: the driver library
//! (`libcuda.so`) is loaded at the first driver call, so everything builds on a machine without a
//! GPU.
//!
//! - [`Device`]: the device of the calling thread's current context (else device 0) in its
//!   primary context, with a stream; [`Module`]s loaded from PTX; [`DeviceBuffer`]s copied to and
//!   from the interpreter's [`kiln_dsl::HostBuffer`]s; [`Device::launch`] checks arguments
//!   against the kernel's parameters.
//! - Every launch path encodes the Hopper tensor maps a kernel's PTX asks for (its TMA copies')
//!   from the launch's arguments and passes them after them (the `tensor_map` module).
//! - [`Context`] and [`ModuleCache`]: the prebuilt kernels' path: the context current on the
//!   calling thread (PyTorch's) or device 0's primary one, each module loaded once per context,
//!   launches on raw device addresses and a caller's stream.
//! - `jit` (feature `jit`, which links kiln-codegen): user kernels compiled on first launch,
//!   through a disk cache; a [`kiln_dsl::Launcher`] for the kernels' typed `launch` functions.

mod buffer;
mod context;
mod device;
mod error;
#[cfg(feature = "jit")]
pub mod jit;
mod launch;
mod module_cache;
mod tensor_map;
// Raw-byte transfers and event timing, for harnesses that move large tensors and time kernels.
mod raw;
mod timing;

pub use buffer::DeviceBuffer;
pub use context::{
    Context, RawStream, StreamWorkspaces, cuda_release, driver_present, driver_version,
};
pub use device::{Device, Function, Module, performance_warnings};
pub use error::RuntimeError;
pub use launch::{LaunchArg, LaunchConfig, ParamType};
pub use module_cache::{LoadedKernel, ModuleCache, ModuleSource, RawArg, waits_for_prior_grids};
pub use timing::Event;
