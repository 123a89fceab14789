//! Block sizes and warps of the attention kernels, per head dim: the one table every launch reads.
//!
//! | head dim | forward BLOCK_M x BLOCK_N, warps, stages | backward BLOCK_M x BLOCK_N (dQ and dK/dV), warps dQ / dK/dV, stages dQ / dK/dV |
//! | --- | --- | --- |
//! | 32, 64 | 128 x 64, 4, 2 | 64 x 64, 4 / 8, 2 / 2 |
//! | 128 | 128 x 64, 8, 2 | 64 x 64, 8 / 8, 2 / 2 (1 on sm_80) |
//! | 256 | 64 x 32, 4, 2 | 32 x 32, 4 / 8, 2 / 2 |
//!
//! Forward blocks follow FlashAttention-2's sm_80 choices; head dim 256 halves them to keep a
//! program's tiles in registers. Warps: 8 where 4 warps' registers cannot hold the accumulators
//! without spilling (the forward's 128-row O at head dim 128; dK/dV's two accumulators), else 4,
//! which keeps every warp along M so that dQ's `dS @ K` takes dS from registers; dQ at head dim
//! 128 takes 8 (dS then goes through shared memory) because 4 warps sit at 255 registers and
//! spill once pipelined. Stages are
//! kiln-codegen's `CompileOptions::num_stages` for the kernel's streaming loop (K/V in the
//! forward and dQ, Q/dO in dK/dV): shared buffers per streamed tile, one tile in flight with
//! `cp.async` while the program computes on another (FlashAttention-2's double buffering; the
//! preprocessing kernel has no loop). dK/dV at head dim 128 keeps 1 stage on sm_80 (its Q/dO
//! loads go through registers there): pipelined, its causal variant needs 255 registers and
//! spills 28 bytes for sm_80 (ptxas 13.0; sm_90a fits it without a spill), and the tests allow no
//! spill up to head dim 128. The performance issue retunes these per architecture.

use super::plan::AttentionKernel;

/// Head dims the attention kernels are built for; any other is refused.
pub const HEAD_DIMS: [usize; 4] = [32, 64, 128, 256];

/// Block sizes for one head dim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub fwd_block_m: usize,
    pub fwd_block_n: usize,
    pub bwd_block_m: usize,
    pub bwd_block_n: usize,
    /// Rows per program of the backward preprocessing kernel.
    pub preprocess_block_m: usize,
    pub fwd_num_warps: u32,
    pub preprocess_num_warps: u32,
    pub dq_num_warps: u32,
    pub dkdv_num_warps: u32,
    /// Pipeline stages (kiln-codegen's `num_stages`) of the forward, dQ and dK/dV kernels.
    pub fwd_num_stages: u32,
    pub dq_num_stages: u32,
    pub dkdv_num_stages: u32,
    /// dK/dV's stages when compiled for sm_80, whose register allocation differs.
    pub dkdv_num_stages_sm80: u32,
}

impl BlockSizes {
    /// Warps per program of `kernel`.
    pub fn num_warps(&self, kernel: AttentionKernel) -> u32 {
        match kernel {
            AttentionKernel::Forward => self.fwd_num_warps,
            AttentionKernel::Preprocess => self.preprocess_num_warps,
            AttentionKernel::Dq => self.dq_num_warps,
            AttentionKernel::DkDv => self.dkdv_num_warps,
        }
    }

    /// Pipeline stages of `kernel` compiled for `target` (`sm_80` or `sm_90a`); 1 for the
    /// preprocessing kernel, which has no streaming loop.
    pub fn num_stages(&self, kernel: AttentionKernel, target: &str) -> u32 {
        match kernel {
            AttentionKernel::Forward => self.fwd_num_stages,
            AttentionKernel::Dq => self.dq_num_stages,
            AttentionKernel::DkDv if target == "sm_80" => self.dkdv_num_stages_sm80,
            AttentionKernel::DkDv => self.dkdv_num_stages,
            AttentionKernel::Preprocess => 1,
        }
    }
}

/// The block sizes for `head_dim`, or `None` if kiln has no attention kernel for it.
pub fn block_sizes(head_dim: usize) -> Option<BlockSizes> {
    match head_dim {
        32 | 64 | 128 => Some(BlockSizes {
            fwd_block_m: 128,
            fwd_block_n: 64,
            bwd_block_m: 64,
            bwd_block_n: 64,
            preprocess_block_m: 64,
            fwd_num_warps: if head_dim == 128 { 8 } else { 4 },
            preprocess_num_warps: 4,
            dq_num_warps: if head_dim == 128 { 8 } else { 4 },
            dkdv_num_warps: 8,
            fwd_num_stages: 2,
            dq_num_stages: 2,
            dkdv_num_stages: 2,
            dkdv_num_stages_sm80: if head_dim == 128 { 1 } else { 2 },
        }),
        256 => Some(BlockSizes {
            fwd_block_m: 64,
            fwd_block_n: 32,
            bwd_block_m: 32,
            bwd_block_n: 32,
            preprocess_block_m: 64,
            fwd_num_warps: 4,
            preprocess_num_warps: 4,
            dq_num_warps: 4,
            dkdv_num_warps: 8,
            fwd_num_stages: 2,
            dq_num_stages: 2,
            dkdv_num_stages: 2,
            dkdv_num_stages_sm80: 2,
        }),
        _ => None,
    }
}

/// Every block size the attention kernels use, for tests that step just below and above each.
pub fn all_block_sizes() -> Vec<usize> {
    let mut sizes: Vec<usize> = HEAD_DIMS
        .iter()
        .filter_map(|&d| block_sizes(d))
        .flat_map(|b| {
            [
                b.fwd_block_m,
                b.fwd_block_n,
                b.bwd_block_m,
                b.bwd_block_n,
                b.preprocess_block_m,
            ]
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}
