//! f64 references and the yardsticks the tests judge kernels by: attention forward and backward
//! computed directly (no tiling, no online softmax), a seeded random source, and the per-row
//! relative error.

use rayon::prelude::*;

use kiln_dsl::DType;

use crate::attention::AttentionParams;

/// A small, fast, seeded random source (SplitMix64): the tests print their seed so any failure
/// reproduces.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A seed from the clock, for fresh inputs on every run (print it with the results).
    pub fn fresh_seed() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    pub fn normals(&mut self, n: usize, scale: f64) -> Vec<f64> {
        (0..n).map(|_| self.normal() * scale).collect()
    }
}

/// The worst row's relative error: `max_r |x_r - ref_r| / max(|ref_r|, mean_r |ref_r|)` over rows
/// of `row_len` elements (2-norms). Rows near zero are judged against a typical row, so one wrong
/// row cannot hide in a global norm and an exact zero row does not divide by zero. Infinite when
/// `actual` holds a NaN or an infinity where the reference is finite.
pub fn row_error(actual: &[f64], reference: &[f64], row_len: usize) -> f64 {
    row_error_conditioned(actual, reference, None, row_len)
}

/// [`row_error`], each row judged against the larger of its norm and `magnitude`'s: the norm of
/// the sum of the absolute values of the terms that made it. Where a result is a small difference
/// of large terms (a gradient through a nearly one-hot softmax), rounding errors scale with the
/// terms, not with the result; this measures them against that scale, each row against its own
/// (not a typical row's, against which the dV row of a key only the last queries see could be
/// twice what it is and pass).
pub fn row_error_conditioned(
    actual: &[f64],
    reference: &[f64],
    magnitude: Option<&[f64]>,
    row_len: usize,
) -> f64 {
    assert_eq!(
        actual.len(),
        reference.len(),
        "compared arrays differ in length"
    );
    let rows = actual.len() / row_len;
    let norm = |v: &[f64]| v.iter().map(|y| y * y).sum::<f64>().sqrt();
    let row = |v: &[f64], r: usize| -> Vec<f64> { v[r * row_len..(r + 1) * row_len].to_vec() };
    let mut diffs = Vec::with_capacity(rows);
    let mut scales = Vec::with_capacity(rows);
    for r in 0..rows {
        let (a, b) = (row(actual, r), row(reference, r));
        let diff: Vec<f64> = a.iter().zip(&b).map(|(x, y)| x - y).collect();
        diffs.push(norm(&diff));
        let terms = magnitude.map_or(0.0, |m| norm(&row(m, r)));
        scales.push(norm(&b).max(terms));
    }
    if diffs.iter().any(|d| !d.is_finite()) {
        return f64::INFINITY;
    }
    let mean = scales.iter().sum::<f64>() / rows.max(1) as f64;
    let floor = if magnitude.is_some() { 0.0 } else { mean };
    diffs
        .iter()
        .zip(&scales)
        .map(|(d, s)| d / s.max(floor).max(1e-300))
        .fold(0.0, f64::max)
}

/// Outputs of the reference, dense `[batch, seqlen, heads, head_dim]` (LSE `[batch, heads_q, seqlen_q]`).
#[derive(Clone, Debug)]
pub struct AttentionReference {
    pub o: Vec<f64>,
    pub lse: Vec<f64>,
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
    /// Per element, the sum of the absolute values of the terms of dQ, dK and dV (see
    /// [`row_error_conditioned`]).
    pub dq_terms: Vec<f64>,
    pub dk_terms: Vec<f64>,
    pub dv_terms: Vec<f64>,
    /// Per row, the largest sum of absolute values of a visible score's terms,
    /// `|scale| * sum |q_x k_x|`: a score's rounding error is relative to it, and LSE's too.
    pub lse_terms: Vec<f64>,
}

/// The absolute error a weight of the kernels (P, or dS, rounded to `dtype` from f32) may carry
/// beyond its relative rounding, in units of that rounding: half the dtype's subnormal spacing,
/// or where the GPU's `ex2.approx.ftz` flushes an f32 weight below 2^-126 to 0, that. Added to
/// each weight's terms, so that a row whose weights are all tiny is judged against what rounding
/// them can do.
fn weight_floor(dtype: DType) -> f64 {
    let subnormal = match dtype {
        DType::F16 => 2f64.powi(-24),
        DType::BF16 => 2f64.powi(-133),
        _ => 2f64.powi(-149),
    };
    (subnormal / 2.0).max(2f64.powi(-126)) / unit_roundoff(dtype)
}

/// The relative error of rounding to `dtype` (f16 2^-11, bf16 2^-8, f32 2^-24): the unit the
/// checks' bars are counted in.
pub fn unit_roundoff(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        _ => 2f64.powi(-24),
    }
}

/// Attention forward and backward in f64 from dense, already-rounded inputs (`d_o` like `q`).
pub fn attention(
    p: &AttentionParams,
    q: &[f64],
    k: &[f64],
    v: &[f64],
    d_o: &[f64],
) -> AttentionReference {
    let (sq, sk, hq, hkv, d) = (p.seqlen_q, p.seqlen_k, p.heads_q, p.heads_kv, p.head_dim);
    let scale = p.softmax_scale as f64;
    let shift = sk as i64 - sq as i64;
    let qi = |b: usize, i: usize, h: usize| ((b * sq + i) * hq + h) * d;
    let ki = |b: usize, j: usize, h: usize| ((b * sk + j) * hkv + h) * d;
    let dotp = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let floor = weight_floor(p.dtype);

    struct Head {
        o: Vec<f64>,
        lse: Vec<f64>,
        dq: Vec<f64>,
        dk: Vec<f64>,
        dv: Vec<f64>,
        dq_terms: Vec<f64>,
        dk_terms: Vec<f64>,
        dv_terms: Vec<f64>,
        lse_terms: Vec<f64>,
    }
    // One (batch, query head) at a time, in parallel; dK/dV of a kv head sum over its group after.
    let heads: Vec<Head> = (0..p.batch * hq)
        .into_par_iter()
        .map(|bh| {
            let (b, h) = (bh / hq, bh % hq);
            let hk = h / p.group();
            let mut head = Head {
                o: vec![0.0; sq * d],
                lse: vec![f64::NEG_INFINITY; sq],
                dq: vec![0.0; sq * d],
                dk: vec![0.0; sk * d],
                dv: vec![0.0; sk * d],
                dq_terms: vec![0.0; sq * d],
                dk_terms: vec![0.0; sk * d],
                dv_terms: vec![0.0; sk * d],
                lse_terms: vec![0.0; sq],
            };
            let abs_dot =
                |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| (x * y).abs()).sum::<f64>();
            for i in 0..sq {
                let visible = |j: usize| !p.causal || (j as i64) <= i as i64 + shift;
                let qrow = &q[qi(b, i, h)..qi(b, i, h) + d];
                // Each visible score, and the size of its terms.
                let (s, terms): (Vec<f64>, Vec<f64>) = (0..sk)
                    .map(|j| {
                        let krow = &k[ki(b, j, hk)..ki(b, j, hk) + d];
                        if visible(j) {
                            (scale * dotp(qrow, krow), scale.abs() * abs_dot(qrow, krow))
                        } else {
                            (f64::NEG_INFINITY, 0.0)
                        }
                    })
                    .unzip();
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue; // no visible key: O = 0, LSE = -inf, zero gradients
                }
                let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
                let lse = max + sum.ln();
                head.lse[i] = lse;
                head.lse_terms[i] = terms.iter().copied().fold(0.0, f64::max);
                let prob: Vec<f64> = s.iter().map(|x| (x - lse).exp()).collect();
                let dorow = &d_o[qi(b, i, h)..qi(b, i, h) + d];
                let vrow = |j: usize| &v[ki(b, j, hk)..ki(b, j, hk) + d];
                let dp: Vec<f64> = (0..sk).map(|j| dotp(dorow, vrow(j))).collect();
                for (j, &pj) in prob.iter().enumerate() {
                    for (o, vx) in head.o[i * d..(i + 1) * d].iter_mut().zip(vrow(j)) {
                        *o += pj * vx;
                    }
                }
                let orow = &head.o[i * d..(i + 1) * d];
                let delta: f64 = prob.iter().zip(&dp).map(|(a, b)| a * b).sum();
                // delta = dO . O is what the kernels compute; its terms are |dO_x O_x|.
                let delta_terms = abs_dot(dorow, orow);
                for j in 0..sk {
                    if prob[j] == 0.0 {
                        continue;
                    }
                    let ds = prob[j] * (dp[j] - delta);
                    // P and dS are rounded to the inputs' dtype: relative error, and `floor`.
                    let ds_terms = prob[j] * (abs_dot(dorow, vrow(j)) + delta_terms) + floor;
                    let kv = ki(b, j, hk);
                    for x in 0..d {
                        head.dq[i * d + x] += scale * ds * k[kv + x];
                        head.dk[j * d + x] += scale * ds * qrow[x];
                        head.dv[j * d + x] += prob[j] * dorow[x];
                        head.dq_terms[i * d + x] += scale * ds_terms * k[kv + x].abs();
                        head.dk_terms[j * d + x] += scale * ds_terms * qrow[x].abs();
                        head.dv_terms[j * d + x] += (prob[j] + floor) * dorow[x].abs();
                    }
                }
            }
            head
        })
        .collect();

    let mut out = AttentionReference {
        o: vec![0.0; p.batch * sq * hq * d],
        lse: vec![0.0; p.batch * hq * sq],
        dq: vec![0.0; p.batch * sq * hq * d],
        dk: vec![0.0; p.batch * sk * hkv * d],
        dv: vec![0.0; p.batch * sk * hkv * d],
        dq_terms: vec![0.0; p.batch * sq * hq * d],
        dk_terms: vec![0.0; p.batch * sk * hkv * d],
        dv_terms: vec![0.0; p.batch * sk * hkv * d],
        lse_terms: vec![0.0; p.batch * hq * sq],
    };
    for (bh, head) in heads.iter().enumerate() {
        let (b, h) = (bh / hq, bh % hq);
        let hk = h / p.group();
        out.lse[bh * sq..(bh + 1) * sq].copy_from_slice(&head.lse);
        out.lse_terms[bh * sq..(bh + 1) * sq].copy_from_slice(&head.lse_terms);
        for i in 0..sq {
            let at = qi(b, i, h);
            out.o[at..at + d].copy_from_slice(&head.o[i * d..(i + 1) * d]);
            out.dq[at..at + d].copy_from_slice(&head.dq[i * d..(i + 1) * d]);
            out.dq_terms[at..at + d].copy_from_slice(&head.dq_terms[i * d..(i + 1) * d]);
        }
        for j in 0..sk {
            let at = ki(b, j, hk);
            for x in 0..d {
                out.dk[at + x] += head.dk[j * d + x];
                out.dv[at + x] += head.dv[j * d + x];
                out.dk_terms[at + x] += head.dk_terms[j * d + x];
                out.dv_terms[at + x] += head.dv_terms[j * d + x];
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{row_error, row_error_conditioned};

    #[test]
    fn a_small_row_is_judged_against_its_own_terms() {
        // Two rows of two: a typical one, and one a thousandth its size (a key few queries see).
        let want = [1.0, 1.0, 1e-3, 1e-3];
        let terms = [1.0, 1.0, 1e-3, 1e-3];
        let mut got = want;
        // The small row doubled: plain relative error, against the typical row, hides it ...
        got[2] *= 2.0;
        got[3] *= 2.0;
        assert!(row_error(&got, &want, 2) < 2e-3);
        // ... its terms do not.
        assert!(row_error_conditioned(&got, &want, Some(&terms), 2) > 0.9);
        // Within a rounding of its terms, it passes.
        got[2] = 1e-3 * (1.0 + 2f64.powi(-9));
        got[3] = 1e-3;
        assert!(row_error_conditioned(&got, &want, Some(&terms), 2) < 2f64.powi(-8));
        // A row that must be exactly zero (no visible key) is judged exactly.
        let want = [1.0, 1.0, 0.0, 0.0];
        let terms = [1.0, 1.0, 0.0, 0.0];
        let got = [1.0, 1.0, 1e-20, 0.0];
        assert!(row_error_conditioned(&got, &want, Some(&terms), 2) > 1.0);
    }
}
