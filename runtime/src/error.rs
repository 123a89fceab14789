//! kiln-runtime's one error type.

use std::fmt;

use cudarc::driver::DriverError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RuntimeError {
    /// No CUDA driver library could be loaded: no NVIDIA driver on this machine.
    NoDriver,
    /// A CUDA driver call failed.
    Driver {
        /// What kiln was doing: "loading module `vector_add`", "synchronizing".
        action: String,
        message: String,
    },
    /// A launch whose arguments do not fit the kernel's parameters.
    Launch { kernel: String, message: String },
    /// A kernel that failed to build at its spec.
    Kernel(kiln_dsl::Error),
    /// A kernel codegen could not compile (the JIT).
    Compile(String),
}

impl From<kiln_dsl::Error> for RuntimeError {
    fn from(e: kiln_dsl::Error) -> Self {
        RuntimeError::Kernel(e)
    }
}

impl RuntimeError {
    pub(crate) fn driver(action: impl Into<String>, error: DriverError) -> RuntimeError {
        RuntimeError::Driver {
            action: action.into(),
            message: driver_message(error),
        }
    }
}

/// `text` as the driver takes it, NUL-terminated; an inner NUL byte (on which cudarc would
/// panic) is an error of `action` naming `what`.
pub(crate) fn c_text(
    text: &str,
    what: &str,
    action: impl FnOnce() -> String,
) -> Result<std::ffi::CString, RuntimeError> {
    std::ffi::CString::new(text).map_err(|_| RuntimeError::Driver {
        action: action(),
        message: format!("{what} holds a NUL byte"),
    })
}

/// The driver's words for an error, with its code: "invalid argument (CUDA_ERROR_INVALID_VALUE)".
pub(crate) fn driver_message(error: DriverError) -> String {
    match error.error_string() {
        Ok(text) => format!("{} ({:?})", text.to_string_lossy(), error.0),
        Err(_) => format!("{:?}", error.0),
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::NoDriver => f.write_str(
                "no cuda driver: expected libcuda.so (the nvidia driver) on the library path",
            ),
            RuntimeError::Driver { action, message } => {
                write!(f, "cuda driver error while {action}: {message}")
            }
            RuntimeError::Launch { kernel, message } => {
                write!(f, "cannot launch `{kernel}`: {message}")
            }
            RuntimeError::Kernel(e) => write!(f, "{e}"),
            RuntimeError::Compile(message) => write!(f, "cannot compile: {message}"),
        }
    }
}

impl std::error::Error for RuntimeError {}
