//! The attention harness for a GPU: kiln's four attention kernels (forward, preprocess, dQ,
//! dK/dV) at sizes up to seqlen 16k, from the PTX kiln-kernels ships (`kernels/ptx/`, or a
//! directory of the same form given with `--ptx`), launched with exactly the
//! specialisations, grids and arguments of `kiln_kernels::attention::cpu`. It links no LLVM.
//!
//! ```text
//! kiln-attention-gpu --check DIR [--ptx DIR] [--filter TEXT]
//!     ragged shapes up to seqlen 16k (GQA/MQA, seqlen_q != seqlen_k both ways, causal and not,
//!     f16 and bf16, head dims 64 and 128): random normal inputs, forward + backward on the GPU
//!     with every output and the delta workspace poisoned (NaN) first; writes each case's inputs
//!     and outputs as raw little-endian files and a `case.json` under DIR/<case>/. The judge is
//!     `scripts/attention_vs_sdpa.py check DIR` (fp32 reference, PyTorch SDPA's error as the bar).
//! kiln-attention-gpu --interp-shapes [--ptx DIR] [--filter TEXT]
//!     the interpreter tests' designed shapes (`attention::check::designed_cases`, but the f32
//!     ones: the kernels are compiled for f16 and bf16), each in its strided layout: forward +
//!     backward on the GPU with every output poisoned (padding too) and on the interpreter on
//!     the same inputs; every GPU output against the interpreter's with the interpreter tests'
//!     measures and bars (`check::Tolerance`: worst-row relative error, the gradients' also
//!     against the size of their terms), every element written, padding untouched, LSE -inf
//!     exactly where the interpreter has it. Prints a table; exits non-zero on a failure.
//! kiln-attention-gpu --time [--ptx DIR] [--seqs 1024,2048] [--rep N]
//!     forward and backward (preprocess + dQ + dK/dV) at the FlashAttention benchmark setup
//!     (bf16, head dims 64 and 128, causal and not, batch = 16384 / seqlen, heads = 2048 /
//!     head_dim), timed with CUDA events (warm-up, then the median of N samples); prints JSON
//!     with TFLOP/s (forward 4 B H N^2 D, halved when causal; backward 2.5x forward).
//! ```
//!
//! Each mode runs the PTX of the device's best target (sm_90a on compute capability 9.0, else
//! sm_80); `--target sm_80` runs the portable PTX on a Hopper GPU too.
//!
//! `scripts/device-attention.sh` builds it here and stages it with the script for a GPU machine.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use half::{bf16, f16};
use kiln_dsl::{DType, Kernel, Target};
use kiln_kernels::attention::check::{self, Inputs, Outputs, StridedTensor, Tolerance};
use kiln_kernels::attention::plan::{
    self, Arg, AttentionKernel, BackwardLayouts, ForwardLayouts, Launch, Role,
};
use kiln_kernels::attention::{AttentionParams, Layout, prebuilt};
use kiln_kernels::reference::Rng;
use kiln_runtime::{Device, DeviceBuffer, Function, LaunchArg, LaunchConfig, ParamType};

type Result<T> = std::result::Result<T, String>;

fn runtime(e: kiln_runtime::RuntimeError) -> String {
    e.to_string()
}

// ---- PTX: the shipped set, or a directory of the same form ----

/// PTX by case name, with the dynamic shared memory its launch gives.
struct PtxSet {
    entries: HashMap<String, (String, u32)>,
    source: String,
}

impl PtxSet {
    /// The PTX kiln-kernels ships, compiled into this binary.
    fn shipped() -> PtxSet {
        PtxSet {
            entries: prebuilt::all()
                .map(|(name, ptx)| (name.to_string(), (ptx.text.to_string(), ptx.shared_bytes)))
                .collect(),
            source: "kernels/ptx (kiln-kernels' shipped set, compiled in)".to_string(),
        }
    }

    /// A directory laid out as `kernels/ptx`: its `mod.rs` lists
    /// `("name", include_str!("name.ptx"), shared_bytes),` and `name.ptx` sits beside it.
    fn from_dir(dir: &Path) -> Result<PtxSet> {
        let index = std::fs::read_to_string(dir.join("mod.rs"))
            .map_err(|e| format!("reading {}: {e}", dir.join("mod.rs").display()))?;
        let mut entries = HashMap::new();
        for line in index.lines().map(str::trim) {
            let Some(rest) = line.strip_prefix("(\"") else {
                continue;
            };
            let name = rest.split('"').next().unwrap_or_default();
            let shared = line
                .trim_end_matches("),")
                .rsplit(',')
                .next()
                .and_then(|s| s.trim().parse::<u32>().ok())
                .ok_or_else(|| format!("cannot read the shared bytes in `{line}`"))?;
            let path = dir.join(format!("{name}.ptx"));
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            entries.insert(name.to_string(), (text, shared));
        }
        Ok(PtxSet {
            entries,
            source: dir.display().to_string(),
        })
    }
}

// ---- the kernels of one specialisation ----

/// One loaded attention kernel: its function, warps and dynamic shared memory.
struct Loaded {
    function: Function,
    num_warps: u32,
    shared_bytes: u32,
}

/// The four kernels of one (dtype, head dim, causal).
/// The loaded kernels of one specialisation of a call (forward, preprocess, dQ, dK/dV).
struct Kernels {
    target: Target,
    loaded: HashMap<AttentionKernel, Loaded>,
}

fn load(
    device: &Device,
    set: &PtxSet,
    kernel: &Kernel,
    name: &str,
    num_warps: u32,
) -> Result<Loaded> {
    let (text, shared_bytes) = set.entries.get(name).ok_or_else(|| {
        format!(
            "no PTX for {name} in {}: kiln ships every specialisation of \
             `attention::prebuilt::shipped` (bless with KILN_BLESS=1 cargo test -p kiln-codegen)",
            set.source
        )
    })?;
    let module = device.load_module(name, text).map_err(runtime)?;
    let function = module
        .function(kernel.name(), ParamType::of_kernel(kernel))
        .map_err(runtime)?;
    if *shared_bytes > 0 {
        function
            .set_max_dynamic_shared_bytes(*shared_bytes)
            .map_err(runtime)?;
    }
    Ok(Loaded {
        function,
        num_warps,
        shared_bytes: *shared_bytes,
    })
}

/// The launches of a call with packed tensors on `target`: the forward's, then the backward's.
fn launches(p: &AttentionParams, target: Target) -> Result<Vec<Launch>> {
    strided_launches(
        p,
        target,
        Layout::contiguous(p.seqlen_q, p.heads_q, p.head_dim),
        Layout::contiguous(p.seqlen_k, p.heads_kv, p.head_dim),
    )
}

/// The launches of a call on `target` whose Q, O, dO and dQ are laid out as `q`, K, V, dK and
/// dV as `k`.
fn strided_launches(
    p: &AttentionParams,
    target: Target,
    q: Layout,
    k: Layout,
) -> Result<Vec<Launch>> {
    let forward = plan::forward(p, &ForwardLayouts { q, k, v: k, o: q }, target)
        .map_err(|e| e.to_string())?;
    let layouts = BackwardLayouts {
        q,
        k,
        v: k,
        o: q,
        d_o: q,
        dq: q,
        dk: k,
        dv: k,
    };
    let backward = plan::backward(p, &layouts, target).map_err(|e| e.to_string())?;
    Ok(std::iter::once(forward).chain(backward).collect())
}

/// Each kernel of a call on `target` built at its specialisation.
fn specialisations(p: &AttentionParams, target: Target) -> Result<Vec<(Launch, Kernel)>> {
    launches(p, target)?
        .into_iter()
        .map(|launch| {
            let kernel = launch
                .kernel
                .build(&launch.spec)
                .map_err(|e| e.to_string())?;
            Ok((launch, kernel))
        })
        .collect()
}

impl Kernels {
    fn load(device: &Device, set: &PtxSet, target: Target, p: &AttentionParams) -> Result<Kernels> {
        let mut loaded = HashMap::new();
        for (launch, kernel) in specialisations(p, target)? {
            let function = load(device, set, &kernel, &launch.name, launch.config.num_warps)?;
            loaded.insert(launch.kernel, function);
        }
        Ok(Kernels { target, loaded })
    }
}

/// The loaded kernels of every specialisation asked for so far.
struct Cache<'a> {
    device: &'a Device,
    set: PtxSet,
    target: Target,
    loaded: HashMap<(DType, usize, bool), Kernels>,
}

impl Cache<'_> {
    fn get(&mut self, p: &AttentionParams) -> Result<&Kernels> {
        let key = (p.dtype, p.head_dim, p.causal);
        if !self.loaded.contains_key(&key) {
            let kernels = Kernels::load(self.device, &self.set, self.target, p)?;
            self.loaded.insert(key, kernels);
        }
        Ok(&self.loaded[&key])
    }
}

// ---- one attention call on the GPU: the launches of kiln_kernels::attention::cpu ----

/// The buffers of one call; tensors `[batch, seqlen, heads, head_dim]` packed, LSE and delta
/// `[batch, heads_q, seqlen_q]` f32. Buffers may be longer than the call needs.
struct Tensors {
    q: DeviceBuffer,
    k: DeviceBuffer,
    v: DeviceBuffer,
    d_o: DeviceBuffer,
    o: DeviceBuffer,
    lse: DeviceBuffer,
    dq: DeviceBuffer,
    dk: DeviceBuffer,
    dv: DeviceBuffer,
    delta: DeviceBuffer,
}

/// Runs one planned launch with each role bound to this call's device buffer.
fn run(device: &Device, kernels: &Kernels, launch: &Launch, t: &Tensors) -> Result<()> {
    let kernel = &kernels.loaded[&launch.kernel];
    let args: Vec<LaunchArg<'_>> = launch
        .args
        .iter()
        .map(|arg| match *arg {
            Arg::Buffer(role) => LaunchArg::Buffer(match role {
                Role::Q => &t.q,
                Role::K => &t.k,
                Role::V => &t.v,
                Role::O => &t.o,
                Role::Lse => &t.lse,
                Role::DO => &t.d_o,
                Role::Dq => &t.dq,
                Role::Dk => &t.dk,
                Role::Dv => &t.dv,
                Role::Delta => &t.delta,
            }),
            Arg::I32(v) => LaunchArg::I32(v),
            Arg::I64(v) => LaunchArg::I64(v),
            Arg::F32(v) => LaunchArg::F32(v),
        })
        .collect();
    let config = LaunchConfig::new(launch.grid, kernel.num_warps * 32)
        .with_dynamic_shared_bytes(kernel.shared_bytes);
    // Safety: the PTX is this specialisation's kernel, whose parameters `ParamType::of_kernel`
    // lists; the buffers hold at least the elements the sizes and packed strides address, which
    // is all the kernel reads or writes (its loads and stores are masked at the sizes).
    unsafe { device.launch(&kernel.function, config, &args) }.map_err(runtime)
}

/// The forward launch: O and LSE from Q, K, V.
fn run_forward(device: &Device, k: &Kernels, p: &AttentionParams, t: &Tensors) -> Result<()> {
    let forward = launches(p, k.target)?.swap_remove(0);
    run(device, k, &forward, t)
}

/// The backward launches, in order: preprocessing (delta), dQ, dK/dV.
fn run_backward(device: &Device, k: &Kernels, p: &AttentionParams, t: &Tensors) -> Result<()> {
    for launch in &launches(p, k.target)?[1..] {
        run(device, k, launch, t)?;
    }
    Ok(())
}

// ---- inputs ----

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

/// Elements of `bytes` (of `dtype`, f16/bf16/f32) that are NaN: the poison a kernel left.
fn count_nan(dtype: DType, bytes: &[u8]) -> usize {
    match dtype {
        DType::F16 => bytes
            .chunks_exact(2)
            .filter(|c| f16::from_le_bytes([c[0], c[1]]).is_nan())
            .count(),
        DType::BF16 => bytes
            .chunks_exact(2)
            .filter(|c| bf16::from_le_bytes([c[0], c[1]]).is_nan())
            .count(),
        _ => bytes
            .chunks_exact(4)
            .filter(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_nan())
            .count(),
    }
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
    }
}

fn elements(p: &AttentionParams) -> (usize, usize, usize) {
    (
        p.batch * p.seqlen_q * p.heads_q * p.head_dim,
        p.batch * p.seqlen_k * p.heads_kv * p.head_dim,
        p.lse_len(),
    )
}

// ---- --check ----

/// The check's shapes: `[batch, seqlen_q, seqlen_k, heads_q, heads_kv]` per (dtype, head dim,
/// causal). Every combination gets two ragged GQA shapes (seqlen_q < and > seqlen_k, as
/// `compare.py`); four get a ~4k MQA shape; seqlen 16k runs once per head dim (and once more
/// with seqlen_q > seqlen_k), to keep the fp32 reference and the files small.
fn check_cases() -> Vec<(String, AttentionParams)> {
    let mut cases = Vec::new();
    let mut add = |dtype: DType, head_dim: usize, causal: bool, shape: [usize; 5]| {
        let [b, nq, nk, hq, hkv] = shape;
        let mask = if causal { "_causal" } else { "" };
        cases.push((
            format!("{dtype}_d{head_dim}{mask}_b{b}_q{nq}_k{nk}_h{hq}x{hkv}"),
            params(dtype, head_dim, causal, shape),
        ));
    };
    for dtype in [DType::F16, DType::BF16] {
        for head_dim in [64, 128] {
            for causal in [false, true] {
                add(dtype, head_dim, causal, [2, 777, 1031, 8, 2]);
                add(dtype, head_dim, causal, [1, 1031, 513, 4, 4]);
            }
        }
    }
    add(DType::BF16, 64, false, [1, 4097, 3001, 8, 1]);
    add(DType::F16, 64, true, [1, 3001, 4097, 8, 1]);
    add(DType::F16, 128, false, [1, 3001, 4097, 8, 1]);
    add(DType::BF16, 128, true, [1, 4097, 3001, 8, 1]);
    add(DType::F16, 64, false, [1, 15999, 16384, 8, 2]);
    add(DType::BF16, 64, true, [1, 16384, 12289, 8, 8]);
    add(DType::BF16, 128, true, [1, 16384, 16384, 16, 4]);
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

fn check_one(
    device: &Device,
    cache: &mut Cache<'_>,
    p: &AttentionParams,
    seed: u64,
    dir: &Path,
) -> Result<f64> {
    let kernels = cache.get(p)?;
    let (q_len, k_len, rows) = elements(p);
    let inputs = [
        normal_bytes(p.dtype, q_len, seed),
        normal_bytes(p.dtype, k_len, seed + 1),
        normal_bytes(p.dtype, k_len, seed + 2),
        normal_bytes(p.dtype, q_len, seed + 3),
    ];
    let up = |bytes: &[u8]| device.upload_bytes(p.dtype, bytes).map_err(runtime);
    let poisoned = |dtype: DType, len: usize| device.filled(dtype, len, POISON).map_err(runtime);
    let t = Tensors {
        q: up(&inputs[0])?,
        k: up(&inputs[1])?,
        v: up(&inputs[2])?,
        d_o: up(&inputs[3])?,
        o: poisoned(p.dtype, q_len)?,
        lse: poisoned(DType::F32, rows)?,
        dq: poisoned(p.dtype, q_len)?,
        dk: poisoned(p.dtype, k_len)?,
        dv: poisoned(p.dtype, k_len)?,
        delta: poisoned(DType::F32, rows)?,
    };
    device.synchronize().map_err(runtime)?;
    let start = device.record_event().map_err(runtime)?;
    run_forward(device, kernels, p, &t)?;
    run_backward(device, kernels, p, &t)?;
    let end = device.record_event().map_err(runtime)?;
    device.synchronize().map_err(runtime)?;
    let ms = start.elapsed_ms(&end).map_err(runtime)? as f64;
    for (name, bytes) in ["q.bin", "k.bin", "v.bin", "do.bin"].iter().zip(&inputs) {
        write(dir, name, bytes)?;
    }
    for (name, buffer) in [
        ("o.bin", &t.o),
        ("lse.bin", &t.lse),
        ("dq.bin", &t.dq),
        ("dk.bin", &t.dk),
        ("dv.bin", &t.dv),
    ] {
        write(dir, name, &buffer.to_bytes(device).map_err(runtime)?)?;
    }
    Ok(ms)
}

fn check(device: &Device, cache: &mut Cache<'_>, out: &Path, filter: &str) -> Result<bool> {
    let mut all_ran = true;
    for (index, (name, p)) in check_cases().into_iter().enumerate() {
        if !name.contains(filter) {
            continue;
        }
        let dir = out.join(&name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        let outcome = check_one(device, cache, &p, 1000 * index as u64 + 7, &dir);
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

// ---- --interp-shapes ----

/// The designed cases the GPU runs (the f32 ones are the interpreter's only), with names.
fn interp_cases() -> Vec<(String, check::Case)> {
    check::designed_cases()
        .into_iter()
        .filter(|c| c.params.dtype != DType::F32)
        .map(|c| {
            let p = &c.params;
            let mask = if p.causal { "_causal" } else { "" };
            let name = format!(
                "{}_d{}{mask}_b{}_q{}_k{}_h{}x{}_{:?}_s{:.3}{}",
                p.dtype,
                p.head_dim,
                p.batch,
                p.seqlen_q,
                p.seqlen_k,
                p.heads_q,
                p.heads_kv,
                c.layout,
                p.softmax_scale,
                if c.input_scale > 1.0 { "_large" } else { "" }
            );
            (name, c)
        })
        .collect()
}

/// One designed case on the GPU and the interpreter: the GPU's report against the interpreter,
/// with the f64 reference's sizes of the gradients' terms.
fn interp_one(
    device: &Device,
    cache: &mut Cache<'_>,
    c: &check::Case,
    seed: u64,
) -> Result<check::Report> {
    let p = &c.params;
    let inputs = Inputs::random(p, c.layout, c.input_scale, &mut Rng::new(seed));
    let interpreter = Outputs::poisoned(p, &inputs);
    check::run_interpreter(p, cache.target, &inputs, &interpreter).map_err(|e| e.to_string())?;
    let faults = interpreter.faults();
    if !faults.is_empty() {
        return Err(format!("the interpreter: {}", faults.join("; ")));
    }
    // The device gets the inputs and the poison (padding included) as the interpreter had them.
    let poisoned = Outputs::poisoned(p, &inputs);
    let up = |b: &kiln_dsl::HostBuffer| device.upload(b).map_err(runtime);
    let t = Tensors {
        q: up(&inputs.q.buffer)?,
        k: up(&inputs.k.buffer)?,
        v: up(&inputs.v.buffer)?,
        d_o: up(&inputs.d_o.buffer)?,
        o: up(&poisoned.o.buffer)?,
        lse: up(&poisoned.lse)?,
        dq: up(&poisoned.dq.buffer)?,
        dk: up(&poisoned.dk.buffer)?,
        dv: up(&poisoned.dv.buffer)?,
        delta: up(&poisoned.delta)?,
    };
    let kernels = cache.get(p)?;
    for launch in strided_launches(p, kernels.target, inputs.q.layout, inputs.k.layout)? {
        run(device, kernels, &launch, &t)?;
    }
    device.synchronize().map_err(runtime)?;
    let down = |b: &DeviceBuffer| b.to_host(device).map_err(runtime);
    let like = |b: &DeviceBuffer, t: &StridedTensor| -> Result<StridedTensor> {
        Ok(StridedTensor {
            buffer: down(b)?,
            layout: t.layout,
            dims: t.dims,
        })
    };
    let gpu = Outputs {
        o: like(&t.o, &poisoned.o)?,
        lse: down(&t.lse)?,
        dq: like(&t.dq, &poisoned.dq)?,
        dk: like(&t.dk, &poisoned.dk)?,
        dv: like(&t.dv, &poisoned.dv)?,
        delta: down(&t.delta)?,
    };
    let want = interpreter.as_reference(inputs.reference(p));
    Ok(gpu.compare(p, &want, c.input_scale > 1.0))
}

/// Runs every designed case; prints one row per case and the worst error of each output per
/// dtype against its bar. Returns whether all passed.
fn interp_shapes(device: &Device, cache: &mut Cache<'_>, filter: &str) -> Result<bool> {
    println!(
        "GPU vs interpreter, worst-row relative error (gradients at |s|~100: against their terms)"
    );
    println!(
        "{:52} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}  result",
        "case", "o", "lse", "dq", "dk", "dv", "dq/terms", "dk/terms", "dv/terms"
    );
    let mut worst = std::collections::BTreeMap::<(&str, bool), [f64; 8]>::new();
    let (mut passed, mut failed) = (0, 0);
    for (index, (name, c)) in interp_cases().into_iter().enumerate() {
        if !name.contains(filter) {
            continue;
        }
        let start = std::time::Instant::now();
        let report = match interp_one(device, cache, &c, 7919 * index as u64 + 11) {
            Ok(report) => report,
            Err(e) => {
                println!("{name:52} FAILED: {e}");
                failed += 1;
                continue;
            }
        };
        let [cq, ck, cv] = report.conditioned;
        let errors = [
            report.o, report.lse, report.dq, report.dk, report.dv, cq, ck, cv,
        ];
        let w = worst
            .entry((c.params.dtype.name(), report.large_scores))
            .or_default();
        for (slot, err) in w.iter_mut().zip(errors) {
            *slot = slot.max(err);
        }
        let failures = report.failures(Tolerance::for_dtype(c.params.dtype));
        let mut row = format!("{name:52}");
        for err in errors {
            let _ = write!(row, " {err:>9.2e}");
        }
        let seconds = start.elapsed().as_secs_f64();
        if failures.is_empty() {
            println!("{row}  ok ({seconds:.1} s)");
            passed += 1;
        } else {
            println!("{row}  FAILED ({seconds:.1} s)");
            for failure in failures {
                println!("    {failure}");
            }
            failed += 1;
        }
    }
    println!(
        "worst per output (bars: check::Tolerance; dQ, dK, dV at |s|~100 judged against their terms only):"
    );
    for ((dtype, large), errors) in &worst {
        let bars = Tolerance::for_dtype(DType::from_name(dtype).unwrap_or(DType::F32));
        let grad = if *large {
            "-".to_string()
        } else {
            format!("{:.1e}", bars.grad)
        };
        println!(
            "  {dtype} {}: o {:.2e} (bar {:.1e}), lse {:.2e} ({:.1e}), dq {:.2e} / dk {:.2e} / dv {:.2e} ({grad}), against terms {:.2e} / {:.2e} / {:.2e} ({:.1e})",
            if *large { "|s|~100" } else { "|s|~1" },
            errors[0],
            bars.o,
            errors[1],
            bars.lse,
            errors[2],
            errors[3],
            errors[4],
            errors[5],
            errors[6],
            errors[7],
            bars.grad_terms
        );
    }
    println!("{passed} cases agree with the interpreter, {failed} do not");
    Ok(failed == 0 && passed > 0)
}

// ---- --time ----

/// Median GPU time in ms of `samples` calls of `body` after `warmup` calls, each call timed
/// between two events.
fn median_ms(
    device: &Device,
    warmup: usize,
    samples: usize,
    mut body: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..warmup {
        body()?;
    }
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let start = device.record_event().map_err(runtime)?;
        body()?;
        let end = device.record_event().map_err(runtime)?;
        times.push(start.elapsed_ms(&end).map_err(runtime)? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The FlashAttention benchmark setup: batch = TOKENS / seqlen, heads = HIDDEN / head_dim.
const TOKENS: usize = 16384;
const HIDDEN: usize = 2048;

fn time(device: &Device, cache: &mut Cache<'_>, seqs: &[usize], samples: usize) -> Result<String> {
    let dtype = DType::BF16;
    // Every shape of the setup has TOKENS x HIDDEN elements per tensor: one set of buffers
    // serves them all (rows of LSE and delta: TOKENS x HIDDEN / head_dim, largest at 64).
    let len = TOKENS * HIDDEN;
    let rows = TOKENS * HIDDEN / 64;
    let up = |seed: u64| {
        device
            .upload_bytes(dtype, &normal_bytes(dtype, len, seed))
            .map_err(runtime)
    };
    let mut t = Tensors {
        q: up(1)?,
        k: up(2)?,
        v: up(3)?,
        d_o: up(4)?,
        o: device.filled(dtype, len, POISON).map_err(runtime)?,
        lse: device.filled(DType::F32, rows, POISON).map_err(runtime)?,
        dq: device.filled(dtype, len, POISON).map_err(runtime)?,
        dk: device.filled(dtype, len, POISON).map_err(runtime)?,
        dv: device.filled(dtype, len, POISON).map_err(runtime)?,
        delta: device.filled(DType::F32, rows, POISON).map_err(runtime)?,
    };
    let mut json = format!(
        "{{\"gpu\": \"{}\", \"dtype\": \"bf16\", \"samples\": {samples}, \"rows\": [\n",
        device.name().unwrap_or_default()
    );
    let mut first = true;
    for (head_dim, causal, n, b, h) in timed_shapes(seqs) {
        let p = params(dtype, head_dim, causal, [b, n, n, h, h]);
        let kernels = cache.get(&p)?;
        // One poisoned run first: every output element of the timed shape is written.
        for buffer in [&mut t.o, &mut t.dq, &mut t.dk, &mut t.dv] {
            buffer.fill(device, POISON).map_err(runtime)?;
        }
        run_forward(device, kernels, &p, &t)?;
        run_backward(device, kernels, &p, &t)?;
        let mut unwritten = 0;
        for buffer in [&t.o, &t.dq, &t.dk, &t.dv] {
            unwritten += count_nan(dtype, &buffer.to_bytes(device).map_err(runtime)?);
        }
        let fwd_ms = median_ms(device, 2, samples, || run_forward(device, kernels, &p, &t))?;
        let bwd_ms = median_ms(device, 2, samples, || run_backward(device, kernels, &p, &t))?;
        let flops = 4.0 * (b * h) as f64 * (n * n) as f64 * head_dim as f64
            / if causal { 2.0 } else { 1.0 };
        let (fwd, bwd) = (flops / fwd_ms / 1e9, 2.5 * flops / bwd_ms / 1e9);
        eprintln!(
            "kiln D={head_dim:3} causal={} N={n:5} B={b:2} H={h:2} | fwd {fwd_ms:8.3} ms \
             {fwd:6.1} TFLOP/s | bwd {bwd_ms:8.3} ms {bwd:6.1} TFLOP/s | unwritten {unwritten}",
            causal as u8
        );
        if !first {
            json.push_str(",\n");
        }
        first = false;
        let _ = write!(
            json,
            "  {{\"D\": {head_dim}, \"causal\": {causal}, \"N\": {n}, \"B\": {b}, \"H\": {h}, \
             \"fwd_ms\": {fwd_ms:.4}, \"bwd_ms\": {bwd_ms:.4}, \"kiln_fwd\": {fwd:.2}, \
             \"kiln_bwd\": {bwd:.2}, \"unwritten\": {unwritten}}}"
        );
    }
    json.push_str("\n]}\n");
    Ok(json)
}

// ---- --plan ----

/// The timed shapes: (head dim, causal, seqlen, batch, heads), bf16.
fn timed_shapes(seqs: &[usize]) -> Vec<(usize, bool, usize, usize, usize)> {
    let mut shapes = Vec::new();
    for head_dim in [64usize, 128] {
        for causal in [false, true] {
            for &n in seqs {
                shapes.push((head_dim, causal, n, TOKENS / n, HIDDEN / head_dim));
            }
        }
    }
    shapes
}

/// Without a GPU: the check's cases, the interpreter shapes, the timed shapes, and the PTX each
/// needs (sm_90a), with what the set lacks; an error if it lacks any.
fn plan(set: &PtxSet, options: &Options) -> Result<()> {
    println!("PTX from {} ({} entries)", set.source, set.entries.len());
    let mut calls: Vec<(String, AttentionParams)> = check_cases()
        .into_iter()
        .chain(
            interp_cases()
                .into_iter()
                .map(|(name, c)| (format!("interp {name}"), c.params)),
        )
        .filter(|(name, _)| name.contains(&options.filter))
        .collect();
    for (head_dim, causal, n, b, h) in timed_shapes(&options.seqs) {
        let mask = if causal { "_causal" } else { "" };
        calls.push((
            format!("time bf16_d{head_dim}{mask}_n{n}_b{b}_h{h}"),
            params(DType::BF16, head_dim, causal, [b, n, n, h, h]),
        ));
    }
    let mut missing = std::collections::BTreeSet::new();
    for (name, p) in &calls {
        let names: Vec<String> = specialisations(p, Target::Sm90a)?
            .into_iter()
            .map(|(launch, _)| {
                let ptx = launch.name;
                if set.entries.contains_key(&ptx) {
                    ptx
                } else {
                    missing.insert(ptx.clone());
                    format!("{ptx} (MISSING)")
                }
            })
            .collect();
        println!("{name:48} {}", names.join(" "));
    }
    if missing.is_empty() {
        println!("every PTX the runs need is there");
        Ok(())
    } else {
        Err(format!(
            "{} PTX missing from {}: {}",
            missing.len(),
            set.source,
            missing.into_iter().collect::<Vec<_>>().join(", ")
        ))
    }
}

// ---- main ----

struct Options {
    check: Option<PathBuf>,
    interp_shapes: bool,
    time: bool,
    plan: bool,
    ptx: Option<PathBuf>,
    /// The PTX target to run; by default the device's best (`Target::for_capability`).
    target: Option<Target>,
    filter: String,
    seqs: Vec<usize>,
    samples: usize,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut options = Options {
        check: None,
        interp_shapes: false,
        time: false,
        plan: false,
        ptx: None,
        target: None,
        filter: String::new(),
        seqs: vec![1024, 2048, 4096, 8192, 16384],
        samples: 10,
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .cloned()
                .ok_or_else(|| format!("{arg} expects a value"))
        };
        match arg.as_str() {
            "--check" => options.check = Some(PathBuf::from(value()?)),
            "--interp-shapes" => options.interp_shapes = true,
            "--time" => options.time = true,
            "--plan" => options.plan = true,
            "--ptx" => options.ptx = Some(PathBuf::from(value()?)),
            "--target" => {
                options.target = Some(value()?.parse().map_err(|e| format!("--target: {e}"))?)
            }
            "--filter" => options.filter = value()?,
            "--seqs" => {
                options.seqs = value()?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<usize>()
                            .map_err(|e| format!("--seqs: {e}"))
                    })
                    .collect::<Result<_>>()?;
                if let Some(bad) = options.seqs.iter().find(|&&n| n == 0 || 16384 % n != 0) {
                    return Err(format!("--seqs: {bad} does not divide 16384"));
                }
            }
            "--rep" => {
                options.samples = value()?
                    .parse::<usize>()
                    .map_err(|e| format!("--rep: {e}"))?
                    .max(1)
            }
            // What `cargo test` may pass to a test binary without a harness.
            "--nocapture" | "--test-threads=1" => {}
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(options)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = match parse(&args) {
        Ok(options) => options,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if options.check.is_none() && !options.interp_shapes && !options.time && !options.plan {
        eprintln!(
            "usage: kiln-attention-gpu --check DIR | --interp-shapes | --time | --plan \
             [--ptx DIR] [--filter TEXT] [--seqs 1024,2048] [--rep N]"
        );
        return ExitCode::FAILURE;
    }
    let set = match &options.ptx {
        Some(dir) => match PtxSet::from_dir(dir) {
            Ok(set) => set,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => PtxSet::shipped(),
    };
    if options.plan {
        return match plan(&set, &options) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let device = match Device::current_or_default() {
        Ok(device) => device,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let capability = device.compute_capability().unwrap_or((0, 0));
    let Some(target) = options
        .target
        .or_else(|| Target::for_capability(capability.0, capability.1))
    else {
        eprintln!(
            "error: kiln's kernels need compute capability 8.0 or newer, got {}.{}",
            capability.0, capability.1
        );
        return ExitCode::FAILURE;
    };
    eprintln!(
        "device {}: {} (compute capability {}.{}), {target} PTX from {}",
        device.ordinal(),
        device.name().unwrap_or_else(|e| e.to_string()),
        capability.0,
        capability.1,
        set.source
    );
    let mut cache = Cache {
        device: &device,
        set,
        target,
        loaded: HashMap::new(),
    };
    let mut ok = true;
    if let Some(dir) = &options.check {
        match check(&device, &mut cache, dir, &options.filter) {
            Ok(all_ran) => ok &= all_ran,
            Err(e) => {
                eprintln!("error: {e}");
                ok = false;
            }
        }
    }
    if options.interp_shapes {
        match interp_shapes(&device, &mut cache, &options.filter) {
            Ok(all_passed) => ok &= all_passed,
            Err(e) => {
                eprintln!("error: {e}");
                ok = false;
            }
        }
    }
    if options.time {
        match time(&device, &mut cache, &options.seqs, options.samples) {
            Ok(json) => print!("{json}"),
            Err(e) => {
                eprintln!("error: {e}");
                ok = false;
            }
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
