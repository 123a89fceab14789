//! The C interface to the prebuilt attention kernels, exactly as `../shared/c-abi.md` fixes it:
//! `libkiln_kernels.so` / `.a` export these functions, and cbindgen writes their header,
//! `kernels/include/kiln.h` (a test keeps it current).
//!
//! Every entry point validates its arguments before anything runs (invalid arguments first,
//! then what this build cannot do), never unwinds into C (a panic is caught and reported as
//! `KILN_INTERNAL`), and leaves its message for [`kiln_last_error`] on the calling thread.

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};

use kiln_dsl::DType;
use kiln_runtime::Context;

use crate::attention::gpu::{self, BackwardAddresses, ForwardAddresses, RawTensor};
use crate::attention::{AttentionError, AttentionParams, HEAD_DIMS, Layout};

pub const KILN_F16: i32 = 0;
pub const KILN_BF16: i32 = 1;

/// The backward runs one fused pass with dQ accumulated by f32 atomic adds, not bitwise
/// reproducible (on an H100 today as fast as the split backward at head dim 64 without the mask,
/// slower otherwise: docs/PERF.md). Without it the split dQ and dK/dV kernels run, bitwise the
/// same on every run.
pub const KILN_FLAG_FUSED_BACKWARD: u32 = 1;

pub const KILN_OK: i32 = 0;
/// Shapes, strides, pointers, alignment or sizes are wrong.
pub const KILN_INVALID_ARGUMENT: i32 = 1;
/// A valid request this build has no kernel for.
pub const KILN_UNSUPPORTED: i32 = 2;
/// The driver reported an error.
pub const KILN_CUDA_ERROR: i32 = 3;
/// A bug in kiln; the message says where.
pub const KILN_INTERNAL: i32 = 4;

/// What to compute. No implicit padding: 72 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kiln_attn_config {
    /// `KILN_F16` or `KILN_BF16`.
    pub dtype: i32,
    pub batch: i32,
    pub seqlen_q: i32,
    pub seqlen_k: i32,
    pub heads_q: i32,
    /// `heads_q % heads_kv == 0`: MHA, GQA and MQA.
    pub heads_kv: i32,
    pub head_dim: i32,
    /// 0 or 1; the mask is aligned to the bottom-right corner.
    pub causal: i32,
    /// -1: unbounded.
    pub window_left: i32,
    /// -1: unbounded.
    pub window_right: i32,
    /// `s = softmax_scale * dot(q, k)`.
    pub softmax_scale: f32,
    /// > 0: `s = softcap * tanh(s / softcap)`; 0: off.
    pub softcap: f32,
    /// Probability of dropping an attention weight; 0: off.
    pub dropout_p: f32,
    /// `KILN_FLAG_*` bits; every other bit must be 0.
    pub flags: u32,
    pub rng_seed: u64,
    pub rng_offset: u64,
}

/// A `[batch, seqlen, heads, head_dim]` tensor in device memory; strides count elements.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kiln_tensor {
    pub data: *mut c_void,
    pub batch_stride: i64,
    pub seq_stride: i64,
    pub head_stride: i64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kiln_attn_fwd_args {
    pub cfg: kiln_attn_config,
    pub q: kiln_tensor,
    pub k: kiln_tensor,
    pub v: kiln_tensor,
    pub o: kiln_tensor,
    /// Output `[batch, heads_q, seqlen_q]`, contiguous: natural-log log-sum-exp of each row.
    pub lse: *mut f32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct kiln_attn_bwd_args {
    pub cfg: kiln_attn_config,
    pub q: kiln_tensor,
    pub k: kiln_tensor,
    pub v: kiln_tensor,
    pub o: kiln_tensor,
    pub d_o: kiln_tensor,
    pub lse: *const f32,
    pub dq: kiln_tensor,
    pub dk: kiln_tensor,
    pub dv: kiln_tensor,
    /// At least `kiln_attn_bwd_workspace_bytes(&cfg)` bytes of device memory.
    pub workspace: *mut c_void,
    pub workspace_bytes: usize,
}

const _: () = assert!(size_of::<kiln_attn_config>() == 72);

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// The message of this thread's last failed call ("" if none). Valid until this thread's next
/// call.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// `"kiln <version> (<kernels>: <dtypes>, head dims <list>, archs <list>)"`.
#[unsafe(no_mangle)]
pub extern "C" fn kiln_version() -> *const c_char {
    VERSION.as_ptr()
}

static VERSION: std::sync::LazyLock<CString> = std::sync::LazyLock::new(|| {
    let dims: Vec<String> = HEAD_DIMS.iter().map(usize::to_string).collect();
    CString::new(format!(
        "kiln {} (attention forward, split and fused backward; causal, MHA/GQA/MQA: f16, bf16, \
         head dims {}, \
         archs sm_80, sm_90a)",
        env!("CARGO_PKG_VERSION"),
        dims.join(", ")
    ))
    .expect("no NUL in the version")
});

/// Launches the forward pass on `stream` in the calling thread's current context (device 0's
/// primary context if none). Where the call has too few query blocks to fill the GPU (a decode
/// step, a short chunk of queries against long keys) it splits the keys over more programs and
/// adds their parts up in a second kernel, with a workspace it allocates and frees in the
/// stream's order (`cuMemAllocAsync`).
///
/// # Safety
/// `args` is NULL or points to a valid `kiln_attn_fwd_args` whose tensors address device memory
/// holding every element their shapes and strides reach.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_attn_fwd(
    args: *const kiln_attn_fwd_args,
    stream: *mut c_void,
) -> i32 {
    guarded(|| {
        // Safety: NULL or valid, as the caller promises.
        let args = unsafe { args.as_ref() }.ok_or_else(|| invalid("args is NULL"))?;
        let (p, unsupported) = params(&args.cfg, false)?;
        let at = ForwardAddresses {
            q: raw(&args.q),
            k: raw(&args.k),
            v: raw(&args.v),
            o: raw(&args.o),
            lse: args.lse as u64,
        };
        gpu::check_forward(&p, &at)?;
        let context = supported(&p, unsupported)?;
        // Safety: the caller vouches for the memory (the C interface cannot know lengths).
        unsafe { gpu::launch_forward_checked(context, stream, &p, &at, &Default::default()) }
    })
}

/// Bytes of device workspace `kiln_attn_bwd` needs for `cfg`; 0 if `cfg` is invalid (see
/// `kiln_last_error`).
///
/// # Safety
/// `cfg` is NULL or points to a valid `kiln_attn_config`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_attn_bwd_workspace_bytes(cfg: *const kiln_attn_config) -> usize {
    let mut bytes = 0;
    guarded(|| {
        // Safety: NULL or valid, as the caller promises.
        let cfg = unsafe { cfg.as_ref() }.ok_or_else(|| invalid("cfg is NULL"))?;
        let (p, _) = params(cfg, true)?;
        bytes = gpu::workspace_bytes(&p)?;
        Ok(())
    });
    bytes
}

/// Launches the backward pass on `stream`, as [`kiln_attn_fwd`] does: split (bitwise the same on
/// every run), or fused with `KILN_FLAG_FUSED_BACKWARD`.
///
/// # Safety
/// `args` is NULL or points to a valid `kiln_attn_bwd_args` whose tensors, `lse` and workspace
/// address device memory holding every element their shapes and strides reach.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kiln_attn_bwd(
    args: *const kiln_attn_bwd_args,
    stream: *mut c_void,
) -> i32 {
    guarded(|| {
        // Safety: NULL or valid, as the caller promises.
        let args = unsafe { args.as_ref() }.ok_or_else(|| invalid("args is NULL"))?;
        let (p, unsupported) = params(&args.cfg, true)?;
        let at = BackwardAddresses {
            q: raw(&args.q),
            k: raw(&args.k),
            v: raw(&args.v),
            o: raw(&args.o),
            d_o: raw(&args.d_o),
            lse: args.lse as u64,
            dq: raw(&args.dq),
            dk: raw(&args.dk),
            dv: raw(&args.dv),
            workspace: args.workspace as u64,
            workspace_bytes: args.workspace_bytes,
        };
        gpu::check_backward(&p, &at)?;
        let context = supported(&p, unsupported)?;
        // Safety: the caller vouches for the memory (the C interface cannot know lengths).
        unsafe { gpu::launch_backward_checked(context, stream, &p, &at, &Default::default()) }
    })
}

/// After the invalid-argument checks: the first feature this build lacks, or whatever else
/// kiln has no kernel for, as `KILN_UNSUPPORTED`; else the context to launch in.
fn supported(p: &AttentionParams, lacks: Option<String>) -> Result<Context, AttentionError> {
    if let Some(what) = lacks {
        return Err(AttentionError::Unsupported(what));
    }
    gpu::check_supported(p)?;
    Ok(Context::current_or_primary()?)
}

/// Runs `f`, records its error for `kiln_last_error` and maps it to a return code; a panic
/// becomes `KILN_INTERNAL` instead of unwinding into C.
fn guarded(f: impl FnOnce() -> Result<(), AttentionError>) -> i32 {
    let (code, message) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => (KILN_OK, String::new()),
        Ok(Err(e)) => (code(&e), e.to_string()),
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".to_string());
            (
                KILN_INTERNAL,
                format!("internal error (a bug in kiln): {what}"),
            )
        }
    };
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = message);
    code
}

fn code(e: &AttentionError) -> i32 {
    match e {
        AttentionError::InvalidArgument(_) => KILN_INVALID_ARGUMENT,
        AttentionError::Unsupported(_) => KILN_UNSUPPORTED,
        AttentionError::Device(_) => KILN_CUDA_ERROR,
        AttentionError::Kernel(_) | AttentionError::Internal(_) => KILN_INTERNAL,
    }
}

fn invalid(message: &str) -> AttentionError {
    AttentionError::InvalidArgument(message.to_string())
}

fn raw(t: &kiln_tensor) -> RawTensor {
    RawTensor {
        address: t.data as u64,
        layout: Layout {
            batch_stride: t.batch_stride,
            seq_stride: t.seq_stride,
            head_stride: t.head_stride,
        },
    }
}

/// The call `cfg` describes, after checking every field; with it, the first feature it asks for
/// that this build does not implement (answered `KILN_UNSUPPORTED` once the rest is valid).
fn params(
    cfg: &kiln_attn_config,
    backward: bool,
) -> Result<(AttentionParams, Option<String>), AttentionError> {
    let fail = |m: String| Err(AttentionError::InvalidArgument(m));
    let dtype = match cfg.dtype {
        KILN_F16 => DType::F16,
        KILN_BF16 => DType::BF16,
        other => {
            return fail(format!(
                "cfg.dtype must be KILN_F16 (0) or KILN_BF16 (1), got {other}"
            ));
        }
    };
    let mut sizes = [0usize; 6];
    for (slot, (name, value)) in sizes.iter_mut().zip([
        ("batch", cfg.batch),
        ("seqlen_q", cfg.seqlen_q),
        ("seqlen_k", cfg.seqlen_k),
        ("heads_q", cfg.heads_q),
        ("heads_kv", cfg.heads_kv),
        ("head_dim", cfg.head_dim),
    ]) {
        if value <= 0 {
            return fail(format!("cfg.{name} must be positive, got {value}"));
        }
        *slot = value as usize;
    }
    let [batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim] = sizes;
    if !matches!(cfg.causal, 0 | 1) {
        return fail(format!("cfg.causal must be 0 or 1, got {}", cfg.causal));
    }
    let mut unsupported = None;
    let mut lacks = |what: String| {
        unsupported.get_or_insert(what);
    };
    for (name, value) in [
        ("window_left", cfg.window_left),
        ("window_right", cfg.window_right),
    ] {
        if value < -1 {
            return fail(format!(
                "cfg.{name} must be -1 (unbounded) or >= 0, got {value}"
            ));
        }
        if value >= 0 {
            lacks(format!(
                "sliding windows (cfg.{name} = {value}): this build has none"
            ));
        }
    }
    if !cfg.softmax_scale.is_finite() {
        return fail(format!(
            "cfg.softmax_scale must be finite, got {}",
            cfg.softmax_scale
        ));
    }
    if cfg.softcap.is_nan() || cfg.softcap < 0.0 || cfg.softcap.is_infinite() {
        return fail(format!(
            "cfg.softcap must be 0 (off) or a finite positive cap, got {}",
            cfg.softcap
        ));
    }
    if cfg.softcap > 0.0 {
        lacks(format!(
            "soft-capping (cfg.softcap = {}): this build has none",
            cfg.softcap
        ));
    }
    if !(0.0..1.0).contains(&cfg.dropout_p) {
        return fail(format!(
            "cfg.dropout_p must be in [0, 1), got {}",
            cfg.dropout_p
        ));
    }
    if cfg.dropout_p > 0.0 {
        lacks(format!(
            "dropout (cfg.dropout_p = {}): this build has none",
            cfg.dropout_p
        ));
    }
    if cfg.flags & !KILN_FLAG_FUSED_BACKWARD != 0 {
        return fail(format!(
            "cfg.flags has unknown bits {:#x} (known: KILN_FLAG_FUSED_BACKWARD = 1)",
            cfg.flags & !KILN_FLAG_FUSED_BACKWARD
        ));
    }
    let p = AttentionParams {
        dtype,
        batch,
        seqlen_q,
        seqlen_k,
        heads_q,
        heads_kv,
        head_dim,
        causal: cfg.causal == 1,
        softmax_scale: cfg.softmax_scale,
        // The forward has nothing to fuse: its calls are the same with the flag or without.
        fused_backward: backward && cfg.flags & KILN_FLAG_FUSED_BACKWARD != 0,
    };
    p.check_fields()?;
    Ok((p, unsupported))
}
