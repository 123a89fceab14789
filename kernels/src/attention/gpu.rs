//! Attention on the GPU with the prebuilt kernels: the launches of [`super::plan`] bound to
//! device addresses, in a driver context on a stream, each kernel's shipped PTX loaded once per
//! context. The safe Rust API ([`forward`], [`backward`]) comes here through [`launch_forward`]
//! and [`launch_backward`], which check everything that can be checked from addresses and
//! strides (the Rust API also knows each buffer's length); the C interface runs the same checks
//! itself, in its own order, and then their unchecked halves.

use std::sync::{Arc, LazyLock};

use kiln_dsl::{DType, Target};
use kiln_runtime::{
    Context, LoadedKernel, ModuleCache, ModuleSource, ParamType, RawArg, RawStream,
    StreamWorkspaces,
};
// The device and its buffers, as the safe API takes them.
pub use kiln_runtime::{Device, DeviceBuffer};

use super::plan::{self, Arg, AttentionKernel, BackwardLayouts, ForwardLayouts, Launch, Role};
use super::{
    AttentionConfig, AttentionError, AttentionParams, KernelConfig, Layout, invalid, prebuilt,
};

/// Every context's loaded attention kernels, for the whole process.
static MODULES: LazyLock<ModuleCache> = LazyLock::new(ModuleCache::new);

/// Each stream's workspace for the split forward's parts, which the C interface does not pass.
static WORKSPACES: StreamWorkspaces = StreamWorkspaces::new();

/// One kernel compiled at a configuration other than the table's, to run in its place: what
/// `kiln tune` times.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The specialisation it stands in for ([`plan::specialisation_name`]): a call that needs
    /// another is refused.
    pub name: String,
    pub kernel: AttentionKernel,
    pub config: KernelConfig,
    pub ptx: String,
    /// The dynamic shared memory a launch gives it.
    pub shared_bytes: u32,
}

impl Candidate {
    /// The name it is loaded under: its specialisation's and its configuration's, all of it
    /// (a module name identifies its PTX).
    fn module_name(&self) -> String {
        let c = &self.config;
        format!(
            "{}_m{}_n{}_w{}_s{}{}{}{}{}{}{}{}{}{}{}",
            self.name,
            c.block_m,
            c.block_n.unwrap_or(0),
            c.num_warps,
            c.num_stages,
            if c.wgmma { "_wgmma" } else { "" },
            if c.producer { "_producer" } else { "" },
            if c.persistent { "_persistent" } else { "" },
            if c.lean_producer { "_lean" } else { "" },
            if c.uniform_warpgroup { "_uniform" } else { "" },
            if c.descriptors_at_issue {
                "_at_issue"
            } else {
                ""
            },
            if c.resident_a { "_resident_a" } else { "" },
            if c.partial_sums { "_partial_sums" } else { "" },
            if c.loop_tid { "_loop_tid" } else { "" },
            if c.dq_by_turns { "_turns" } else { "" }
        )
    }
}

/// The candidates a call runs instead of the shipped kernels, at most one per kernel; the
/// default runs what ships.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overrides {
    candidates: Vec<Candidate>,
    splits: Option<usize>,
}

impl Overrides {
    /// Splits the forward's keys `splits` ways (1: not at all) where [`plan::forward_splits`]
    /// would choose by the SM count: what a test runs on the interpreter and the GPU alike. A
    /// forward candidate ([`Overrides::with`]) runs unsplit.
    pub fn with_splits(mut self, splits: usize) -> Overrides {
        self.splits = Some(splits);
        self
    }

    /// Runs `candidate` in place of its kernel (replacing an earlier candidate for it).
    pub fn with(mut self, candidate: Candidate) -> Overrides {
        self.candidates.retain(|c| c.kernel != candidate.kernel);
        self.candidates.push(candidate);
        self
    }

    fn get(&self, kernel: AttentionKernel) -> Option<&Candidate> {
        self.candidates.iter().find(|c| c.kernel == kernel)
    }

    /// `table` with each overridden kernel's configuration replaced by its candidate's.
    fn config(&self, table: AttentionConfig) -> AttentionConfig {
        self.candidates
            .iter()
            .fold(table, |config, c| config.with(c.kernel, c.config))
    }
}

/// A tensor in device memory: its address and its `[batch, seqlen, heads, head_dim]` strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawTensor {
    pub address: u64,
    pub layout: Layout,
}

/// The device memory of a forward call.
#[derive(Clone, Copy, Debug)]
pub struct ForwardAddresses {
    pub q: RawTensor,
    pub k: RawTensor,
    pub v: RawTensor,
    pub o: RawTensor,
    /// `[batch, heads_q, seqlen_q]` f32, contiguous.
    pub lse: u64,
}

/// The device memory of a backward call.
#[derive(Clone, Copy, Debug)]
pub struct BackwardAddresses {
    pub q: RawTensor,
    pub k: RawTensor,
    pub v: RawTensor,
    pub o: RawTensor,
    pub d_o: RawTensor,
    pub lse: u64,
    pub dq: RawTensor,
    pub dk: RawTensor,
    pub dv: RawTensor,
    /// At least [`workspace_bytes`] bytes.
    pub workspace: u64,
    pub workspace_bytes: usize,
}

/// Device memory the backward pass needs beside its outputs: two f32 statistics of every query
/// row, its LSE in base 2 and `delta = rowsum(dO * O)`, each `[batch, heads_q, seqlen_q]` with
/// heads [`AttentionParams::stats_stride`] apart (delta at [`delta_offset`]), and for the fused
/// backward the f32 dQ accumulator after them (at [`dq_accum_offset`]), `[batch, heads_q,
/// seqlen_q, head_dim]`.
///
/// ```
/// use kiln_kernels::attention::{AttentionParams, DType, gpu};
///
/// let p = AttentionParams {
///     dtype: DType::F16,
///     batch: 2,
///     seqlen_q: 100,
///     seqlen_k: 100,
///     heads_q: 8,
///     heads_kv: 8,
///     head_dim: 64,
///     causal: false,
///     softmax_scale: 0.125,
///     fused_backward: false,
/// };
/// // Heads of 104 rows (100 rounded up to 8), two arrays of them.
/// assert_eq!(gpu::workspace_bytes(&p)?, 2 * (2 * 8 * 104 * 4));
/// let fused = AttentionParams { fused_backward: true, ..p };
/// assert_eq!(gpu::workspace_bytes(&fused)?, 13312 + 2 * 8 * 100 * 64 * 4);
/// # Ok::<(), kiln_kernels::attention::AttentionError>(())
/// ```
pub fn workspace_bytes(p: &AttentionParams) -> Result<usize, AttentionError> {
    if !p.fused_backward {
        return Ok(2 * delta_offset(p));
    }
    // Checked: `check_fields` bounds batch * heads_q * seqlen_q, not the head dim.
    p.dq_accum_len()
        .checked_mul(DType::F32.size_bytes())
        .and_then(|bytes| bytes.checked_add(dq_accum_offset(p)))
        .ok_or_else(|| {
            invalid(format!(
                "the fused backward's f32 dQ accumulator of batch * heads_q * seqlen_q * \
                 head_dim = {} * {} * {} * {} elements would not fit in memory",
                p.batch, p.heads_q, p.seqlen_q, p.head_dim
            ))
        })
}

/// Where delta starts in the workspace, after the LSE in base 2 (a multiple of 32 bytes).
pub fn delta_offset(p: &AttentionParams) -> usize {
    p.stats_len() * DType::F32.size_bytes()
}

/// Where the fused backward's dQ accumulator starts in the workspace: after the statistics, at
/// a multiple of 256 bytes so that its rows keep the alignment the kernels were compiled for.
pub fn dq_accum_offset(p: &AttentionParams) -> usize {
    (2 * delta_offset(p)).next_multiple_of(256)
}

/// Checks a forward call as far as addresses and strides allow: every refusal is an
/// [`AttentionError::InvalidArgument`] naming the field.
pub fn check_forward(p: &AttentionParams, at: &ForwardAddresses) -> Result<(), AttentionError> {
    p.check_fields()?;
    let extents = check_tensors(
        p,
        &[
            (Input, Queries, "q", at.q),
            (Input, Keys, "k", at.k),
            (Input, Keys, "v", at.v),
            (Output, Queries, "o", at.o),
        ],
    )?;
    let lse = check_rows("lse", at.lse, p.lse_len() * 4)?;
    check_disjoint(&[("o", extents[3]), ("lse", lse)])
}

/// Launches the forward pass in `context` on `stream`, after [`check_forward`] and after
/// checking that kiln has kernels for it ([`AttentionError::Unsupported`] if not: nothing runs).
///
/// # Safety
/// Every address must point to device memory of `context` holding every element the sizes and
/// strides address (the C interface's contract: it cannot know allocations' lengths).
///
/// ```no_run
/// use kiln_kernels::attention::gpu::{self, Device, ForwardAddresses, RawTensor};
/// use kiln_kernels::attention::{AttentionParams, DType, Layout};
///
/// // Memory kiln did not allocate, as a framework hands it over: addresses and strides.
/// let device = Device::current_or_default()?;
/// let p = AttentionParams {
///     dtype: DType::BF16,
///     batch: 1,
///     seqlen_q: 256,
///     seqlen_k: 256,
///     heads_q: 4,
///     heads_kv: 4,
///     head_dim: 64,
///     causal: true,
///     softmax_scale: 0.125,
///     fused_backward: false,
/// };
/// let layout = Layout::contiguous(256, 4, 64);
/// let qkv = device.filled(DType::BF16, 256 * 4 * 64, 0)?;
/// let o = device.filled(DType::BF16, 256 * 4 * 64, 0)?;
/// let lse = device.filled(DType::F32, p.lse_len(), 0)?;
/// let tensor = |address| RawTensor { address, layout };
/// let at = ForwardAddresses {
///     q: tensor(qkv.device_address(&device)),
///     k: tensor(qkv.device_address(&device)),
///     v: tensor(qkv.device_address(&device)),
///     o: tensor(o.device_address(&device)),
///     lse: lse.device_address(&device),
/// };
/// // Safety: each buffer holds what its shape and strides address.
/// unsafe { gpu::launch_forward(device.context(), device.raw_stream(), &p, &at) }?;
/// device.synchronize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe fn launch_forward(
    context: Context,
    stream: RawStream,
    p: &AttentionParams,
    at: &ForwardAddresses,
) -> Result<(), AttentionError> {
    check_forward(p, at)?;
    check_supported(p)?;
    // Safety: passed on from the caller.
    unsafe { launch_forward_checked(context, stream, p, at, &Overrides::default()) }
}

/// [`launch_forward`] for a call already through [`check_forward`] and [`check_supported`]:
/// the C interface runs them itself, with its own checks between them.
///
/// # Safety
/// As [`launch_forward`].
pub(crate) unsafe fn launch_forward_checked(
    context: Context,
    stream: RawStream,
    p: &AttentionParams,
    at: &ForwardAddresses,
    overrides: &Overrides,
) -> Result<(), AttentionError> {
    let target = target_of(context)?;
    let layouts = ForwardLayouts {
        q: at.q.layout,
        k: at.k.layout,
        v: at.v.layout,
        o: at.o.layout,
    };
    let address = |role| match role {
        Role::Q => Some(at.q.address),
        Role::K => Some(at.k.address),
        Role::V => Some(at.v.address),
        Role::O => Some(at.o.address),
        Role::Lse => Some(at.lse),
        _ => None,
    };
    // The table's forward (and its entry for a negative scale where that one is persistent),
    // or the candidate in its place; split over the keys where the call has too few query
    // blocks to fill the SMs.
    let launch = match overrides.get(AttentionKernel::Forward) {
        Some(candidate) => plan::forward_with(p, &layouts, target, candidate.config)?,
        None => {
            let splits = match overrides.splits {
                Some(splits) => splits,
                None => plan::forward_splits(p, target, context.multiprocessor_count()?)?,
            };
            if splits > 1 {
                // Safety: as below.
                return unsafe {
                    launch_split_forward(context, stream, p, &layouts, target, splits, address)
                };
            }
            plan::forward(p, &layouts, target)?
        }
    };
    // Safety: the caller vouches for the memory; the plan's accesses stay within the sizes.
    unsafe { run(context, stream, &launch, overrides, address) }
}

/// The forward split `splits` ways ([`plan::forward_split`]) on `stream`, its workspace the
/// stream's in [`WORKSPACES`].
///
/// # Safety
/// As [`launch_forward_checked`]'s, with `address` the call's checked memory.
unsafe fn launch_split_forward(
    context: Context,
    stream: RawStream,
    p: &AttentionParams,
    layouts: &ForwardLayouts,
    target: Target,
    splits: usize,
    address: impl Fn(Role) -> Option<u64>,
) -> Result<(), AttentionError> {
    let launches = plan::forward_split(p, layouts, target, splits)?;
    let [o_parts, lse_parts] = plan::split_workspace_len(p, splits);
    let bytes = (o_parts + lse_parts) * DType::F32.size_bytes();
    let queue = |workspace: u64| {
        let parts = |role| match role {
            Role::OParts => Some(workspace),
            Role::LseParts => Some(workspace + (o_parts * DType::F32.size_bytes()) as u64),
            other => address(other),
        };
        for launch in &launches {
            // Safety: the caller vouches for the call's memory; the workspace holds what the
            // plan addresses in it.
            unsafe { run(context, stream, launch, &Overrides::default(), parts)? };
        }
        Ok(())
    };
    // Safety: `stream` is the caller's stream of `context`; the workspace is used only by the
    // two launches, queued on `stream`.
    unsafe { WORKSPACES.with(&context, stream, bytes, queue) }
}

/// Checks a backward call as far as addresses and strides allow: every refusal is an
/// [`AttentionError::InvalidArgument`] naming the field.
pub fn check_backward(p: &AttentionParams, at: &BackwardAddresses) -> Result<(), AttentionError> {
    p.check_fields()?;
    let extents = check_tensors(
        p,
        &[
            (Input, Queries, "q", at.q),
            (Input, Keys, "k", at.k),
            (Input, Keys, "v", at.v),
            (Input, Queries, "o", at.o),
            (Input, Queries, "d_o", at.d_o),
            (Output, Queries, "dq", at.dq),
            (Output, Keys, "dk", at.dk),
            (Output, Keys, "dv", at.dv),
        ],
    )?;
    check_rows("lse", at.lse, p.lse_len() * 4)?;
    let need = workspace_bytes(p)?;
    if at.workspace_bytes < need {
        return Err(invalid(format!(
            "workspace_bytes must be at least {need} ({}), got {}",
            if p.fused_backward {
                "the row statistics and the fused backward's dQ accumulator"
            } else {
                "two f32 row statistics of batch * heads_q * round_up(seqlen_q, 8)"
            },
            at.workspace_bytes
        )));
    }
    let workspace = check_rows("workspace", at.workspace, need)?;
    check_disjoint(&[
        ("dq", extents[5]),
        ("dk", extents[6]),
        ("dv", extents[7]),
        ("workspace", workspace),
    ])
}

/// Launches the backward pass (dQ, which writes the row statistics, then dK/dV; or fused, the
/// preprocessing, dK/dV adding into the dQ accumulator, and the dQ conversion) in `context` on
/// `stream`, after [`check_backward`] and after checking that kiln has kernels for it.
///
/// # Safety
/// As [`launch_forward`]: every address must hold what its sizes and strides address.
pub unsafe fn launch_backward(
    context: Context,
    stream: RawStream,
    p: &AttentionParams,
    at: &BackwardAddresses,
) -> Result<(), AttentionError> {
    check_backward(p, at)?;
    check_supported(p)?;
    // Safety: passed on from the caller.
    unsafe { launch_backward_checked(context, stream, p, at, &Overrides::default()) }
}

/// [`launch_backward`] for a call already through [`check_backward`] and [`check_supported`].
///
/// # Safety
/// As [`launch_forward`].
pub(crate) unsafe fn launch_backward_checked(
    context: Context,
    stream: RawStream,
    p: &AttentionParams,
    at: &BackwardAddresses,
    overrides: &Overrides,
) -> Result<(), AttentionError> {
    let target = target_of(context)?;
    let layouts = BackwardLayouts {
        q: at.q.layout,
        k: at.k.layout,
        v: at.v.layout,
        o: at.o.layout,
        d_o: at.d_o.layout,
        dq: at.dq.layout,
        dk: at.dk.layout,
        dv: at.dv.layout,
    };
    let address = |role| {
        Some(match role {
            Role::Q => at.q.address,
            Role::K => at.k.address,
            Role::V => at.v.address,
            Role::O => at.o.address,
            Role::DO => at.d_o.address,
            Role::Lse => at.lse,
            Role::Dq => at.dq.address,
            Role::Dk => at.dk.address,
            Role::Dv => at.dv.address,
            Role::LseBase2 => at.workspace,
            Role::Delta => at.workspace + delta_offset(p) as u64,
            Role::DqAccum => at.workspace + dq_accum_offset(p) as u64,
            Role::OParts | Role::LseParts => return None,
        })
    };
    let config = overrides.config(p.config(target)?);
    for launch in plan::backward_with(p, &layouts, target, config) {
        // Safety: as for the forward; the launches queue in order on one stream.
        unsafe { run(context, stream, &launch, overrides, address)? };
    }
    Ok(())
}

/// Most programs a grid's y dimension holds (CUDA's limit); the kernels put batch x heads there.
const MAX_GRID_Y: usize = 65535;

/// Checks that kiln has kernels for a valid call: its head dim, its dtype (f16 and bf16 on the
/// GPU), batch x heads within one grid. Refusals are [`AttentionError::Unsupported`].
pub fn check_supported(p: &AttentionParams) -> Result<(), AttentionError> {
    p.validate()?;
    let unsupported = |m: String| Err(AttentionError::Unsupported(m));
    if !prebuilt::DTYPES.contains(&p.dtype) {
        return unsupported(format!(
            "dtype {} on the GPU (the prebuilt kernels take f16 and bf16)",
            p.dtype
        ));
    }
    if p.batch * p.heads_q > MAX_GRID_Y {
        return unsupported(format!(
            "batch * heads_q = {} (the kernels launch one grid row per head, at most {MAX_GRID_Y})",
            p.batch * p.heads_q
        ));
    }
    Ok(())
}

/// The target whose PTX runs on `device`: the newest that runs there, or `KILN_TARGET`.
pub fn target(device: &Device) -> Result<Target, AttentionError> {
    target_of(device.context())
}

/// The target whose PTX runs on the context's device (compute capability 8.0 or newer): the
/// newest that runs there and whose PTX the driver reads (a CUDA 12.0 driver runs the portable
/// PTX on Hopper: [`Target::for_device`]), or `KILN_TARGET` (`sm_80` runs the portable PTX on
/// a Hopper GPU too).
fn target_of(context: Context) -> Result<Target, AttentionError> {
    let unsupported = |m: String| Err(AttentionError::Unsupported(m));
    let (major, minor) = context.compute_capability()?;
    let driver = kiln_runtime::driver_version()?;
    let device = format!(
        "compute capability {major}.{minor} under a {} driver",
        kiln_runtime::cuda_release(driver)
    );
    let Some(best) = Target::for_device(major, minor, driver) else {
        return unsupported(format!(
            "{device} (kiln's kernels need 8.0 or newer, and a {} driver or later)",
            kiln_runtime::cuda_release(Target::Sm80.min_driver())
        ));
    };
    let Ok(asked) = std::env::var("KILN_TARGET") else {
        return Ok(best);
    };
    match asked.parse::<Target>() {
        Ok(target) if target == best || target == Target::Sm80 => Ok(target),
        Ok(target) => unsupported(format!(
            "KILN_TARGET={target} on {device} (it runs {best}{})",
            if best == Target::Sm80 {
                ""
            } else {
                " or sm_80"
            }
        )),
        Err(e) => Err(invalid(format!("KILN_TARGET: {e}"))),
    }
}

/// A byte range `[start, end)` of device memory.
type Extent = (u64, u64);

/// Whether a call reads or writes a tensor: outputs may not overlap themselves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Input,
    Output,
}

/// Whose rows and heads a tensor has.
#[derive(Clone, Copy)]
enum Rows {
    /// `seqlen_q` rows, `heads_q` heads: q, o, dO, dQ.
    Queries,
    /// `seqlen_k` rows, `heads_kv` heads: k, v, dK, dV.
    Keys,
}

use Access::{Input, Output};
use Rows::{Keys, Queries};

/// Checks each tensor of a call ([`check_tensor`], and [`check_injective`] for outputs); their
/// byte ranges, in order.
fn check_tensors(
    p: &AttentionParams,
    tensors: &[(Access, Rows, &str, RawTensor)],
) -> Result<Vec<Extent>, AttentionError> {
    let elem = p.dtype.size_bytes() as u64;
    tensors
        .iter()
        .map(|&(access, rows, name, tensor)| {
            let (seqlen, heads) = match rows {
                Queries => (p.seqlen_q, p.heads_q),
                Keys => (p.seqlen_k, p.heads_kv),
            };
            let extent = check_tensor(name, tensor, p, seqlen, heads, elem)?;
            if access == Output {
                check_injective(name, tensor.layout, p, seqlen, heads)?;
            }
            Ok(extent)
        })
        .collect()
}

/// Checks a tensor's address and strides against what the prebuilt kernels assume (16-byte
/// alignment, strides in multiples of 8 elements; [`prebuilt::divisibility`]); its byte range.
fn check_tensor(
    name: &str,
    t: RawTensor,
    p: &AttentionParams,
    seqlen: usize,
    heads: usize,
    elem: u64,
) -> Result<Extent, AttentionError> {
    if t.address == 0 {
        return Err(invalid(format!("{name}.data is NULL")));
    }
    if !t.address.is_multiple_of(16) {
        return Err(invalid(format!(
            "{name}.data must be 16-byte aligned, got {:#x}",
            t.address
        )));
    }
    for (field, stride) in [
        ("batch_stride", t.layout.batch_stride),
        ("seq_stride", t.layout.seq_stride),
        ("head_stride", t.layout.head_stride),
    ] {
        if stride % 8 != 0 {
            return Err(invalid(format!(
                "{name}.{field} must be a multiple of 8 elements (16 bytes), got {stride}"
            )));
        }
    }
    let len = t
        .layout
        .required_len(name, p.batch, seqlen, heads, p.head_dim)? as u64;
    extent(name, t.address, len.checked_mul(elem))
}

/// The byte range of an f32 row array (LSE, the workspace) after checking its address.
fn check_rows(name: &str, address: u64, bytes: usize) -> Result<Extent, AttentionError> {
    if address == 0 {
        return Err(invalid(format!("{name} is NULL")));
    }
    if !address.is_multiple_of(16) {
        return Err(invalid(format!(
            "{name} must be 16-byte aligned, got {address:#x}"
        )));
    }
    extent(name, address, Some(bytes as u64))
}

fn extent(name: &str, address: u64, bytes: Option<u64>) -> Result<Extent, AttentionError> {
    bytes
        .and_then(|bytes| address.checked_add(bytes).map(|end| (address, end)))
        .ok_or_else(|| invalid(format!("{name} extends past the end of the address space")))
}

/// Refuses an output whose layout maps two elements to one address (say, a zero stride): each
/// dimension's stride must step past everything the smaller-strided dimensions reach.
fn check_injective(
    name: &str,
    layout: Layout,
    p: &AttentionParams,
    seqlen: usize,
    heads: usize,
) -> Result<(), AttentionError> {
    let mut dims = [
        ("head_dim", 1, p.head_dim),
        ("batch_stride", layout.batch_stride, p.batch),
        ("seq_stride", layout.seq_stride, seqlen),
        ("head_stride", layout.head_stride, heads),
    ];
    dims.sort_by_key(|&(_, stride, _)| stride);
    let mut reach: i64 = 0;
    for (field, stride, size) in dims {
        if size == 1 {
            continue;
        }
        if stride <= reach {
            return Err(invalid(format!(
                "{name} overlaps itself: {name}.{field} = {stride} does not step past the \
                 {} elements its smaller strides cover",
                reach + 1
            )));
        }
        reach += stride * (size as i64 - 1);
    }
    Ok(())
}

/// Refuses outputs whose byte ranges intersect.
fn check_disjoint(outputs: &[(&str, Extent)]) -> Result<(), AttentionError> {
    for (i, (a, (a_start, a_end))) in outputs.iter().enumerate() {
        for (b, (b_start, b_end)) in &outputs[i + 1..] {
            if a_start < b_end && b_start < a_end {
                return Err(invalid(format!(
                    "outputs {a} and {b} overlap ({a} spans {a_start:#x}..{a_end:#x}, {b} \
                     {b_start:#x}..{b_end:#x})"
                )));
            }
        }
    }
    Ok(())
}

/// Loads `launch`'s PTX (`candidate`'s, else the shipped one) in `context` as `name`.
fn load(
    context: Context,
    launch: &Launch,
    name: &str,
    candidate: Option<&Candidate>,
) -> Result<Arc<LoadedKernel>, AttentionError> {
    let (ptx, shared_bytes) = match candidate {
        Some(c) => (c.ptx.as_str(), c.shared_bytes),
        None => {
            let shipped = prebuilt::ptx(&launch.name).ok_or_else(|| {
                AttentionError::Unsupported(format!("no prebuilt kernel {}", launch.name))
            })?;
            (shipped.text, shipped.shared_bytes)
        }
    };
    let signature = launch.kernel.signature();
    let params = ParamType::of_signature(signature, &launch.spec).ok_or_else(|| {
        AttentionError::Internal(format!(
            "{}: an argument type the spec leaves open",
            launch.name
        ))
    })?;
    Ok(MODULES.get_or_load(
        context,
        ModuleSource {
            name,
            ptx,
            entry: signature.name,
            params: &params,
            shared_bytes,
            // A candidate's ptxas warnings are what `kiln tune` reports of it.
            report: candidate.is_some(),
        },
    )?)
}

/// What ptxas said costs `candidate` speed, once a call on `device` has loaded it (none
/// before: the trial that runs it loads it).
pub fn candidate_warnings(device: &Device, candidate: &Candidate) -> Vec<String> {
    MODULES
        .get(device.context(), &candidate.module_name())
        .map(|kernel| kernel.performance_warnings().to_vec())
        .unwrap_or_default()
}

/// Loads (once per context) and launches one planned kernel with its roles at `address`.
///
/// # Safety
/// The addresses must hold what the launch reads and writes.
unsafe fn run(
    context: Context,
    stream: RawStream,
    launch: &Launch,
    overrides: &Overrides,
    address: impl Fn(Role) -> Option<u64>,
) -> Result<(), AttentionError> {
    let candidate = overrides.get(launch.kernel);
    let name = match candidate {
        Some(c) if c.name != launch.name => {
            return Err(invalid(format!(
                "the candidate for {} cannot run a call that needs {}",
                c.name, launch.name
            )));
        }
        Some(c) => &c.module_name(),
        None => &launch.name,
    };
    // Every launch after a context's first finds its kernel loaded.
    let kernel = match MODULES.get(context, name) {
        Some(kernel) => kernel,
        None => load(context, launch, name, candidate)?,
    };
    let args = launch
        .args
        .iter()
        .map(|arg| match *arg {
            Arg::Buffer(role) => address(role).map(RawArg::Ptr).ok_or_else(|| {
                AttentionError::Internal(format!("{}: the plan names {role:?}", launch.name))
            }),
            Arg::I32(v) => Ok(RawArg::I32(v)),
            Arg::I64(v) => Ok(RawArg::I64(v)),
            Arg::F32(v) => Ok(RawArg::F32(v)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    // A persistent kernel runs one program an SM.
    let grid = if launch.config.persistent {
        launch.grid_within(context.multiprocessor_count()?)
    } else {
        launch.grid
    };
    // Safety: the caller vouches for the memory behind the addresses.
    unsafe { kernel.launch(stream, grid, launch.config.threads(), &args) }?;
    Ok(())
}

// ---- the safe Rust API ----

/// A tensor in a [`DeviceBuffer`]: `[batch, seqlen, heads, head_dim]` with element strides.
#[derive(Clone, Copy, Debug)]
pub struct DeviceTensor<'a> {
    pub buffer: &'a DeviceBuffer,
    pub layout: Layout,
}

/// A tensor the call writes.
#[derive(Debug)]
pub struct DeviceTensorMut<'a> {
    pub buffer: &'a mut DeviceBuffer,
    pub layout: Layout,
}

/// The gradients a backward call writes, shaped like q, k and v.
#[derive(Debug)]
pub struct Gradients<'a> {
    pub dq: DeviceTensorMut<'a>,
    pub dk: DeviceTensorMut<'a>,
    pub dv: DeviceTensorMut<'a>,
}

/// Checks a buffer's dtype and that it holds every element its shape and strides address; its
/// address on `device`.
fn bound(
    device: &Device,
    name: &str,
    buffer: &DeviceBuffer,
    layout: Layout,
    p: &AttentionParams,
    seqlen: usize,
    heads: usize,
) -> Result<RawTensor, AttentionError> {
    if buffer.dtype() != p.dtype {
        return Err(invalid(format!(
            "{name} holds {}, expected {}",
            buffer.dtype(),
            p.dtype
        )));
    }
    let need = layout.required_len(name, p.batch, seqlen, heads, p.head_dim)?;
    if buffer.len() < need {
        return Err(invalid(format!(
            "{name} has {} elements but its shape and strides address {need}",
            buffer.len()
        )));
    }
    Ok(RawTensor {
        address: buffer.device_address(device),
        layout,
    })
}

/// Checks an f32 row buffer (LSE, the workspace) holds `len` elements; its address.
fn bound_rows(
    device: &Device,
    name: &str,
    buffer: &DeviceBuffer,
    len: usize,
) -> Result<u64, AttentionError> {
    if buffer.dtype() != DType::F32 || buffer.len() < len {
        return Err(invalid(format!(
            "{name} must hold at least {len} f32 (batch * heads_q * seqlen_q), got {} {}",
            buffer.len(),
            buffer.dtype()
        )));
    }
    Ok(buffer.device_address(device))
}

/// Attention forward on `device`'s stream: writes `o` (shaped like `q`) and the natural-log
/// `lse` (`[batch, heads_q, seqlen_q]` f32). Queued, not waited for.
///
/// ```no_run
/// use kiln_kernels::attention::gpu::{self, Device, DeviceTensor, DeviceTensorMut};
/// use kiln_kernels::attention::{AttentionParams, DType, Layout};
///
/// let device = Device::current_or_default()?;
/// let p = AttentionParams {
///     dtype: DType::BF16,
///     batch: 2,
///     seqlen_q: 1000,
///     seqlen_k: 1000,
///     heads_q: 8,
///     heads_kv: 2,
///     head_dim: 128,
///     causal: true,
///     softmax_scale: AttentionParams::default_scale(128),
///     fused_backward: false,
/// };
/// let ql = Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim);
/// let kl = Layout::contiguous(p.seqlen_k, p.heads_kv, p.head_dim);
/// let q = device.filled(DType::BF16, p.batch * p.seqlen_q * p.heads_q * p.head_dim, 0)?;
/// let k = device.filled(DType::BF16, p.batch * p.seqlen_k * p.heads_kv * p.head_dim, 0)?;
/// let v = device.filled(DType::BF16, p.batch * p.seqlen_k * p.heads_kv * p.head_dim, 0)?;
/// let mut o = device.filled(DType::BF16, p.batch * p.seqlen_q * p.heads_q * p.head_dim, 0)?;
/// let mut lse = device.filled(DType::F32, p.lse_len(), 0)?;
/// gpu::forward(
///     &device,
///     &p,
///     DeviceTensor { buffer: &q, layout: ql },
///     DeviceTensor { buffer: &k, layout: kl },
///     DeviceTensor { buffer: &v, layout: kl },
///     DeviceTensorMut { buffer: &mut o, layout: ql },
///     &mut lse,
/// )?;
/// device.synchronize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn forward(
    device: &Device,
    p: &AttentionParams,
    q: DeviceTensor<'_>,
    k: DeviceTensor<'_>,
    v: DeviceTensor<'_>,
    o: DeviceTensorMut<'_>,
    lse: &mut DeviceBuffer,
) -> Result<(), AttentionError> {
    forward_with(device, p, [q, k, v], o, lse, &Overrides::default())
}

/// [`forward`] running `overrides`' candidates in place of the shipped kernels.
pub fn forward_with(
    device: &Device,
    p: &AttentionParams,
    [q, k, v]: [DeviceTensor<'_>; 3],
    o: DeviceTensorMut<'_>,
    lse: &mut DeviceBuffer,
    overrides: &Overrides,
) -> Result<(), AttentionError> {
    p.check_fields()?;
    let at = ForwardAddresses {
        q: bound(device, "q", q.buffer, q.layout, p, p.seqlen_q, p.heads_q)?,
        k: bound(device, "k", k.buffer, k.layout, p, p.seqlen_k, p.heads_kv)?,
        v: bound(device, "v", v.buffer, v.layout, p, p.seqlen_k, p.heads_kv)?,
        o: bound(device, "o", o.buffer, o.layout, p, p.seqlen_q, p.heads_q)?,
        lse: bound_rows(device, "lse", lse, p.lse_len())?,
    };
    check_forward(p, &at)?;
    check_supported(p)?;
    // Safety: every buffer was checked to hold what its shape and strides address, and the
    // borrows keep the outputs apart and alive until the call returns (the stream orders any
    // later use of them after the kernels).
    unsafe { launch_forward_checked(device.context(), device.raw_stream(), p, &at, overrides) }
}

/// Attention backward on `device`'s stream: from `inputs = [q, k, v, o, d_o]` (the forward's
/// inputs and output, and the output gradient) and the forward's `lse`, writes dQ, dK and dV
/// (GQA's groups summed into dK/dV). The split kernels make it bitwise the same on every run.
/// Queued, not waited for.
///
/// ```no_run
/// use kiln_kernels::attention::gpu::{self, Device, DeviceTensor, DeviceTensorMut, Gradients};
/// use kiln_kernels::attention::{AttentionParams, DType, Layout};
///
/// let device = Device::current_or_default()?;
/// let p = AttentionParams {
///     dtype: DType::F16,
///     batch: 1,
///     seqlen_q: 512,
///     seqlen_k: 512,
///     heads_q: 4,
///     heads_kv: 4,
///     head_dim: 64,
///     causal: false,
///     softmax_scale: AttentionParams::default_scale(64),
///     fused_backward: false,
/// };
/// let l = Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim);
/// let n = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
/// let [q, k, v, o, d_o] = [0; 5].map(|_| device.filled(DType::F16, n, 0).unwrap());
/// let lse = device.filled(DType::F32, p.lse_len(), 0)?;
/// let [mut dq, mut dk, mut dv] = [0; 3].map(|_| device.filled(DType::F16, n, 0).unwrap());
/// let t = |buffer| DeviceTensor { buffer, layout: l };
/// gpu::backward(
///     &device,
///     &p,
///     [t(&q), t(&k), t(&v), t(&o), t(&d_o)],
///     &lse,
///     Gradients {
///         dq: DeviceTensorMut { buffer: &mut dq, layout: l },
///         dk: DeviceTensorMut { buffer: &mut dk, layout: l },
///         dv: DeviceTensorMut { buffer: &mut dv, layout: l },
///     },
/// )?;
/// device.synchronize()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn backward(
    device: &Device,
    p: &AttentionParams,
    inputs: [DeviceTensor<'_>; 5],
    lse: &DeviceBuffer,
    grads: Gradients<'_>,
) -> Result<(), AttentionError> {
    backward_with(device, p, inputs, lse, grads, &Overrides::default())
}

/// [`backward`] running `overrides`' candidates in place of the shipped kernels.
pub fn backward_with(
    device: &Device,
    p: &AttentionParams,
    [q, k, v, o, d_o]: [DeviceTensor<'_>; 5],
    lse: &DeviceBuffer,
    grads: Gradients<'_>,
    overrides: &Overrides,
) -> Result<(), AttentionError> {
    p.check_fields()?;
    // The row statistics (written by dQ, or fused by the preprocessing, which also zeroes the
    // accumulator).
    let workspace_bytes = workspace_bytes(p)?;
    let workspace = device.scratch(DType::F32, workspace_bytes / DType::F32.size_bytes())?;
    let at = BackwardAddresses {
        q: bound(device, "q", q.buffer, q.layout, p, p.seqlen_q, p.heads_q)?,
        k: bound(device, "k", k.buffer, k.layout, p, p.seqlen_k, p.heads_kv)?,
        v: bound(device, "v", v.buffer, v.layout, p, p.seqlen_k, p.heads_kv)?,
        o: bound(device, "o", o.buffer, o.layout, p, p.seqlen_q, p.heads_q)?,
        d_o: bound(
            device, "d_o", d_o.buffer, d_o.layout, p, p.seqlen_q, p.heads_q,
        )?,
        lse: bound_rows(device, "lse", lse, p.lse_len())?,
        dq: bound(
            device,
            "dq",
            grads.dq.buffer,
            grads.dq.layout,
            p,
            p.seqlen_q,
            p.heads_q,
        )?,
        dk: bound(
            device,
            "dk",
            grads.dk.buffer,
            grads.dk.layout,
            p,
            p.seqlen_k,
            p.heads_kv,
        )?,
        dv: bound(
            device,
            "dv",
            grads.dv.buffer,
            grads.dv.layout,
            p,
            p.seqlen_k,
            p.heads_kv,
        )?,
        workspace: workspace.device_address(device),
        workspace_bytes,
    };
    check_backward(p, &at)?;
    check_supported(p)?;
    // Safety: as in `forward`; the workspace lives until the stream has run the kernels, as
    // dropping a buffer frees it in stream order.
    unsafe { launch_backward_checked(device.context(), device.raw_stream(), p, &at, overrides) }
}
