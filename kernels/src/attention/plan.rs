//! What an attention call launches for a target, independent of where it runs: for each kernel
//! its specialisation, warps, stages, grid and argument list, with buffers named by role. The interpreter
//! (`cpu`) and the GPU bind the roles to their own buffers, so both launch exactly the same thing.

use kiln_dsl::{Kernel, Spec, Target};

use super::{
    AttentionConfig, AttentionError, AttentionParams, DECODE_ROWS, KernelConfig, KeyLength, Layout,
    backward, config, forward,
};

/// One of the attention kernels: the forward and, where it splits the keys, its combine; the
/// backward's dK/dV; the split backward's dQ; the fused backward's preprocessing and dQ
/// conversion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKernel {
    Forward,
    Combine,
    Preprocess,
    Dq,
    DkDv,
    DqConvert,
}

impl AttentionKernel {
    pub const ALL: [AttentionKernel; 6] = [
        AttentionKernel::Forward,
        AttentionKernel::Combine,
        AttentionKernel::Preprocess,
        AttentionKernel::Dq,
        AttentionKernel::DkDv,
        AttentionKernel::DqConvert,
    ];

    /// Whether the kernel reads keys, and so has a key block and a mask: all but the
    /// combine, preprocessing and dQ conversion kernels, which walk query rows only.
    pub fn reads_keys(self) -> bool {
        !matches!(
            self,
            AttentionKernel::Combine | AttentionKernel::Preprocess | AttentionKernel::DqConvert
        )
    }

    /// Whether the kernel is specialised differently for the fused backward: dK/dV, which adds
    /// dQ into an accumulator there. The preprocessing and dQ conversion kernels exist only in
    /// the fused backward, and dQ only in the split one.
    pub fn differs_when_fused(self) -> bool {
        self == AttentionKernel::DkDv
    }

    /// The backward's kernels in launch order: split, dQ (which also writes the row
    /// statistics, delta and the LSE in base 2) and dK/dV; fused, the preprocessing (the
    /// statistics, and the dQ accumulator zeroed), dK/dV and the dQ conversion.
    pub fn backward(fused: bool) -> &'static [AttentionKernel] {
        if fused {
            &[
                AttentionKernel::Preprocess,
                AttentionKernel::DkDv,
                AttentionKernel::DqConvert,
            ]
        } else {
            &[AttentionKernel::Dq, AttentionKernel::DkDv]
        }
    }

    /// The spec parameter that [`KernelConfig::block_m`] sets: query rows a program or a
    /// streamed tile, but for the combine's splits a tile.
    pub fn block_m_param(self) -> &'static str {
        match self {
            AttentionKernel::Combine => "SPLIT_BLOCK",
            _ => "BLOCK_M",
        }
    }

    /// The kernel's name, as its `#[kernel]` fn is called.
    pub fn name(self) -> &'static str {
        self.signature().name
    }

    /// The kernel called `name`.
    pub fn from_name(name: &str) -> Option<AttentionKernel> {
        AttentionKernel::ALL.into_iter().find(|k| k.name() == name)
    }

    pub fn signature(self) -> &'static kiln_dsl::KernelSignature {
        match self {
            AttentionKernel::Forward => &forward::attention_fwd::SIGNATURE,
            AttentionKernel::Combine => &forward::attention_fwd_combine::SIGNATURE,
            AttentionKernel::Preprocess => &backward::attention_bwd_preprocess::SIGNATURE,
            AttentionKernel::Dq => &backward::attention_bwd_dq::SIGNATURE,
            AttentionKernel::DkDv => &backward::attention_bwd_dkdv::SIGNATURE,
            AttentionKernel::DqConvert => &backward::attention_bwd_dq_convert::SIGNATURE,
        }
    }

    /// Builds the kernel's IR at `spec`.
    pub fn build(self, spec: &Spec) -> kiln_dsl::Result<Kernel> {
        match self {
            AttentionKernel::Forward => forward::attention_fwd::build(spec),
            AttentionKernel::Combine => forward::attention_fwd_combine::build(spec),
            AttentionKernel::Preprocess => backward::attention_bwd_preprocess::build(spec),
            AttentionKernel::Dq => backward::attention_bwd_dq::build(spec),
            AttentionKernel::DkDv => backward::attention_bwd_dkdv::build(spec),
            AttentionKernel::DqConvert => backward::attention_bwd_dq_convert::build(spec),
        }
    }
}

/// A buffer of an attention call, by its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    Q,
    K,
    V,
    O,
    Lse,
    DO,
    Dq,
    Dk,
    Dv,
    /// The backward's f32 workspace of each query row's LSE in base 2 (`+inf` where it is
    /// `-inf`), `[batch, heads_q, seqlen_q]` with heads [`AttentionParams::stats_stride`] apart:
    /// written by dQ or the preprocessing, read by dK/dV.
    LseBase2,
    /// The backward's f32 workspace of `rowsum(dO * O)`, laid out as [`Role::LseBase2`].
    Delta,
    /// The fused backward's `[batch, heads_q, seqlen_q, head_dim]` f32 dQ accumulator.
    DqAccum,
    /// The split forward's workspace of each split's O, f32 `[splits * batch, seqlen_q,
    /// heads_q, head_dim]` packed (split s's batches after the splits before).
    OParts,
    /// The split forward's workspace of each split's natural-log LSE, f32 `[splits * batch,
    /// heads_q, seqlen_q]` packed.
    LseParts,
}

/// One launch argument: a buffer by role, or a scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Buffer(Role),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// The name of `kernel`'s specialisation for calls like `p` on `target`, such as
/// `attention_bwd_dq_bf16_d128_causal_sm_90a`: what its compiled PTX is known by. The kernels
/// that read no keys have no mask, so their names have none; those of the fused backward that
/// differ from the split one's are `_fused`; a forward in other blocks for short or long
/// sequences than the table's own entry is `_short` or `_long` ([`KeyLength`]); one of at most
/// [`DECODE_ROWS`] rows a head (a decode step's GQA group counted as rows) is `_decode`
/// ([`fn@forward`]).
pub fn specialisation_name(kernel: AttentionKernel, p: &AttentionParams, target: Target) -> String {
    specialisation_name_in(kernel, p, target, p.key_length())
}

/// [`specialisation_name`] of the table's entry for the sequence lengths of `keys`.
fn specialisation_name_in(
    kernel: AttentionKernel,
    p: &AttentionParams,
    target: Target,
    keys: KeyLength,
) -> String {
    if kernel == AttentionKernel::Forward && decodes(&grouped_params(p).unwrap_or(*p)) {
        return named(kernel, p, target, "_decode");
    }
    // A forward whose blocks for these sequence lengths are not the table's own entry's.
    let blocks = |keys| {
        config(p.head_dim, p.causal, p.fused_backward, target, keys).map(|c| c.kernel(kernel))
    };
    let keys = if blocks(keys) == blocks(KeyLength::Medium) {
        ""
    } else {
        keys.suffix()
    };
    named(kernel, p, target, keys)
}

/// A specialisation's name, with `variant` (`_long`, `_signed`, ...) before the target.
fn named(kernel: AttentionKernel, p: &AttentionParams, target: Target, variant: &str) -> String {
    let mask = if p.causal && kernel.reads_keys() {
        "_causal"
    } else {
        ""
    };
    let fused = if p.fused_backward && kernel.differs_when_fused() {
        "_fused"
    } else {
        ""
    };
    format!(
        "{}_{}_d{}{mask}{fused}{variant}_{target}",
        kernel.name(),
        p.dtype,
        p.head_dim
    )
}

/// Where the long range's forward entry for calls like `p` is persistent (which takes only a
/// scale of 0 or more): the forward in its blocks, one program a block, that calls with a
/// negative softmax scale run, and its name: the table's entry's with `_signed`.
pub fn signed_forward(p: &AttentionParams, target: Target) -> Option<(KernelConfig, String)> {
    let long = config(p.head_dim, p.causal, false, target, KeyLength::Long)?.forward;
    long.persistent.then(|| {
        let config = KernelConfig {
            persistent: false,
            ..long
        };
        (
            config,
            named(AttentionKernel::Forward, p, target, "_signed"),
        )
    })
}

/// One kernel launch of an attention call: which kernel, compiled how, launched how.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: AttentionKernel,
    /// [`specialisation_name`]: the kernel, dtype, head dim, mask and target.
    pub name: String,
    pub target: Target,
    /// Block sizes, warps and stages, from the configuration table.
    pub config: KernelConfig,
    pub spec: Spec,
    /// One program per block of rows of each head; a persistent kernel's grid is its tiles, of
    /// which a launch runs [`Launch::grid_within`] programs.
    pub grid: [u32; 3],
    pub args: Vec<Arg>,
}

impl Launch {
    fn new(
        p: &AttentionParams,
        kernel: AttentionKernel,
        target: Target,
        config: KernelConfig,
        args: Vec<Arg>,
    ) -> Launch {
        Launch::in_range(p, kernel, target, config, args, p.key_length())
    }

    /// [`Launch::new`] of the specialisation for the sequence lengths of `keys`.
    fn in_range(
        p: &AttentionParams,
        kernel: AttentionKernel,
        target: Target,
        config: KernelConfig,
        args: Vec<Arg>,
        keys: KeyLength,
    ) -> Launch {
        // One program per block of query rows for each query head (the combine's blocks are
        // one row); dK/dV's per block of keys for each kv head.
        let (rows, block, heads) = match (kernel, config.block_n) {
            (AttentionKernel::DkDv, Some(block_n)) => (p.seqlen_k, block_n, p.heads_kv),
            (AttentionKernel::Combine, _) => (p.seqlen_q, 1, p.heads_q),
            _ => (p.seqlen_q, config.block_m, p.heads_q),
        };
        let blocks = rows.div_ceil(block) as u32;
        // A persistent forward loops over the blocks of every head itself; causal, over pairs
        // of them (`forward.rs::persistent_tile`).
        let grid = if config.persistent {
            let tiles = if p.causal { blocks.div_ceil(2) } else { blocks };
            [tiles * (p.batch * heads) as u32, 1, 1]
        } else {
            [blocks, (p.batch * heads) as u32, 1]
        };
        Launch {
            kernel,
            name: specialisation_name_in(kernel, p, target, keys),
            target,
            config,
            spec: p.spec(kernel, config),
            grid,
            args,
        }
    }

    /// The grid to launch where at most `programs` run at once (one an SM): a persistent
    /// kernel's programs, each looping over its share of the tiles; any other's whole grid.
    pub fn grid_within(&self, programs: u32) -> [u32; 3] {
        let [x, y, z] = self.grid;
        if self.config.persistent {
            [x.min(programs.max(1)), y, z]
        } else {
            [x, y, z]
        }
    }
}

/// The strides of the forward pass's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ForwardLayouts {
    pub q: Layout,
    pub k: Layout,
    pub v: Layout,
    pub o: Layout,
}

/// The strides of the backward pass's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardLayouts {
    pub q: Layout,
    pub k: Layout,
    pub v: Layout,
    pub o: Layout,
    pub d_o: Layout,
    pub dq: Layout,
    pub dk: Layout,
    pub dv: Layout,
}

/// The batch and head strides of the backward's statistics ([`Role::LseBase2`], [`Role::Delta`]).
fn stats_strides(p: &AttentionParams) -> [Arg; 2] {
    let head = p.stats_stride();
    [Arg::I64((p.heads_q * head) as i64), Arg::I64(head as i64)]
}

fn strides(layout: Layout) -> [Arg; 3] {
    [
        Arg::I64(layout.batch_stride),
        Arg::I64(layout.seq_stride),
        Arg::I64(layout.head_stride),
    ]
}

/// The forward pass on `target`: one launch of [`AttentionKernel::Forward`], configured as
/// kiln's table says. Heads of at most [`DECODE_ROWS`] query rows (after grouping: a batch of
/// decode steps) run the table's decode blocks ([`AttentionConfig::decode`], `_decode`), not
/// blocks of 128-256 rows mostly empty (D64, 32 x 32 heads against 4k keys: 576 against 244
/// us, run 380). Where the table's entry is persistent and `softmax_scale` negative (which a
/// persistent forward does not take), the long range's entry runs, or where that one is
/// persistent too, [`signed_forward`].
pub fn forward(
    p: &AttentionParams,
    layouts: &ForwardLayouts,
    target: Target,
) -> Result<Launch, AttentionError> {
    let (p, layouts) = &grouped(p, layouts);
    if decodes(p) {
        let decode = p.config(target)?.decode;
        return forward_in(p, layouts, target, decode, KeyLength::Medium);
    }
    let config = p.config(target)?.forward;
    if !(config.persistent && p.softmax_scale < 0.0) {
        return forward_with(p, layouts, target, config);
    }
    let keys = KeyLength::Long;
    if let Some((signed, name)) = signed_forward(p, target) {
        let launch = forward_in(p, layouts, target, signed, keys)?;
        return Ok(Launch { name, ..launch });
    }
    let long = super::config::config(p.head_dim, p.causal, p.fused_backward, target, keys)
        .expect("the table covers every head dim in HEAD_DIMS")
        .forward;
    forward_in(p, layouts, target, long, keys)
}

/// [`fn@forward`] with the forward kernel configured as `config` (what `kiln tune` tries). A
/// persistent forward takes Q to the tensor cores as loaded, with no room to flip its sign: it
/// refuses a negative `softmax_scale`.
pub fn forward_with(
    p: &AttentionParams,
    layouts: &ForwardLayouts,
    target: Target,
    config: KernelConfig,
) -> Result<Launch, AttentionError> {
    let (p, layouts) = &grouped(p, layouts);
    forward_in(p, layouts, target, config, p.key_length())
}

/// [`forward_with`], named as the specialisation for the sequence lengths of `keys`.
fn forward_in(
    p: &AttentionParams,
    layouts: &ForwardLayouts,
    target: Target,
    config: KernelConfig,
    keys: KeyLength,
) -> Result<Launch, AttentionError> {
    if config.persistent && p.softmax_scale < 0.0 {
        return Err(super::invalid(format!(
            "softmax_scale = {}: a persistent forward ({config}) takes a scale >= 0",
            p.softmax_scale
        )));
    }
    let mut args = vec![
        Arg::Buffer(Role::Q),
        Arg::Buffer(Role::K),
        Arg::Buffer(Role::V),
        Arg::Buffer(Role::O),
        Arg::Buffer(Role::Lse),
        Arg::I32(p.seqlen_q as i32),
        Arg::I32(p.seqlen_k as i32),
        Arg::I32(p.heads_q as i32),
        Arg::I32(p.group() as i32),
        Arg::I32(p.batch as i32),
        Arg::I32(p.heads_kv as i32),
    ];
    for layout in [layouts.q, layouts.k, layouts.v, layouts.o] {
        args.extend(strides(layout));
    }
    args.push(Arg::F32(p.softmax_scale));
    Ok(Launch::in_range(
        p,
        AttentionKernel::Forward,
        target,
        config,
        args,
        keys,
    ))
}

/// A forward of one query row (a decode step) with groups of query heads sharing a kv head
/// (GQA, MQA), seen as a forward whose query rows are a group's heads: each program then
/// streams its kv head's keys once for the whole group, not once for each of its heads
/// (FlashAttention-2's `seqlenq_ngroups_swapped`). Query head `kv * group + g` of the one row
/// is row g of head kv: rows a head apart, heads a group apart, and the LSE's `[batch,
/// heads_q, 1]` is `[batch, heads_kv, group]` as it lies. One row sees every key, causal or
/// not (the mask is aligned bottom-right). Any other call is as it was.
fn grouped(p: &AttentionParams, layouts: &ForwardLayouts) -> (AttentionParams, ForwardLayouts) {
    let Some(grouped) = grouped_params(p) else {
        return (*p, *layouts);
    };
    let group = p.group() as i64;
    // A group's stride overflows only with one kv head (the checks bound the last query head's
    // offset, `(heads_q - 1) * head_stride`), whose index is always 0: any stride serves there.
    let rows = |l: Layout| Layout {
        batch_stride: l.batch_stride,
        seq_stride: l.head_stride,
        head_stride: l.head_stride.checked_mul(group).unwrap_or(0),
    };
    let layouts = ForwardLayouts {
        q: rows(layouts.q),
        o: rows(layouts.o),
        ..*layouts
    };
    (grouped, layouts)
}

/// [`grouped`]'s call, where it differs.
fn grouped_params(p: &AttentionParams) -> Option<AttentionParams> {
    (p.seqlen_q == 1 && p.heads_q > p.heads_kv).then(|| AttentionParams {
        seqlen_q: p.group(),
        heads_q: p.heads_kv,
        causal: false,
        ..*p
    })
}

/// The most ways [`forward_splits`] splits the keys.
pub const MAX_SPLITS: usize = 128;

/// How many ways the forward splits each query block's keys where `programs` run at once (one
/// an SM): FlashDecoding's answer to calls with fewer query blocks than SMs (a decode step, a
/// short chunk of queries against a long cache), whose grid would leave SMs idle. Much as
/// FlashAttention-2 chooses: 1 where the blocks fill 80% of the SMs; else the fewest splits
/// whose waves of programs fill their last within 95% (FlashAttention-2: 85%) of the best of 1
/// to `min(programs, key blocks, MAX_SPLITS)` splits, counting only splits that change each
/// one's share of the key blocks. The programs stream keys at the memory's pace, so an idle
/// SM is bandwidth lost: 95% took a D64 decode step of 16 heads from 7 splits to 8 and 14.3 to
/// 12.8 us at 8k keys, 39.2 to 37.7 at 32k (docs/PERF.md, thirty-second session, run 377).
/// Heads of at most [`DECODE_ROWS`] rows (after grouping) count as one 16-row block each, the
/// decode blocks [`fn@forward`] runs them in unsplit and [`forward_split`] split.
pub fn forward_splits(
    p: &AttentionParams,
    target: Target,
    programs: u32,
) -> Result<usize, AttentionError> {
    let p = &grouped_params(p).unwrap_or(*p);
    let (config, _) = split_forward_config(p, target)?;
    let programs = programs.max(1) as usize;
    let tiles = p.batch * p.heads_q * p.seqlen_q.div_ceil(config.block_m);
    if tiles * 5 >= programs * 4 {
        return Ok(1);
    }
    let key_blocks = p
        .seqlen_k
        .div_ceil(config.block_n.unwrap_or(config.block_m));
    let most = programs.min(key_blocks).min(MAX_SPLITS);
    let efficiency = |splits: usize| {
        let waves = (tiles * splits) as f64 / programs as f64;
        waves / waves.ceil()
    };
    let changes_shares = |splits: usize| {
        splits == 1 || key_blocks.div_ceil(splits) != key_blocks.div_ceil(splits - 1)
    };
    let best = (1..=most)
        .filter(|&s| changes_shares(s))
        .map(efficiency)
        .fold(0.0, f64::max);
    Ok((1..=most)
        .filter(|&s| changes_shares(s))
        .find(|&s| efficiency(s) >= 0.95 * best)
        .unwrap_or(1))
}

/// The blocks the split forward runs in, with its name's variant: with at most [`DECODE_ROWS`]
/// query rows a head (after [`grouped`]), the table's decode blocks
/// ([`AttentionConfig::split_decode`]); else its entry for medium lengths
/// ([`AttentionConfig::split_forward`]): where it splits, its query blocks are mostly rows past
/// the end, so not the long range's 256-row D64 blocks.
fn split_forward_config(
    p: &AttentionParams,
    target: Target,
) -> Result<(KernelConfig, &'static str), AttentionError> {
    p.validate()?;
    let table = config(p.head_dim, p.causal, false, target, KeyLength::Medium)
        .expect("the table covers every head dim in HEAD_DIMS");
    Ok(match decodes(p) {
        true => (table.split_decode, "_split_decode"),
        false => (table.split_forward(), "_split"),
    })
}

/// Whether a call (after [`grouped`]) has few enough rows a head for the decode blocks.
fn decodes(p: &AttentionParams) -> bool {
    p.seqlen_q <= DECODE_ROWS
}

/// The f32 elements of the split forward's two workspaces, [`Role::OParts`] and
/// [`Role::LseParts`], for `splits` splits.
pub fn split_workspace_len(p: &AttentionParams, splits: usize) -> [usize; 2] {
    let lse = splits * p.lse_len();
    [lse * p.head_dim, lse]
}

/// The forward split `splits` ways over the keys ([`forward_splits`]): the forward at
/// [`AttentionParams::split_spec`], one program per (query block, head, split), writing each
/// split's part of O and the LSE into the workspaces, then [`AttentionKernel::Combine`] adding
/// them up into O and the LSE.
pub fn forward_split(
    p: &AttentionParams,
    layouts: &ForwardLayouts,
    target: Target,
    splits: usize,
) -> Result<[Launch; 2], AttentionError> {
    let (p, layouts) = &grouped(p, layouts);
    let (config, variant) = split_forward_config(p, target)?;
    if !(2..=MAX_SPLITS).contains(&splits) {
        return Err(super::invalid(format!(
            "a split forward takes 2 to {MAX_SPLITS} splits, got {splits}"
        )));
    }
    let parts = Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim);
    let mut split = forward_in(
        p,
        &ForwardLayouts {
            o: parts,
            ..*layouts
        },
        target,
        config,
        KeyLength::Medium,
    )?;
    for arg in &mut split.args {
        *arg = match *arg {
            Arg::Buffer(Role::O) => Arg::Buffer(Role::OParts),
            Arg::Buffer(Role::Lse) => Arg::Buffer(Role::LseParts),
            other => other,
        };
    }
    split.name = named(AttentionKernel::Forward, p, target, variant);
    split.spec = p.split_spec(config);
    split.grid[2] = splits as u32;
    let mut args = vec![
        Arg::Buffer(Role::OParts),
        Arg::Buffer(Role::LseParts),
        Arg::Buffer(Role::O),
        Arg::Buffer(Role::Lse),
        Arg::I32(p.seqlen_q as i32),
        Arg::I32(p.heads_q as i32),
        Arg::I32(p.batch as i32),
        Arg::I32(splits as i32),
    ];
    args.extend(strides(parts));
    args.extend(strides(layouts.o));
    let combine_config = p.config(target)?.combine;
    let combine = Launch::new(p, AttentionKernel::Combine, target, combine_config, args);
    Ok([split, combine])
}

/// The backward pass on `target`, in order, configured as kiln's table says: dQ (with the row
/// statistics), then dK/dV, or with `p.fused_backward` the preprocessing (the statistics, and
/// the accumulator zeroed), dK/dV adding dQ into the accumulator, and the dQ conversion.
pub fn backward(
    p: &AttentionParams,
    layouts: &BackwardLayouts,
    target: Target,
) -> Result<Vec<Launch>, AttentionError> {
    Ok(backward_with(p, layouts, target, p.config(target)?))
}

/// [`fn@backward`] with its kernels configured as `config` (what `kiln tune` tries).
pub fn backward_with(
    p: &AttentionParams,
    layouts: &BackwardLayouts,
    target: Target,
    config: AttentionConfig,
) -> Vec<Launch> {
    AttentionKernel::backward(p.fused_backward)
        .iter()
        .map(|&kernel| {
            let args = backward_args(kernel, p, layouts);
            Launch::new(p, kernel, target, config.kernel(kernel), args)
        })
        .collect()
}

/// The arguments of one of the backward's kernels, in its signature's order.
fn backward_args(
    kernel: AttentionKernel,
    p: &AttentionParams,
    layouts: &BackwardLayouts,
) -> Vec<Arg> {
    let buffers = |roles: &[Role]| {
        roles
            .iter()
            .map(|&role| Arg::Buffer(role))
            .collect::<Vec<_>>()
    };
    match kernel {
        AttentionKernel::Preprocess => {
            let mut args = buffers(&[
                Role::O,
                Role::DO,
                Role::Lse,
                Role::LseBase2,
                Role::Delta,
                Role::DqAccum,
            ]);
            args.extend([
                Arg::I32(p.seqlen_q as i32),
                Arg::I32(p.heads_q as i32),
                Arg::I32(p.batch as i32),
            ]);
            args.extend(strides(layouts.o));
            args.extend(strides(layouts.d_o));
            args.extend(stats_strides(p));
            args
        }
        AttentionKernel::DqConvert => {
            let mut args = buffers(&[Role::DqAccum, Role::Dq]);
            args.extend([Arg::I32(p.seqlen_q as i32), Arg::I32(p.heads_q as i32)]);
            args.extend(strides(layouts.dq));
            args.push(Arg::F32(p.softmax_scale));
            args
        }
        AttentionKernel::Dq => {
            let mut args = buffers(&[
                Role::Q,
                Role::K,
                Role::V,
                Role::O,
                Role::DO,
                Role::Dq,
                Role::Lse,
                Role::LseBase2,
                Role::Delta,
            ]);
            args.extend([
                Arg::I32(p.seqlen_q as i32),
                Arg::I32(p.seqlen_k as i32),
                Arg::I32(p.heads_q as i32),
                Arg::I32(p.group() as i32),
                Arg::I32(p.batch as i32),
                Arg::I32(p.heads_kv as i32),
            ]);
            for layout in [
                layouts.q,
                layouts.k,
                layouts.v,
                layouts.o,
                layouts.d_o,
                layouts.dq,
            ] {
                args.extend(strides(layout));
            }
            args.extend(stats_strides(p));
            args.push(Arg::F32(p.softmax_scale));
            args
        }
        AttentionKernel::DkDv => {
            // The split backward has no accumulator: its dK/dV never reads the pointer.
            let dq_accum = if p.fused_backward {
                Role::DqAccum
            } else {
                Role::Delta
            };
            let mut args = buffers(&[
                Role::Q,
                Role::K,
                Role::V,
                Role::DO,
                Role::Dk,
                Role::Dv,
                Role::LseBase2,
                Role::Delta,
                dq_accum,
            ]);
            args.extend([
                Arg::I32(p.seqlen_q as i32),
                Arg::I32(p.seqlen_k as i32),
                Arg::I32(p.heads_kv as i32),
                Arg::I32(p.group() as i32),
                Arg::I32(p.batch as i32),
                Arg::I32(p.heads_q as i32),
            ]);
            for layout in [
                layouts.q,
                layouts.k,
                layouts.v,
                layouts.d_o,
                layouts.dk,
                layouts.dv,
            ] {
                args.extend(strides(layout));
            }
            args.extend(stats_strides(p));
            // The accumulator is packed `[batch, heads_q, seqlen_q, head_dim]`.
            let head = p.seqlen_q * p.head_dim;
            args.extend([Arg::I64((p.heads_q * head) as i64), Arg::I64(head as i64)]);
            args.push(Arg::F32(p.softmax_scale));
            args
        }
        AttentionKernel::Forward | AttentionKernel::Combine => {
            unreachable!("the forward is not part of the backward")
        }
    }
}
