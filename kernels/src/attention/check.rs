//! Checking the attention kernels against the f64 reference: strided tensors with poisoned
//! padding, one forward + backward run on fresh random inputs, and the per-dtype error bars.
//! The test suite and `kiln demo` both run through here.

use kiln_dsl::{DType, HostBuffer};

use super::cpu::{self, BackwardOutputs};
use super::{AttentionError, AttentionParams, Layout, Tensor};
use crate::reference::{self, Rng, row_error, row_error_conditioned};

/// How far from the f64 reference each output may be, in units of the dtype's unit roundoff u
/// (f16: 2^-11 = 4.9e-4, bf16: 2^-8 = 3.9e-3).
///
/// The kernels round what the GPU rounds: P to the input dtype before `P @ V`, dS before `dS @ K`
/// and `dS^T @ Q`, delta from the rounded O, and every output to its dtype. Each product term thus
/// carries a relative error of about u, and:
/// - O has no cancellation (P >= 0, sums to 1): its worst row is within about u (seen: 0.9u).
/// - A gradient is a sum of signed terms that largely cancel (the dS of a row sum to 0), so its
///   error is a few u of its *terms*, more of the result. Measured against the size of its terms
///   (`reference::row_error_conditioned`) it stays within about u (seen: 1.1u); measured as a plain
///   relative error it reaches 10u at ordinary scores (|s| ~ 1) and more when the softmax is nearly
///   one-hot (|s| ~ 100), where only the conditioned measure is meaningful.
/// - LSE is computed in f32 from the rounded inputs, as the reference: within f32 rounding.
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
    /// LSE's absolute error relative to max(1, |lse|).
    pub lse: f64,
}

impl Tolerance {
    pub fn for_dtype(dtype: DType) -> Tolerance {
        let u = match dtype {
            DType::F16 => 2f64.powi(-11),
            DType::BF16 => 2f64.powi(-8),
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
            lse: 1e-5,
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

/// Runs forward and backward on the interpreter with fresh inputs from `rng` (q and k with
/// standard deviation `input_scale`, v and dO with 1) and compares with the f64 reference.
pub fn run_on_interpreter(
    p: &AttentionParams,
    layout: LayoutKind,
    input_scale: f64,
    rng: &mut Rng,
) -> Result<Report, AttentionError> {
    let qdims = [p.batch, p.seqlen_q, p.heads_q, p.head_dim];
    let kdims = [p.batch, p.seqlen_k, p.heads_kv, p.head_dim];
    let ql = layout.layout(p.seqlen_q, p.heads_q, p.head_dim);
    let kl = layout.layout(p.seqlen_k, p.heads_kv, p.head_dim);
    let mut input = |dims: [usize; 4], layout, scale| {
        let n = dims.iter().product();
        StridedTensor::from_dense(p.dtype, layout, dims, &rng.normals(n, scale))
    };
    let q = input(qdims, ql, input_scale);
    let k = input(kdims, kl, input_scale);
    let v = input(kdims, kl, 1.0);
    let d_o = input(qdims, ql, 1.0);

    let o = StridedTensor::poisoned(p.dtype, ql, qdims);
    let lse = HostBuffer::poisoned(DType::F32, p.lse_len());
    cpu::forward(
        p,
        q.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        o.as_tensor(),
        &lse,
    )?;
    let dq = StridedTensor::poisoned(p.dtype, ql, qdims);
    let dk = StridedTensor::poisoned(p.dtype, kl, kdims);
    let dv = StridedTensor::poisoned(p.dtype, kl, kdims);
    let delta = HostBuffer::poisoned(DType::F32, p.lse_len());
    let outputs = BackwardOutputs {
        dq: dq.as_tensor(),
        dk: dk.as_tensor(),
        dv: dv.as_tensor(),
        delta: &delta,
    };
    cpu::backward(
        p,
        q.as_tensor(),
        k.as_tensor(),
        v.as_tensor(),
        o.as_tensor(),
        d_o.as_tensor(),
        &lse,
        outputs,
    )?;

    let mut report = Report {
        large_scores: input_scale > 1.0,
        ..Report::default()
    };
    for (name, t) in [("o", &o), ("dq", &dq), ("dk", &dk), ("dv", &dv)] {
        let unwritten = t.to_dense().iter().filter(|x| x.is_nan()).count();
        if unwritten > 0 {
            report
                .faults
                .push(format!("{unwritten} elements of {name} unwritten or NaN"));
        }
        if !t.padding_untouched() {
            report
                .faults
                .push(format!("{name} written outside its shape"));
        }
    }
    for (name, b) in [("lse", &lse), ("delta", &delta)] {
        let unwritten = b.poisoned_indices().len();
        if unwritten > 0 {
            report
                .faults
                .push(format!("{unwritten} elements of {name} unwritten or NaN"));
        }
    }

    let r = reference::attention(
        p,
        &q.to_dense(),
        &k.to_dense(),
        &v.to_dense(),
        &d_o.to_dense(),
    );
    for (i, (got, &want)) in lse.to_f64().into_iter().zip(&r.lse).enumerate() {
        if want == f64::NEG_INFINITY || got == f64::NEG_INFINITY {
            if got != want {
                report
                    .faults
                    .push(format!("lse[{i}] is {got}, the reference has {want}"));
            }
        } else {
            report.lse = report.lse.max((got - want).abs() / want.abs().max(1.0));
        }
    }
    let d = p.head_dim;
    report.o = row_error(&o.to_dense(), &r.o, d);
    report.dq = row_error(&dq.to_dense(), &r.dq, d);
    report.dk = row_error(&dk.to_dense(), &r.dk, d);
    report.dv = row_error(&dv.to_dense(), &r.dv, d);
    report.conditioned = [
        row_error_conditioned(&dq.to_dense(), &r.dq, Some(&r.dq_terms), d),
        row_error_conditioned(&dk.to_dense(), &r.dk, Some(&r.dk_terms), d),
        row_error_conditioned(&dv.to_dense(), &r.dv, Some(&r.dv_terms), d),
    ];
    Ok(report)
}
