//! The attention check for a GPU: kiln's prebuilt attention kernels through the safe Rust API
//! (`kiln_kernels::attention::gpu`), forward and backward at ragged shapes up to seqlen 16k
//! (GQA/MQA, seqlen_q != seqlen_k both ways, causal and not, f16 and bf16, head dims 64 and 128)
//! with every output poisoned (NaN) first; each case's inputs and outputs are written as raw
//! little-endian files and a `case.json` under DIR/<case>/ for `scripts/attention_vs_sdpa.py
//! check DIR`, which judges them against an fp32 reference with PyTorch SDPA's error in the same
//! dtype as the bar. It links no LLVM.
//!
//! ```text
//! kiln-attention-gpu --check DIR [--filter TEXT]
//! ```
//!
//! The kernels run the PTX of the device's best target; `KILN_TARGET=sm_80` runs the portable
//! PTX on a Hopper GPU too. `scripts/device-attention.sh` builds it here and stages it, with the
//! judge and `kernels/examples/attention_gpu.rs` (the interpreter tests' shapes against the
//! interpreter), for a GPU machine.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use half::{bf16, f16};
use kiln_dsl::DType;
use kiln_kernels::attention::gpu::{self, DeviceTensor, DeviceTensorMut, Gradients};
use kiln_kernels::attention::{AttentionParams, Layout};
use kiln_runtime::Device;

type Result<T> = std::result::Result<T, String>;

fn runtime(e: kiln_runtime::RuntimeError) -> String {
    e.to_string()
}

/// `len` standard-normal values (xorshift64* and Box-Muller), rounded to `dtype`, as bytes.
fn normal_bytes(dtype: DType, len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x2545_f491_4f6c_dd1d;
    let mut uniform = || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        // 53 random bits in (0, 1].
        ((state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    };
    let mut bytes = Vec::with_capacity(len * dtype.size_bytes());
    let mut spare = None;
    for _ in 0..len {
        let x = match spare.take() {
            Some(x) => x,
            None => {
                let (u1, u2) = (uniform(), uniform());
                let r = (-2.0 * u1.ln()).sqrt();
                let angle = std::f64::consts::TAU * u2;
                spare = Some(r * angle.sin());
                r * angle.cos()
            }
        } as f32;
        match dtype {
            DType::F16 => bytes.extend(f16::from_f32(x).to_le_bytes()),
            DType::BF16 => bytes.extend(bf16::from_f32(x).to_le_bytes()),
            DType::F32 => bytes.extend(x.to_le_bytes()),
            other => panic!("no normal inputs of {other}"),
        }
    }
    bytes
}

/// The poison: every byte 0xff is a NaN in f16, bf16 and f32.
const POISON: u8 = 0xff;

fn params(
    dtype: DType,
    head_dim: usize,
    causal: bool,
    [batch, seqlen_q, seqlen_k, heads_q, heads_kv]: [usize; 5],
) -> AttentionParams {
    AttentionParams {
        dtype,
        batch,
        seqlen_q,
        seqlen_k,
        heads_q,
        heads_kv,
        head_dim,
        causal,
        softmax_scale: AttentionParams::default_scale(head_dim),
        fused_backward: false,
    }
}

/// The check's shapes: `[batch, seqlen_q, seqlen_k, heads_q, heads_kv]` per (dtype, head dim,
/// causal). Every combination gets two ragged GQA shapes (seqlen_q < and > seqlen_k, as
/// `compare.py`); four get a ~4k MQA shape; seqlen 16k runs once per head dim (and once more
/// with seqlen_q > seqlen_k), to keep the fp32 reference and the files small.
fn check_cases() -> Vec<(String, AttentionParams)> {
    let mut cases = Vec::new();
    let mut add = |dtype: DType, head_dim: usize, causal: bool, shape: [usize; 5], fused: bool| {
        let [b, nq, nk, hq, hkv] = shape;
        let mask = if causal { "_causal" } else { "" };
        let backward = if fused { "_fused" } else { "" };
        cases.push((
            format!("{dtype}_d{head_dim}{mask}_b{b}_q{nq}_k{nk}_h{hq}x{hkv}{backward}"),
            AttentionParams {
                fused_backward: fused,
                ..params(dtype, head_dim, causal, shape)
            },
        ));
    };
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                add(dtype, head_dim, causal, [2, 777, 1031, 8, 2], false);
                add(dtype, head_dim, causal, [1, 1031, 513, 4, 4], false);
            }
        }
    }
    add(DType::BF16, 64, false, [1, 4097, 3001, 8, 1], false);
    add(DType::F16, 64, true, [1, 3001, 4097, 8, 1], false);
    add(DType::F16, 128, false, [1, 3001, 4097, 8, 1], false);
    add(DType::BF16, 128, true, [1, 4097, 3001, 8, 1], false);
    add(DType::F16, 64, false, [1, 15999, 16384, 8, 2], false);
    add(DType::BF16, 64, true, [1, 16384, 12289, 8, 8], false);
    add(DType::BF16, 128, true, [1, 16384, 16384, 16, 4], false);
    // The fused backward (dQ by atomic adds) on the ragged GQA shape, and once at 16k.
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                add(dtype, head_dim, causal, [2, 777, 1031, 8, 2], true);
            }
        }
    }
    add(DType::BF16, 128, true, [1, 16384, 15001, 16, 4], true);
    cases
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<()> {
    std::fs::write(dir.join(name), bytes).map_err(|e| format!("writing {name}: {e}"))
}

fn case_json(name: &str, p: &AttentionParams, error: Option<&str>) -> String {
    let mut json = String::new();
    let _ = write!(
        json,
        "{{\"name\": \"{name}\", \"dtype\": \"{}\", \"batch\": {}, \"seqlen_q\": {}, \
         \"seqlen_k\": {}, \"heads_q\": {}, \"heads_kv\": {}, \"head_dim\": {}, \"causal\": {}, \
         \"softmax_scale\": {:e}, \"layout\": \"[batch, seqlen, heads, head_dim] packed; lse \
         [batch, heads_q, seqlen_q] f32\"",
        p.dtype,
        p.batch,
        p.seqlen_q,
        p.seqlen_k,
        p.heads_q,
        p.heads_kv,
        p.head_dim,
        p.causal,
        p.softmax_scale
    );
    match error {
        Some(e) => {
            let _ = write!(
                json,
                ", \"error\": \"{}\"}}",
                e.replace('\\', "\\\\").replace('"', "'").replace('\n', " ")
            );
        }
        None => json.push_str(
            ", \"files\": {\"q\": \"q.bin\", \"k\": \"k.bin\", \"v\": \"v.bin\", \"do\": \"do.bin\", \
             \"o\": \"o.bin\", \"lse\": \"lse.bin\", \"dq\": \"dq.bin\", \"dk\": \"dk.bin\", \
             \"dv\": \"dv.bin\"}}",
        ),
    }
    json.push('\n');
    json
}

/// One case: forward and backward through the Rust API on poisoned outputs; the files written
/// and the GPU time of both passes.
fn check_one(device: &Device, p: &AttentionParams, seed: u64, dir: &Path) -> Result<f64> {
    let q_len = p.batch * p.seqlen_q * p.heads_q * p.head_dim;
    let k_len = p.batch * p.seqlen_k * p.heads_kv * p.head_dim;
    let inputs = [
        normal_bytes(p.dtype, q_len, seed),
        normal_bytes(p.dtype, k_len, seed + 1),
        normal_bytes(p.dtype, k_len, seed + 2),
        normal_bytes(p.dtype, q_len, seed + 3),
    ];
    let up = |bytes: &[u8]| device.upload_bytes(p.dtype, bytes).map_err(runtime);
    let poisoned = |dtype: DType, len: usize| device.filled(dtype, len, POISON).map_err(runtime);
    let (q, k, v, d_o) = (
        up(&inputs[0])?,
        up(&inputs[1])?,
        up(&inputs[2])?,
        up(&inputs[3])?,
    );
    let mut o = poisoned(p.dtype, q_len)?;
    let mut lse = poisoned(DType::F32, p.lse_len())?;
    let mut dq = poisoned(p.dtype, q_len)?;
    let mut dk = poisoned(p.dtype, k_len)?;
    let mut dv = poisoned(p.dtype, k_len)?;
    let ql = Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim);
    let kl = Layout::contiguous(p.seqlen_k, p.heads_kv, p.head_dim);
    let t = |buffer, layout| DeviceTensor { buffer, layout };
    device.synchronize().map_err(runtime)?;
    let start = device.record_event().map_err(runtime)?;
    gpu::forward(
        device,
        p,
        t(&q, ql),
        t(&k, kl),
        t(&v, kl),
        DeviceTensorMut {
            buffer: &mut o,
            layout: ql,
        },
        &mut lse,
    )
    .map_err(|e| e.to_string())?;
    gpu::backward(
        device,
        p,
        [t(&q, ql), t(&k, kl), t(&v, kl), t(&o, ql), t(&d_o, ql)],
        &lse,
        Gradients {
            dq: DeviceTensorMut {
                buffer: &mut dq,
                layout: ql,
            },
            dk: DeviceTensorMut {
                buffer: &mut dk,
                layout: kl,
            },
            dv: DeviceTensorMut {
                buffer: &mut dv,
                layout: kl,
            },
        },
    )
    .map_err(|e| e.to_string())?;
    let end = device.record_event().map_err(runtime)?;
    device.synchronize().map_err(runtime)?;
    let ms = start.elapsed_ms(&end).map_err(runtime)? as f64;
    for (name, bytes) in ["q.bin", "k.bin", "v.bin", "do.bin"].iter().zip(&inputs) {
        write(dir, name, bytes)?;
    }
    for (name, buffer) in [
        ("o.bin", &o),
        ("lse.bin", &lse),
        ("dq.bin", &dq),
        ("dk.bin", &dk),
        ("dv.bin", &dv),
    ] {
        write(dir, name, &buffer.to_bytes(device).map_err(runtime)?)?;
    }
    Ok(ms)
}

fn check(device: &Device, out: &Path, filter: &str) -> Result<bool> {
    let mut all_ran = true;
    for (index, (name, p)) in check_cases().into_iter().enumerate() {
        if !name.contains(filter) {
            continue;
        }
        let dir = out.join(&name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let outcome = check_one(device, &p, 1000 * index as u64 + 7, &dir);
        let json = case_json(&name, &p, outcome.as_ref().err().map(String::as_str));
        write(&dir, "case.json", json.as_bytes())?;
        match outcome {
            Ok(ms) => println!("{name:48} ran: forward + backward {ms:9.3} ms"),
            Err(e) => {
                println!("{name:48} FAILED: {e}");
                all_ran = false;
            }
        }
    }
    Ok(all_ran)
}

const USAGE: &str = "usage: kiln-attention-gpu --check DIR [--filter TEXT]";

fn run(args: &[String]) -> Result<bool> {
    let (mut dir, mut filter) = (None::<PathBuf>, String::new());
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{arg} expects a value"))
        };
        match arg.as_str() {
            "--check" => dir = Some(PathBuf::from(value()?)),
            "--filter" => filter = value()?,
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    let dir = dir.ok_or_else(|| USAGE.to_string())?;
    let device = Device::current_or_default().map_err(runtime)?;
    let (major, minor) = device.compute_capability().map_err(runtime)?;
    eprintln!(
        "device {}: {} (compute capability {major}.{minor}), KILN_TARGET={}",
        device.ordinal(),
        device.name().unwrap_or_else(|e| e.to_string()),
        std::env::var("KILN_TARGET").unwrap_or_else(|_| "(the device's)".to_string())
    );
    check(&device, &dir, &filter)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
