//! Checking the attention kernels against the f64 reference: strided tensors with poisoned
//! padding, one forward + backward run on fresh random inputs, and the per-dtype error bars.
//! The test suite and `kiln demo` both run through here.

use kiln_dsl::{DType, HostBuffer, Target};

use super::cpu::{self, BackwardOutputs};
use super::{AttentionError, AttentionParams, Layout, Tensor};
use crate::reference::{self, AttentionReference, Rng, row_error, row_error_conditioned};

/// How far from the f64 reference each output may be, in units of the dtype's unit roundoff u
/// (f16: 2^-11 = 4.9e-4, bf16: 2^-8 = 3.9e-3).
///
/// The kernels round what the GPU rounds: P to the input dtype before `P @ V`, dS before `dS @ K`
/// and `dS^T @ Q`, delta from the rounded O, and every output to its dtype. Each product term thus
/// carries a relative error of about u, and:
/// - O has no cancellation (P >= 0, sums to 1): its worst row is within about u (seen: 0.9u).
/// - A gradient is a sum of signed terms that largely cancel (the dS of a row sum to 0), so its
///   error is a few u of its *terms*, more of the result. Measured against the size of its terms
///   (`reference::row_error_conditioned`, each row against its own, a weight's subnormal rounding
///   counted in) it stays within about 2u (seen: 2.1u, in rows of few terms, which a rounding of
///   dS and one of the output bound by 2u); measured as a plain
///   relative error it reaches 10u at ordinary scores (|s| ~ 1) and more when the softmax is nearly
///   one-hot (|s| ~ 100), where only the conditioned measure is meaningful.
/// - LSE is computed in f32 from scores the tensor cores sum in their own order and precision:
///   within f32 rounding of the scores' terms, `|scale| * sum |q_x k_x|`, whatever LSE's own
///   size. It is measured against max(1, |lse|, the row's largest such sum): against |lse| alone
///   a row whose scores are large (inputs x10) but whose LSE is near 0 reached 3.4e-5 (bf16,
///   97 x 70, head dim 128, causal; docs/PERF.md, 2026-11-25, fifth session). The bar for 16-bit
///   inputs is 3e-5.
///
/// Each bar is about 3x the worst error seen over many runs of the test shapes. f32 runs
/// (interpreter only) differ from f64 only in summation order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// O's worst-row relative error.
    pub o: f64,
    /// dQ, dK and dV's worst-row relative error, at ordinary scores.
    pub grad: f64,
    /// dQ, dK and dV's worst-row error against the size of their terms, at any scores.
    pub grad_terms: f64,
    /// LSE's absolute error relative to max(1, |lse|, its scores' terms).
    pub lse: f64,
}

impl Tolerance {
    pub fn for_dtype(dtype: DType) -> Tolerance {
        let u = match dtype {
            DType::F16 | DType::BF16 => reference::unit_roundoff(dtype),
            _ => {
                return Tolerance {
                    o: 5e-6,
                    grad: 1e-5,
                    grad_terms: 1e-6,
                    lse: 1e-6,
                };
            }
        };
        Tolerance {
            o: 3.0 * u,
            grad: 25.0 * u,
            grad_terms: 3.0 * u,
            lse: 3e-5,
        }
    }
}

/// Where a `[batch, seqlen, heads, head_dim]` tensor's elements live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutKind {
    Packed,
    /// Strides larger than the sizes: padded heads, rows and batches.
    Padded,
    /// `[batch, heads, seqlen, head_dim]` in memory (PyTorch's transposed view).
    HeadsMajor,
}

impl LayoutKind {
    pub fn layout(self, seqlen: usize, heads: usize, head_dim: usize) -> Layout {
        match self {
            LayoutKind::Packed => Layout::contiguous(seqlen, heads, head_dim),
            LayoutKind::Padded => {
                let head_stride = (head_dim + 8) as i64;
                let seq_stride = heads as i64 * head_stride + 16;
                Layout {
                    batch_stride: seqlen as i64 * seq_stride + 24,
                    seq_stride,
                    head_stride,
                }
            }
            LayoutKind::HeadsMajor => Layout {
                batch_stride: (heads * seqlen * head_dim) as i64,
                seq_stride: head_dim as i64,
                head_stride: (seqlen * head_dim) as i64,
            },
        }
    }
}

/// A `[batch, seqlen, heads, head_dim]` tensor in a host buffer whose elements outside the tensor
/// (stride padding) hold NaN: a kernel that reads them poisons its output, and one that writes
/// them is caught by [`StridedTensor::padding_untouched`].
#[derive(Debug)]
pub struct StridedTensor {
    pub buffer: HostBuffer,
    pub layout: Layout,
    pub dims: [usize; 4],
}

impl StridedTensor {
    /// Every element index the tensor addresses, in dense `[b, s, h, d]` order.
    pub fn indices(layout: Layout, dims: [usize; 4]) -> Vec<usize> {
        let [b, s, h, d] = dims;
        let mut out = Vec::with_capacity(b * s * h * d);
        for bi in 0..b as i64 {
            for si in 0..s as i64 {
                for hi in 0..h as i64 {
                    let base =
                        bi * layout.batch_stride + si * layout.seq_stride + hi * layout.head_stride;
                    out.extend((0..d).map(|x| base as usize + x));
                }
            }
        }
        out
    }

    fn buffer_len(layout: Layout, dims: [usize; 4]) -> usize {
        Self::indices(layout, dims)
            .into_iter()
            .max()
            .map_or(0, |m| m + 1)
    }

    /// A tensor holding `dense` (rounded to `dtype`), its padding poisoned.
    pub fn from_dense(
        dtype: DType,
        layout: Layout,
        dims: [usize; 4],
        dense: &[f64],
    ) -> StridedTensor {
        let buffer = HostBuffer::poisoned(dtype, Self::buffer_len(layout, dims));
        for (&i, &v) in Self::indices(layout, dims).iter().zip(dense) {
            buffer.write_float(i, v as f32);
        }
        StridedTensor {
            buffer,
            layout,
            dims,
        }
    }

    /// An output tensor: every element poisoned.
    pub fn poisoned(dtype: DType, layout: Layout, dims: [usize; 4]) -> StridedTensor {
        StridedTensor {
            buffer: HostBuffer::poisoned(dtype, Self::buffer_len(layout, dims)),
            layout,
            dims,
        }
    }

    /// The tensor's elements in dense `[b, s, h, d]` order, widened to f64.
    pub fn to_dense(&self) -> Vec<f64> {
        Self::indices(self.layout, self.dims)
            .into_iter()
            .map(|i| self.buffer.read_float(i) as f64)
            .collect()
    }

    /// Whether every element outside the tensor still holds its poison.
    pub fn padding_untouched(&self) -> bool {
        let mut inside = vec![false; self.buffer.len()];
        for i in Self::indices(self.layout, self.dims) {
            inside[i] = true;
        }
        (0..self.buffer.len()).all(|i| inside[i] || self.buffer.read_float(i).is_nan())
    }

    pub fn as_tensor(&self) -> Tensor<'_> {
        Tensor::new(&self.buffer, self.layout)
    }
}

/// Worst-row errors of one run, and whatever the run left unwritten or wrote out of place.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Report {
    pub o: f64,
    pub lse: f64,
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    /// dQ, dK and dV errors measured against the size of their terms.
    pub conditioned: [f64; 3],
    /// Whether the inputs made |s| ~ 100 (only the conditioned gradient errors are judged then).
    pub large_scores: bool,
    /// Problems that are wrong whatever the tolerance: unwritten elements, writes into padding,
    /// LSE -inf where the reference has none (or the other way round).
    pub faults: Vec<String>,
}

impl Report {
    /// The outputs over their bars, as lines.
    pub fn failures(&self, tolerance: Tolerance) -> Vec<String> {
        let mut out = self.faults.clone();
        let [dq_terms, dk_terms, dv_terms] = self.conditioned;
        let grad = if self.large_scores {
            f64::INFINITY
        } else {
            tolerance.grad
        };
        for (name, err, bar) in [
            ("o", self.o, tolerance.o),
            ("lse", self.lse, tolerance.lse),
            ("dq", self.dq, grad),
            ("dk", self.dk, grad),
            ("dv", self.dv, grad),
            ("dq against its terms", dq_terms, tolerance.grad_terms),
            ("dk against its terms", dk_terms, tolerance.grad_terms),
            ("dv against its terms", dv_terms, tolerance.grad_terms),
        ] {
            // A NaN error fails too.
            if err.is_nan() || err > bar {
                out.push(format!("{name} error {err:.3e} > {bar:.1e}"));
            }
        }
        out
    }
}

/// How a case draws its inputs: q, k, v and dO standard normal but for these.
#[derive(Clone, Copy, Debug)]
pub struct Draw {
    /// Standard deviation of q and k: 1 gives |s| ~ 1, 10 gives |s| ~ 100.
    pub input_scale: f64,
    /// Key row `j` of `n` is scaled by `1 + key_ramp * j / (n - 1)`: later key blocks' scores
    /// rise past the row maxes of the blocks before, so that the online softmax rescales what
    /// it has summed at nearly every block (with plain inputs the max settles within a few).
    pub key_ramp: f64,
}

impl Draw {
    pub const PLAIN: Draw = Draw {
        input_scale: 1.0,
        key_ramp: 0.0,
    };

    /// Whether scores are large enough (|s| ~ 100) that errors are judged against the
    /// problem's conditioning ([`Outputs::compare`]).
    pub fn conditioned(&self) -> bool {
        self.input_scale > 1.0
    }
}

/// Nothing for plain inputs; else what differs, after a comma.
impl std::fmt::Display for Draw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.input_scale != 1.0 {
            write!(f, ", q and k x{}", self.input_scale)?;
        }
        if self.key_ramp != 0.0 {
            write!(f, ", keys ramped to x{}", 1.0 + self.key_ramp)?;
        }
        Ok(())
    }
}

/// One case of the designed shape set.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub params: AttentionParams,
    pub draw: Draw,
    pub layout: LayoutKind,
    /// How many ways the forward splits each query block's keys (1: not split), on the
    /// interpreter and the GPU alike ([`super::plan::forward_split`]).
    pub splits: usize,
}

fn case(
    dtype: DType,
    batch: usize,
    sq: usize,
    sk: usize,
    hq: usize,
    hkv: usize,
    d: usize,
    causal: bool,
) -> Case {
    Case {
        params: AttentionParams {
            dtype,
            batch,
            seqlen_q: sq,
            seqlen_k: sk,
            heads_q: hq,
            heads_kv: hkv,
            head_dim: d,
            causal,
            softmax_scale: AttentionParams::default_scale(d),
            fused_backward: false,
        },
        draw: Draw::PLAIN,
        layout: LayoutKind::Packed,
        splits: 1,
    }
}

/// The designed shape set (not a cross product): each line adds something the others lack.
/// The interpreter tests run all of it against f64; the GPU check all but the f32 cases (the
/// kernels are compiled for f16 and bf16 only) against the interpreter.
pub fn designed_cases() -> Vec<Case> {
    use DType::{BF16, F16, F32};
    let mut cases = vec![
        case(F16, 1, 1, 1, 1, 1, 32, false),
        case(BF16, 1, 1, 1, 1, 1, 64, true),
        case(F16, 3, 31, 31, 2, 2, 32, true),
        case(BF16, 1, 33, 33, 4, 1, 64, false),
        case(F16, 1, 63, 65, 4, 4, 128, true),
        case(BF16, 2, 65, 63, 8, 2, 64, true),
        case(F16, 1, 127, 129, 8, 1, 32, false),
        case(BF16, 1, 129, 127, 2, 1, 256, true),
        case(F16, 1, 31, 33, 2, 1, 256, false),
        case(BF16, 3, 33, 31, 4, 4, 256, false),
        case(F16, 1, 1000, 1000, 1, 1, 64, true),
        case(BF16, 1, 1000, 1000, 2, 1, 128, false),
        case(F16, 1, 1, 1000, 2, 1, 64, true),
        case(BF16, 1, 1000, 1, 1, 1, 32, true),
        case(F16, 2, 100, 300, 4, 1, 64, true),
        case(BF16, 2, 300, 100, 8, 1, 128, true),
        case(F16, 1, 300, 100, 4, 4, 32, false),
        case(BF16, 1, 100, 300, 4, 2, 32, false),
        case(F16, 3, 129, 129, 8, 8, 128, false),
        case(BF16, 1, 64, 64, 4, 1, 128, true),
        case(F16, 1, 128, 128, 2, 2, 256, true),
        // Key lengths a multiple of every block: the masked loop of the overlapped forward runs
        // no iteration, its last block's P @ V after the loops.
        case(F16, 1, 256, 256, 2, 1, 128, false),
        case(BF16, 1, 256, 256, 2, 1, 32, false),
        // Causal past 512 keys a row on average: D128's table blocks, not its short ones.
        case(BF16, 1, 1100, 1100, 2, 1, 128, true),
        // Around 256 query rows: several 64- and 128-row blocks, one partial.
        case(BF16, 1, 255, 257, 2, 1, 64, false),
        case(F16, 2, 257, 255, 2, 2, 64, false),
        case(F32, 1, 77, 91, 4, 1, 64, true),
        case(F32, 2, 65, 33, 2, 2, 32, false),
    ];
    // Scores of |s| ~ 100: exp2 of them overflows f32 unless the row max is subtracted first.
    for (dtype, causal, d) in [
        (F16, false, 64),
        (BF16, true, 128),
        (F16, true, 32),
        (BF16, false, 256),
    ] {
        let mut c = case(dtype, 1, 97, 70, 4, 2, d, causal);
        c.draw.input_scale = 10.0;
        cases.push(c);
    }
    // Keys growing along the sequence, over several key blocks: every block's row max rises
    // past the last, so every block rescales the accumulator and the sum.
    for (dtype, causal, d) in [(BF16, false, 128), (F16, true, 64)] {
        let mut c = case(dtype, 1, 300, 1000, 2, 1, d, causal);
        c.draw.key_ramp = 3.0;
        cases.push(c);
    }
    // Strided layouts and other softmax scales, zero and negative ones too (the C interface takes
    // any finite scale): the kernels must not scale a masked -inf into NaN or +inf.
    for (dtype, layout, causal, scale) in [
        (F16, LayoutKind::Padded, true, 0.3),
        (BF16, LayoutKind::HeadsMajor, false, 1.0),
        (F16, LayoutKind::HeadsMajor, true, 0.125),
        (BF16, LayoutKind::Padded, false, 0.05),
        (F16, LayoutKind::Packed, true, -0.2),
        (BF16, LayoutKind::Padded, false, -0.7),
        (BF16, LayoutKind::Padded, true, 0.0),
        (F16, LayoutKind::HeadsMajor, false, 0.0),
    ] {
        let mut c = case(dtype, 2, 70, 45, 4, 2, 64, causal);
        c.layout = layout;
        c.params.softmax_scale = scale;
        cases.push(c);
    }
    // D128 without a mask: the table's forward is persistent, which takes a scale >= 0 (a
    // negative one runs the long range's entry), over blocks of two heads (D64's, persistent
    // too, by the strided cases above).
    for scale in [-0.3, 0.0, 0.2] {
        let mut c = case(BF16, 1, 300, 333, 2, 1, 128, false);
        c.params.softmax_scale = scale;
        cases.push(c);
    }
    // The fused backward: MHA, GQA and MQA, every head dim, ragged both ways, rows that see no
    // key (their dQ accumulator must stay zero), a strided layout.
    for (mut c, layout) in [
        (case(F16, 1, 63, 65, 4, 4, 128, true), LayoutKind::Packed),
        (case(BF16, 2, 65, 63, 8, 2, 64, true), LayoutKind::Padded),
        (case(F16, 1, 127, 129, 8, 1, 32, false), LayoutKind::Packed),
        (
            case(BF16, 1, 129, 127, 2, 1, 256, false),
            LayoutKind::Packed,
        ),
        (
            case(BF16, 1, 200, 37, 2, 1, 64, true),
            LayoutKind::HeadsMajor,
        ),
        (case(F16, 2, 100, 130, 4, 2, 128, false), LayoutKind::Packed),
    ] {
        c.params.fused_backward = true;
        c.layout = layout;
        cases.push(c);
    }
    // The forward split over the keys (a decode step and short chunks against long keys): every
    // head dim, MQA and GQA, ragged keys, splits past a causal block's last key (empty: they
    // must weigh nothing), more splits than key blocks, a strided layout with a negative scale.
    for (mut c, splits) in [
        (case(F16, 1, 1, 1000, 4, 1, 64, false), 3),
        (case(BF16, 2, 5, 777, 4, 2, 128, true), 4),
        (case(F16, 1, 200, 300, 2, 1, 32, true), 5),
        (case(BF16, 1, 70, 1100, 2, 2, 256, false), 2),
        (case(BF16, 1, 129, 1031, 2, 1, 128, false), 7),
        (case(F16, 1, 33, 65, 2, 2, 64, true), 9),
        // Few rows a head run the decode blocks (`DECODE_ROWS`): one row of MHA, a block's
        // worth of rows causal, one short of it, and one row past them (the split blocks).
        (case(F16, 1, 1, 2000, 4, 4, 64, false), 6),
        (case(BF16, 1, 16, 600, 2, 2, 32, true), 3),
        (case(F16, 1, 15, 900, 4, 4, 256, false), 4),
        (case(BF16, 1, 17, 500, 2, 1, 128, true), 2),
        // More splits than key blocks and than two of the combine's tiles of splits.
        (case(F16, 1, 3, 2500, 2, 2, 64, false), 40),
    ] {
        c.splits = splits;
        cases.push(c);
    }
    let mut c = case(BF16, 2, 70, 450, 4, 2, 64, true);
    c.layout = LayoutKind::Padded;
    c.params.softmax_scale = -0.7;
    c.splits = 3;
    cases.push(c);
    // Decode steps unsplit in the decode blocks (a batch that fills the GPU): one row of MHA,
    // 13 rows of GQA causal inside the block, a full block at D256, and D32's own blocks
    // strided with a negative scale, and grouped.
    for (mut c, layout, scale) in [
        (
            case(BF16, 3, 1, 1500, 8, 8, 64, false),
            LayoutKind::Packed,
            0.125,
        ),
        (
            case(F16, 2, 13, 700, 4, 2, 128, true),
            LayoutKind::Packed,
            0.09,
        ),
        (
            case(BF16, 1, 16, 333, 2, 2, 256, false),
            LayoutKind::HeadsMajor,
            0.06,
        ),
        (
            case(F16, 2, 1, 999, 4, 4, 32, true),
            LayoutKind::Padded,
            -0.4,
        ),
        (
            case(BF16, 1, 1, 1025, 2, 1, 32, false),
            LayoutKind::Packed,
            0.2,
        ),
    ] {
        c.layout = layout;
        c.params.softmax_scale = scale;
        cases.push(c);
    }
    // A decode step of GQA, its groups' heads the rows of one block (`plan`'s `grouped`): causal
    // (one row sees every key), split, strided.
    for (mut c, layout, splits) in [
        (
            case(BF16, 2, 1, 777, 8, 2, 128, true),
            LayoutKind::Padded,
            4,
        ),
        (
            case(F16, 1, 1, 300, 6, 3, 32, false),
            LayoutKind::HeadsMajor,
            1,
        ),
    ] {
        c.layout = layout;
        c.splits = splits;
        cases.push(c);
    }
    cases
}

/// The inputs of one call in a strided layout, their padding poisoned.
#[derive(Debug)]
pub struct Inputs {
    pub q: StridedTensor,
    pub k: StridedTensor,
    pub v: StridedTensor,
    pub d_o: StridedTensor,
}

impl Inputs {
    /// Fresh inputs from `rng`, drawn as `draw` says.
    pub fn random(p: &AttentionParams, layout: LayoutKind, draw: Draw, rng: &mut Rng) -> Inputs {
        let qdims = [p.batch, p.seqlen_q, p.heads_q, p.head_dim];
        let kdims = [p.batch, p.seqlen_k, p.heads_kv, p.head_dim];
        let ql = layout.layout(p.seqlen_q, p.heads_q, p.head_dim);
        let kl = layout.layout(p.seqlen_k, p.heads_kv, p.head_dim);
        let mut input = |dims: [usize; 4], layout, scale, ramp: f64| {
            let n = dims.iter().product();
            let mut values = rng.normals(n, scale);
            let [_, seqlen, heads, head_dim] = dims;
            if ramp != 0.0 && seqlen > 1 {
                for (i, x) in values.iter_mut().enumerate() {
                    let row = i / (heads * head_dim) % seqlen;
                    *x *= 1.0 + ramp * row as f64 / (seqlen - 1) as f64;
                }
            }
            StridedTensor::from_dense(p.dtype, layout, dims, &values)
        };
        Inputs {
            q: input(qdims, ql, draw.input_scale, 0.0),
            k: input(kdims, kl, draw.input_scale, draw.key_ramp),
            v: input(kdims, kl, 1.0, 0.0),
            d_o: input(qdims, ql, 1.0, 0.0),
        }
    }

    /// The f64 reference of forward and backward on these (rounded) inputs.
    pub fn reference(&self, p: &AttentionParams) -> AttentionReference {
        reference::attention(
            p,
            &self.q.to_dense(),
            &self.k.to_dense(),
            &self.v.to_dense(),
            &self.d_o.to_dense(),
        )
    }
}

/// The outputs of one forward + backward call, in the inputs' layout: O, dQ, dK and dV as
/// strided tensors, LSE as `[batch, heads_q, seqlen_q]` f32, the backward's row statistics
/// (`lse_base2` and `delta`, heads [`AttentionParams::stats_stride`] apart), and the fused
/// backward's dQ accumulator (empty for the split backward).
#[derive(Debug)]
pub struct Outputs {
    pub o: StridedTensor,
    pub lse: HostBuffer,
    pub dq: StridedTensor,
    pub dk: StridedTensor,
    pub dv: StridedTensor,
    pub lse_base2: HostBuffer,
    pub delta: HostBuffer,
    pub dq_accum: HostBuffer,
    /// How far apart the row statistics' heads are (0 where the outputs hold none).
    stats_stride: usize,
    /// The rows of each head the statistics hold (`seqlen_q`); the rest is padding.
    stats_rows: usize,
}

impl Outputs {
    /// Outputs shaped for `inputs`, every element poisoned.
    pub fn poisoned(p: &AttentionParams, inputs: &Inputs) -> Outputs {
        let like = |t: &StridedTensor| StridedTensor::poisoned(p.dtype, t.layout, t.dims);
        Outputs {
            o: like(&inputs.q),
            lse: HostBuffer::poisoned(DType::F32, p.lse_len()),
            dq: like(&inputs.q),
            dk: like(&inputs.k),
            dv: like(&inputs.v),
            lse_base2: HostBuffer::poisoned(DType::F32, p.stats_len()),
            delta: HostBuffer::poisoned(DType::F32, p.stats_len()),
            // Poisoned too: the fused backward must zero it before adding into it.
            dq_accum: HostBuffer::poisoned(DType::F32, p.dq_accum_len()),
            stats_stride: p.stats_stride(),
            stats_rows: p.seqlen_q,
        }
    }

    /// Outputs read back from a run that keeps its workspace to itself (the GPU API): the row
    /// statistics and dQ accumulator are empty, and [`Outputs::faults`] passes over them.
    pub fn without_workspace(
        o: StridedTensor,
        lse: HostBuffer,
        [dq, dk, dv]: [StridedTensor; 3],
    ) -> Outputs {
        let empty = || HostBuffer::zeros(DType::F32, 0);
        Outputs {
            o,
            lse,
            dq,
            dk,
            dv,
            lse_base2: empty(),
            delta: empty(),
            dq_accum: empty(),
            stats_stride: 0,
            stats_rows: 0,
        }
    }

    /// What is wrong whatever the tolerance: elements left unwritten (or NaN), writes into
    /// padding.
    pub fn faults(&self) -> Vec<String> {
        let mut faults = Vec::new();
        for (name, t) in [
            ("o", &self.o),
            ("dq", &self.dq),
            ("dk", &self.dk),
            ("dv", &self.dv),
        ] {
            let unwritten = t.to_dense().iter().filter(|x| x.is_nan()).count();
            if unwritten > 0 {
                faults.push(format!("{unwritten} elements of {name} unwritten or NaN"));
            }
            if !t.padding_untouched() {
                faults.push(format!("{name} written outside its shape"));
            }
        }
        for (name, b) in [("lse", &self.lse), ("dq_accum", &self.dq_accum)] {
            let unwritten = b.poisoned_indices().len();
            if unwritten > 0 {
                faults.push(format!("{unwritten} elements of {name} unwritten or NaN"));
            }
        }
        // The statistics' rows past seqlen_q are padding: never written (nor read).
        let (stride, rows) = (self.stats_stride, self.stats_rows);
        for (name, b) in [("lse_base2", &self.lse_base2), ("delta", &self.delta)] {
            if stride == 0 {
                break;
            }
            let poisoned = b.poisoned_indices();
            let unwritten = poisoned.iter().filter(|&&i| i % stride < rows).count();
            let padding = b.len() / stride * (stride - rows);
            if unwritten > 0 {
                faults.push(format!("{unwritten} elements of {name} unwritten or NaN"));
            }
            if poisoned.len() - unwritten < padding {
                faults.push(format!("{name} written in its padding"));
            }
        }
        // Each row's LSE in base 2 is its LSE's, +inf where that is -inf.
        if stride > 0 {
            let (lse, base2) = (self.lse.to_f64(), self.lse_base2.to_f64());
            let wrong = lse
                .iter()
                .enumerate()
                .filter(|&(i, &l)| {
                    let got = base2[i / rows * stride + i % rows];
                    let want = if l == f64::NEG_INFINITY {
                        f64::INFINITY
                    } else {
                        l * std::f64::consts::LOG2_E
                    };
                    !(got == want || (got - want).abs() <= 1e-6 * want.abs().max(1.0))
                })
                .count();
            if wrong > 0 {
                faults.push(format!("{wrong} rows of lse_base2 are not lse * log2(e)"));
            }
        }
        faults
    }

    /// Compares with `want` (dense, as the reference gives them; its terms condition the
    /// gradient errors): the worst-row errors, and [`Outputs::faults`] plus every row whose
    /// LSE is -inf in one and not the other.
    pub fn compare(
        &self,
        p: &AttentionParams,
        want: &AttentionReference,
        large_scores: bool,
    ) -> Report {
        let mut report = Report {
            large_scores,
            faults: self.faults(),
            ..Report::default()
        };
        let lse = self.lse.to_f64();
        for (i, ((got, &wanted), &terms)) in lse
            .into_iter()
            .zip(&want.lse)
            .zip(&want.lse_terms)
            .enumerate()
        {
            if wanted == f64::NEG_INFINITY || got == f64::NEG_INFINITY {
                if got != wanted {
                    report
                        .faults
                        .push(format!("lse[{i}] is {got}, the reference has {wanted}"));
                }
            } else {
                let size = wanted.abs().max(terms).max(1.0);
                report.lse = report.lse.max((got - wanted).abs() / size);
            }
        }
        let d = p.head_dim;
        let (dq, dk, dv) = (self.dq.to_dense(), self.dk.to_dense(), self.dv.to_dense());
        report.o = row_error(&self.o.to_dense(), &want.o, d);
        report.conditioned = [
            row_error_conditioned(&dq, &want.dq, Some(&want.dq_terms), d),
            row_error_conditioned(&dk, &want.dk, Some(&want.dk_terms), d),
            row_error_conditioned(&dv, &want.dv, Some(&want.dv_terms), d),
        ];
        // A gradient that is zero throughout (one key: the softmax passes no gradient to the
        // scores) has no relative error; its error against its terms stands for it.
        let plain = |got: &[f64], want: &[f64], conditioned: f64| {
            if want.iter().all(|&w| w == 0.0) {
                conditioned
            } else {
                row_error(got, want, d)
            }
        };
        report.dq = plain(&dq, &want.dq, report.conditioned[0]);
        report.dk = plain(&dk, &want.dk, report.conditioned[1]);
        report.dv = plain(&dv, &want.dv, report.conditioned[2]);
        report
    }

    /// The outputs as the reference gives them (dense, f64), with `terms`' sizes of the
    /// gradients' terms: what another run of the same call is compared against.
    pub fn as_reference(&self, terms: AttentionReference) -> AttentionReference {
        AttentionReference {
            o: self.o.to_dense(),
            lse: self.lse.to_f64(),
            dq: self.dq.to_dense(),
            dk: self.dk.to_dense(),
            dv: self.dv.to_dense(),
            ..terms
        }
    }
}

/// Forward (its keys split `splits` ways) and backward on the interpreter as `target` runs
/// them, `outputs` written.
pub fn run_interpreter(
    p: &AttentionParams,
    target: Target,
    inputs: &Inputs,
    outputs: &Outputs,
    splits: usize,
) -> Result<(), AttentionError> {
    let Inputs { q, k, v, d_o } = inputs;
    cpu::forward_in_splits(
        p,
        target,
        [q.as_tensor(), k.as_tensor(), v.as_tensor()],
        outputs.o.as_tensor(),
        &outputs.lse,
        splits,
    )?;
    let grads = BackwardOutputs {
        dq: outputs.dq.as_tensor(),
        dk: outputs.dk.as_tensor(),
        dv: outputs.dv.as_tensor(),
        lse_base2: &outputs.lse_base2,
        delta: &outputs.delta,
        dq_accum: Some(&outputs.dq_accum),
    };
    cpu::backward(
        p,
        target,
        q.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        outputs.o.as_tensor(),
        d_o.as_tensor(),
        &outputs.lse,
        grads,
    )
}

/// Runs `case` forward and backward on the interpreter, as `target` runs them, with fresh
/// inputs from `rng`, and compares with the f64 reference.
pub fn run_on_interpreter(
    case: &Case,
    target: Target,
    rng: &mut Rng,
) -> Result<Report, AttentionError> {
    let Case {
        params: p,
        draw,
        layout,
        splits,
    } = case;
    let inputs = Inputs::random(p, *layout, *draw, rng);
    let outputs = Outputs::poisoned(p, &inputs);
    run_interpreter(p, target, &inputs, &outputs, *splits)?;
    Ok(outputs.compare(p, &inputs.reference(p), draw.conditioned()))
}
