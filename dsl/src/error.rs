//! kiln-dsl's one error type: every failure names where in the DSL source it comes from.

use std::fmt;

/// A position in a kernel's Rust source, carried from the macro into every IR instruction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    pub file: &'static str,
    pub line: u32,
    pub col: u32,
}

impl Loc {
    pub const fn new(file: &'static str, line: u32, col: u32) -> Loc {
        Loc { file, line, col }
    }

    /// For IR built by hand, outside any DSL source.
    pub const UNKNOWN: Loc = Loc::new("<unknown>", 0, 0);
}

impl fmt::Display for Loc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.col)
    }
}

/// What went wrong, in three families: building/checking a kernel, specialising it, running it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Error {
    /// A semantic error in the DSL source: wrong shapes, dtypes, ranks, a failed `static_assert`.
    Semantic { loc: Loc, message: String },
    /// A specialisation that does not fit the kernel's signature.
    Spec { kernel: String, message: String },
    /// A launch of the interpreter with arguments that do not fit the kernel.
    Launch { kernel: String, message: String },
    /// A fault while interpreting an op: an unmasked out-of-bounds access, a division by zero.
    Runtime {
        loc: Loc,
        op: &'static str,
        program: [u32; 3],
        message: String,
    },
}

impl Error {
    pub fn semantic(loc: Loc, message: impl Into<String>) -> Error {
        Error::Semantic {
            loc,
            message: message.into(),
        }
    }

    /// This error, raised inside `#[kernel_fn]` `function` called at `call`: a semantic error's
    /// message also says where the function was called from, innermost call first; the same call
    /// repeated (a function that calls itself) is counted rather than repeated.
    pub fn called_from(self, function: &str, call: Loc) -> Error {
        let Error::Semantic { loc, message } = self else {
            return self;
        };
        let frame = format!(" (in `{function}`, called at {call}");
        let message = match message.rsplit_once(&frame) {
            Some((before, ")")) => format!("{before}{frame}, 2 times)"),
            Some((before, rest)) => {
                let repeated = rest
                    .strip_prefix(", ")
                    .and_then(|rest| rest.strip_suffix(" times)"))
                    .and_then(|count| count.parse::<usize>().ok());
                match repeated {
                    Some(count) => format!("{before}{frame}, {} times)", count + 1),
                    None => format!("{message}{frame})"),
                }
            }
            None => format!("{message}{frame})"),
        };
        Error::Semantic { loc, message }
    }

    pub fn message(&self) -> &str {
        match self {
            Error::Semantic { message, .. }
            | Error::Spec { message, .. }
            | Error::Launch { message, .. }
            | Error::Runtime { message, .. } => message,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Semantic { loc, message } => write!(f, "{message}\n  --> {loc}"),
            Error::Spec { kernel, message } => write!(f, "cannot specialise `{kernel}`: {message}"),
            Error::Launch { kernel, message } => write!(f, "cannot launch `{kernel}`: {message}"),
            Error::Runtime {
                loc,
                op,
                program,
                message,
            } => write!(
                f,
                "`{op}` failed in program ({}, {}, {}): {message}\n  --> {loc}",
                program[0], program[1], program[2]
            ),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
