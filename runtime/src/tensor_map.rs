//! Tensor maps at launch: a kernel whose loads kiln-codegen turned into TMA copies takes, after
//! its own parameters, a `CUtensorMap` per array it copies from, whose recipe its PTX carries
//! (`// kiln.tensor_map` lines, [`TensorMapSpec::in_ptx`]). Each launch resolves the recipes
//! with its arguments (address, shape, strides) and encodes them with the driver
//! (`cuTensorMapEncodeTiled`); the kernel reads them in place from the parameter space.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::sync::Mutex;

use cudarc::driver::{result, sys};
use kiln_dsl::{DType, TensorMapParams, TensorMapSpec};

use crate::RuntimeError;
use crate::context::Context;
use crate::error::driver_message;

type Result<T> = std::result::Result<T, RuntimeError>;

/// An encoded tensor map, as a kernel parameter takes it (128 bytes, 64-byte aligned).
pub(crate) type TensorMap = sys::CUtensorMap;

/// The tensor maps `ptx` asks for, or why its lines are not tensor maps kiln wrote.
pub(crate) fn specs_in_ptx(kernel: &str, ptx: &str) -> Result<Vec<TensorMapSpec>> {
    TensorMapSpec::in_ptx(ptx).map_err(|message| RuntimeError::Launch {
        kernel: kernel.to_string(),
        message: format!("its PTX carries a tensor map kiln cannot read: {message}"),
    })
}

/// Encodes the maps of `specs` for a launch in `context` whose pointer argument `i` is
/// `address(i)` and integer argument `i` is `int(i)` (`None`: not an integer).
pub(crate) fn encode_all(
    kernel: &str,
    context: Context,
    specs: &[TensorMapSpec],
    address: impl Fn(usize) -> u64,
    int: impl Fn(usize) -> Option<i64>,
) -> Result<Vec<TensorMap>> {
    specs
        .iter()
        .enumerate()
        .map(|(m, spec)| {
            let refused = |message: String| RuntimeError::Launch {
                kernel: kernel.to_string(),
                message: format!("tensor map {m} (of argument {}): {message}", spec.base),
            };
            let params = spec.resolve(address(spec.base), &int).map_err(refused)?;
            encode(&params, context).map_err(refused)
        })
        .collect()
}

/// One map through the driver. An empty array becomes one zero element (the driver takes no
/// empty dimension; every copy from an empty array reads zeros either way).
fn encode(params: &TensorMapParams, context: Context) -> std::result::Result<TensorMap, String> {
    let rank = params.dims.len();
    let (address, dims, strides) = if params.is_empty() {
        let zero = zero_page(context).map_err(|e| e.to_string())?;
        (zero, vec![1; rank], vec![16; rank - 1])
    } else {
        (
            params.address,
            params.dims.clone(),
            params.byte_strides.clone(),
        )
    };
    let dtype = match params.dtype {
        DType::F16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::BF16 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F32 => sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        other => return Err(format!("no tensor map of {other}")),
    };
    let swizzle = match params.swizzle_bytes {
        128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        0 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
        other => return Err(format!("no {other}-byte swizzle")),
    };
    let element_strides = vec![1u32; rank];
    let mut map = MaybeUninit::<TensorMap>::zeroed();
    // Safety: every array holds `rank` entries (`rank - 1` strides), as the call reads them,
    // and `map` is a writable, aligned `CUtensorMap`.
    let status = unsafe {
        sys::cuTensorMapEncodeTiled(
            map.as_mut_ptr(),
            dtype,
            rank as u32,
            address as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            params.box_dims.as_ptr(),
            element_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    status.result().map_err(|e| {
        format!(
            "the driver refused it ({}): dims {dims:?}, byte strides {strides:?}, box {:?}, \
             address {address:#x}",
            driver_message(e),
            params.box_dims
        )
    })?;
    // Safety: the driver wrote the map.
    Ok(unsafe { map.assume_init() })
}

/// 256 zero bytes of device memory in `context`, allocated on first use and kept for the
/// process: what the map of an empty array points at.
fn zero_page(context: Context) -> Result<u64> {
    static PAGES: Mutex<Option<HashMap<Context, u64>>> = Mutex::new(None);
    const BYTES: usize = 256;
    let mut pages = PAGES.lock().unwrap_or_else(|e| e.into_inner());
    let pages = pages.get_or_insert_with(HashMap::new);
    if let Some(&page) = pages.get(&context) {
        return Ok(page);
    }
    let page = context.with_current(|| {
        let action = "allocating the zero page of empty tensor maps";
        // Safety: a fresh allocation, zeroed before anyone reads it.
        unsafe {
            let page = result::malloc_sync(BYTES).map_err(|e| RuntimeError::driver(action, e))?;
            result::memset_d8_sync(page, 0, BYTES).map_err(|e| RuntimeError::driver(action, e))?;
            Ok(page)
        }
    })?;
    pages.insert(context, page);
    Ok(page)
}
