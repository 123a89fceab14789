//! Host buffers: what a pointer argument points at when the interpreter runs a kernel.
//!
//! Programs run in parallel and may write the same buffer, so elements are stored as atomics of
//! their width, read and written with relaxed ordering: two programs storing one element race as
//! they would on the GPU (one of the values wins), never undefined behaviour.

use std::fmt;
use std::sync::atomic::Ordering::{AcqRel, Relaxed};
use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64};

use half::{bf16, f16};

use crate::passes::wrap_int;
use crate::types::DType;

enum Cells {
    W8(Vec<AtomicU8>),
    W16(Vec<AtomicU16>),
    W32(Vec<AtomicU32>),
    W64(Vec<AtomicU64>),
}

/// A typed array in host memory that a kernel reads and writes through a `Ptr<T>` argument.
pub struct HostBuffer {
    dtype: DType,
    cells: Cells,
}

impl fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HostBuffer<{}>[{}]", self.dtype, self.len())
    }
}

/// The bit pattern an element is poisoned with: NaN for floats, a recognisable integer otherwise.
fn poison_bits(dtype: DType) -> u64 {
    match dtype {
        DType::F16 => f16::NAN.to_bits() as u64,
        DType::BF16 => bf16::NAN.to_bits() as u64,
        DType::F32 => f32::NAN.to_bits() as u64,
        DType::I32 => 0x5a5a_5a5a,
        DType::I64 => 0x5a5a_5a5a_5a5a_5a5a,
        DType::I1 => 0x5a,
    }
}

impl HostBuffer {
    fn filled(dtype: DType, len: usize, bits: u64) -> HostBuffer {
        let cells = match dtype.size_bytes() {
            1 => Cells::W8((0..len).map(|_| AtomicU8::new(bits as u8)).collect()),
            2 => Cells::W16((0..len).map(|_| AtomicU16::new(bits as u16)).collect()),
            4 => Cells::W32((0..len).map(|_| AtomicU32::new(bits as u32)).collect()),
            _ => Cells::W64((0..len).map(|_| AtomicU64::new(bits)).collect()),
        };
        HostBuffer { dtype, cells }
    }

    pub fn zeros(dtype: DType, len: usize) -> HostBuffer {
        HostBuffer::filled(dtype, len, 0)
    }

    /// A buffer of NaN (floats) or `0x5a..` (integers), so that an element a kernel fails to
    /// write stands out.
    pub fn poisoned(dtype: DType, len: usize) -> HostBuffer {
        HostBuffer::filled(dtype, len, poison_bits(dtype))
    }

    /// A buffer holding `values` rounded to `dtype` (floats round to nearest even; integer dtypes
    /// take the values truncated; i1 is `v != 0`).
    pub fn from_f64(dtype: DType, values: &[f64]) -> HostBuffer {
        let buffer = HostBuffer::zeros(dtype, values.len());
        for (i, &v) in values.iter().enumerate() {
            if dtype.is_float() {
                buffer.write_float(i, v as f32);
            } else {
                buffer.write_int(i, v as i64);
            }
        }
        buffer
    }

    pub fn from_f32(dtype: DType, values: &[f32]) -> HostBuffer {
        let wide: Vec<f64> = values.iter().map(|&v| v as f64).collect();
        HostBuffer::from_f64(dtype, &wide)
    }

    pub fn from_i64(dtype: DType, values: &[i64]) -> HostBuffer {
        let buffer = HostBuffer::zeros(dtype, values.len());
        for (i, &v) in values.iter().enumerate() {
            if dtype.is_float() {
                buffer.write_float(i, v as f32);
            } else {
                buffer.write_int(i, v);
            }
        }
        buffer
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        match &self.cells {
            Cells::W8(c) => c.len(),
            Cells::W16(c) => c.len(),
            Cells::W32(c) => c.len(),
            Cells::W64(c) => c.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn bits(&self, index: usize) -> u64 {
        match &self.cells {
            Cells::W8(c) => c[index].load(Relaxed) as u64,
            Cells::W16(c) => c[index].load(Relaxed) as u64,
            Cells::W32(c) => c[index].load(Relaxed) as u64,
            Cells::W64(c) => c[index].load(Relaxed),
        }
    }

    fn set_bits(&self, index: usize, bits: u64) {
        match &self.cells {
            Cells::W8(c) => c[index].store(bits as u8, Relaxed),
            Cells::W16(c) => c[index].store(bits as u16, Relaxed),
            Cells::W32(c) => c[index].store(bits as u32, Relaxed),
            Cells::W64(c) => c[index].store(bits, Relaxed),
        }
    }

    /// Element `index` of a float buffer, widened to f32 (exact for f16 and bf16).
    pub fn read_float(&self, index: usize) -> f32 {
        let bits = self.bits(index);
        match self.dtype {
            DType::F16 => f16::from_bits(bits as u16).to_f32(),
            DType::BF16 => bf16::from_bits(bits as u16).to_f32(),
            DType::F32 => f32::from_bits(bits as u32),
            DType::I32 => bits as u32 as i32 as f32,
            DType::I64 => bits as i64 as f32,
            DType::I1 => (bits != 0) as u8 as f32,
        }
    }

    /// Element `index` of an integer or bool buffer.
    pub fn read_int(&self, index: usize) -> i64 {
        let bits = self.bits(index);
        match self.dtype {
            DType::I32 => bits as u32 as i32 as i64,
            DType::I64 => bits as i64,
            DType::I1 => (bits != 0) as i64,
            _ => self.read_float(index) as i64,
        }
    }

    /// Writes a float, rounding it to nearest even in the buffer's dtype.
    pub fn write_float(&self, index: usize, value: f32) {
        let bits = match self.dtype {
            DType::F16 => f16::from_f32(value).to_bits() as u64,
            DType::BF16 => bf16::from_f32(value).to_bits() as u64,
            DType::F32 => value.to_bits() as u64,
            _ => return self.write_int(index, value as i64),
        };
        self.set_bits(index, bits);
    }

    /// Adds `value` to element `index` of an f32 buffer as one atomic step (the interpreter's
    /// programs run in parallel), as the GPU's `red.add.f32` does: rounded to nearest even, with
    /// subnormal inputs and results flushed to zero of their sign.
    pub fn atomic_add_f32(&self, index: usize, value: f32) {
        let Cells::W32(cells) = &self.cells else {
            unreachable!("the builder lets `atomic_add` add into f32 only")
        };
        let flush = |x: f32| {
            if x.is_subnormal() {
                0.0f32.copysign(x)
            } else {
                x
            }
        };
        let add = |bits: u32| Some(flush(flush(f32::from_bits(bits)) + flush(value)).to_bits());
        // The closure never refuses, so the update always succeeds.
        let _ = cells[index].fetch_update(Relaxed, Relaxed, add);
    }

    /// Adds 1 to element `index` of an i32 buffer as one atomic step that orders the calling
    /// program's memory accesses before it (release) and after it (acquire), and gives the value
    /// before: [`crate::Builder::atomic_arrive`].
    pub fn arrive_i32(&self, index: usize) -> i32 {
        let Cells::W32(cells) = &self.cells else {
            unreachable!("the builder lets `atomic_arrive` count in i32 only")
        };
        cells[index].fetch_add(1, AcqRel) as i32
    }

    /// Writes an integer, wrapped to the buffer's width.
    pub fn write_int(&self, index: usize, value: i64) {
        if self.dtype.is_float() {
            return self.write_float(index, value as f32);
        }
        let bits = match self.dtype {
            DType::I1 => (value != 0) as u64,
            d => wrap_int(value, d) as u64,
        };
        self.set_bits(index, bits);
    }

    /// The whole buffer widened to f64 (integers converted).
    pub fn to_f64(&self) -> Vec<f64> {
        (0..self.len())
            .map(|i| {
                if self.dtype.is_float() {
                    self.read_float(i) as f64
                } else {
                    self.read_int(i) as f64
                }
            })
            .collect()
    }

    pub fn to_f32(&self) -> Vec<f32> {
        (0..self.len()).map(|i| self.read_float(i)).collect()
    }

    pub fn to_i64(&self) -> Vec<i64> {
        (0..self.len()).map(|i| self.read_int(i)).collect()
    }

    /// Indices of elements that still hold the poison pattern of [`HostBuffer::poisoned`].
    pub fn poisoned_indices(&self) -> Vec<usize> {
        let poison = poison_bits(self.dtype);
        (0..self.len())
            .filter(|&i| {
                if self.dtype.is_float() {
                    self.read_float(i).is_nan()
                } else {
                    self.bits(i) == poison
                }
            })
            .collect()
    }
}
