//! Attention on the GPU at the FlashAttention benchmark setup, through the safe Rust API: random
//! inputs, forward and backward timed with CUDA events, TFLOP/s by the FlashAttention
//! convention, and a check of one (batch, kv head) of the outputs against the f64 reference.
//! `kiln bench` and the GPU path of `kiln demo` run it; `../shared/bench/compare.py` measures the
//! same kernels through the C interface beside PyTorch.

use kiln_dsl::{DType, HostBuffer};
use kiln_runtime::{Device, DeviceBuffer};

use crate::attention::check::{Outputs, Report, StridedTensor, Tolerance};
use crate::attention::gpu::{self, DeviceTensor, DeviceTensorMut, Gradients};
use crate::attention::{AttentionError, AttentionParams, Layout};
use crate::reference::{self, Rng};

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
        for buffer in [
            &mut self.o,
            &mut self.lse,
            &mut self.dq,
            &mut self.dk,
            &mut self.dv,
        ] {
            buffer.fill(device, 0xff)?;
        }
        self.params = p;
        Ok(Some(self))
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
        gpu::forward(
            device,
            &self.params,
            t(&self.q, ql),
            t(&self.k, kl),
            t(&self.v, kl),
            DeviceTensorMut {
                buffer: &mut self.o,
                layout: ql,
            },
            &mut self.lse,
        )
    }

    /// Queues the backward pass (after a forward).
    pub fn backward(&mut self, device: &Device) -> Result<(), AttentionError> {
        let (ql, kl) = self.layouts();
        let t = |buffer, layout| DeviceTensor { buffer, layout };
        let out = |buffer, layout| DeviceTensorMut { buffer, layout };
        gpu::backward(
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
        )
    }

    /// Times each pass: a few warm-up calls, then the median of `samples` calls between events.
    pub fn time(&mut self, device: &Device, samples: usize) -> Result<Timing, AttentionError> {
        let mut median = |pass: &mut dyn FnMut(&mut Problem) -> Result<(), AttentionError>| {
            for _ in 0..3 {
                pass(self)?;
            }
            let mut times = Vec::with_capacity(samples);
            for _ in 0..samples.max(1) {
                let start = device.record_event()?;
                pass(self)?;
                let end = device.record_event()?;
                times.push(start.elapsed_ms(&end)? as f64);
            }
            times.sort_by(f64::total_cmp);
            Ok::<f64, AttentionError>(times[times.len() / 2])
        };
        let forward_ms = median(&mut |p| p.forward(device))?;
        let backward_ms = median(&mut |p| p.backward(device))?;
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
        let p = &self.params;
        let group = p.group();
        let sub = AttentionParams {
            batch: 1,
            heads_q: group,
            heads_kv: 1,
            ..*p
        };
        let q_heads = kv_head * group..(kv_head + 1) * group;
        let k_heads = kv_head..kv_head + 1;
        let down = |b: &DeviceBuffer| b.to_host(device).map(|h| h.to_f64());
        // `[seqlen, heads, head_dim]` of batch entry `batch`, heads `heads` only.
        let slice = |all: &[f64], seqlen: usize, heads: usize, keep: &std::ops::Range<usize>| {
            let row = heads * p.head_dim;
            let base = batch * seqlen * row;
            (0..seqlen)
                .flat_map(|i| {
                    let at = base + i * row + keep.start * p.head_dim;
                    all[at..at + keep.len() * p.head_dim].iter().copied()
                })
                .collect::<Vec<f64>>()
        };
        let (sq, sk) = (p.seqlen_q, p.seqlen_k);
        let q = slice(&down(&self.q)?, sq, p.heads_q, &q_heads);
        let k = slice(&down(&self.k)?, sk, p.heads_kv, &k_heads);
        let v = slice(&down(&self.v)?, sk, p.heads_kv, &k_heads);
        let d_o = slice(&down(&self.d_o)?, sq, p.heads_q, &q_heads);
        let want = reference::attention(&sub, &q, &k, &v, &d_o);
        let all_lse = down(&self.lse)?;
        let lse: Vec<f64> = q_heads
            .clone()
            .flat_map(|h| {
                let at = (batch * p.heads_q + h) * sq;
                all_lse[at..at + sq].iter().copied()
            })
            .collect();
        let dense = |values: &[f64], seqlen, heads| {
            StridedTensor::from_dense(
                p.dtype,
                Layout::contiguous(seqlen, heads, p.head_dim),
                [1, seqlen, heads, p.head_dim],
                values,
            )
        };
        let got = Outputs {
            o: dense(&slice(&down(&self.o)?, sq, p.heads_q, &q_heads), sq, group),
            lse: HostBuffer::from_f64(DType::F32, &lse),
            dq: dense(&slice(&down(&self.dq)?, sq, p.heads_q, &q_heads), sq, group),
            dk: dense(&slice(&down(&self.dk)?, sk, p.heads_kv, &k_heads), sk, 1),
            dv: dense(&slice(&down(&self.dv)?, sk, p.heads_kv, &k_heads), sk, 1),
            // The Rust API keeps delta in its own workspace.
            delta: HostBuffer::from_f64(DType::F32, &vec![0.0; sub.lse_len()]),
        };
        Ok(got.compare(&sub, &want, false))
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
/// use kiln_kernels::bench;
/// use kiln_kernels::reference::Rng;
///
/// let device = Device::current_or_default()?;
/// let rows = bench::measure(&device, DType::BF16, &[128], &[4096], 20, true, &mut Rng::new(7))?;
/// print!("{}", bench::table(&rows));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn measure(
    device: &Device,
    dtype: DType,
    head_dims: &[usize],
    seqlens: &[usize],
    samples: usize,
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
                let timing = problem.time(device, samples)?;
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
