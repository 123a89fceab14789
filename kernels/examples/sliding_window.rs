//! Sliding-window attention with tanh soft-capping, forward only, written in kiln's DSL from
//! scratch as a user would: the kernel, a launcher on the CPU interpreter, an f64 reference.
//!
//! Semantics (kiln's C ABI): with `shift = seqlen_k - seqlen_q`, query row i sees key j iff
//! `j >= i + shift - window_left` (when `window_left >= 0`) and `j <= i + shift + window_right`
//! (when `window_right >= 0`); -1 leaves a side unbounded. Scores are `s = softmax_scale q.k`,
//! soft-capped to `softcap tanh(s / softcap)` when a cap is set, then masked. A row that sees no
//! key gets O = 0 and LSE = -inf. Tensors are `[batch, seqlen, heads, head_dim]`, LSE is
//! `[batch, heads, seqlen_q]` f32 (natural log).
//!
//! `cargo run --release -p kiln-kernels --example sliding_window` runs one case and prints its
//! error; `cargo test --release -p kiln-kernels --example sliding_window` runs the tests.

use kiln_dsl::{DType, Grid, HostBuffer, KernelArg, Spec, kernel};
use kiln_kernels::attention::Layout;
use kiln_kernels::reference::{Rng, row_error};

/// One program per (query block, batch x head). Key tiles wholly outside every row's window are
/// never visited; tiles wholly inside every row's window (and the sequence) skip the mask.
#[kernel]
pub fn sliding_window_fwd<
    T,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const SOFTCAP: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    o: Ptr<T>,
    lse: Ptr<f32>,
    seqlen_q: i32,
    seqlen_k: i32,
    heads: i32,
    q_batch_stride: i64,
    q_seq_stride: i64,
    q_head_stride: i64,
    k_batch_stride: i64,
    k_seq_stride: i64,
    k_head_stride: i64,
    v_batch_stride: i64,
    v_seq_stride: i64,
    v_head_stride: i64,
    o_batch_stride: i64,
    o_seq_stride: i64,
    o_head_stride: i64,
    window_left: i32,
    window_right: i32,
    softmax_scale: f32,
    softcap: f32,
) {
    let start_m = program_id(0);
    let batch_head = program_id(1);
    let batch = batch_head / heads;
    let head = batch_head % heads;
    let q_base = q + batch * q_batch_stride + head * q_head_stride;
    let k_base = k + batch * k_batch_stride + head * k_head_stride;
    let v_base = v + batch * v_batch_stride + head * v_head_stride;
    let o_base = o + batch * o_batch_stride + head * o_head_stride;

    let first_row = start_m * BLOCK_M;
    // Padding rows past the sequence widen no bound: nothing of theirs is stored.
    let last_row = minimum(first_row + BLOCK_M, seqlen_q) - 1;
    let offs_m = first_row + arange(0, BLOCK_M);
    let shift = seqlen_k - seqlen_q;

    // Keys [lo, hi) hold every key a row of this block sees; lo starts a tile so that tiles stay
    // aligned. Tiles starting in [full_lo, full_hi] are inside every row's window and the sequence.
    let mut lo = 0;
    let mut hi = seqlen_k;
    let mut full_lo = 0;
    let mut full_hi = seqlen_k - BLOCK_N;
    if window_left >= 0 {
        lo = maximum(first_row + shift - window_left, 0) / BLOCK_N * BLOCK_N;
        full_lo = last_row + shift - window_left;
    }
    if window_right >= 0 {
        hi = minimum(last_row + shift + window_right + 1, seqlen_k);
        full_hi = minimum(full_hi, first_row + shift + window_right + 1 - BLOCK_N);
    }

    let q_block = make_block_ptr(
        q_base,
        [seqlen_q, HEAD_DIM],
        [q_seq_stride, 1],
        [first_row, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    let q_tile = load(q_block, [0]);
    let mut k_block = make_block_ptr(
        k_base,
        [seqlen_k, HEAD_DIM],
        [k_seq_stride, 1],
        [lo, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    let mut v_block = make_block_ptr(
        v_base,
        [seqlen_k, HEAD_DIM],
        [v_seq_stride, 1],
        [lo, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );

    // The softmax runs in base 2 (exp2 is the GPU's native exponential): scores are multiplied
    // by log2(e) after the cap, which folds into the cap's outer factor.
    let qk_scale = softmax_scale * f32::consts::LOG2_E;
    let cap_in = softmax_scale / softcap;
    let cap_out = softcap * f32::consts::LOG2_E;

    let mut m_i = full([BLOCK_M], f32::NEG_INFINITY, f32);
    let mut l_i = zeros([BLOCK_M], f32);
    let mut acc = zeros([BLOCK_M, HEAD_DIM], f32);
    for start_n in (lo..hi).step_by(BLOCK_N) {
        let qk = dot(q_tile, trans(load(k_block, [0])));
        let mut s = qk * qk_scale;
        if SOFTCAP {
            s = cap_out * tanh(qk * cap_in);
        }
        if start_n < full_lo || start_n > full_hi {
            let j = (start_n + arange(0, BLOCK_N)).expand_dims(0);
            let i = offs_m.expand_dims(1) + shift;
            let visible = j < seqlen_k
                && (window_left < 0 || j >= i - window_left)
                && (window_right < 0 || j <= i + window_right);
            s = where_(visible, s, f32::NEG_INFINITY);
        }
        let m_new = maximum(m_i, s.max(1));
        // A row that has seen no key keeps m = -inf: subtracting 0 instead gives p = 0, not NaN.
        let m_safe = where_(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let p = exp2(s - m_safe.expand_dims(1));
        let alpha = exp2(m_i - m_safe);
        l_i = l_i * alpha + p.sum(1);
        acc = dot(p.to::<T>(), load(v_block, [0]), acc * alpha.expand_dims(1));
        m_i = m_new;
        k_block = advance(k_block, [BLOCK_N, 0]);
        v_block = advance(v_block, [BLOCK_N, 0]);
    }

    // A row that saw a key has l >= 1 (its max contributes exp2(0)); one that saw none has l = 0.
    let seen = l_i > 0.0;
    let l_safe = where_(seen, l_i, 1.0);
    let o_block = make_block_ptr(
        o_base,
        [seqlen_q, HEAD_DIM],
        [o_seq_stride, 1],
        [first_row, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    store(o_block, acc / l_safe.expand_dims(1), [0]);
    let lse_row = where_(
        seen,
        (m_i + log2(l_safe)) * f32::consts::LN_2,
        f32::NEG_INFINITY,
    );
    store(
        lse + batch_head.to::<i64>() * seqlen_q + offs_m,
        lse_row,
        offs_m < seqlen_q,
    );
}

/// One call. Tensors are packed `[batch, seqlen, heads, head_dim]`.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub dtype: DType,
    pub batch: usize,
    pub heads: usize,
    pub seqlen_q: usize,
    pub seqlen_k: usize,
    pub head_dim: usize,
    pub window_left: i32,
    pub window_right: i32,
    /// `None` turns soft-capping off.
    pub softcap: Option<f32>,
    pub softmax_scale: f32,
    pub block_m: usize,
    pub block_n: usize,
}

/// Sequences up to 2^29 keep every window bound the kernel computes inside i32.
const MAX_SEQLEN: usize = 1 << 29;

impl Window {
    fn layout(&self, seqlen: usize) -> Layout {
        Layout::contiguous(seqlen, self.heads, self.head_dim)
    }

    pub fn len(&self, seqlen: usize) -> usize {
        self.batch * seqlen * self.heads * self.head_dim
    }

    /// Checks every field; a window at least as long as the sequence is unbounded, so it is
    /// clamped to keep `i + shift +- window` inside i32.
    fn validated(&self) -> Result<(i32, i32), String> {
        if !matches!(self.dtype, DType::F16 | DType::BF16) {
            return Err(format!("dtype must be f16 or bf16, got {}", self.dtype));
        }
        for (name, value, max) in [
            ("batch", self.batch, i32::MAX as usize),
            ("heads", self.heads, i32::MAX as usize),
            ("seqlen_q", self.seqlen_q, MAX_SEQLEN),
            ("seqlen_k", self.seqlen_k, MAX_SEQLEN),
        ] {
            if value == 0 || value > max {
                return Err(format!("{name} must be in 1..={max}, got {value}"));
            }
        }
        if self.batch * self.heads * self.seqlen_q > i32::MAX as usize {
            return Err("batch * heads * seqlen_q must stay below 2^31 (LSE offsets)".to_string());
        }
        for (name, value) in [
            ("head_dim", self.head_dim),
            ("block_m", self.block_m),
            ("block_n", self.block_n),
        ] {
            if value < 16 || !value.is_power_of_two() {
                return Err(format!(
                    "{name} must be a power of two of at least 16, got {value}"
                ));
            }
        }
        for (name, value) in [
            ("window_left", self.window_left),
            ("window_right", self.window_right),
        ] {
            if value < -1 {
                return Err(format!(
                    "{name} must be -1 (unbounded) or at least 0, got {value}"
                ));
            }
        }
        if let Some(cap) = self.softcap
            && !(cap > 0.0 && cap.is_finite())
        {
            return Err(format!("softcap must be positive and finite, got {cap}"));
        }
        if !self.softmax_scale.is_finite() {
            return Err(format!(
                "softmax_scale must be finite, got {}",
                self.softmax_scale
            ));
        }
        Ok((
            self.window_left.min(self.seqlen_k as i32),
            self.window_right.min(self.seqlen_q as i32),
        ))
    }
}

impl Window {
    /// The kernel's specialisation, grid and arguments for tensors `q, k, v, o, lse` (of the
    /// lengths `forward` checks): what `forward` runs here and kiln-runtime's GPU test launches.
    pub fn launch<'a>(
        &self,
        [q, k, v, o, lse]: [&'a HostBuffer; 5],
    ) -> Result<(Spec, Grid, Vec<KernelArg<'a>>), String> {
        let (window_left, window_right) = self.validated()?;
        let spec = Spec::new()
            .dtype("T", self.dtype)
            .int("HEAD_DIM", self.head_dim as i64)
            .int("BLOCK_M", self.block_m as i64)
            .int("BLOCK_N", self.block_n as i64)
            .flag("SOFTCAP", self.softcap.is_some());
        let mut args = vec![
            KernelArg::Buffer(q),
            KernelArg::Buffer(k),
            KernelArg::Buffer(v),
            KernelArg::Buffer(o),
            KernelArg::Buffer(lse),
            KernelArg::I32(self.seqlen_q as i32),
            KernelArg::I32(self.seqlen_k as i32),
            KernelArg::I32(self.heads as i32),
        ];
        for layout in [
            self.layout(self.seqlen_q),
            self.layout(self.seqlen_k),
            self.layout(self.seqlen_k),
            self.layout(self.seqlen_q),
        ] {
            args.extend([
                KernelArg::I64(layout.batch_stride),
                KernelArg::I64(layout.seq_stride),
                KernelArg::I64(layout.head_stride),
            ]);
        }
        args.extend([
            KernelArg::I32(window_left),
            KernelArg::I32(window_right),
            KernelArg::F32(self.softmax_scale),
            // Unused when the cap is off (SOFTCAP = false builds no cap).
            KernelArg::F32(self.softcap.unwrap_or(1.0)),
        ]);
        let grid = Grid::new(
            self.seqlen_q.div_ceil(self.block_m) as u32,
            (self.batch * self.heads) as u32,
            1,
        );
        Ok((spec, grid, args))
    }
}

/// Runs the kernel on the interpreter: writes `o` (like `q`) and `lse`.
fn forward(
    p: &Window,
    q: &HostBuffer,
    k: &HostBuffer,
    v: &HostBuffer,
    o: &HostBuffer,
    lse: &HostBuffer,
) -> Result<(), String> {
    p.validated()?;
    for (name, buffer, dtype, len) in [
        ("q", q, p.dtype, p.len(p.seqlen_q)),
        ("k", k, p.dtype, p.len(p.seqlen_k)),
        ("v", v, p.dtype, p.len(p.seqlen_k)),
        ("o", o, p.dtype, p.len(p.seqlen_q)),
        ("lse", lse, DType::F32, p.batch * p.heads * p.seqlen_q),
    ] {
        if buffer.dtype() != dtype || buffer.len() != len {
            return Err(format!(
                "{name} must hold {len} elements of {dtype}, got {} of {}",
                buffer.len(),
                buffer.dtype()
            ));
        }
    }
    let (spec, grid, args) = p.launch([q, k, v, o, lse])?;
    let kernel = sliding_window_fwd::build(&spec).map_err(|e| e.to_string())?;
    kiln_dsl::run(&kernel, grid, &args).map_err(|e| e.to_string())
}

/// Windowed, soft-capped attention in f64, directly: O (like q) and LSE (`-inf` for rows that
/// see no key).
fn reference(p: &Window, q: &[f64], k: &[f64], v: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (sq, sk, h, d) = (p.seqlen_q, p.seqlen_k, p.heads, p.head_dim);
    let shift = sk as i64 - sq as i64;
    let (wl, wr) = (p.window_left as i64, p.window_right as i64);
    let mut o = vec![0.0; q.len()];
    let mut lse = vec![f64::NEG_INFINITY; p.batch * h * sq];
    for b in 0..p.batch {
        for head in 0..h {
            for i in 0..sq {
                let at = |s: usize, seq: usize| ((b * s + seq) * h + head) * d;
                let qrow = &q[at(sq, i)..at(sq, i) + d];
                let visible = |j: i64| {
                    (wl < 0 || j >= i as i64 + shift - wl) && (wr < 0 || j <= i as i64 + shift + wr)
                };
                let scores: Vec<(usize, f64)> = (0..sk)
                    .filter(|&j| visible(j as i64))
                    .map(|j| {
                        let krow = &k[at(sk, j)..at(sk, j) + d];
                        let mut s = p.softmax_scale as f64
                            * qrow.iter().zip(krow).map(|(x, y)| x * y).sum::<f64>();
                        if let Some(cap) = p.softcap {
                            s = cap as f64 * (s / cap as f64).tanh();
                        }
                        (j, s)
                    })
                    .collect();
                if scores.is_empty() {
                    continue;
                }
                let max = scores
                    .iter()
                    .map(|&(_, s)| s)
                    .fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = scores.iter().map(|&(_, s)| (s - max).exp()).sum();
                lse[(b * h + head) * sq + i] = max + sum.ln();
                for &(j, s) in &scores {
                    let weight = (s - max).exp() / sum;
                    for x in 0..d {
                        o[at(sq, i) + x] += weight * v[at(sk, j) + x];
                    }
                }
            }
        }
    }
    (o, lse)
}

/// How far one run is from the reference.
#[derive(Debug)]
struct Errors {
    /// The worst row's relative error of O (`reference::row_error`, rows of head_dim).
    o: f64,
    /// The largest absolute LSE error over rows that see a key.
    lse: f64,
}

/// Runs `p` on fresh inputs from `seed` and compares with the reference; an `Err` says what is
/// structurally wrong (an unwritten output, `-inf` in the wrong rows).
fn run_case(p: &Window, seed: u64) -> Result<Errors, String> {
    let mut rng = Rng::new(seed);
    // q and k at 1.5 put scores around N(0, 2.25): soft caps of a few units bend them visibly.
    let mut input = |seqlen: usize, scale: f64| {
        let buffer = HostBuffer::from_f64(p.dtype, &rng.normals(p.len(seqlen), scale));
        let rounded = buffer.to_f64();
        (buffer, rounded)
    };
    let (q, q_ref) = input(p.seqlen_q, 1.5);
    let (k, k_ref) = input(p.seqlen_k, 1.5);
    let (v, v_ref) = input(p.seqlen_k, 1.0);
    let o = HostBuffer::poisoned(p.dtype, p.len(p.seqlen_q));
    let lse = HostBuffer::poisoned(DType::F32, p.batch * p.heads * p.seqlen_q);
    forward(p, &q, &k, &v, &o, &lse)?;
    for (name, buffer) in [("o", &o), ("lse", &lse)] {
        let unwritten = buffer.poisoned_indices();
        if !unwritten.is_empty() {
            return Err(format!(
                "{name} has {} unwritten elements, first {}",
                unwritten.len(),
                unwritten[0]
            ));
        }
    }
    let (o_ref, lse_ref) = reference(p, &q_ref, &k_ref, &v_ref);
    let mut lse_error: f64 = 0.0;
    for (row, (&got, &want)) in lse.to_f64().iter().zip(&lse_ref).enumerate() {
        if (got == f64::NEG_INFINITY) != (want == f64::NEG_INFINITY) {
            return Err(format!("lse row {row} is {got}, the reference {want}"));
        }
        if want != f64::NEG_INFINITY {
            lse_error = lse_error.max((got - want).abs());
        }
    }
    Ok(Errors {
        o: row_error(&o.to_f64(), &o_ref, p.head_dim),
        lse: lse_error,
    })
}

/// The tests' shapes, each in f16 (the tests run them in bf16 too; kiln-runtime's GPU test runs
/// both on the GPU).
#[cfg_attr(
    not(test),
    allow(
        dead_code,
        reason = "the tests and kiln-runtime's GPU cases use it, not main"
    )
)]
pub fn test_cases() -> Vec<Window> {
    vec![
        // A local causal window on a ragged sequence.
        case([1, 2, 37, 37], 32, (8, 0), Some(5.0), (32, 16)),
        // seqlen_q > seqlen_k, window 0 both sides: the first rows see no key at all.
        case([2, 1, 50, 33], 32, (0, 0), None, (32, 16)),
        // Right side only, seqlen_q < seqlen_k.
        case([1, 1, 17, 81], 64, (-1, 5), Some(2.0), (32, 16)),
        // Left side only.
        case([1, 2, 33, 65], 32, (3, -1), None, (16, 16)),
        // Left window 0 only (a row sees its diagonal and after), seqlen_q > seqlen_k.
        case([1, 1, 33, 17], 32, (0, -1), Some(4.0), (16, 16)),
        // Windows longer than either sequence: plain attention.
        case([1, 1, 40, 40], 32, (1000, 1000), Some(30.0), (32, 16)),
        // Both sides unbounded, blocks larger than the sequences.
        case([1, 1, 31, 45], 32, (-1, -1), None, (64, 64)),
        // One query, one key, a tight cap.
        case([1, 1, 1, 1], 32, (-1, -1), Some(1.0), (16, 16)),
        // A small two-sided window far down a long key sequence: most key tiles are skipped.
        case([1, 1, 40, 200], 32, (10, 3), Some(5.0), (16, 16)),
        // seqlen_q > seqlen_k with a window: late rows see the last keys, early rows none.
        case([1, 1, 65, 16], 32, (2, 7), Some(3.0), (32, 16)),
        // Windows of block - 1 and block + 1 keys.
        case([1, 1, 63, 97], 64, (15, 17), None, (32, 16)),
    ]
}

/// An f16 case at the default scale (the test runs it in bf16 too): `[batch, heads,
/// seqlen_q, seqlen_k]`, head_dim, `(window_left, window_right)`, softcap, `(block_m, block_n)`.
fn case(
    [batch, heads, seqlen_q, seqlen_k]: [usize; 4],
    head_dim: usize,
    (window_left, window_right): (i32, i32),
    softcap: Option<f32>,
    (block_m, block_n): (usize, usize),
) -> Window {
    Window {
        dtype: DType::F16,
        batch,
        heads,
        seqlen_q,
        seqlen_k,
        head_dim,
        window_left,
        window_right,
        softcap,
        softmax_scale: 1.0 / (head_dim as f32).sqrt(),
        block_m,
        block_n,
    }
}

fn main() {
    let p = Window {
        dtype: DType::BF16,
        batch: 2,
        heads: 4,
        seqlen_q: 300,
        seqlen_k: 333,
        head_dim: 64,
        window_left: 64,
        window_right: 0,
        softcap: Some(30.0),
        softmax_scale: 1.0 / 8.0,
        block_m: 64,
        block_n: 32,
    };
    let seed = Rng::fresh_seed();
    match run_case(&p, seed) {
        Ok(errors) => println!(
            "{p:?}\nseed {seed}: O row error {:.3e}, LSE max abs error {:.3e}",
            errors.o, errors.lse
        ),
        Err(message) => {
            eprintln!("{p:?}\nseed {seed}: {message}");
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit_roundoff(dtype: DType) -> f64 {
        match dtype {
            DType::F16 => 1.0 / 2048.0,
            _ => 1.0 / 256.0,
        }
    }

    #[test]
    fn matches_the_f64_reference() {
        let cases = test_cases();
        let seed = Rng::fresh_seed();
        for (index, f16_case) in cases.iter().enumerate() {
            for dtype in [DType::F16, DType::BF16] {
                let p = Window { dtype, ..*f16_case };
                let case_seed = seed.wrapping_add(index as u64);
                let errors = run_case(&p, case_seed)
                    .unwrap_or_else(|message| panic!("seed {case_seed}: {p:?}: {message}"));
                // O: P is rounded to T before its dot with V (at most u per weight, independent
                // errors, so about u in norm, not sqrt(seqlen_k) u) and O once more at the store
                // (u). 4u leaves room for rows whose output is a cancelling sum of many values;
                // a wrong mask or a skipped tile is off by O(1).
                // LSE: f32 scores of exact inputs err by at most head_dim 2^-24 sum|q_i k_i| scale
                // (~1e-6 here); the cap (slope <= 1), exp2 and log2 carry that to the LSE
                // unamplified. 1e-4 is a hundredfold margin.
                let u = unit_roundoff(dtype);
                assert!(
                    errors.o <= 4.0 * u && errors.lse <= 1e-4,
                    "seed {case_seed}: {p:?}: {errors:?}"
                );
            }
        }
    }

    #[test]
    fn refuses_bad_windows_and_caps() {
        let p = case([1, 1, 4, 4], 32, (-2, 0), None, (16, 16));
        let message = p.validated().unwrap_err();
        assert!(
            message.contains("window_left must be -1 (unbounded) or at least 0"),
            "{message}"
        );
        let p = case([1, 1, 4, 4], 32, (1, 0), Some(0.0), (16, 16));
        let message = p.validated().unwrap_err();
        assert!(message.contains("softcap must be positive"), "{message}");
    }
}
