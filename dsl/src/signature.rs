//! What `#[kiln::kernel]` records about a kernel: its specialisation parameters and its arguments,
//! as static data the builder, the interpreter and the runtime's typed launchers all read.

use std::collections::BTreeMap;
use std::fmt;

use crate::types::DType;

/// A kernel's signature as written in its Rust `fn`.
#[derive(Debug, PartialEq, Eq)]
pub struct KernelSignature {
    pub name: &'static str,
    /// The source file of the kernel, as `file!()` gives it.
    pub file: &'static str,
    /// Generic parameters of the `fn`, in order: `T: Float`, `const BLOCK_M: usize`, `const CAUSAL: bool`.
    pub params: &'static [SpecParam],
    /// Arguments of the `fn`, in order: what a launch passes.
    pub args: &'static [ArgDecl],
}

impl KernelSignature {
    pub fn param(&self, name: &str) -> Option<&SpecParam> {
        self.params.iter().find(|p| p.name == name)
    }

    fn param_names(&self) -> String {
        let names: Vec<_> = self.params.iter().map(|p| p.name).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }
}

/// One specialisation parameter: fixed when a kernel is built, a compile-time constant inside it.
#[derive(Debug, PartialEq, Eq)]
pub struct SpecParam {
    pub name: &'static str,
    pub kind: SpecKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecKind {
    /// A type parameter: the element type of pointers and casts.
    DType,
    /// A `const N: usize` (or i32, i64) parameter: block sizes, head dims.
    Int,
    /// A `const FLAG: bool` parameter.
    Bool,
}

impl fmt::Display for SpecKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SpecKind::DType => "a dtype",
            SpecKind::Int => "an integer",
            SpecKind::Bool => "a bool",
        })
    }
}

/// One kernel argument.
#[derive(Debug, PartialEq, Eq)]
pub struct ArgDecl {
    pub name: &'static str,
    pub ty: ArgType,
}

/// The type of a kernel argument, possibly naming a dtype parameter (`Ptr<T>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArgType {
    /// A global pointer to elements of the given dtype.
    Ptr(DTypeRef),
    /// A scalar passed by value (`i32`, `i64`, `f32`).
    Scalar(DTypeRef),
}

/// A dtype as written in a signature: fixed, or a type parameter resolved by the spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRef {
    Fixed(DType),
    Param(&'static str),
}

impl DTypeRef {
    pub fn resolve(self, spec: &Spec) -> Option<DType> {
        match self {
            DTypeRef::Fixed(dtype) => Some(dtype),
            DTypeRef::Param(name) => spec.dtype_param(name),
        }
    }
}

impl fmt::Display for ArgType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = |r: &DTypeRef| match r {
            DTypeRef::Fixed(d) => d.name(),
            DTypeRef::Param(p) => p,
        };
        match self {
            ArgType::Ptr(r) => write!(f, "Ptr<{}>", name(r)),
            ArgType::Scalar(r) => f.write_str(name(r)),
        }
    }
}

/// The value of one specialisation parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpecValue {
    DType(DType),
    Int(i64),
    Bool(bool),
}

impl SpecValue {
    pub fn kind(self) -> SpecKind {
        match self {
            SpecValue::DType(_) => SpecKind::DType,
            SpecValue::Int(_) => SpecKind::Int,
            SpecValue::Bool(_) => SpecKind::Bool,
        }
    }
}

impl fmt::Display for SpecValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecValue::DType(d) => write!(f, "{d}"),
            SpecValue::Int(i) => write!(f, "{i}"),
            SpecValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// A specialisation: a value for every parameter of a kernel's signature.
///
/// ```
/// use kiln_dsl::{DType, Spec};
/// let spec = Spec::new().dtype("T", DType::F16).int("BLOCK", 64).flag("CAUSAL", true);
/// assert_eq!(spec.to_string(), "BLOCK = 64, CAUSAL = true, T = f16");
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Spec {
    values: BTreeMap<String, SpecValue>,
}

impl Spec {
    pub fn new() -> Spec {
        Spec::default()
    }

    pub fn set(mut self, name: &str, value: SpecValue) -> Spec {
        self.values.insert(name.to_string(), value);
        self
    }

    pub fn dtype(self, name: &str, dtype: DType) -> Spec {
        self.set(name, SpecValue::DType(dtype))
    }

    pub fn int(self, name: &str, value: i64) -> Spec {
        self.set(name, SpecValue::Int(value))
    }

    pub fn flag(self, name: &str, value: bool) -> Spec {
        self.set(name, SpecValue::Bool(value))
    }

    pub fn get(&self, name: &str) -> Option<SpecValue> {
        self.values.get(name).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, SpecValue)> {
        self.values.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// The dtype bound to a type parameter.
    pub fn dtype_param(&self, name: &str) -> Option<DType> {
        match self.get(name) {
            Some(SpecValue::DType(d)) => Some(d),
            _ => None,
        }
    }

    /// Sets parameters from `NAME=VALUE` pairs separated by commas (`T=bf16,BLOCK_M=64,CAUSAL=true`),
    /// reading each value as the kind `signature` declares for it.
    pub fn with_assignments(
        mut self,
        text: &str,
        signature: &KernelSignature,
    ) -> Result<Spec, String> {
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("expected NAME=VALUE, got `{pair}`"))?;
            let (name, value) = (name.trim(), value.trim());
            let param = signature.param(name).ok_or_else(|| {
                format!(
                    "kernel `{}` has no specialisation parameter `{name}`; its parameters are: {}",
                    signature.name,
                    signature.param_names()
                )
            })?;
            let parsed = match param.kind {
                SpecKind::DType => DType::from_name(value).map(SpecValue::DType),
                SpecKind::Int => value.parse().ok().map(SpecValue::Int),
                SpecKind::Bool => value.parse().ok().map(SpecValue::Bool),
            };
            let parsed =
                parsed.ok_or_else(|| format!("`{name}` expects {}, got `{value}`", param.kind))?;
            self = self.set(name, parsed);
        }
        Ok(self)
    }

    /// Checks that this spec gives every parameter of `signature` a value of its kind, and nothing else.
    pub fn validate(&self, signature: &KernelSignature) -> Result<(), String> {
        for (name, value) in self.iter() {
            let Some(param) = signature.param(name) else {
                return Err(format!(
                    "kernel `{}` has no specialisation parameter `{name}`; its parameters are: {}",
                    signature.name,
                    signature.param_names()
                ));
            };
            if param.kind != value.kind() {
                return Err(format!(
                    "specialisation parameter `{name}` of kernel `{}` expects {} but got `{value}`",
                    signature.name, param.kind
                ));
            }
        }
        for param in signature.params {
            if self.get(param.name).is_none() {
                return Err(format!(
                    "kernel `{}` needs a value for specialisation parameter `{}` ({})",
                    signature.name, param.name, param.kind
                ));
            }
        }
        Ok(())
    }
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} = {value}")?;
        }
        Ok(())
    }
}
