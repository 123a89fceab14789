//! kiln-codegen's one error type. Every failure on a kernel names the stage, and where it is the
//! kernel's fault (an op codegen cannot lower yet), the op and its DSL `file:line:col`.

use std::fmt;

use kiln_dsl::Loc;

use crate::Stage;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CodegenError {
    /// Compile options (or a stage or target name) that codegen does not know.
    Options { message: String },
    /// An op, type or shape that a stage cannot handle yet.
    Unsupported {
        stage: Stage,
        op: &'static str,
        loc: Loc,
        message: String,
    },
    /// LLVM refused: the verifier on a module kiln made (a kiln bug), the target, the emission.
    Llvm { stage: Stage, message: String },
    /// A check inside codegen failed: a kiln bug, reported rather than a panic.
    Internal { stage: Stage, message: String },
}

impl CodegenError {
    pub(crate) fn unsupported(
        stage: Stage,
        op: &'static str,
        loc: Loc,
        message: impl Into<String>,
    ) -> CodegenError {
        CodegenError::Unsupported {
            stage,
            op,
            loc,
            message: message.into(),
        }
    }

    pub(crate) fn llvm(stage: Stage, message: impl fmt::Display) -> CodegenError {
        CodegenError::Llvm {
            stage,
            message: message.to_string(),
        }
    }

    pub(crate) fn internal(stage: Stage, message: impl Into<String>) -> CodegenError {
        CodegenError::Internal {
            stage,
            message: message.into(),
        }
    }
}

impl fmt::Display for CodegenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodegenError::Options { message } => write!(f, "invalid compile options: {message}"),
            CodegenError::Unsupported {
                stage,
                op,
                loc,
                message,
            } => write!(
                f,
                "{stage} stage cannot handle `{op}` yet: {message}\n  --> {loc}"
            ),
            CodegenError::Llvm { stage, message } => {
                write!(f, "{stage} stage: llvm failed: {message}")
            }
            CodegenError::Internal { stage, message } => {
                write!(f, "{stage} stage: internal error (a kiln bug): {message}")
            }
        }
    }
}

impl std::error::Error for CodegenError {}

/// inkwell's builder fails only on misuse (no insertion point, wrong operand types): a kiln bug,
/// reported rather than unwrapped so that it can never abort a caller.
impl From<inkwell::builder::BuilderError> for CodegenError {
    fn from(error: inkwell::builder::BuilderError) -> CodegenError {
        CodegenError::llvm(Stage::Llir, format!("ir builder: {error}"))
    }
}
