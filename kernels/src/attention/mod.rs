//! FlashAttention: the kernels (written in the DSL: [`forward`], [`backward`], [`common`]), their
//! configuration table per target ([`mod@config`]), the parameters of a call with their validation,
//! what a call launches ([`plan`]), and where it runs: the CPU interpreter ([`cpu`], checked by
//! [`check`]) or the GPU with the PTX kiln ships ([`prebuilt`], [`gpu`]).
//!
//! A call is one [`AttentionParams`] plus [`Tensor`]s in the `[batch, seqlen, heads, head_dim]`
//! layout with element strides; LSE is `[batch, heads_q, seqlen_q]` f32, the backward's per-row
//! statistics (LSE in base 2 and `delta`) the same with heads [`AttentionParams::stats_stride`]
//! apart, the fused backward's dQ accumulator `[batch, heads_q, seqlen_q, head_dim]` f32.

pub mod backward;
pub mod check;
pub mod common;
pub mod config;
pub mod cpu;
pub mod forward;
pub mod gpu;
pub mod plan;
pub mod prebuilt;

use std::fmt;

use kiln_dsl::{HostBuffer, Spec};

pub use config::{
    AttentionConfig, CodegenKnobs, DECODE_ROWS, HEAD_DIMS, KernelConfig, KeyLength, config,
};
// What a call names, so that a caller needs no other kiln crate.
pub use kiln_dsl::{DType, Target};
pub use plan::AttentionKernel;

/// The longest sequence a call may have, of queries or of keys: 2^30 rows. The kernels count
/// rows in 32-bit integers and add a block or another length to a row.
pub const MAX_SEQLEN: usize = 1 << 30;

/// What an attention call computes.
///
/// ```
/// use kiln_kernels::attention::{AttentionParams, DType, Target};
///
/// let p = AttentionParams {
///     dtype: DType::BF16,
///     batch: 2,
///     seqlen_q: 1000,
///     seqlen_k: 1500,
///     heads_q: 16,
///     heads_kv: 4, // GQA: 4 query heads per kv head
///     head_dim: 128,
///     causal: true,
///     softmax_scale: AttentionParams::default_scale(128),
///     fused_backward: false,
/// };
/// p.validate()?;
/// // The block sizes, warps and stages each kernel runs with on a Hopper GPU, and on which
/// // tensor-core instructions.
/// let config = p.config(Target::Sm90a)?;
/// assert_eq!((config.forward.block_m, config.forward.num_warps), (128, 8));
/// assert!(config.forward.wgmma);
/// assert!(AttentionParams { heads_q: 6, ..p }.validate().is_err());
/// # Ok::<(), kiln_kernels::attention::AttentionError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionParams {
    pub dtype: DType,
    pub batch: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub heads_q: usize,
    pub heads_kv: usize,
    pub head_dim: usize,
    /// Causal mask aligned to the bottom-right corner: row i sees key j iff `j <= i + seqlen_k - seqlen_q`.
    pub causal: bool,
    /// `s = softmax_scale * q . k`.
    pub softmax_scale: f32,
    /// The backward in one fused pass over the keys, dQ accumulated with f32 atomic adds
    /// (`KILN_FLAG_FUSED_BACKWARD`): dQ may differ in its last bits from run to run, and on an
    /// H100 it is not yet faster than the split backward (docs/PERF.md). Without it the split
    /// backward runs, bitwise reproducible.
    pub fused_backward: bool,
}

/// Why a call was refused or failed.
#[derive(Clone, Debug, PartialEq)]
pub enum AttentionError {
    /// Shapes, strides, dtypes or buffer lengths that do not fit; the message names the field.
    InvalidArgument(String),
    /// A valid request kiln has no kernel for (a head dim other than 32, 64, 128 or 256).
    Unsupported(String),
    /// A kernel failed to build or to run on the interpreter.
    Kernel(kiln_dsl::Error),
    /// The CUDA driver failed (loading a module, launching).
    Device(kiln_runtime::RuntimeError),
    /// A bug in kiln: the message says where.
    Internal(String),
}

impl fmt::Display for AttentionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AttentionError::InvalidArgument(m) => write!(f, "invalid argument: {m}"),
            AttentionError::Unsupported(m) => write!(f, "unsupported: {m}"),
            AttentionError::Kernel(e) => write!(f, "kernel error: {e}"),
            AttentionError::Device(e) => write!(f, "{e}"),
            AttentionError::Internal(m) => write!(f, "internal error (a bug in kiln): {m}"),
        }
    }
}

impl std::error::Error for AttentionError {}

impl From<kiln_dsl::Error> for AttentionError {
    fn from(e: kiln_dsl::Error) -> Self {
        AttentionError::Kernel(e)
    }
}

impl From<kiln_runtime::RuntimeError> for AttentionError {
    fn from(e: kiln_runtime::RuntimeError) -> Self {
        AttentionError::Device(e)
    }
}

fn invalid(message: String) -> AttentionError {
    AttentionError::InvalidArgument(message)
}

/// `bf16 batch 2 seqlen_q 200 seqlen_k 173 heads 4/2 head_dim 64 causal scale 0.125`.
impl fmt::Display for AttentionParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} batch {} seqlen_q {} seqlen_k {} heads {}/{} head_dim {} {} scale {}",
            self.dtype,
            self.batch,
            self.seqlen_q,
            self.seqlen_k,
            self.heads_q,
            self.heads_kv,
            self.head_dim,
            if self.causal { "causal" } else { "full" },
            self.softmax_scale
        )
    }
}

impl AttentionParams {
    /// Query heads per kv head.
    pub fn group(&self) -> usize {
        self.heads_q / self.heads_kv
    }

    /// The softmax scale FlashAttention uses by default, `1 / sqrt(head_dim)`.
    pub fn default_scale(head_dim: usize) -> f32 {
        1.0 / (head_dim as f32).sqrt()
    }

    /// Checks every field, the head dim included (kiln must have kernels for it).
    pub fn validate(&self) -> Result<(), AttentionError> {
        self.check_fields()?;
        if !HEAD_DIMS.contains(&self.head_dim) {
            return Err(AttentionError::Unsupported(format!(
                "head_dim {} (kiln has attention kernels for head dims {HEAD_DIMS:?})",
                self.head_dim
            )));
        }
        Ok(())
    }

    /// Checks that the fields describe a valid call, whether or not kiln has kernels for it:
    /// every refusal is an [`AttentionError::InvalidArgument`].
    pub fn check_fields(&self) -> Result<(), AttentionError> {
        if !matches!(self.dtype, DType::F16 | DType::BF16 | DType::F32) {
            return Err(invalid(format!(
                "dtype must be f16 or bf16 (or f32 in the interpreter), got {}",
                self.dtype
            )));
        }
        for (name, value) in [
            ("batch", self.batch),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 || value > i32::MAX as usize {
                return Err(invalid(format!(
                    "{name} must be in 1..=2^31-1, got {value}"
                )));
            }
        }
        // A causal block's last key adds a block and the other sequence's length to a row, a
        // split's end a share of the keys: [`MAX_SEQLEN`] leaves room for both in 32 bits.
        for (name, value) in [("seqlen_q", self.seqlen_q), ("seqlen_k", self.seqlen_k)] {
            if value == 0 || value > MAX_SEQLEN {
                return Err(invalid(format!(
                    "{name} must be in 1..=2^30 (the kernels count rows in 32-bit integers), \
                     got {value}"
                )));
            }
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(invalid(format!(
                "heads_q ({}) must be a multiple of heads_kv ({})",
                self.heads_q, self.heads_kv
            )));
        }
        if !self.softmax_scale.is_finite() {
            return Err(invalid(format!(
                "softmax_scale must be finite, got {}",
                self.softmax_scale
            )));
        }
        // Checked: three factors below 2^31 can overflow 64 bits.
        let lse_rows = self
            .batch
            .checked_mul(self.heads_q)
            .and_then(|n| n.checked_mul(self.seqlen_q))
            .filter(|&n| n <= i32::MAX as usize);
        if lse_rows.is_none() {
            return Err(invalid(format!(
                "batch * heads_q * seqlen_q must stay below 2^31, got {} * {} * {}",
                self.batch, self.heads_q, self.seqlen_q
            )));
        }
        Ok(())
    }

    /// The kernels' configuration on `target` for this call, after [`Self::validate`].
    pub fn config(&self, target: Target) -> Result<AttentionConfig, AttentionError> {
        self.validate()?;
        Ok(config(
            self.head_dim,
            self.causal,
            self.fused_backward,
            target,
            self.key_length(),
        )
        .expect("the table covers every head dim in HEAD_DIMS"))
    }

    /// The range of sequence lengths the table places this call in.
    pub fn key_length(&self) -> KeyLength {
        KeyLength::of(self.seqlen_q, self.seqlen_k, self.causal)
    }

    /// The specialisation of `kernel` for this call, at the block sizes of its `config`, with
    /// the forward's flags ([`forward_flags`]) or dK/dV's ([`dkdv_flags`]).
    pub fn spec(&self, kernel: AttentionKernel, config: KernelConfig) -> Spec {
        self.spec_of(kernel, config, false)
    }

    /// The forward at `config` that takes one split of the keys and writes its part of the
    /// output, O in f32 and the LSE, for [`AttentionKernel::Combine`] ([`plan::forward_split`]).
    pub fn split_spec(&self, config: KernelConfig) -> Spec {
        self.spec_of(AttentionKernel::Forward, config, true)
    }

    fn spec_of(&self, kernel: AttentionKernel, config: KernelConfig, split: bool) -> Spec {
        let spec = Spec::new()
            .dtype("T", self.dtype)
            .int("HEAD_DIM", self.head_dim as i64)
            .int(kernel.block_m_param(), config.block_m as i64);
        // The preprocessing and dQ conversion kernels read no keys: no key block, no mask.
        let spec = match config.block_n {
            None => spec,
            Some(block_n) => spec
                .int("BLOCK_N", block_n as i64)
                .flag("CAUSAL", self.causal),
        };
        match kernel {
            AttentionKernel::Forward => forward_flags(self.head_dim, config)
                .into_iter()
                .fold(spec, |spec, (name, on)| spec.flag(name, on))
                .dtype("OUT", forward_out(self.dtype, split))
                .flag("SPLIT", split),
            AttentionKernel::DkDv => dkdv_flags(self.fused_backward, config)
                .into_iter()
                .fold(spec, |spec, (name, on)| spec.flag(name, on)),
            _ => spec,
        }
    }

    /// Elements of the `[batch, heads_q, seqlen_q]` LSE array.
    pub fn lse_len(&self) -> usize {
        self.batch * self.heads_q * self.seqlen_q
    }

    /// How far apart the heads of the backward's per-row statistics are (its LSE in base 2 and
    /// delta, [`plan::Role::LseBase2`]): `seqlen_q` rounded up to 8 elements, so that every head
    /// starts 32-byte aligned (what TMA asks of its rows, and the kernels assume of strides).
    pub fn stats_stride(&self) -> usize {
        self.seqlen_q.next_multiple_of(8)
    }

    /// Elements of each of the backward's per-row statistics arrays
    /// ([`AttentionParams::stats_stride`]).
    pub fn stats_len(&self) -> usize {
        self.batch * self.heads_q * self.stats_stride()
    }

    /// Elements of the fused backward's `[batch, heads_q, seqlen_q, head_dim]` f32 dQ
    /// accumulator; 0 for the split backward, which has none.
    pub fn dq_accum_len(&self) -> usize {
        if self.fused_backward {
            self.lse_len() * self.head_dim
        } else {
            0
        }
    }
}

/// The forward's flags at `head_dim` in `config`: on `wgmma` it overlaps its softmax with
/// `P @ V` and, at head dims 32 and 128, does the last block's `P @ V` after its loops, which
/// takes one more V tile of shared memory: there 1.01-1.11x at 1k, 1.0-1.07x at 4k and 16k
/// (interleaved A/B, H200, runs 86-87, docs/PERF.md, 2026-11-26, eighth session; D128's causal
/// short blocks +2.6% and -2.9% in the two). At 64 the tile costs the 64 x 64 blocks one of
/// their four programs an SM (0.97-0.98x; the long blocks, one program an SM, were not told
/// apart); at 256 it does not fit beside the table's 128 x 64 blocks (262,272 bytes of shared
/// memory, 232,448 the most). A rule by head dim, then, not by blocks; a persistent forward
/// always does (its last V tile shares a slot of the ring with the next block's first K).
pub fn forward_flags(head_dim: usize, config: KernelConfig) -> [(&'static str, bool); 3] {
    [
        ("PERSISTENT", config.persistent),
        ("OVERLAP_SOFTMAX", config.wgmma),
        (
            "LAST_BLOCK_APART",
            config.wgmma && (config.persistent || matches!(head_dim, 32 | 128)),
        ),
    ]
}

/// The forward's output dtype (`OUT`) for inputs of `dtype`: theirs, or split over the keys
/// ([`plan::forward_split`]), f32 parts for the combine to add up.
pub fn forward_out(dtype: DType, split: bool) -> DType {
    if split { DType::F32 } else { dtype }
}

/// dK/dV's flags in `config`: for the fused backward it adds dQ into an accumulator
/// (`ACCUMULATE_DQ`); it computes key-major where [`dkdv_key_major`] says, dP early where
/// [`dkdv_early_dp`] does, and dQ by one warpgroup a query tile where [`dkdv_dq_by_turns`]
/// does.
pub fn dkdv_flags(fused_backward: bool, config: KernelConfig) -> [(&'static str, bool); 4] {
    [
        ("ACCUMULATE_DQ", fused_backward),
        ("KEY_MAJOR", dkdv_key_major(fused_backward, config)),
        ("EARLY_DP", dkdv_early_dp(config)),
        ("DQ_BY_TURNS", dkdv_dq_by_turns(fused_backward, config)),
    ]
}

/// Whether the fused dK/dV, key-major, computes each query tile's `dQ = dS K` whole in one
/// warpgroup, the warpgroups taking turns (cuDNN's form), rather than `dQ^T = K^T dS^T` split
/// over them: where `config` asks for it ([`KernelConfig::dq_by_turns`]) and the query tile is
/// one warpgroup's 64 rows in a program of several (kiln-codegen's
/// `LayoutAssignment::one_warpgroup_dot`). Its products are N = HEAD_DIM wide and a warpgroup
/// whose turn it is not goes on to the next tile, but the owner's product, wait and reduction
/// lie on the path from one tile to the next: the fused D128 0.98-0.99x (runs 267 and 273,
/// docs/PERF.md, twenty-second session), not in the table.
pub fn dkdv_dq_by_turns(fused_backward: bool, config: KernelConfig) -> bool {
    config.dq_by_turns
        && fused_backward
        && dkdv_key_major(fused_backward, config)
        && config.block_m == 64
        && config.num_warps > 4
}

/// Whether dK/dV computes key-major (`S^T = K Q^T`, every product's A operand from registers):
/// the split backward on `wgmma`, 1.05-1.21x the query-major form there (run 101). The fused
/// one wants dS query-major for dQ's `dS K` (key-major 0.79-0.98x, run 103) where its query
/// tile feeds every warpgroup; where it is too short for them (64 rows, two warpgroups) it goes
/// key-major and computes dQ transposed (`dQ^T = K^T dS^T`, whose rows the warpgroups share;
/// twelfth session). On `mma.sync`, whose operands are all registers, key-major cost D64's
/// dK/dV 14-26% (run 110; docs/PERF.md, 2026-11-26, tenth session).
pub fn dkdv_key_major(fused_backward: bool, config: KernelConfig) -> bool {
    config.wgmma && (!fused_backward || config.block_m < 16 * config.num_warps as usize)
}

/// Whether dK/dV issues dP's product beside the scores', so that it runs while P is computed:
/// where each warpgroup's score tile (on `mma.sync`, the program's) is at most 64 x 64 (D128 on
/// sm_90a +4-6%; the fused D128's two warpgroups of 64 x 64 1.00-1.02x, run 235, twentieth
/// session). Larger, the two tiles' registers spill: at 128 x 64 (D64's 4 warps) -4% to -10%
/// (docs/PERF.md, 2026-11-26).
pub fn dkdv_early_dp(config: KernelConfig) -> bool {
    let warpgroups = if config.wgmma {
        (config.num_warps as usize / 4).max(1)
    } else {
        1
    };
    config.block_m * config.block_n.unwrap_or(0) <= 64 * 64 * warpgroups
}

/// Strides, in elements, of a `[batch, seqlen, heads, head_dim]` tensor whose head_dim is contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub batch_stride: i64,
    pub seq_stride: i64,
    pub head_stride: i64,
}

impl Layout {
    /// The packed layout of a `[batch, seqlen, heads, head_dim]` tensor.
    ///
    /// ```
    /// use kiln_kernels::attention::Layout;
    ///
    /// let packed = Layout::contiguous(1000, 8, 64);
    /// assert_eq!((packed.batch_stride, packed.seq_stride, packed.head_stride), (512_000, 512, 64));
    /// // PyTorch's `[batch, heads, seqlen, head_dim]` memory, read as `[batch, seqlen, heads, ..]`:
    /// let heads_major = Layout { batch_stride: 512_000, seq_stride: 64, head_stride: 64_000 };
    /// assert_eq!(heads_major.required_len("q", 1, 1000, 8, 64)?, 512_000);
    /// # Ok::<(), kiln_kernels::attention::AttentionError>(())
    /// ```
    pub fn contiguous(seqlen: usize, heads: usize, head_dim: usize) -> Layout {
        Layout {
            batch_stride: (seqlen * heads * head_dim) as i64,
            seq_stride: (heads * head_dim) as i64,
            head_stride: head_dim as i64,
        }
    }

    /// The number of elements a buffer needs for this layout at the given sizes, or why the
    /// strides are invalid (negative, or offsets that overflow).
    pub fn required_len(
        &self,
        name: &str,
        batch: usize,
        seqlen: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<usize, AttentionError> {
        let mut last: i64 = head_dim as i64 - 1;
        for (field, stride, count) in [
            ("batch_stride", self.batch_stride, batch),
            ("seq_stride", self.seq_stride, seqlen),
            ("head_stride", self.head_stride, heads),
        ] {
            if stride < 0 {
                return Err(invalid(format!(
                    "{name}.{field} must not be negative, got {stride}"
                )));
            }
            last = stride
                .checked_mul(count as i64 - 1)
                .and_then(|extent| extent.checked_add(last))
                .ok_or_else(|| {
                    invalid(format!(
                        "{name}.{field} = {stride} overflows 64-bit offsets"
                    ))
                })?;
        }
        Ok(last as usize + 1)
    }
}

/// A `[batch, seqlen, heads, head_dim]` tensor in a host buffer.
#[derive(Clone, Copy, Debug)]
pub struct Tensor<'a> {
    pub buffer: &'a HostBuffer,
    pub layout: Layout,
}

impl<'a> Tensor<'a> {
    pub fn new(buffer: &'a HostBuffer, layout: Layout) -> Tensor<'a> {
        Tensor { buffer, layout }
    }

    /// Checks dtype and that every element the sizes address lies in the buffer.
    fn check(
        &self,
        name: &str,
        dtype: DType,
        seqlen: usize,
        heads: usize,
        params: &AttentionParams,
    ) -> Result<(), AttentionError> {
        if self.buffer.dtype() != dtype {
            return Err(invalid(format!(
                "{name} holds {}, expected {dtype}",
                self.buffer.dtype()
            )));
        }
        let need = self
            .layout
            .required_len(name, params.batch, seqlen, heads, params.head_dim)?;
        if self.buffer.len() < need {
            return Err(invalid(format!(
                "{name} has {} elements but its shape and strides address {need}",
                self.buffer.len()
            )));
        }
        Ok(())
    }
}

/// Checks an f32 buffer of the backward's per-row statistics: [`AttentionParams::stats_len`]
/// elements.
fn check_stats(
    name: &str,
    buffer: &HostBuffer,
    params: &AttentionParams,
) -> Result<(), AttentionError> {
    if buffer.dtype() != DType::F32 || buffer.len() < params.stats_len() {
        return Err(invalid(format!(
            "{name} must hold at least batch * heads_q * round_up(seqlen_q, 8) = {} f32, got {} {}",
            params.stats_len(),
            buffer.len(),
            buffer.dtype()
        )));
    }
    Ok(())
}

/// Checks an f32 `[batch, heads_q, seqlen_q]` buffer (LSE).
fn check_rows(
    name: &str,
    buffer: &HostBuffer,
    params: &AttentionParams,
) -> Result<(), AttentionError> {
    if buffer.dtype() != DType::F32 {
        return Err(invalid(format!(
            "{name} must hold f32, got {}",
            buffer.dtype()
        )));
    }
    if buffer.len() < params.lse_len() {
        return Err(invalid(format!(
            "{name} has {} elements, needs batch * heads_q * seqlen_q = {}",
            buffer.len(),
            params.lse_len()
        )));
    }
    Ok(())
}
