//! Device buffers as raw bytes: filled from and read back into little-endian byte arrays, and
//! overwritten with a byte pattern, for callers that keep large tensors out of
//! [`kiln_dsl::HostBuffer`]s (the attention harness writes them to files for PyTorch to read).

use cudarc::driver::{DevicePtrMut, result};
use kiln_dsl::DType;

use crate::{Device, DeviceBuffer, RuntimeError};

type Result<T> = std::result::Result<T, RuntimeError>;

impl Device {
    /// A device buffer of `dtype` holding `bytes`, the elements little-endian as the GPU stores
    /// them; its length is `bytes.len() / dtype.size_bytes()`, which must divide evenly.
    pub fn upload_bytes(&self, dtype: DType, bytes: &[u8]) -> Result<DeviceBuffer> {
        let size = dtype.size_bytes();
        if !bytes.len().is_multiple_of(size) {
            return Err(RuntimeError::Driver {
                action: "copying a buffer to the device".to_string(),
                message: format!(
                    "{} bytes are not a whole number of {dtype} elements",
                    bytes.len()
                ),
            });
        }
        // The driver refuses empty allocations: an empty buffer still holds one byte.
        let slice = if bytes.is_empty() {
            self.stream.clone_htod(&[0u8][..])
        } else {
            self.stream.clone_htod(bytes)
        }
        .map_err(|e| RuntimeError::driver("copying a buffer to the device", e))?;
        Ok(DeviceBuffer {
            dtype,
            len: bytes.len() / size,
            bytes: slice,
        })
    }

    /// `len` elements of `dtype` whose every byte is `byte` (`0xff` is a NaN in f16, bf16 and
    /// f32: the poison an output starts with, so that an element a kernel fails to write shows).
    pub fn filled(&self, dtype: DType, len: usize, byte: u8) -> Result<DeviceBuffer> {
        let mut buffer = self.scratch(dtype, len)?;
        buffer.fill(self, byte)?;
        Ok(buffer)
    }

    /// `len` elements of `dtype` holding whatever the allocator left there: a workspace whose
    /// kernels write every element before they read it, which a fill would only slow down.
    pub fn scratch(&self, dtype: DType, len: usize) -> Result<DeviceBuffer> {
        let bytes = len * dtype.size_bytes();
        // Safety: any byte pattern is a valid `u8`; device memory is never read as anything
        // else on the host.
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }
            .map_err(|e| RuntimeError::driver("allocating a device buffer", e))?;
        Ok(DeviceBuffer {
            dtype,
            len,
            bytes: slice,
        })
    }
}

impl DeviceBuffer {
    /// Sets every byte to `byte`, queued on `device`'s stream.
    pub fn fill(&mut self, device: &Device, byte: u8) -> Result<()> {
        let count = self.bytes.len();
        let (pointer, _record) = self.bytes.device_ptr_mut(&device.stream);
        // Safety: `pointer` is this buffer's allocation of `count` bytes on `device`'s stream,
        // and any byte pattern is a valid `u8`.
        unsafe { result::memset_d8_async(pointer, byte, count, device.stream.cu_stream()) }
            .map_err(|e| RuntimeError::driver("filling a device buffer", e))
    }

    /// The buffer's elements as little-endian bytes (waiting for the work queued before).
    pub fn to_bytes(&self, device: &Device) -> Result<Vec<u8>> {
        let mut bytes = device
            .stream
            .clone_dtoh(&self.bytes)
            .map_err(|e| RuntimeError::driver("copying a buffer to the host", e))?;
        device.synchronize()?;
        bytes.truncate(self.len * self.dtype.size_bytes());
        Ok(bytes)
    }
}
