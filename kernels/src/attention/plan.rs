//! What an attention call launches, independent of where it runs: for each kernel its
//! specialisation, grid, warps and argument list, with buffers named by role. The interpreter
//! (`cpu`) and the GPU bind the roles to their own buffers, so both launch exactly the same thing.

use kiln_dsl::{Kernel, Spec};

use super::{AttentionError, AttentionParams, Layout, backward, forward};

/// One of the four attention kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionKernel {
    Forward,
    Preprocess,
    Dq,
    DkDv,
}

impl AttentionKernel {
    pub const ALL: [AttentionKernel; 4] = [
        AttentionKernel::Forward,
        AttentionKernel::Preprocess,
        AttentionKernel::Dq,
        AttentionKernel::DkDv,
    ];

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
            AttentionKernel::Preprocess => &backward::attention_bwd_preprocess::SIGNATURE,
            AttentionKernel::Dq => &backward::attention_bwd_dq::SIGNATURE,
            AttentionKernel::DkDv => &backward::attention_bwd_dkdv::SIGNATURE,
        }
    }

    /// Builds the kernel's IR at `spec`.
    pub fn build(self, spec: &Spec) -> kiln_dsl::Result<Kernel> {
        match self {
            AttentionKernel::Forward => forward::attention_fwd::build(spec),
            AttentionKernel::Preprocess => backward::attention_bwd_preprocess::build(spec),
            AttentionKernel::Dq => backward::attention_bwd_dq::build(spec),
            AttentionKernel::DkDv => backward::attention_bwd_dkdv::build(spec),
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
    /// The backward's `[batch, heads_q, seqlen_q]` f32 workspace, `rowsum(dO * O)`.
    Delta,
}

/// One launch argument: a buffer by role, or a scalar.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arg {
    Buffer(Role),
    I32(i32),
    I64(i64),
    F32(f32),
}

/// One kernel launch of an attention call.
#[derive(Clone, Debug, PartialEq)]
pub struct Launch {
    pub kernel: AttentionKernel,
    pub spec: Spec,
    pub grid: [u32; 3],
    pub num_warps: u32,
    pub args: Vec<Arg>,
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

fn strides(layout: Layout) -> [Arg; 3] {
    [
        Arg::I64(layout.batch_stride),
        Arg::I64(layout.seq_stride),
        Arg::I64(layout.head_stride),
    ]
}

fn blocks(n: usize, block: usize) -> u32 {
    n.div_ceil(block) as u32
}

/// The forward pass: one launch of [`AttentionKernel::Forward`].
pub fn forward(p: &AttentionParams, layouts: &ForwardLayouts) -> Result<Launch, AttentionError> {
    let sizes = p.validate()?;
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
    ];
    for layout in [layouts.q, layouts.k, layouts.v, layouts.o] {
        args.extend(strides(layout));
    }
    args.push(Arg::F32(p.softmax_scale));
    Ok(Launch {
        kernel: AttentionKernel::Forward,
        spec: p.spec(AttentionKernel::Forward, sizes),
        grid: [
            blocks(p.seqlen_q, sizes.fwd_block_m),
            (p.batch * p.heads_q) as u32,
            1,
        ],
        num_warps: sizes.num_warps(AttentionKernel::Forward),
        args,
    })
}

/// The backward pass, in order: preprocessing (delta), dQ, dK/dV.
pub fn backward(
    p: &AttentionParams,
    layouts: &BackwardLayouts,
) -> Result<[Launch; 3], AttentionError> {
    let sizes = p.validate()?;
    let mut preprocess_args = vec![
        Arg::Buffer(Role::O),
        Arg::Buffer(Role::DO),
        Arg::Buffer(Role::Delta),
        Arg::I32(p.seqlen_q as i32),
        Arg::I32(p.heads_q as i32),
    ];
    preprocess_args.extend(strides(layouts.o));
    preprocess_args.extend(strides(layouts.d_o));
    let preprocess = Launch {
        kernel: AttentionKernel::Preprocess,
        spec: p.spec(AttentionKernel::Preprocess, sizes),
        grid: [
            blocks(p.seqlen_q, sizes.preprocess_block_m),
            (p.batch * p.heads_q) as u32,
            1,
        ],
        num_warps: sizes.num_warps(AttentionKernel::Preprocess),
        args: preprocess_args,
    };

    let mut dq_args = vec![
        Arg::Buffer(Role::Q),
        Arg::Buffer(Role::K),
        Arg::Buffer(Role::V),
        Arg::Buffer(Role::DO),
        Arg::Buffer(Role::Dq),
        Arg::Buffer(Role::Lse),
        Arg::Buffer(Role::Delta),
        Arg::I32(p.seqlen_q as i32),
        Arg::I32(p.seqlen_k as i32),
        Arg::I32(p.heads_q as i32),
        Arg::I32(p.group() as i32),
    ];
    for layout in [layouts.q, layouts.k, layouts.v, layouts.d_o, layouts.dq] {
        dq_args.extend(strides(layout));
    }
    dq_args.push(Arg::F32(p.softmax_scale));
    let dq = Launch {
        kernel: AttentionKernel::Dq,
        spec: p.spec(AttentionKernel::Dq, sizes),
        grid: [
            blocks(p.seqlen_q, sizes.bwd_block_m),
            (p.batch * p.heads_q) as u32,
            1,
        ],
        num_warps: sizes.num_warps(AttentionKernel::Dq),
        args: dq_args,
    };

    let mut dkdv_args = vec![
        Arg::Buffer(Role::Q),
        Arg::Buffer(Role::K),
        Arg::Buffer(Role::V),
        Arg::Buffer(Role::DO),
        Arg::Buffer(Role::Dk),
        Arg::Buffer(Role::Dv),
        Arg::Buffer(Role::Lse),
        Arg::Buffer(Role::Delta),
        Arg::I32(p.seqlen_q as i32),
        Arg::I32(p.seqlen_k as i32),
        Arg::I32(p.heads_kv as i32),
        Arg::I32(p.group() as i32),
    ];
    for layout in [
        layouts.q,
        layouts.k,
        layouts.v,
        layouts.d_o,
        layouts.dk,
        layouts.dv,
    ] {
        dkdv_args.extend(strides(layout));
    }
    dkdv_args.push(Arg::F32(p.softmax_scale));
    let dkdv = Launch {
        kernel: AttentionKernel::DkDv,
        spec: p.spec(AttentionKernel::DkDv, sizes),
        grid: [
            blocks(p.seqlen_k, sizes.bwd_block_n),
            (p.batch * p.heads_kv) as u32,
            1,
        ],
        num_warps: sizes.num_warps(AttentionKernel::DkDv),
        args: dkdv_args,
    };
    Ok([preprocess, dq, dkdv])
}
