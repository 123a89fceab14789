//! kiln-runtime: loads PTX through the CUDA driver (cudarc) and launches kernels with arguments
//! checked against their signatures.
//!
//! Where it sits: after kiln-codegen (which makes PTX) and under kiln-kernels' GPU API. It links
//! no LLVM and needs no CUDA toolkit: the driver library (`libcuda.so`) is loaded when a
//! [`Device`] is first opened, so everything builds on a machine without a GPU.
//!
//! What it holds today is the minimal loader the GPU tests need: a [`Device`] (the current
//! context's device, or device 0's primary context), [`Module`]s loaded from PTX text,
//! [`DeviceBuffer`]s copied to and from the interpreter's [`kiln_dsl::HostBuffer`]s, and
//! [`Device::launch`]. The "Runtime" issue grows it (module cache, typed launches, JIT).

mod buffer;
mod context;
mod device;
mod error;
mod launch;
mod module_cache;
// Raw-byte transfers and event timing, for harnesses that move large tensors and time kernels.
mod raw;
mod timing;

pub use buffer::DeviceBuffer;
pub use context::{Context, RawStream, driver_present};
pub use device::{Device, Function, Module};
pub use error::RuntimeError;
pub use launch::{LaunchArg, LaunchConfig, ParamType};
pub use module_cache::{LoadedKernel, ModuleCache, ModuleSource, RawArg};
pub use timing::Event;
