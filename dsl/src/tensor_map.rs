//! Hopper tensor maps: what a launch builds on the host for a kernel whose loads kiln-codegen
//! turned into TMA copies (`cp.async.bulk.tensor`). A map describes one array a block pointer
//! reads, whole (kiln-dsl's `make_block_ptr` with its base, shape and strides all kernel
//! arguments or constants), and the box one copy moves; the launcher reads the array's address,
//! shape and strides from the launch's arguments ([`TensorMapSpec::resolve`]) and passes the
//! encoded map as a hidden parameter after the kernel's own.
//!
//! Where it sits: kiln-codegen writes the specs (`Compiled::tensor_maps`), kiln-runtime encodes
//! them with the driver (`cuTensorMapEncodeTiled`) and kiln-codegen's CPU emulator reads
//! through them, so that both agree with one description.

use std::fmt;
use std::str::FromStr;

use crate::types::DType;

/// A size or stride of the array a tensor map describes: an integer argument of the kernel or a
/// constant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MapScalar {
    /// The kernel argument at this index (i32 or i64).
    Arg(usize),
    Const(i64),
}

/// A tensor map as a kernel needs it, in the DSL's dimension order (outermost first).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSpec {
    pub dtype: DType,
    /// The kernel argument that holds the array's base address.
    pub base: usize,
    /// Per dimension: its size and its stride in elements (the last dimension's is 1).
    pub shape: Vec<MapScalar>,
    pub strides: Vec<MapScalar>,
    /// The box one copy moves, per dimension (1 along indexed dimensions).
    pub box_shape: Vec<u32>,
    /// The shared-memory swizzle the copies write: 128, 64 or 32 bytes, a box row (its last
    /// dimension) that long; or 0, none: the box lands row-major, its rows 16-byte multiples.
    pub swizzle_bytes: u32,
}

/// A tensor map's fields as `cuTensorMapEncodeTiled` takes them: innermost dimension first,
/// strides in bytes for every dimension but the innermost. A dimension may be 0 (an empty
/// array, where every copy reads zeros), which the driver cannot encode: see [`Self::is_empty`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapParams {
    pub dtype: DType,
    pub address: u64,
    pub dims: Vec<u64>,
    pub byte_strides: Vec<u64>,
    pub box_dims: Vec<u32>,
    pub swizzle_bytes: u32,
}

impl TensorMapParams {
    /// Whether the array has no element: a launcher encodes a map of one zero element instead
    /// (every copy then reads zeros, as from the empty array).
    pub fn is_empty(&self) -> bool {
        self.dims.contains(&0)
    }
}

/// The largest array dimension a tensor map describes, and the bound on its byte strides.
const MAX_DIM: u64 = 1 << 32;
const MAX_STRIDE: u64 = 1 << 40;

impl TensorMapSpec {
    /// The map for a launch whose base address is `address` and whose argument `i` is the
    /// integer `int(i)` (`None`: not an integer); an error names the value a tensor map cannot
    /// describe (TMA's rules: a 16-byte aligned address, sizes up to 2^32, strides in multiples
    /// of 16 bytes below 2^40).
    pub fn resolve(
        &self,
        address: u64,
        int: impl Fn(usize) -> Option<i64>,
    ) -> Result<TensorMapParams, String> {
        let value = |s: MapScalar| match s {
            MapScalar::Arg(i) => int(i).ok_or_else(|| format!("argument {i} is not an integer")),
            MapScalar::Const(c) => Ok(c),
        };
        if !address.is_multiple_of(16) {
            return Err(format!(
                "a tensor map's base address must be 16-byte aligned, got {address:#x}"
            ));
        }
        let elem = self.dtype.size_bytes() as u64;
        let rank = self.shape.len();
        let mut dims = Vec::with_capacity(rank);
        let mut byte_strides = Vec::with_capacity(rank - 1);
        for d in (0..rank).rev() {
            let size = value(self.shape[d])?;
            if size < 0 || size as u64 > MAX_DIM {
                return Err(format!(
                    "dimension {d} of a tensor map must have 0 to 2^32 elements, got {size}"
                ));
            }
            dims.push(size as u64);
            if d == rank - 1 {
                continue;
            }
            let stride = value(self.strides[d])?;
            let bytes = (stride as u64).wrapping_mul(elem);
            let encodable = stride >= 0 && bytes.is_multiple_of(16) && bytes < MAX_STRIDE;
            // Only index 0 of a dimension of one element is read (past it a copy reads zeros):
            // its stride never moves an address, so one TMA cannot encode (a batch of one's,
            // say) is as good as 0.
            if !encodable && size <= 1 {
                byte_strides.push(0);
                continue;
            }
            if !encodable {
                return Err(format!(
                    "the stride of dimension {d} of a tensor map must be a multiple of 16 bytes \
                     below 2^40, got {stride} elements of {}",
                    self.dtype
                ));
            }
            byte_strides.push(bytes);
        }
        Ok(TensorMapParams {
            dtype: self.dtype,
            address,
            dims,
            byte_strides,
            box_dims: self.box_shape.iter().rev().copied().collect(),
            swizzle_bytes: self.swizzle_bytes,
        })
    }
}

impl fmt::Display for MapScalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapScalar::Arg(i) => write!(f, "arg{i}"),
            MapScalar::Const(c) => write!(f, "{c}"),
        }
    }
}

impl FromStr for MapScalar {
    type Err = String;

    fn from_str(s: &str) -> Result<MapScalar, String> {
        let parsed = match s.strip_prefix("arg") {
            Some(index) => index.parse().map(MapScalar::Arg).ok(),
            None => s.parse().map(MapScalar::Const).ok(),
        };
        parsed.ok_or_else(|| format!("expected `argN` or an integer, got `{s}`"))
    }
}

/// The prefix of the PTX comment line that carries each tensor map a kernel takes, in order.
pub const PTX_LINE: &str = "// kiln.tensor_map ";

impl TensorMapSpec {
    /// The specs a kernel's PTX carries ([`PTX_LINE`]), in parameter order.
    pub fn in_ptx(ptx: &str) -> Result<Vec<TensorMapSpec>, String> {
        ptx.lines()
            .filter_map(|line| line.strip_prefix(PTX_LINE))
            .map(str::parse)
            .collect()
    }
}

impl fmt::Display for TensorMapSpec {
    /// `arg1 bf16 shape=arg9,arg10,arg6,128 strides=arg14,arg16,arg15,1 box=1,1,64,64 swizzle=128`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(v: &[T]) -> String {
            v.iter().map(T::to_string).collect::<Vec<_>>().join(",")
        }
        write!(
            f,
            "arg{} {} shape={} strides={} box={} swizzle={}",
            self.base,
            self.dtype,
            list(&self.shape),
            list(&self.strides),
            list(&self.box_shape),
            self.swizzle_bytes
        )
    }
}

impl FromStr for TensorMapSpec {
    type Err = String;

    /// The [`fmt::Display`] form back.
    fn from_str(s: &str) -> Result<TensorMapSpec, String> {
        let bad = || {
            format!(
                "expected a tensor map `argN dtype shape=.. strides=.. box=.. swizzle=N`, got `{s}`"
            )
        };
        let words: Vec<&str> = s.split_whitespace().collect();
        let [base, dtype, shape, strides, box_shape, swizzle] = words[..] else {
            return Err(bad());
        };
        fn field<'w>(
            word: &'w str,
            key: &str,
            bad: impl Fn() -> String,
        ) -> Result<&'w str, String> {
            word.strip_prefix(key).ok_or_else(bad)
        }
        let scalars = |list: &str| -> Result<Vec<MapScalar>, String> {
            list.split(',').map(str::parse).collect()
        };
        let number = |word: &str| word.parse::<u32>().map_err(|_| bad());
        let MapScalar::Arg(base) = base.parse()? else {
            return Err(bad());
        };
        let spec = TensorMapSpec {
            dtype: DType::from_name(dtype).ok_or_else(bad)?,
            base,
            shape: scalars(field(shape, "shape=", bad)?)?,
            strides: scalars(field(strides, "strides=", bad)?)?,
            box_shape: field(box_shape, "box=", bad)?
                .split(',')
                .map(number)
                .collect::<Result<_, _>>()?,
            swizzle_bytes: number(field(swizzle, "swizzle=", bad)?)?,
        };
        // What `cuTensorMapEncodeTiled` reads: 1 to 5 dimensions, each with a stride and a box
        // size of 1 to 256, and a swizzle it knows.
        let rank = spec.shape.len();
        if !(1..=5).contains(&rank)
            || spec.strides.len() != rank
            || spec.box_shape.len() != rank
            || spec.box_shape.iter().any(|&b| !(1..=256).contains(&b))
            || ![0, 32, 64, 128].contains(&spec.swizzle_bytes)
        {
            return Err(format!(
                "a tensor map has 1 to 5 dimensions, each with a stride and a box size of 1 to \
                 256, and a swizzle of 0, 32, 64 or 128 bytes; got `{s}`"
            ));
        }
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> TensorMapSpec {
        TensorMapSpec {
            dtype: DType::BF16,
            base: 1,
            shape: vec![MapScalar::Arg(9), MapScalar::Arg(6), MapScalar::Const(128)],
            strides: vec![MapScalar::Arg(14), MapScalar::Arg(15), MapScalar::Const(1)],
            box_shape: vec![1, 64, 64],
            swizzle_bytes: 128,
        }
    }

    #[test]
    fn a_spec_reads_back_from_its_ptx_line() {
        let ptx = format!("{PTX_LINE}{}\n.version 8.1\n", spec());
        assert_eq!(TensorMapSpec::in_ptx(&ptx).unwrap(), vec![spec()]);
        assert!(TensorMapSpec::in_ptx(&format!("{PTX_LINE}arg1 bf16")).is_err());
        // Lengths the driver would read past, a box it cannot copy.
        for bad in [
            "arg1 bf16 shape=arg9,128 strides=1 box=64,64 swizzle=128",
            "arg1 bf16 shape=arg9,128 strides=arg3,1 box=64 swizzle=128",
            "arg1 bf16 shape=arg9,128 strides=arg3,1 box=512,64 swizzle=128",
            "arg1 bf16 shape=1,1,1,1,1,1 strides=1,1,1,1,1,1 box=1,1,1,1,1,1 swizzle=0",
            "arg1 bf16 shape=arg9,128 strides=arg3,1 box=64,64 swizzle=16",
        ] {
            let err = bad.parse::<TensorMapSpec>().unwrap_err();
            assert!(err.contains("1 to 5 dimensions"), "{bad}: {err}");
        }
    }

    #[test]
    fn resolving_orders_dimensions_innermost_first_and_checks_tma_rules() {
        let args = |i: usize| match i {
            9 => Some(2),
            6 => Some(100),
            14 => Some(100 * 8 * 128),
            15 => Some(8 * 128),
            _ => unreachable!("argument {i}"),
        };
        let params = spec().resolve(0x1000, args).unwrap();
        assert_eq!(params.dims, vec![128, 100, 2]);
        assert_eq!(params.byte_strides, vec![8 * 128 * 2, 100 * 8 * 128 * 2]);
        assert_eq!(params.box_dims, vec![64, 64, 1]);
        let err = spec().resolve(0x1008, args).unwrap_err();
        assert!(err.contains("16-byte aligned, got 0x1008"), "{err}");
        let odd = |i: usize| if i == 15 { Some(4) } else { args(i) };
        let err = spec().resolve(0x1000, odd).unwrap_err();
        assert!(
            err.contains("dimension 1") && err.contains("got 4 elements of bf16"),
            "{err}"
        );
        let empty = |i: usize| if i == 6 { Some(0) } else { args(i) };
        assert!(spec().resolve(0x1000, empty).unwrap().is_empty());
        // A batch of one: its stride, past what TMA encodes, never moves an address.
        let one = |i: usize| match i {
            9 => Some(1),
            14 => Some(1 << 40),
            _ => args(i),
        };
        let params = spec().resolve(0x1000, one).unwrap();
        assert_eq!(params.byte_strides, vec![8 * 128 * 2, 0]);
    }
}
