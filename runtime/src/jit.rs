//! JIT compilation of user kernels (feature `jit`, which links kiln-codegen and so LLVM): a
//! `#[kiln::kernel]` compiles on its first launch for the device's architecture, through the
//! disk cache of `kiln_codegen::cache` (`$KILN_CACHE_DIR`, default `~/.cache/kiln`; `KILN_DUMP`
//! writes every stage), and stays loaded for the process. [`Jit`] is a [`Launcher`], so a
//! kernel's typed `launch` runs on the GPU with it and on the CPU with kiln-dsl's interpreter.

use std::path::PathBuf;
use std::sync::Arc;

use kiln_codegen::CompileOptions;
use kiln_codegen::cache::{self, CachedPtx};
use kiln_dsl::{Arg, Grid, KernelDef, Launcher, Spec, Target};

use crate::launch::check_args;
use crate::{
    Device, DeviceBuffer, LoadedKernel, ModuleCache, ModuleSource, ParamType, RawArg, RawStream,
    RuntimeError, cuda_release, driver_version,
};

type Result<T> = std::result::Result<T, RuntimeError>;

/// Compiles kernels for one device on first launch and launches them on a stream of its
/// context: the device's own, or one the caller gives ([`Jit::with_stream`]).
#[derive(Debug)]
pub struct Jit {
    device: Device,
    stream: RawStream,
    target: Target,
    num_warps: u32,
    num_stages: u32,
    cache_dir: Option<PathBuf>,
    dump_dir: Option<PathBuf>,
    loaded: ModuleCache,
}

impl Jit {
    /// A JIT for `device`: 4 warps per program, no pipelining, the cache and dump folders of the
    /// environment.
    ///
    /// # Safety
    /// Every kernel launched through it must stay within its buffers at the arguments it gets:
    /// a GPU does not check, so an unmasked access past a buffer is undefined behaviour. The
    /// interpreter checks every access: run a kernel there first (the same typed `launch` call
    /// with `kiln_dsl::Interpreter`).
    pub unsafe fn new(device: Device) -> Result<Jit> {
        let (major, minor) = device.compute_capability()?;
        let driver = driver_version()?;
        let target =
            Target::for_device(major, minor, driver).ok_or_else(|| RuntimeError::Launch {
                kernel: "(any)".to_string(),
                message: format!(
                    "kiln compiles for compute capability 8.0 and newer, under a {} driver or \
                     later; got {major}.{minor} under {}",
                    cuda_release(Target::Sm80.min_driver()),
                    cuda_release(driver)
                ),
            })?;
        Ok(Jit {
            stream: device.raw_stream(),
            device,
            target,
            num_warps: 4,
            num_stages: 1,
            cache_dir: cache::default_dir(),
            dump_dir: cache::dump_dir(),
            loaded: ModuleCache::new(),
        })
    }

    /// The same JIT launching on `stream` (a `CUstream` of the device's context, such as
    /// PyTorch's current stream; null is the legacy default stream).
    ///
    /// # Safety
    /// `stream` must stay a valid stream of this device's primary context while the JIT launches
    /// on it. The buffers' own operations (upload, [`DeviceBuffer::to_host`], drop, which frees)
    /// run on the device's stream: where `stream` is not ordered with it (a non-blocking stream,
    /// as PyTorch's side streams are), synchronise the device ([`Device::synchronize`]) after
    /// uploads that launches on `stream` read, and `stream` before a buffer a launch used is
    /// read back or dropped.
    pub unsafe fn with_stream(self, stream: RawStream) -> Jit {
        Jit { stream, ..self }
    }

    /// The same JIT compiling with `num_warps` warps per program and `num_stages` pipeline
    /// stages (kiln-codegen's `CompileOptions`).
    pub fn with_options(self, num_warps: u32, num_stages: u32) -> Jit {
        Jit {
            num_warps,
            num_stages,
            ..self
        }
    }

    /// The same JIT with its disk cache in `dir`, or none.
    pub fn with_cache_dir(self, dir: Option<PathBuf>) -> Jit {
        Jit {
            cache_dir: dir,
            ..self
        }
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn target(&self) -> Target {
        self.target
    }

    /// `kernel` at `spec` compiled (or found in the cache): its PTX and whether the disk cache
    /// had it, without loading it.
    pub fn compile(&self, kernel: &KernelDef, spec: &Spec) -> Result<CachedPtx> {
        let built = (kernel.build)(spec)?;
        let options = CompileOptions::new(self.target, self.num_warps).with_stages(self.num_stages);
        cache::compile_cached(
            &built,
            &options,
            self.cache_dir.as_deref(),
            self.dump_dir.as_deref(),
        )
        .map_err(|e| RuntimeError::Compile(e.to_string()))
    }

    /// The loaded kernel of `kernel` at `spec`, compiled and loaded on first use.
    fn kernel(&self, kernel: &KernelDef, spec: &Spec) -> Result<Arc<LoadedKernel>> {
        // What identifies the PTX: the kernel (its signature's static, unique to each
        // `#[kernel]`, as two in different modules may share a name), the spec and the options
        // ([`Jit::with_options`] keeps what is loaded).
        let name = format!(
            "{}{spec:?} ({} warps, {} stages; {}#{:x})",
            kernel.signature.name,
            self.num_warps,
            self.num_stages,
            kernel.signature.file,
            std::ptr::from_ref(kernel.signature) as usize
        );
        if let Some(loaded) = self.loaded.get(self.device.context(), &name) {
            return Ok(loaded);
        }
        let compiled = self.compile(kernel, spec)?;
        let params = ParamType::of_signature(kernel.signature, spec).ok_or_else(|| {
            RuntimeError::Compile(format!(
                "{}: the spec leaves an argument type open",
                kernel.signature.name
            ))
        })?;
        self.loaded.get_or_load(
            self.device.context(),
            ModuleSource {
                name: &name,
                ptx: &compiled.ptx,
                entry: kernel.signature.name,
                params: &params,
                shared_bytes: compiled.shared_bytes,
                report: false,
            },
        )
    }
}

impl Launcher for Jit {
    type Buffer = DeviceBuffer;
    type Error = RuntimeError;

    /// Queues the launch on the device's stream (compiling and loading the kernel first if this
    /// JIT has not yet).
    fn launch(
        &self,
        kernel: &KernelDef,
        spec: &Spec,
        grid: Grid,
        args: &[Arg<'_, DeviceBuffer>],
    ) -> Result<()> {
        let loaded = self.kernel(kernel, spec)?;
        check_args(kernel.signature.name, loaded.params(), args)?;
        let args: Vec<RawArg> = args
            .iter()
            .map(|arg| match *arg {
                Arg::Buffer(buffer) => RawArg::Ptr(buffer.device_address(&self.device)),
                Arg::I32(v) => RawArg::I32(v),
                Arg::I64(v) => RawArg::I64(v),
                Arg::F32(v) => RawArg::F32(v),
            })
            .collect();
        // Safety: the arguments are checked against the kernel's parameters; that its accesses
        // stay within the buffers is what `Jit::new`'s caller vouched for, and the stream is the
        // device's or one `with_stream`'s caller vouched for.
        unsafe { loaded.launch(self.stream, grid.0, self.num_warps * 32, &args) }
    }
}
