//! Every kernel kiln-kernels defines, by name, with a default specialisation: what `kiln list`
//! and `kiln ir` read.

use kiln_dsl::{DType, Kernel, KernelSignature, Spec};

use crate::attention::{AttentionParams, backward, block_sizes, forward};

/// One kernel: its signature, its builder and the spec `kiln ir` uses when given none.
#[derive(Clone, Copy, Debug)]
pub struct KernelEntry {
    pub signature: &'static KernelSignature,
    pub build: fn(&Spec) -> kiln_dsl::Result<Kernel>,
    pub default_spec: fn() -> Spec,
}

impl KernelEntry {
    pub fn name(&self) -> &'static str {
        self.signature.name
    }
}

/// The attention call the default specs describe: f16, head dim 64, causal.
fn default_attention() -> AttentionParams {
    AttentionParams {
        dtype: DType::F16,
        batch: 1,
        seqlen_q: 1,
        seqlen_k: 1,
        heads_q: 1,
        heads_kv: 1,
        head_dim: 64,
        causal: true,
        softmax_scale: 0.125,
    }
}

fn default_blocks() -> crate::attention::BlockSizes {
    block_sizes(64).expect("head dim 64 has kernels")
}

/// Every kernel, in pipeline order.
pub fn kernels() -> Vec<KernelEntry> {
    vec![
        KernelEntry {
            signature: &forward::attention_fwd::SIGNATURE,
            build: forward::attention_fwd::build,
            default_spec: || default_attention().forward_spec(default_blocks()),
        },
        KernelEntry {
            signature: &backward::attention_bwd_preprocess::SIGNATURE,
            build: backward::attention_bwd_preprocess::build,
            default_spec: || default_attention().preprocess_spec(default_blocks()),
        },
        KernelEntry {
            signature: &backward::attention_bwd_dq::SIGNATURE,
            build: backward::attention_bwd_dq::build,
            default_spec: || default_attention().backward_spec(default_blocks()),
        },
        KernelEntry {
            signature: &backward::attention_bwd_dkdv::SIGNATURE,
            build: backward::attention_bwd_dkdv::build,
            default_spec: || default_attention().backward_spec(default_blocks()),
        },
    ]
}

/// The kernel called `name`, or an error listing the kernels that exist.
pub fn find(name: &str) -> Result<KernelEntry, String> {
    let all = kernels();
    all.iter()
        .find(|k| k.name() == name)
        .copied()
        .ok_or_else(|| {
            let names: Vec<_> = all.iter().map(|k| k.name()).collect();
            format!("no kernel `{name}`; kernels: {}", names.join(", "))
        })
}
