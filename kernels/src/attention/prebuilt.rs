//! The attention kernels' PTX as kiln ships it: every specialisation a call can need, compiled
//! from the DSL by kiln-codegen and kept in `kernels/ptx/` (one file per specialisation, named by
//! [`plan::specialisation_name`]), so that linking kiln-kernels needs no LLVM. kiln-codegen's
//! tests compile every entry of [`shipped`] again and fail if a file differs from what the DSL
//! gives today (`KILN_BLESS=1 cargo test -p kiln-codegen` rewrites them).

use kiln_dsl::{DType, Spec, Target};

use super::plan::{self, AttentionKernel};
use super::{AttentionParams, HEAD_DIMS, KernelConfig, KeyLength, Layout};

#[path = "../../ptx/mod.rs"]
mod table;

/// The dtypes the prebuilt kernels are compiled for.
pub const DTYPES: [DType; 2] = [DType::F16, DType::BF16];

/// One shipped specialisation: how it is built and compiled.
#[derive(Clone, Debug, PartialEq)]
pub struct Specialisation {
    /// [`plan::specialisation_name`], also its PTX file's stem.
    pub name: String,
    pub kernel: AttentionKernel,
    pub target: Target,
    pub config: KernelConfig,
    pub spec: Spec,
}

/// Every specialisation kiln ships: for each dtype, head dim and target, the forward (in each of
/// its blocks by sequence length, [`plan::signed_forward`] where there is one, in the decode
/// blocks, and split over the keys with its combine: [`plan::forward_split`]) and both
/// backwards' kernels, masked and
/// not where they read keys (the combine and the fused backward's preprocessing and dQ
/// conversion kernels do not).
pub fn shipped() -> Vec<Specialisation> {
    let mut all: Vec<Specialisation> = Vec::new();
    for target in Target::ALL {
        for dtype in DTYPES {
            for head_dim in HEAD_DIMS {
                for causal in [false, true] {
                    for fused_backward in [false, true] {
                        for keys in KeyLength::ALL {
                            let seqlen = keys.example_seqlen(causal);
                            let p = AttentionParams {
                                dtype,
                                batch: 1,
                                seqlen_q: seqlen,
                                seqlen_k: seqlen,
                                heads_q: 1,
                                heads_kv: 1,
                                head_dim,
                                causal,
                                softmax_scale: 1.0,
                                fused_backward,
                            };
                            let config = p.config(target).expect("a shipped head dim");
                            let mut kernels = AttentionKernel::backward(fused_backward).to_vec();
                            if !fused_backward {
                                kernels.insert(0, AttentionKernel::Forward);
                            }
                            // The forward a negative scale runs where the long range's entry
                            // is persistent.
                            let signed = plan::signed_forward(&p, target)
                                .filter(|_| !fused_backward)
                                .map(|(config, name)| {
                                    let spec = p.spec(AttentionKernel::Forward, config);
                                    (AttentionKernel::Forward, config, name, spec)
                                });
                            // The forward split over the keys, and its combine, in its
                            // blocks for many query rows and for a decode step's; and a
                            // decode step's forward unsplit (a batch of them fills the GPU).
                            let split = if fused_backward {
                                Vec::new()
                            } else {
                                let layout = Layout::contiguous(seqlen, 1, head_dim);
                                let layouts = plan::ForwardLayouts {
                                    q: layout,
                                    k: layout,
                                    v: layout,
                                    o: layout,
                                };
                                let decode = AttentionParams { seqlen_q: 1, ..p };
                                let unsplit = plan::forward(&decode, &layouts, target)
                                    .expect("a shipped head dim");
                                [p, decode]
                                    .iter()
                                    .flat_map(|p| {
                                        plan::forward_split(p, &layouts, target, 2)
                                            .expect("a shipped head dim")
                                    })
                                    .chain([unsplit])
                                    .map(|l| (l.kernel, l.config, l.name, l.spec))
                                    .collect()
                            };
                            let planned = kernels
                                .into_iter()
                                .filter(|kernel| !causal || kernel.reads_keys())
                                .map(|kernel| {
                                    let name = plan::specialisation_name(kernel, &p, target);
                                    let config = config.kernel(kernel);
                                    (kernel, config, name, p.spec(kernel, config))
                                });
                            for (kernel, config, name, spec) in planned.chain(signed).chain(split) {
                                // Most kernels are the same at every sequence length: one name,
                                // one specialisation.
                                if let Some(same) = all.iter().find(|s| s.name == name) {
                                    debug_assert_eq!(same.spec, spec, "{name}");
                                    continue;
                                }
                                all.push(Specialisation {
                                    name,
                                    kernel,
                                    target,
                                    config,
                                    spec,
                                });
                            }
                        }
                    }
                }
            }
        }
    }
    all
}

/// The shipped PTX of one specialisation, with the dynamic shared memory a launch gives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ptx {
    pub text: &'static str,
    pub shared_bytes: u32,
}

/// The shipped PTX of the specialisation called `name`, if kiln ships it.
pub fn ptx(name: &str) -> Option<Ptx> {
    // The generated table is sorted by name.
    let i = table::PTX
        .binary_search_by(|(n, _, _)| (*n).cmp(name))
        .ok()?;
    let (_, text, shared_bytes) = table::PTX[i];
    Some(Ptx { text, shared_bytes })
}

/// Every shipped PTX with its specialisation's name, sorted by name.
pub fn all() -> impl Iterator<Item = (&'static str, Ptx)> {
    table::PTX
        .iter()
        .map(|&(name, text, shared_bytes)| (name, Ptx { text, shared_bytes }))
}

/// What the prebuilt kernels were compiled assuming of their arguments (kiln-codegen's
/// divisibility): every pointer 16-byte aligned and every stride a multiple of 8 elements, as the
/// C interface requires of its callers and every launcher checks. It lets 16-byte vectors move
/// each row.
pub fn divisibility(kernel: AttentionKernel) -> Vec<(&'static str, u64)> {
    kernel
        .signature()
        .args
        .iter()
        .filter_map(|arg| match arg.ty {
            kiln_dsl::ArgType::Ptr(_) => Some((arg.name, 16)),
            _ if arg.name.ends_with("_stride") => Some((arg.name, 8)),
            _ => None,
        })
        .collect()
}
