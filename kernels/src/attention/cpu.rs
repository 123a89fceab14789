//! Attention on the CPU interpreter: the same kernels, specs and argument lists the GPU runs.

use kiln_dsl::{Grid, HostBuffer, KernelArg};

use super::{AttentionError, AttentionParams, Tensor, backward, check_rows, forward};

fn strides(t: &Tensor<'_>) -> [KernelArg<'static>; 3] {
    [
        KernelArg::I64(t.layout.batch_stride),
        KernelArg::I64(t.layout.seq_stride),
        KernelArg::I64(t.layout.head_stride),
    ]
}

fn blocks(n: usize, block: usize) -> u32 {
    n.div_ceil(block) as u32
}

/// Forward: writes `o` (shaped like `q`) and the natural-log `lse` (`[batch, heads_q, seqlen_q]`).
pub fn forward(
    params: &AttentionParams,
    q: Tensor<'_>,
    k: Tensor<'_>,
    v: Tensor<'_>,
    o: Tensor<'_>,
    lse: &HostBuffer,
) -> Result<(), AttentionError> {
    let sizes = params.validate()?;
    let p = params;
    q.check("q", p.dtype, p.seqlen_q, p.heads_q, p)?;
    k.check("k", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    v.check("v", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    o.check("o", p.dtype, p.seqlen_q, p.heads_q, p)?;
    check_rows("lse", lse, p)?;
    let kernel = forward::attention_fwd::build(&p.forward_spec(sizes))?;
    let mut args = vec![
        KernelArg::Buffer(q.buffer),
        KernelArg::Buffer(k.buffer),
        KernelArg::Buffer(v.buffer),
        KernelArg::Buffer(o.buffer),
        KernelArg::Buffer(lse),
        KernelArg::I32(p.seqlen_q as i32),
        KernelArg::I32(p.seqlen_k as i32),
        KernelArg::I32(p.heads_q as i32),
        KernelArg::I32(p.group() as i32),
    ];
    for t in [&q, &k, &v, &o] {
        args.extend(strides(t));
    }
    args.push(KernelArg::F32(p.softmax_scale));
    let grid = Grid::new(
        blocks(p.seqlen_q, sizes.fwd_block_m),
        (p.batch * p.heads_q) as u32,
        1,
    );
    kiln_dsl::run(&kernel, grid, &args)?;
    Ok(())
}

/// The gradients of one backward call, and the `delta` workspace (`[batch, heads_q, seqlen_q]` f32).
#[derive(Clone, Copy, Debug)]
pub struct BackwardOutputs<'a> {
    pub dq: Tensor<'a>,
    pub dk: Tensor<'a>,
    pub dv: Tensor<'a>,
    pub delta: &'a HostBuffer,
}

/// Backward: the preprocessing kernel, then the dQ kernel and the dK/dV kernel.
pub fn backward(
    params: &AttentionParams,
    q: Tensor<'_>,
    k: Tensor<'_>,
    v: Tensor<'_>,
    o: Tensor<'_>,
    d_o: Tensor<'_>,
    lse: &HostBuffer,
    out: BackwardOutputs<'_>,
) -> Result<(), AttentionError> {
    let sizes = params.validate()?;
    let p = params;
    q.check("q", p.dtype, p.seqlen_q, p.heads_q, p)?;
    k.check("k", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    v.check("v", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    o.check("o", p.dtype, p.seqlen_q, p.heads_q, p)?;
    d_o.check("d_o", p.dtype, p.seqlen_q, p.heads_q, p)?;
    out.dq.check("dq", p.dtype, p.seqlen_q, p.heads_q, p)?;
    out.dk.check("dk", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    out.dv.check("dv", p.dtype, p.seqlen_k, p.heads_kv, p)?;
    check_rows("lse", lse, p)?;
    check_rows("delta", out.delta, p)?;

    let preprocess = backward::attention_bwd_preprocess::build(&p.preprocess_spec(sizes))?;
    let mut args = vec![
        KernelArg::Buffer(o.buffer),
        KernelArg::Buffer(d_o.buffer),
        KernelArg::Buffer(out.delta),
        KernelArg::I32(p.seqlen_q as i32),
        KernelArg::I32(p.heads_q as i32),
    ];
    args.extend(strides(&o));
    args.extend(strides(&d_o));
    let grid = Grid::new(
        blocks(p.seqlen_q, sizes.preprocess_block_m),
        (p.batch * p.heads_q) as u32,
        1,
    );
    kiln_dsl::run(&preprocess, grid, &args)?;

    let spec = p.backward_spec(sizes);
    let dq_kernel = backward::attention_bwd_dq::build(&spec)?;
    let mut args = vec![
        KernelArg::Buffer(q.buffer),
        KernelArg::Buffer(k.buffer),
        KernelArg::Buffer(v.buffer),
        KernelArg::Buffer(d_o.buffer),
        KernelArg::Buffer(out.dq.buffer),
        KernelArg::Buffer(lse),
        KernelArg::Buffer(out.delta),
        KernelArg::I32(p.seqlen_q as i32),
        KernelArg::I32(p.seqlen_k as i32),
        KernelArg::I32(p.heads_q as i32),
        KernelArg::I32(p.group() as i32),
    ];
    for t in [&q, &k, &v, &d_o, &out.dq] {
        args.extend(strides(t));
    }
    args.push(KernelArg::F32(p.softmax_scale));
    let grid = Grid::new(
        blocks(p.seqlen_q, sizes.bwd_block_m),
        (p.batch * p.heads_q) as u32,
        1,
    );
    kiln_dsl::run(&dq_kernel, grid, &args)?;

    let dkdv_kernel = backward::attention_bwd_dkdv::build(&spec)?;
    let mut args = vec![
        KernelArg::Buffer(q.buffer),
        KernelArg::Buffer(k.buffer),
        KernelArg::Buffer(v.buffer),
        KernelArg::Buffer(d_o.buffer),
        KernelArg::Buffer(out.dk.buffer),
        KernelArg::Buffer(out.dv.buffer),
        KernelArg::Buffer(lse),
        KernelArg::Buffer(out.delta),
        KernelArg::I32(p.seqlen_q as i32),
        KernelArg::I32(p.seqlen_k as i32),
        KernelArg::I32(p.heads_kv as i32),
        KernelArg::I32(p.group() as i32),
    ];
    for t in [&q, &k, &v, &d_o, &out.dk, &out.dv] {
        args.extend(strides(t));
    }
    args.push(KernelArg::F32(p.softmax_scale));
    let grid = Grid::new(
        blocks(p.seqlen_k, sizes.bwd_block_n),
        (p.batch * p.heads_kv) as u32,
        1,
    );
    kiln_dsl::run(&dkdv_kernel, grid, &args)?;
    Ok(())
}
