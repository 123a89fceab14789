//! The prebuilt attention kernels from Rust, through the safe GPU API (`attention::gpu`): the
//! interpreter tests' designed shapes (ragged seqlens, GQA and MQA, strided layouts, seqlen_q !=
//! seqlen_k both ways, f16 and bf16, all head dims), forward and backward on the GPU with every
//! output poisoned first, each compared with the CPU interpreter on the same inputs; then the
//! backward run again, which must give the same bits (but for the fused backward's dQ). Needs a GPU (compute capability 8.0+):
//!
//! ```sh
//! cargo run --release -p kiln-kernels --example attention_gpu
//! ```

use std::process::ExitCode;

use kiln_kernels::attention::check::{self, Inputs, Outputs, StridedTensor, Tolerance};
use kiln_kernels::attention::gpu::{self, DeviceTensor, DeviceTensorMut, Gradients, Overrides};
use kiln_kernels::attention::{AttentionError, AttentionParams};
use kiln_kernels::reference::Rng;
use kiln_runtime::{Device, DeviceBuffer};

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, AttentionError> {
    // The first calls on a device of their own, dropped before the rest: the last handle of a
    // device releases its primary context, which unloads what it loaded, and the driver may
    // give the next one the same handle. kiln's caches of loaded kernels must not hand the
    // next device's calls the first one's (`kiln_runtime::Context` compares by the driver's
    // unique id too).
    let first = Device::current_or_default()?;
    first_launch(&first, "in this process")?;
    let first_handle = first.context().raw();
    drop(first);
    let device = Device::current_or_default()?;
    let (major, minor) = device.compute_capability()?;
    println!(
        "{} (compute capability {major}.{minor}); a fresh device after the first's was dropped, \
         its context at {} handle",
        device.name().unwrap_or_default(),
        if device.context().raw() == first_handle {
            "the same"
        } else {
            "another"
        }
    );
    first_launch(&device, "on the fresh device")?;
    let seed = Rng::fresh_seed();
    let mut rng = Rng::new(seed);
    let mut all_ok = true;
    for c in check::designed_cases()
        .into_iter()
        .filter(|c| c.params.dtype != kiln_dsl::DType::F32)
    {
        let p = &c.params;
        let inputs = Inputs::random(p, c.layout, c.draw, &mut rng);
        let interpreter = Outputs::poisoned(p, &inputs);
        // The target the GPU runs (`KILN_TARGET` too), whose block sizes the interpreter reproduces.
        check::run_interpreter(p, gpu::target(&device)?, &inputs, &interpreter, c.splits)?;
        let (gpu, [dq_bits, dk_bits, dv_bits]) = on_gpu(&device, p, &inputs, c.splits)?;
        let report = gpu.compare(
            p,
            &interpreter.as_reference(inputs.reference(p)),
            c.draw.conditioned(),
        );
        let mut failures = report.failures(Tolerance::for_dtype(p.dtype));
        // The fused backward's dQ sums atomic adds in any order; dK and dV never vary.
        if !(dk_bits && dv_bits && (dq_bits || p.fused_backward)) {
            failures.push("the backward's second run gave other bits".to_string());
        }
        println!(
            "{p}{}, {:?}: o {:.1e} lse {:.1e} dq {:.1e} dk {:.1e} dv {:.1e}  {}",
            c.draw,
            c.layout,
            report.o,
            report.lse,
            report.dq,
            report.dk,
            report.dv,
            if failures.is_empty() {
                "ok".to_string()
            } else {
                failures.join("; ")
            }
        );
        all_ok &= failures.is_empty();
    }
    println!(
        "{} (seed {seed})",
        if all_ok {
            "all agree with the interpreter"
        } else {
            "FAILED"
        }
    );
    Ok(all_ok)
}

/// Times the first forward call of a specialisation on `device` (`when`: the driver loads and
/// compiles its PTX) against the second.
fn first_launch(device: &Device, when: &str) -> Result<(), AttentionError> {
    let p = AttentionParams {
        dtype: kiln_dsl::DType::BF16,
        batch: 1,
        seqlen_q: 256,
        seqlen_k: 256,
        heads_q: 8,
        heads_kv: 8,
        head_dim: 128,
        causal: true,
        softmax_scale: AttentionParams::default_scale(128),
        fused_backward: false,
    };
    let layout = kiln_kernels::attention::Layout::contiguous(256, 8, 128);
    let n = 256 * 8 * 128;
    let q = device.filled(p.dtype, n, 0)?;
    let mut o = device.filled(p.dtype, n, 0)?;
    let mut lse = device.filled(kiln_dsl::DType::F32, p.lse_len(), 0)?;
    device.synchronize()?;
    let mut times = Vec::new();
    for _ in 0..2 {
        let start = std::time::Instant::now();
        let t = DeviceTensor { buffer: &q, layout };
        let out = DeviceTensorMut {
            buffer: &mut o,
            layout,
        };
        gpu::forward(device, &p, t, t, t, out, &mut lse)?;
        device.synchronize()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "first forward call {when}: {:.1} ms (loads its PTX; the driver compiles it unless its \
         JIT cache has it: CUDA_CACHE_DISABLE=1 to measure that); second: {:.2} ms",
        times[0], times[1]
    );
    Ok(())
}

/// Forward (its keys split `splits` ways) and backward through the GPU API with poisoned
/// outputs; the outputs, and whether a second backward run gave the same bits of dQ, dK and dV.
fn on_gpu(
    device: &Device,
    p: &AttentionParams,
    inputs: &Inputs,
    splits: usize,
) -> Result<(Outputs, [bool; 3]), AttentionError> {
    let up = |t: &StridedTensor| device.upload(&t.buffer);
    let (q, k, v, d_o) = (
        up(&inputs.q)?,
        up(&inputs.k)?,
        up(&inputs.v)?,
        up(&inputs.d_o)?,
    );
    let poisoned = Outputs::poisoned(p, inputs);
    let mut o = up(&poisoned.o)?;
    let mut lse = device.upload(&poisoned.lse)?;
    let input = |buffer, t: &StridedTensor| DeviceTensor {
        buffer,
        layout: t.layout,
    };
    gpu::forward_with(
        device,
        p,
        [
            input(&q, &inputs.q),
            input(&k, &inputs.k),
            input(&v, &inputs.v),
        ],
        DeviceTensorMut {
            buffer: &mut o,
            layout: inputs.q.layout,
        },
        &mut lse,
        &Overrides::default().with_splits(splits),
    )?;
    let (mut dq, mut dk, mut dv) = (up(&poisoned.dq)?, up(&poisoned.dk)?, up(&poisoned.dv)?);
    let qkv = [
        input(&q, &inputs.q),
        input(&k, &inputs.k),
        input(&v, &inputs.v),
    ];
    let saved = [input(&o, &inputs.q), input(&d_o, &inputs.d_o)];
    let backward = |dq: &mut DeviceBuffer, dk: &mut DeviceBuffer, dv: &mut DeviceBuffer| {
        let [q, k, v] = qkv;
        let [o, d_o] = saved;
        let out = |buffer, t: &StridedTensor| DeviceTensorMut {
            buffer,
            layout: t.layout,
        };
        gpu::backward(
            device,
            p,
            [q, k, v, o, d_o],
            &lse,
            Gradients {
                dq: out(dq, &inputs.q),
                dk: out(dk, &inputs.k),
                dv: out(dv, &inputs.v),
            },
        )
    };
    backward(&mut dq, &mut dk, &mut dv)?;
    device.synchronize()?;
    let down = |b: &DeviceBuffer, like: &StridedTensor| -> Result<StridedTensor, AttentionError> {
        Ok(StridedTensor {
            buffer: b.to_host(device)?,
            layout: like.layout,
            dims: like.dims,
        })
    };
    // The Rust API keeps the row statistics and the dQ accumulator in its own workspace; the
    // interpreter tests check them.
    let outputs = Outputs::without_workspace(
        down(&o, &poisoned.o)?,
        lse.to_host(device)?,
        [
            down(&dq, &poisoned.dq)?,
            down(&dk, &poisoned.dk)?,
            down(&dv, &poisoned.dv)?,
        ],
    );
    // Bytes, not values: the padding of strided outputs holds NaN poison, which equals nothing.
    let bytes = |dq: &DeviceBuffer, dk: &DeviceBuffer, dv: &DeviceBuffer| {
        Ok::<_, AttentionError>([
            dq.to_bytes(device)?,
            dk.to_bytes(device)?,
            dv.to_bytes(device)?,
        ])
    };
    let first = bytes(&dq, &dk, &dv)?;
    // Into poisoned buffers again: an element the second run leaves unwritten must not keep
    // the first run's bits.
    let (mut dq, mut dk, mut dv) = (up(&poisoned.dq)?, up(&poisoned.dk)?, up(&poisoned.dv)?);
    backward(&mut dq, &mut dk, &mut dv)?;
    device.synchronize()?;
    let again = bytes(&dq, &dk, &dv)?;
    Ok((outputs, [0, 1, 2].map(|i| first[i] == again[i])))
}
