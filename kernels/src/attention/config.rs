//! How each attention kernel is specialised, per target and head dim: block sizes, warps and
//! pipeline stages. The one table every launch, every shipped PTX and every test reads.
//!
//! Each entry is `BLOCK_M x BLOCK_N, warps, stages`. BLOCK_M counts query rows and BLOCK_N key
//! rows in every kernel: the forward and dQ hold BLOCK_M query rows per program and stream K/V
//! in BLOCK_N-row tiles; dK/dV holds BLOCK_N key rows and streams Q/dO in BLOCK_M-row tiles; the
//! preprocessing kernel has only BLOCK_M.
//!
//! | target | head dim | forward | preprocess | dQ | dK/dV |
//! | --- | --- | --- | --- | --- | --- |
//! | both | 32, 64 | 128 x 64, 4, 2 | 64, 4 | 64 x 64, 4, 2 | 64 x 64, 8, 2 |
//! | sm_90a | 128 | 64 x 64, 4, 3 (2 causal) | 64, 4 | 64 x 64, 8, 2 | 64 x 64, 8, 2 |
//! | sm_80 | 128 | 64 x 64, 4, 3 (2 causal) | 64, 4 | 64 x 64, 8, 2 | 32 x 64, 8, 2 |
//! | both | 256 | 64 x 32, 4, 2 | 64, 4 | 32 x 32, 4, 2 | 32 x 32, 8, 2 |
//!
//! Forward blocks follow FlashAttention-2's sm_80 choices at head dims 32 and 64; head dim 256
//! halves them to keep a program's tiles in registers. At head dim 128 a 128-row block needs 8
//! warps (with 4, 32 query rows per warp, ptxas spills 1.5 KB where FlashAttention-2 fits the same
//! tile in 255 registers: where kiln's extra live registers come from is not yet measured), and one
//! 8-warp block per SM stalls all its warps at each barrier; 64-row blocks of 4 warps run two
//! blocks per SM (255 registers, 80 KB of shared memory each) and measured 6-14% faster on an
//! H200 (docs/PERF.md). Warps elsewhere: 8 where 4 warps' registers cannot hold the
//! accumulators without spilling (dK/dV's two), else 4, which keeps every warp along M so that
//! dQ's `dS @ K` takes dS from registers; dQ at head dim 128 takes 8 (dS then goes through shared
//! memory) because 4 warps sit at 255 registers and spill once pipelined. Stages are kiln-codegen's `CompileOptions::num_stages` for the
//! kernel's streaming loop: shared buffers per streamed tile, one tile in flight with
//! `cp.async` while the program computes on another (FlashAttention-2's double buffering).
//!
//! The targets differ at one entry: ptxas allocates registers differently for sm_80, where dK/dV
//! at head dim 128 with 64-row Q/dO tiles spills 28 bytes once pipelined (sm_90a fits it in 255
//! registers), so sm_80 streams 32-row tiles (237 registers, no spill). Halving the key block
//! instead was measured and rejected (docs/PERF.md, 2026-11-22: it costs a quarter of the
//! backward because every program then streams all of Q/dO for half the work).

use kiln_dsl::Target;

use super::plan::AttentionKernel;

/// Head dims the attention kernels are built for; any other is refused.
pub const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];

/// How one kernel is specialised and launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelConfig {
    /// Query rows per program (forward, preprocess, dQ) or per streamed tile (dK/dV).
    pub block_m: usize,
    /// Key rows per streamed tile (forward, dQ) or per program (dK/dV); `None` for the
    /// preprocessing kernel, which reads no keys.
    pub block_n: Option<usize>,
    pub num_warps: u32,
    /// kiln-codegen's `num_stages` for the kernel's streaming loop; 1 for the preprocessing
    /// kernel, which has none.
    pub num_stages: u32,
}

impl KernelConfig {
    const fn new(block_m: usize, block_n: usize, num_warps: u32, num_stages: u32) -> KernelConfig {
        KernelConfig {
            block_m,
            block_n: Some(block_n),
            num_warps,
            num_stages,
        }
    }
}

/// The four kernels' configurations for one target and head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionConfig {
    pub forward: KernelConfig,
    pub preprocess: KernelConfig,
    pub dq: KernelConfig,
    pub dkdv: KernelConfig,
}

impl AttentionConfig {
    pub fn kernel(&self, kernel: AttentionKernel) -> KernelConfig {
        match kernel {
            AttentionKernel::Forward => self.forward,
            AttentionKernel::Preprocess => self.preprocess,
            AttentionKernel::Dq => self.dq,
            AttentionKernel::DkDv => self.dkdv,
        }
    }
}

/// The configuration for `head_dim`, causal or not, on `target`, or `None` if kiln has no
/// attention kernel for that head dim.
pub fn config(head_dim: usize, causal: bool, target: Target) -> Option<AttentionConfig> {
    let preprocess = KernelConfig {
        block_m: 64,
        block_n: None,
        num_warps: 4,
        num_stages: 1,
    };
    match head_dim {
        32 | 64 => Some(AttentionConfig {
            forward: KernelConfig::new(128, 64, 4, 2),
            preprocess,
            dq: KernelConfig::new(64, 64, 4, 2),
            dkdv: KernelConfig::new(64, 64, 8, 2),
        }),
        128 => Some(AttentionConfig {
            // A third stage helps the full loop (+2.7% at 4k) and hurts the causal one's short
            // loops (-1.6%): docs/PERF.md.
            forward: KernelConfig::new(64, 64, 4, if causal { 2 } else { 3 }),
            preprocess,
            dq: KernelConfig::new(64, 64, 8, 2),
            dkdv: match target {
                Target::Sm80 => KernelConfig::new(32, 64, 8, 2),
                Target::Sm90a => KernelConfig::new(64, 64, 8, 2),
            },
        }),
        256 => Some(AttentionConfig {
            forward: KernelConfig::new(64, 32, 4, 2),
            preprocess,
            dq: KernelConfig::new(32, 32, 4, 2),
            dkdv: KernelConfig::new(32, 32, 8, 2),
        }),
        _ => None,
    }
}

/// Every block size the attention kernels use, for tests that step just below and above each.
pub fn all_block_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = Target::ALL
        .into_iter()
        .flat_map(|target| {
            HEAD_DIMS
                .iter()
                .flat_map(move |&d| [false, true].map(|causal| config(d, causal, target)))
        })
        .flatten()
        .flat_map(|c| AttentionKernel::ALL.map(|k| c.kernel(k)))
        .flat_map(|k| [Some(k.block_m), k.block_n])
        .flatten()
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_head_dim_has_a_configuration_on_every_target() {
        for target in Target::ALL {
            for head_dim in HEAD_DIMS {
                let c = config(head_dim, false, target).expect("a configuration");
                assert_eq!(c.preprocess.block_n, None);
                for kernel in [
                    AttentionKernel::Forward,
                    AttentionKernel::Dq,
                    AttentionKernel::DkDv,
                ] {
                    assert!(
                        c.kernel(kernel).block_n.is_some(),
                        "{kernel:?} at {head_dim}"
                    );
                }
            }
        }
        assert_eq!(config(96, false, Target::Sm80), None);
    }
}
