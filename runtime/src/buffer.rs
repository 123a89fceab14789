//! Device buffers: typed arrays in GPU memory, copied from and to the interpreter's host buffers
//! so that a GPU run and an interpreter run can start from the same bytes and be compared.

use cudarc::driver::{CudaSlice, DevicePtr};
use half::{bf16, f16};
use kiln_dsl::{DType, HostBuffer};

use crate::{Device, RuntimeError};

type Result<T> = std::result::Result<T, RuntimeError>;

/// `len` elements of `dtype` in device memory, little-endian as on the host (booleans as bytes).
#[derive(Debug)]
pub struct DeviceBuffer {
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) bytes: CudaSlice<u8>,
}

impl DeviceBuffer {
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's device address, for raw launches on `device`'s stream.
    pub fn device_address(&self, device: &Device) -> u64 {
        // The guard records the access on the stream when dropped; raw launches queue on the
        // same stream after it, so the order holds.
        let (address, _guard) = self.bytes.device_ptr(&device.stream);
        address
    }

    /// Copies the buffer back into a new host buffer (waiting for the work queued before).
    pub fn to_host(&self, device: &Device) -> Result<HostBuffer> {
        let bytes = device
            .stream
            .clone_dtoh(&self.bytes)
            .map_err(|e| RuntimeError::driver("copying a buffer to the host", e))?;
        device.synchronize()?;
        Ok(decode(
            self.dtype,
            &bytes[..self.len * self.dtype.size_bytes()],
        ))
    }
}

impl Device {
    /// A device copy of `host`, element for element (poison included).
    pub fn upload(&self, host: &HostBuffer) -> Result<DeviceBuffer> {
        let mut bytes = encode(host);
        // The driver refuses empty allocations: an empty buffer still holds one byte.
        if bytes.is_empty() {
            bytes.push(0);
        }
        let slice = self
            .stream
            .clone_htod(&bytes)
            .map_err(|e| RuntimeError::driver("copying a buffer to the device", e))?;
        Ok(DeviceBuffer {
            dtype: host.dtype(),
            len: host.len(),
            bytes: slice,
        })
    }
}

/// The byte a poisoned bool holds (`HostBuffer::poisoned`'s pattern), kept through the device.
const BOOL_POISON: u8 = 0x5a;

/// The buffer's elements as the GPU stores them.
fn encode(host: &HostBuffer) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(host.len() * host.dtype().size_bytes());
    // Bools read back as 0 or 1: their poison is carried by position.
    let poisoned_bools = match host.dtype() {
        DType::I1 => host.poisoned_indices(),
        _ => Vec::new(),
    };
    for i in 0..host.len() {
        match host.dtype() {
            DType::F16 => bytes.extend(f16::from_f32(host.read_float(i)).to_le_bytes()),
            DType::BF16 => bytes.extend(bf16::from_f32(host.read_float(i)).to_le_bytes()),
            DType::F32 => bytes.extend(host.read_float(i).to_le_bytes()),
            DType::I32 => bytes.extend((host.read_int(i) as i32).to_le_bytes()),
            DType::I64 => bytes.extend(host.read_int(i).to_le_bytes()),
            DType::I1 if poisoned_bools.binary_search(&i).is_ok() => bytes.push(BOOL_POISON),
            DType::I1 => bytes.push((host.read_int(i) != 0) as u8),
        }
    }
    bytes
}

/// A host buffer holding the elements in `bytes`; every value is exact in its dtype.
fn decode(dtype: DType, bytes: &[u8]) -> HostBuffer {
    let size = dtype.size_bytes();
    // Poisoned first, so that a bool byte still holding the poison stays poisoned.
    let host = HostBuffer::poisoned(dtype, bytes.len() / size);
    for (i, chunk) in bytes.chunks_exact(size).enumerate() {
        match dtype {
            DType::F16 => host.write_float(i, f16::from_le_bytes([chunk[0], chunk[1]]).to_f32()),
            DType::BF16 => host.write_float(i, bf16::from_le_bytes([chunk[0], chunk[1]]).to_f32()),
            DType::F32 => host.write_float(i, f32::from_le_bytes(chunk.try_into().unwrap())),
            DType::I32 => host.write_int(i, i32::from_le_bytes(chunk.try_into().unwrap()) as i64),
            DType::I64 => host.write_int(i, i64::from_le_bytes(chunk.try_into().unwrap())),
            DType::I1 if chunk[0] == BOOL_POISON => {}
            DType::I1 => host.write_int(i, chunk[0] as i64),
        }
    }
    host
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes a device buffer holds decode to the host buffer they came from, poison included.
    #[test]
    fn host_buffers_round_trip_through_device_bytes() {
        let values = [0.0, -1.5, 3.25, 65504.0, -7.0];
        for dtype in DType::ALL {
            let host = HostBuffer::from_f64(dtype, &values);
            let back = decode(dtype, &encode(&host));
            assert_eq!(back.to_f64(), host.to_f64(), "{dtype}");
            assert_eq!(encode(&host).len(), values.len() * dtype.size_bytes());
            let poisoned = HostBuffer::poisoned(dtype, 3);
            let back = decode(dtype, &encode(&poisoned));
            assert_eq!(back.poisoned_indices(), [0, 1, 2], "{dtype}");
        }
        let halves = encode(&HostBuffer::from_f32(DType::F16, &[1.0, -2.0]));
        assert_eq!(halves, [0x00, 0x3c, 0x00, 0xc0]);
    }
}
