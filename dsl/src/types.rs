//! Element types and value types of the tile IR.

use std::fmt;

/// A scalar element type. Tiles, scalars and pointees are built from these.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F16,
    BF16,
    F32,
    I32,
    I64,
    /// A boolean: the result of a comparison, a mask.
    I1,
}

impl DType {
    pub const ALL: [DType; 6] = [
        DType::F16,
        DType::BF16,
        DType::F32,
        DType::I32,
        DType::I64,
        DType::I1,
    ];

    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::I1 => "i1",
        }
    }

    /// Parses the DSL spelling (`f16`, `bf16`, `f32`, `i32`, `i64`, `bool` or `i1`).
    pub fn from_name(name: &str) -> Option<DType> {
        Some(match name {
            "f16" => DType::F16,
            "bf16" => DType::BF16,
            "f32" => DType::F32,
            "i32" => DType::I32,
            "i64" => DType::I64,
            "bool" | "i1" => DType::I1,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F16 | DType::BF16 | DType::F32)
    }

    /// Integers proper; `i1` is a boolean and is not counted here.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    pub fn size_bytes(self) -> usize {
        match self {
            DType::I1 => 1,
            DType::F16 | DType::BF16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one element of a tensor value is: a number or a global pointer to numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Value(DType),
    Ptr(DType),
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Value(dtype) => write!(f, "{dtype}"),
            Elem::Ptr(dtype) => write!(f, "ptr<{dtype}>"),
        }
    }
}

/// The type of an IR value. Shapes are static; a rank-0 tensor is a scalar.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Tensor {
        elem: Elem,
        shape: Vec<usize>,
    },
    /// A pointer to a `block_shape` window of a strided N-d array (Triton's block pointer).
    BlockPtr {
        pointee: DType,
        block_shape: Vec<usize>,
    },
}

impl Type {
    pub fn scalar(dtype: DType) -> Type {
        Type::Tensor {
            elem: Elem::Value(dtype),
            shape: Vec::new(),
        }
    }

    pub fn tile(dtype: DType, shape: Vec<usize>) -> Type {
        Type::Tensor {
            elem: Elem::Value(dtype),
            shape,
        }
    }

    pub fn ptr(pointee: DType, shape: Vec<usize>) -> Type {
        Type::Tensor {
            elem: Elem::Ptr(pointee),
            shape,
        }
    }

    /// The shape of a tensor; a block pointer has none (its block shape is not a value shape).
    pub fn shape(&self) -> &[usize] {
        match self {
            Type::Tensor { shape, .. } => shape,
            Type::BlockPtr { .. } => &[],
        }
    }

    pub fn elem(&self) -> Option<Elem> {
        match self {
            Type::Tensor { elem, .. } => Some(*elem),
            Type::BlockPtr { .. } => None,
        }
    }

    /// The number type of a tensor of numbers.
    pub fn dtype(&self) -> Option<DType> {
        match self.elem() {
            Some(Elem::Value(dtype)) => Some(dtype),
            _ => None,
        }
    }

    pub fn is_scalar(&self) -> bool {
        matches!(self, Type::Tensor { shape, .. } if shape.is_empty())
    }

    pub fn num_elements(&self) -> usize {
        self.shape().iter().product()
    }
}

impl fmt::Display for Type {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Type::Tensor { elem, shape } if shape.is_empty() => write!(f, "{elem}"),
            Type::Tensor { elem, shape } => write!(f, "{elem}{}", ShapeDisplay(shape)),
            Type::BlockPtr {
                pointee,
                block_shape,
            } => write!(f, "block_ptr<{pointee}>{}", ShapeDisplay(block_shape)),
        }
    }
}

/// Prints a shape as `[64, 128]`.
#[derive(Debug)]
pub struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}
