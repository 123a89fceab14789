//! Attention on the GPU at the FlashAttention benchmark setup, through the safe Rust API: random
//! inputs, forward and backward timed with CUDA events, TFLOP/s by the FlashAttention
//! convention, and a check of one (batch, kv head) of the outputs against the f64 reference.
//! `kiln bench` and the GPU path of `kiln demo` run it; `../shared/bench/compare.py` measures the
//! same kernels through the C interface beside PyTorch.

use std::time::{Duration, Instant};

use kiln_dsl::{DType, HostBuffer};
use kiln_runtime::{Device, DeviceBuffer};

use crate::attention::check::{Outputs, Report, StridedTensor, Tolerance};
use crate::attention::gpu::{self, DeviceTensor, DeviceTensorMut, Gradients, Overrides};
use crate::attention::{AttentionError, AttentionParams, Layout};
use crate::reference::AttentionReference;
use crate::reference::{self, Rng};

/// Calls of a pass timed back to back between two events, as compare.py's `bench_ms` does.
pub const CALLS_PER_SAMPLE: usize = 10;

/// How a pass is timed: `samples` samples of [`CALLS_PER_SAMPLE`] calls each, after `warm` of
/// calls back to back. A GPU that runs attention for longer than a burst settles at its power
/// cap, and there a kernel that spends less energy a FLOP runs at a higher clock, which a burst
/// does not show (docs/PERF.md, fourteenth and thirtieth sessions): `warm` of a few seconds
/// times every candidate at the clock the cap gives it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampling {
    pub samples: usize,
    pub warm: Duration,
}

impl Sampling {
    /// `samples` samples after the warm-up calls alone (compare.py's method).
    pub fn burst(samples: usize) -> Sampling {
        Sampling {
            samples,
            warm: Duration::ZERO,
        }
    }
}

/// `median of 10 samples of 10 launches back to back after 1.0 s of calls back to back`, for the
/// tools' headers.
impl std::fmt::Display for Sampling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "median of {} samples of {CALLS_PER_SAMPLE} launches back to back",
            self.samples
        )?;
        if !self.warm.is_zero() {
            write!(
                f,
                " after {:.1} s of calls back to back",
                self.warm.as_secs_f64()
            )?;
        }
        Ok(())
    }
}

/// The FlashAttention papers' setup: 16k tokens per batch and a hidden size of 2048, so
/// `batch = 16384 / seqlen` and `heads = 2048 / head_dim`.
pub fn standard(dtype: DType, head_dim: usize, causal: bool, seqlen: usize) -> AttentionParams {
    let heads = 2048 / head_dim;
    AttentionParams {
        dtype,
        batch: (16384 / seqlen).max(1),
        seqlen_q: seqlen,
        seqlen_k: seqlen,
        heads_q: heads,
        heads_kv: heads,
        head_dim,
        causal,
        softmax_scale: AttentionParams::default_scale(head_dim),
        fused_backward: false,
    }
}

/// A batch of decode steps that fills the GPU: 16 sequences of one query row against `seqlen`
/// keys, [`standard`]'s heads, what the forward's decode blocks are tuned at.
pub fn decode_steps(dtype: DType, head_dim: usize, causal: bool, seqlen: usize) -> AttentionParams {
    AttentionParams {
        batch: 16,
        seqlen_q: 1,
        ..standard(dtype, head_dim, causal, seqlen)
    }
}

/// Forward FLOPs by the FlashAttention convention: `4 B H Nq Nk D`, halved when causal (the
/// backward counts 2.5 times as many).
pub fn forward_flops(p: &AttentionParams) -> f64 {
    let full = 4.0
        * (p.batch * p.heads_q) as f64
        * p.seqlen_q as f64
        * p.seqlen_k as f64
        * p.head_dim as f64;
    if p.causal { full / 2.0 } else { full }
}

/// Median GPU milliseconds of the forward and backward passes, and their TFLOP/s.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub forward_ms: f64,
    pub backward_ms: f64,
    pub forward_tflops: f64,
    pub backward_tflops: f64,
}

/// A pass of attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Forward,
    /// The backward (after a forward, whose outputs it reads).
    Backward,
}

/// One attention problem on the device: packed inputs, the outputs of the last passes.
#[derive(Debug)]
pub struct Problem {
    pub params: AttentionParams,
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    d_o: DeviceBuffer,
    o: DeviceBuffer,
    lse: DeviceBuffer,
    dq: DeviceBuffer,
    dk: DeviceBuffer,
    dv: DeviceBuffer,
    /// Kernels run in place of the shipped ones (`kiln tune`'s candidates).
    pub overrides: Overrides,
}

impl Problem {
    /// Standard-normal inputs from `rng`; outputs poisoned (NaN) until a pass writes them.
    pub fn random(
        device: &Device,
        p: AttentionParams,
        rng: &mut Rng,
    ) -> Result<Problem, AttentionError> {
        p.validate()?;
        let q_len = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
        let k_len = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
        let mut input = |len| device.upload(&HostBuffer::from_f64(p.dtype, &rng.normals(len, 1.0)));
        let (q, k, v, d_o) = (input(q_len)?, input(k_len)?, input(k_len)?, input(q_len)?);
        let poisoned = |dtype, len| device.filled(dtype, len, 0xff);
        Ok(Problem {
            params: p,
            q,
            k,
            v,
            d_o,
            o: poisoned(p.dtype, q_len)?,
            lse: poisoned(DType::F32, p.lse_len())?,
            dq: poisoned(p.dtype, q_len)?,
            dk: poisoned(p.dtype, k_len)?,
            dv: poisoned(p.dtype, k_len)?,
            overrides: Overrides::default(),
        })
    }

    /// The same buffers for a call of `p`, outputs poisoned again, if they hold it (every shape
    /// of the standard setup has as many elements); else `None`.
    pub fn reuse(
        mut self,
        device: &Device,
        p: AttentionParams,
    ) -> Result<Option<Problem>, AttentionError> {
        p.validate()?;
        let q_len = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
        let k_len = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
        let fits = p.dtype == self.params.dtype
            && [&self.q, &self.d_o, &self.o, &self.dq]
                .iter()
                .all(|b| b.len() >= q_len)
            && [&self.k, &self.v, &self.dk, &self.dv]
                .iter()
                .all(|b| b.len() >= k_len)
            && self.lse.len() >= p.lse_len();
        if !fits {
            return Ok(None);
        }
        self.poison(device)?;
        self.params = p;
        Ok(Some(self))
    }

    /// Fills the outputs with NaN again, so that the next check sees what a pass leaves
    /// unwritten.
    pub fn poison(&mut self, device: &Device) -> Result<(), AttentionError> {
        for buffer in [
            &mut self.o,
            &mut self.lse,
            &mut self.dq,
            &mut self.dk,
            &mut self.dv,
        ] {
            buffer.fill(device, 0xff)?;
        }
        Ok(())
    }

    fn layouts(&self) -> (Layout, Layout) {
        let p = &self.params;
        (
            Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim),
            Layout::contiguous(p.seqlen_k, p.heads_kv, p.head_dim),
        )
    }

    /// Queues the forward pass.
    pub fn forward(&mut self, device: &Device) -> Result<(), AttentionError> {
        let (ql, kl) = self.layouts();
        let t = |buffer, layout| DeviceTensor { buffer, layout };
        gpu::forward_with(
            device,
            &self.params,
            [t(&self.q, ql), t(&self.k, kl), t(&self.v, kl)],
            DeviceTensorMut {
                buffer: &mut self.o,
                layout: ql,
            },
            &mut self.lse,
            &self.overrides,
        )
    }

    /// Queues the backward pass (after a forward).
    pub fn backward(&mut self, device: &Device) -> Result<(), AttentionError> {
        let (ql, kl) = self.layouts();
        let t = |buffer, layout| DeviceTensor { buffer, layout };
        let out = |buffer, layout| DeviceTensorMut { buffer, layout };
        gpu::backward_with(
            device,
            &self.params,
            [
                t(&self.q, ql),
                t(&self.k, kl),
                t(&self.v, kl),
                t(&self.o, ql),
                t(&self.d_o, ql),
            ],
            &self.lse,
            Gradients {
                dq: out(&mut self.dq, ql),
                dk: out(&mut self.dk, kl),
                dv: out(&mut self.dv, kl),
            },
            &self.overrides,
        )
    }

    /// The median GPU milliseconds of a call of `pass` over `sampling.samples` samples, each the
    /// mean of [`CALLS_PER_SAMPLE`] calls back to back between events, after as many warm-up
    /// calls and, for `sampling.warm`, more: compare.py's method, and at the power cap. Timed one
    /// call at a time, kernels that run the GPU harder look faster than they are in a sustained
    /// run (`kiln tune` put a D64 forward 8% ahead that an interleaved compare.py-style run put
    /// 2% behind, docs/PERF.md, 2026-11-26).
    pub fn median_ms(
        &mut self,
        device: &Device,
        sampling: Sampling,
        pass: Pass,
    ) -> Result<f64, AttentionError> {
        let run = |problem: &mut Problem| match pass {
            Pass::Forward => problem.forward(device),
            Pass::Backward => problem.backward(device),
        };
        let start = Instant::now();
        loop {
            for _ in 0..CALLS_PER_SAMPLE {
                run(self)?;
            }
            if start.elapsed() >= sampling.warm {
                break;
            }
            device.synchronize()?;
        }
        let mut times = Vec::with_capacity(sampling.samples);
        for _ in 0..sampling.samples.max(1) {
            let start = device.record_event()?;
            for _ in 0..CALLS_PER_SAMPLE {
                run(self)?;
            }
            let end = device.record_event()?;
            times.push(start.elapsed_ms(&end)? as f64 / CALLS_PER_SAMPLE as f64);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }

    /// Times each pass: [`Self::median_ms`] of the forward, then of the backward.
    pub fn time(&mut self, device: &Device, sampling: Sampling) -> Result<Timing, AttentionError> {
        let forward_ms = self.median_ms(device, sampling, Pass::Forward)?;
        let backward_ms = self.median_ms(device, sampling, Pass::Backward)?;
        let flops = forward_flops(&self.params);
        Ok(Timing {
            forward_ms,
            backward_ms,
            forward_tflops: flops / forward_ms / 1e9,
            backward_tflops: 2.5 * flops / backward_ms / 1e9,
        })
    }

    /// Compares the outputs of the last forward and backward passes, for one batch entry and one
    /// kv head (with its group of query heads), with the f64 reference on the same inputs.
    pub fn check_head(
        &self,
        device: &Device,
        batch: usize,
        kv_head: usize,
    ) -> Result<Report, AttentionError> {
        let reference = self.reference_head(device, batch, kv_head)?;
        self.compare_head(device, &reference)
    }

    /// The f64 reference of one batch entry and one kv head of this problem's inputs (what
    /// [`Self::compare_head`] judges the outputs by, however many passes ran since).
    pub fn reference_head(
        &self,
        device: &Device,
        batch: usize,
        kv_head: usize,
    ) -> Result<HeadReference, AttentionError> {
        let head = Head { batch, kv_head };
        let p = &self.params;
        let q = head.slice(p, &self.q.to_host(device)?.to_f64(), Side::Queries);
        let k = head.slice(p, &self.k.to_host(device)?.to_f64(), Side::Keys);
        let v = head.slice(p, &self.v.to_host(device)?.to_f64(), Side::Keys);
        let d_o = head.slice(p, &self.d_o.to_host(device)?.to_f64(), Side::Queries);
        let want = reference::attention(&head.params(p), &q, &k, &v, &d_o);
        Ok(HeadReference { head, want })
    }

    /// Compares the outputs of the last forward and backward passes with `reference`.
    pub fn compare_head(
        &self,
        device: &Device,
        reference: &HeadReference,
    ) -> Result<Report, AttentionError> {
        let p = &self.params;
        let head = &reference.head;
        let sub = head.params(p);
        let down = |b: &DeviceBuffer| b.to_host(device).map(|h| h.to_f64());
        let all_lse = down(&self.lse)?;
        let (sq, sk) = (p.seqlen_q, p.seqlen_k);
        let lse: Vec<f64> = head
            .query_heads(p)
            .flat_map(|h| {
                let at = (head.batch * p.heads_q + h) * sq;
                all_lse[at..at + sq].iter().copied()
            })
            .collect();
        let dense = |buffer: &DeviceBuffer, side: Side| -> Result<StridedTensor, AttentionError> {
            let (seqlen, heads) = match side {
                Side::Queries => (sq, sub.heads_q),
                Side::Keys => (sk, 1),
            };
            Ok(StridedTensor::from_dense(
                p.dtype,
                Layout::contiguous(seqlen, heads, p.head_dim),
                [1, seqlen, heads, p.head_dim],
                &head.slice(p, &down(buffer)?, side),
            ))
        };
        // The Rust API keeps the row statistics and the dQ accumulator in its own workspace.
        let got = Outputs::without_workspace(
            dense(&self.o, Side::Queries)?,
            HostBuffer::from_f64(DType::F32, &lse),
            [
                dense(&self.dq, Side::Queries)?,
                dense(&self.dk, Side::Keys)?,
                dense(&self.dv, Side::Keys)?,
            ],
        );
        Ok(got.compare(&sub, &reference.want, false))
    }
}

/// Which side of attention a tensor is on: `[batch, seqlen_q, heads_q, head_dim]` or
/// `[batch, seqlen_k, heads_kv, head_dim]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Side {
    Queries,
    Keys,
}

/// The f64 reference outputs of one batch entry and one kv head (with its group of query
/// heads) of a [`Problem`].
#[derive(Clone, Debug)]
pub struct HeadReference {
    head: Head,
    want: AttentionReference,
}

/// One batch entry and one kv head, with its group of query heads.
#[derive(Clone, Copy, Debug)]
struct Head {
    batch: usize,
    kv_head: usize,
}

impl Head {
    /// The call restricted to this batch entry and kv head.
    fn params(&self, p: &AttentionParams) -> AttentionParams {
        AttentionParams {
            batch: 1,
            heads_q: p.group(),
            heads_kv: 1,
            ..*p
        }
    }

    fn query_heads(&self, p: &AttentionParams) -> std::ops::Range<usize> {
        self.kv_head * p.group()..(self.kv_head + 1) * p.group()
    }

    /// This head's `[seqlen, heads, head_dim]` values of a whole `side` tensor `all`.
    fn slice(&self, p: &AttentionParams, all: &[f64], side: Side) -> Vec<f64> {
        let (seqlen, heads, keep) = match side {
            Side::Queries => (p.seqlen_q, p.heads_q, self.query_heads(p)),
            Side::Keys => (p.seqlen_k, p.heads_kv, self.kv_head..self.kv_head + 1),
        };
        let row = heads * p.head_dim;
        let base = self.batch * seqlen * row;
        (0..seqlen)
            .flat_map(|i| {
                let at = base + i * row + keep.start * p.head_dim;
                all[at..at + keep.len() * p.head_dim].iter().copied()
            })
            .collect()
    }
}

/// One measured shape: its parameters, timing, and its check against f64 when asked.
#[derive(Debug)]
pub struct Row {
    pub params: AttentionParams,
    pub timing: Timing,
    /// The failures of the checked head (empty: within every bar); `None` if not checked.
    pub failures: Option<Vec<String>>,
}

/// Times forward and backward at the standard setup for every head dim, mask and seqlen given,
/// each on fresh inputs from `rng`; with `check`, then compares batch entry 0, head 0 of the
/// outputs with the f64 reference (`check::Tolerance`'s bars).
///
/// ```no_run
/// use kiln_kernels::attention::DType;
/// use kiln_kernels::attention::gpu::Device;
/// use kiln_kernels::bench::{self, Sampling};
/// use kiln_kernels::reference::Rng;
///
/// let device = Device::current_or_default()?;
/// let sampling = Sampling::burst(20);
/// let rows = bench::measure(&device, DType::BF16, &[128], &[4096], sampling, true, &mut Rng::new(7))?;
/// print!("{}", bench::table(&rows));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn measure(
    device: &Device,
    dtype: DType,
    head_dims: &[usize],
    seqlens: &[usize],
    sampling: Sampling,
    check: bool,
    rng: &mut Rng,
) -> Result<Vec<Row>, AttentionError> {
    let mut rows = Vec::new();
    // Random inputs are made once and reused by every shape they hold: drawing them on the host
    // takes longer than timing a shape.
    let mut last: Option<Problem> = None;
    for &head_dim in head_dims {
        for causal in [false, true] {
            for &seqlen in seqlens {
                let p = standard(dtype, head_dim, causal, seqlen);
                let reused = match last.take() {
                    Some(problem) => problem.reuse(device, p)?,
                    None => None,
                };
                let mut problem = match reused {
                    Some(problem) => problem,
                    None => Problem::random(device, p, rng)?,
                };
                let timing = problem.time(device, sampling)?;
                let failures = if check {
                    let report = problem.check_head(device, 0, 0)?;
                    Some(report.failures(Tolerance::for_dtype(dtype)))
                } else {
                    None
                };
                rows.push(Row {
                    params: problem.params,
                    timing,
                    failures,
                });
                last = Some(problem);
            }
        }
    }
    Ok(rows)
}

/// The rows as a Markdown table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "| dtype | head dim | causal | seqlen | batch x heads | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | check vs f64 |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for row in rows {
        let p = &row.params;
        let check = match &row.failures {
            None => "-".to_string(),
            Some(f) if f.is_empty() => "ok".to_string(),
            Some(f) => format!("FAILED: {}", f.join("; ")),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} x {} | {:.3} | {:.1} | {:.3} | {:.1} | {check} |\n",
            p.dtype,
            p.head_dim,
            if p.causal { "yes" } else { "no" },
            p.seqlen_q,
            p.batch,
            p.heads_q,
            row.timing.forward_ms,
            row.timing.forward_tflops,
            row.timing.backward_ms,
            row.timing.backward_tflops,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_says_how_a_pass_is_timed() {
        assert_eq!(
            Sampling::burst(20).to_string(),
            "median of 20 samples of 10 launches back to back"
        );
        let warm = Sampling {
            samples: 10,
            warm: Duration::from_millis(1500),
        };
        assert_eq!(
            warm.to_string(),
            "median of 10 samples of 10 launches back to back after 1.5 s of calls back to back"
        );
    }
}
