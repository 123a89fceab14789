//! Every kernel kiln-kernels defines, by name, with a default specialisation: what the `kiln`
//! CLI lists and compiles. The defaults are f16 (f32 bias for the GEMM), attention at head dim 64,
//! and block sizes the launchers would pick.

use kiln_dsl::{DType, Kernel, KernelSignature, Spec, Target};

use crate::attention::{AttentionKernel, AttentionParams, KeyLength, backward, config, forward};
use crate::general::{gemm, layernorm, reduce, softmax, transpose};

/// One kernel: its signature, its builder and the spec the CLI starts from when given none.
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
        fused_backward: false,
    }
}

/// `kernel`'s spec for the default call, at sm_90a's block sizes.
fn attention_spec(kernel: AttentionKernel) -> Spec {
    let config =
        config(64, true, false, Target::Sm90a, KeyLength::Medium).expect("head dim 64 has kernels");
    default_attention().spec(kernel, config.kernel(kernel))
}

/// A `T = f16` spec with the given block sizes.
fn f16_blocks(block_m: i64, block_n: i64) -> Spec {
    Spec::new()
        .dtype("T", DType::F16)
        .int("BLOCK_M", block_m)
        .int("BLOCK_N", block_n)
}

/// Every kernel: attention in pipeline order, then the general kernels.
pub fn kernels() -> Vec<KernelEntry> {
    vec![
        KernelEntry {
            signature: &forward::attention_fwd::SIGNATURE,
            build: forward::attention_fwd::build,
            default_spec: || attention_spec(AttentionKernel::Forward),
        },
        KernelEntry {
            signature: &forward::attention_fwd_combine::SIGNATURE,
            build: forward::attention_fwd_combine::build,
            default_spec: || attention_spec(AttentionKernel::Combine),
        },
        KernelEntry {
            signature: &backward::attention_bwd_preprocess::SIGNATURE,
            build: backward::attention_bwd_preprocess::build,
            default_spec: || attention_spec(AttentionKernel::Preprocess),
        },
        KernelEntry {
            signature: &backward::attention_bwd_dq::SIGNATURE,
            build: backward::attention_bwd_dq::build,
            default_spec: || attention_spec(AttentionKernel::Dq),
        },
        KernelEntry {
            signature: &backward::attention_bwd_dkdv::SIGNATURE,
            build: backward::attention_bwd_dkdv::build,
            default_spec: || attention_spec(AttentionKernel::DkDv),
        },
        KernelEntry {
            signature: &backward::attention_bwd_dq_convert::SIGNATURE,
            build: backward::attention_bwd_dq_convert::build,
            default_spec: || attention_spec(AttentionKernel::DqConvert),
        },
        KernelEntry {
            signature: &gemm::gemm_bias_gelu::SIGNATURE,
            build: gemm::gemm_bias_gelu::build,
            default_spec: || f16_blocks(64, 64).dtype("B", DType::F32).int("BLOCK_K", 32),
        },
        KernelEntry {
            signature: &softmax::softmax_rows::SIGNATURE,
            build: softmax::softmax_rows::build,
            default_spec: || f16_blocks(4, 1024),
        },
        KernelEntry {
            signature: &layernorm::layernorm::SIGNATURE,
            build: layernorm::layernorm::build,
            default_spec: || f16_blocks(16, 64),
        },
        KernelEntry {
            signature: &reduce::column_sums::SIGNATURE,
            build: reduce::column_sums::build,
            default_spec: || f16_blocks(32, 64),
        },
        KernelEntry {
            signature: &transpose::transpose::SIGNATURE,
            build: transpose::transpose::build,
            default_spec: || f16_blocks(32, 64),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_builds_at_its_default_spec() {
        for kernel in kernels() {
            if let Err(e) = (kernel.build)(&(kernel.default_spec)()) {
                panic!("{} does not build at its default spec: {e}", kernel.name());
            }
        }
    }

    #[test]
    fn an_unknown_kernel_lists_the_kernels() {
        let err = find("attention").unwrap_err();
        assert!(
            err.starts_with("no kernel `attention`; kernels: attention_fwd, "),
            "{err}"
        );
    }
}
