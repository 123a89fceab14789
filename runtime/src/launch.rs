//! Kernel launches: a grid and a block, and arguments checked against the kernel's parameters.

use cudarc::driver::{DeviceRepr, LaunchConfig as CudaLaunchConfig, PushKernelArg};
use kiln_dsl::types::{Elem, Type};
use kiln_dsl::{ArgType, DType, Kernel, KernelSignature, Spec};

use crate::tensor_map::{TensorMap, encode_all};
use crate::{Device, DeviceBuffer, Function, RuntimeError};

type Result<T> = std::result::Result<T, RuntimeError>;

/// One kernel parameter as the PTX entry takes it: a global pointer (`.u64`) or a scalar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    Ptr(DType),
    Scalar(DType),
}

impl ParamType {
    /// The parameters of a kernel with `signature` at `spec`, without building it; `None` if the
    /// spec leaves an argument's dtype open.
    pub fn of_signature(signature: &KernelSignature, spec: &Spec) -> Option<Vec<ParamType>> {
        signature
            .args
            .iter()
            .map(|arg| match arg.ty {
                ArgType::Ptr(dtype) => dtype.resolve(spec).map(ParamType::Ptr),
                ArgType::Scalar(dtype) => dtype.resolve(spec).map(ParamType::Scalar),
            })
            .collect()
    }

    /// The parameters of a kiln kernel, in signature order.
    pub fn of_kernel(kernel: &Kernel) -> Vec<ParamType> {
        kernel
            .args
            .iter()
            .map(|&arg| match kernel.ty(arg) {
                Type::Tensor {
                    elem: Elem::Ptr(dtype),
                    ..
                } => ParamType::Ptr(*dtype),
                Type::Tensor {
                    elem: Elem::Value(dtype),
                    ..
                } => ParamType::Scalar(*dtype),
                Type::BlockPtr { pointee, .. } => ParamType::Ptr(*pointee),
            })
            .collect()
    }
}

/// One launch argument, in the kernel's parameter order.
pub type LaunchArg<'a> = kiln_dsl::Arg<'a, DeviceBuffer>;

/// The programs of a launch (CUDA blocks along x, y, z) and the threads of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// `grid` programs of `threads` threads each (a kiln kernel's `32 * num_warps`).
    pub fn new(grid: [u32; 3], threads: u32) -> LaunchConfig {
        LaunchConfig {
            grid,
            block: [threads, 1, 1],
            shared_mem_bytes: 0,
        }
    }

    /// The same launch with `bytes` of dynamic shared memory (what kiln-codegen says a kernel
    /// needs; above 48 KiB the function must opt in first:
    /// [`Function::set_max_dynamic_shared_bytes`]).
    pub fn with_dynamic_shared_bytes(self, bytes: u32) -> LaunchConfig {
        LaunchConfig {
            shared_mem_bytes: bytes,
            ..self
        }
    }
}

impl Device {
    /// Queues `function` on this device's stream; a fault in the kernel surfaces at the next
    /// [`Device::synchronize`] or copy back.
    ///
    /// # Safety
    ///
    /// The function's PTX must take the parameters its [`Function::params`] lists (the
    /// arguments are checked against those), and the kernel must access only the elements of
    /// the buffers it is given: the driver cannot check either.
    pub unsafe fn launch(
        &self,
        function: &Function,
        config: LaunchConfig,
        args: &[LaunchArg<'_>],
    ) -> Result<()> {
        check_args(&function.name, &function.params, args)?;
        let maps = encode_all(
            &function.name,
            function.context,
            &function.tensor_maps,
            |i| match args[i] {
                LaunchArg::Buffer(buffer) => buffer.device_address(self),
                _ => 0,
            },
            |i| args[i].int(),
        )?
        .into_iter()
        .map(MapArg)
        .collect::<Vec<_>>();
        // The driver reads each argument through a pointer to it: the scalars are read where
        // `args` holds them, which outlives the launch call.
        let mut launch = self.stream.launch_builder(&function.function);
        for arg in args {
            match arg {
                LaunchArg::Buffer(buffer) => launch.arg(&buffer.bytes),
                LaunchArg::I32(v) => launch.arg(v),
                LaunchArg::I64(v) => launch.arg(v),
                LaunchArg::F32(v) => launch.arg(v),
            };
        }
        for map in &maps {
            launch.arg(map);
        }
        let [gx, gy, gz] = config.grid;
        let [bx, by, bz] = config.block;
        let cuda_config = CudaLaunchConfig {
            grid_dim: (gx, gy, gz),
            block_dim: (bx, by, bz),
            shared_mem_bytes: config.shared_mem_bytes,
        };
        // Safety: the caller promises the parameters and the accesses; the arguments were
        // checked against the parameters above and live until the launch is queued.
        unsafe { launch.launch(cuda_config) }
            .map_err(|e| RuntimeError::driver(format!("launching `{}`", function.name), e))?;
        Ok(())
    }
}

/// A tensor map as a launch argument: the driver copies its 128 bytes into the parameter.
#[repr(transparent)]
struct MapArg(TensorMap);

// Safety: a `CUtensorMap` is plain bytes the kernel takes by value.
unsafe impl DeviceRepr for MapArg {}

/// Matches `args` against a kernel's parameters: count, buffers of the pointee's dtype, scalars of
/// the parameter's type.
pub(crate) fn check_args(kernel: &str, params: &[ParamType], args: &[LaunchArg<'_>]) -> Result<()> {
    let error = |message: String| RuntimeError::Launch {
        kernel: kernel.to_string(),
        message,
    };
    if args.len() != params.len() {
        return Err(error(format!(
            "it takes {} arguments, got {}",
            params.len(),
            args.len()
        )));
    }
    for (i, (arg, param)) in args.iter().zip(params).enumerate() {
        let fits = match (arg, param) {
            (LaunchArg::Buffer(buffer), ParamType::Ptr(dtype)) => buffer.dtype() == *dtype,
            (LaunchArg::I32(_), ParamType::Scalar(DType::I32))
            | (LaunchArg::I64(_), ParamType::Scalar(DType::I64))
            | (LaunchArg::F32(_), ParamType::Scalar(DType::F32)) => true,
            _ => false,
        };
        if !fits {
            let expected = match param {
                ParamType::Ptr(dtype) => format!("a buffer of {dtype}"),
                ParamType::Scalar(dtype) => format!("{dtype}"),
            };
            let got = match arg {
                LaunchArg::Buffer(buffer) => format!("a buffer of {}", buffer.dtype()),
                LaunchArg::I32(v) => format!("i32 {v}"),
                LaunchArg::I64(v) => format!("i64 {v}"),
                LaunchArg::F32(v) => format!("f32 {v}"),
            };
            return Err(error(format!("argument {i} expects {expected}, got {got}")));
        }
    }
    Ok(())
}
