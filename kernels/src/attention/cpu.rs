//! Attention on the CPU interpreter: the launches of [`super::plan`], bound to host buffers. The
//! plan is a target's (its block sizes decide the order of floating-point sums), so the
//! interpreter reproduces what that target's PTX computes, within rounding.

use kiln_dsl::{DType, Grid, HostBuffer, KernelArg, Target};

use super::plan::{self, Arg, BackwardLayouts, ForwardLayouts, Launch, Role};
use super::{AttentionError, AttentionParams, Tensor, check_rows, check_stats, invalid};

/// The programs a persistent kernel runs on the interpreter: fewer than most calls' tiles, and
/// prime, so that programs loop over uneven shares of them.
const PERSISTENT_PROGRAMS: u32 = 7;

/// Runs one planned launch with each role bound by `buffer`.
fn run<'a>(launch: &Launch, buffer: impl Fn(Role) -> &'a HostBuffer) -> Result<(), AttentionError> {
    let kernel = launch.kernel.build(&launch.spec)?;
    let args: Vec<KernelArg<'_>> = launch
        .args
        .iter()
        .map(|arg| match *arg {
            Arg::Buffer(role) => KernelArg::Buffer(buffer(role)),
            Arg::I32(v) => KernelArg::I32(v),
            Arg::I64(v) => KernelArg::I64(v),
            Arg::F32(v) => KernelArg::F32(v),
        })
        .collect();
    let [x, y, z] = launch.grid_within(PERSISTENT_PROGRAMS);
    kiln_dsl::run(&kernel, Grid::new(x, y, z), &args)?;
    Ok(())
}

/// Forward as `target` runs it where the call fills the GPU: writes `o` (shaped like `q`) and
/// the natural-log `lse` (`[batch, heads_q, seqlen_q]`). Where it does not, the GPU splits the
/// keys ([`forward_in_splits`] runs that).
pub fn forward(
    p: &AttentionParams,
    target: Target,
    q: Tensor<'_>,
    k: Tensor<'_>,
    v: Tensor<'_>,
    o: Tensor<'_>,
    lse: &HostBuffer,
) -> Result<(), AttentionError> {
    forward_in_splits(p, target, [q, k, v], o, lse, 1)
}

/// [`forward`] with each query block's keys split `splits` ways ([`plan::forward_split`], as
/// the GPU splits them where a call has fewer query blocks than SMs; 1: not split).
pub fn forward_in_splits(
    p: &AttentionParams,
    target: Target,
    [q, k, v]: [Tensor<'_>; 3],
    o: Tensor<'_>,
    lse: &HostBuffer,
    splits: usize,
) -> Result<(), AttentionError> {
    p.validate()?;
    q.check("q", p.dtype, p.seqlen_q, p.heads_q, p)?;
    k.check("k", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    v.check("v", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    o.check("o", p.dtype, p.seqlen_q, p.heads_q, p)?;
    check_rows("lse", lse, p)?;
    let layouts = ForwardLayouts {
        q: q.layout,
        k: k.layout,
        v: v.layout,
        o: o.layout,
    };
    // Split, the forward writes its parts into a workspace (poisoned: the combine must read
    // only what was written) and the combine adds them up.
    let (launches, parts) = if splits == 1 {
        (vec![plan::forward(p, &layouts, target)?], [0, 0])
    } else {
        let launches = plan::forward_split(p, &layouts, target, splits)?.to_vec();
        (launches, plan::split_workspace_len(p, splits))
    };
    let [o_parts, lse_parts] = parts.map(|len| HostBuffer::poisoned(DType::F32, len));
    for launch in &launches {
        run(launch, |role| match role {
            Role::Q => q.buffer,
            Role::K => k.buffer,
            Role::V => v.buffer,
            Role::O => o.buffer,
            Role::Lse => lse,
            Role::OParts => &o_parts,
            Role::LseParts => &lse_parts,
            other => unreachable!("the forward plan names no {other:?}"),
        })?;
    }
    Ok(())
}

/// The gradients of one backward call, the workspace of per-row statistics (`lse_base2` and
/// `delta`, f32, [`AttentionParams::stats_len`] elements each: see [`Role::LseBase2`]) and, for
/// the fused backward only, the f32 dQ accumulator (`[batch, heads_q, seqlen_q, head_dim]`,
/// [`AttentionParams::dq_accum_len`] elements).
#[derive(Clone, Copy, Debug)]
pub struct BackwardOutputs<'a> {
    pub dq: Tensor<'a>,
    pub dk: Tensor<'a>,
    pub dv: Tensor<'a>,
    pub lse_base2: &'a HostBuffer,
    pub delta: &'a HostBuffer,
    pub dq_accum: Option<&'a HostBuffer>,
}

/// Backward as `target` runs it: the dQ kernel (which writes the row statistics), then the dK/dV
/// kernel, or
/// with `p.fused_backward` the preprocessing, the fused pass and the dQ conversion.
pub fn backward(
    p: &AttentionParams,
    target: Target,
    q: Tensor<'_>,
    k: Tensor<'_>,
    v: Tensor<'_>,
    o: Tensor<'_>,
    d_o: Tensor<'_>,
    lse: &HostBuffer,
    out: BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    p.validate()?;
    q.check("q", p.dtype, p.seqlen_q, p.heads_q, p)?;
    k.check("k", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    v.check("v", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    o.check("o", p.dtype, p.seqlen_q, p.heads_q, p)?;
    d_o.check("d_o", p.dtype, p.seqlen_q, p.heads_q, p)?;
    out.dq.check("dq", p.dtype, p.seqlen_q, p.heads_q, p)?;
    out.dk.check("dk", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    out.dv.check("dv", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    check_rows("lse", lse, p)?;
    check_stats("lse_base2", out.lse_base2, p)?;
    check_stats("delta", out.delta, p)?;
    let dq_accum = match out.dq_accum {
        Some(buffer) if buffer.dtype() == DType::F32 && buffer.len() >= p.dq_accum_len() => buffer,
        Some(buffer) => {
            return Err(invalid(format!(
                "dq_accum must hold at least {} f32 (batch * heads_q * seqlen_q * head_dim), got \
                 {} {}",
                p.dq_accum_len(),
                buffer.len(),
                buffer.dtype()
            )));
        }
        // The split backward never reads it (see `plan::backward`).
        None if !p.fused_backward => out.delta,
        None => {
            return Err(invalid(
                "the fused backward needs dq_accum, an f32 buffer of batch * heads_q * seqlen_q * \
                 head_dim elements"
                    .to_string(),
            ));
        }
    };
    let layouts = BackwardLayouts {
        q: q.layout,
        k: k.layout,
        v: v.layout,
        o: o.layout,
        d_o: d_o.layout,
        dq: out.dq.layout,
        dk: out.dk.layout,
        dv: out.dv.layout,
    };
    for launch in plan::backward(p, &layouts, target)? {
        run(&launch, |role| match role {
            Role::Q => q.buffer,
            Role::K => k.buffer,
            Role::V => v.buffer,
            Role::O => o.buffer,
            Role::Lse => lse,
            Role::DO => d_o.buffer,
            Role::Dq => out.dq.buffer,
            Role::Dk => out.dk.buffer,
            Role::Dv => out.dv.buffer,
            Role::LseBase2 => out.lse_base2,
            Role::Delta => out.delta,
            Role::DqAccum => dq_accum,
            other => unreachable!("the backward plan names no {other:?}"),
        })?;
    }
    Ok(())
}
