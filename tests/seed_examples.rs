//! Seed 003's worked examples, run through the DSL kernels on the interpreter: each printed
//! number is reproduced to the precision it is printed with. The examples use head dims of 2;
//! the kernels' smallest head dim is 32, so the extra dimensions are zero (which changes no
//! score), and they run in f32 so that the output rounding of f16 does not eat the 4th decimal.

use kiln::prelude::*;
use kiln_kernels::attention::cpu;
use kiln_kernels::attention::{AttentionParams, Layout, Tensor};

const D: usize = 32;

/// Pads rows of `width` numbers to `D` with zeros.
fn pad(rows: &[&[f64]]) -> Vec<f32> {
    rows.iter()
        .flat_map(|r| (0..D).map(move |i| r.get(i).copied().unwrap_or(0.0) as f32))
        .collect()
}

/// Runs the forward kernel on one head: returns O rows (first `out_cols` columns) and LSE.
fn attend(
    q: &[&[f64]],
    k: &[&[f64]],
    v: &[&[f64]],
    causal: bool,
    scale: f32,
    out_cols: usize,
) -> (Vec<Vec<f64>>, Vec<f64>) {
    let p = AttentionParams {
        dtype: F32,
        batch: 1,
        seqlen_q: q.len(),
        seqlen_k: k.len(),
        heads_q: 1,
        heads_kv: 1,
        head_dim: D,
        causal,
        softmax_scale: scale,
        fused_backward: false,
    };
    let (qb, kb, vb) = (
        HostBuffer::from_f32(F32, &pad(q)),
        HostBuffer::from_f32(F32, &pad(k)),
        HostBuffer::from_f32(F32, &pad(v)),
    );
    let o = HostBuffer::poisoned(F32, q.len() * D);
    let lse = HostBuffer::poisoned(F32, q.len());
    let ql = Layout::contiguous(q.len(), 1, D);
    let kl = Layout::contiguous(k.len(), 1, D);
    cpu::forward(
        &p,
        Target::Sm90a,
        Tensor::new(&qb, ql),
        Tensor::new(&kb, kl),
        Tensor::new(&vb, kl),
        Tensor::new(&o, ql),
        &lse,
    )
    .unwrap();
    let o = o.to_f64();
    let rows = (0..q.len())
        .map(|i| o[i * D..i * D + out_cols].to_vec())
        .collect();
    (rows, lse.to_f64())
}

/// `actual` printed with `decimals` decimals is `printed`.
#[track_caller]
fn assert_printed(actual: f64, printed: f64, decimals: i32) {
    let half_ulp = 0.5 * 10f64.powi(-decimals);
    assert!(
        (actual - printed).abs() <= half_ulp + 1e-9,
        "{actual} does not print as {printed} with {decimals} decimals"
    );
}

#[test]
fn online_softmax_of_2_5_1_4() {
    // Scores z = q . k_j with q = e_0 and k_j = z_j e_0; V = identity, so O is the softmax itself.
    let z = [2.0, 5.0, 1.0, 4.0];
    let keys: Vec<[f64; 1]> = z.iter().map(|&x| [x]).collect();
    let key_rows: Vec<&[f64]> = keys.iter().map(|k| &k[..]).collect();
    let identity: Vec<Vec<f64>> = (0..4)
        .map(|i| (0..4).map(|j| (i == j) as u8 as f64).collect())
        .collect();
    let value_rows: Vec<&[f64]> = identity.iter().map(|r| &r[..]).collect();
    let (o, lse) = attend(&[&[1.0]], &key_rows, &value_rows, false, 1.0, 4);
    for (got, printed) in o[0].iter().zip([0.0347, 0.6964, 0.0128, 0.2562]) {
        assert_printed(*got, printed, 4);
    }
    // The running sum s = 1.4360 relative to the final max m = 5.0.
    assert_printed((lse[0] - 5.0).exp(), 1.4360, 4);
}

#[test]
fn online_attention_of_one_query() {
    let k: [&[f64]; 3] = [&[0.5, 0.3], &[0.8, -0.2], &[0.1, 0.7]];
    let v: [&[f64]; 3] = [&[1.0, 0.0], &[0.0, 1.0], &[0.5, 0.5]];
    let (o, lse) = attend(&[&[1.0, 0.0]], &k, &v, false, 1.0, 2);
    assert_printed(o[0][0], 0.4421, 4);
    assert_printed(o[0][1], 0.5579, 4);
    // s = 2.2374 relative to m = 0.8.
    assert_printed((lse[0] - 0.8).exp(), 2.2374, 4);
}

#[kiln::kernel]
fn scaled_scores<const N: usize, const D_: usize>(
    q: Ptr<f32>,
    k: Ptr<f32>,
    s: Ptr<f32>,
    n: i32,
    scale: f32,
) {
    let rows = arange(0, N);
    let cols = arange(0, D_);
    let mask = rows.expand_dims(1) < n;
    let offsets = rows.expand_dims(1) * D_ + cols.expand_dims(0);
    let q_tile = load(q + offsets, mask, 0.0);
    let k_tile = load(k + offsets, mask, 0.0);
    let scores = dot(q_tile, trans(k_tile)) * scale;
    let out = s + rows.expand_dims(1) * N + rows.expand_dims(0);
    store(out, scores, mask && rows.expand_dims(0) < n);
}

#[test]
fn tiled_causal_example_n6_d2() {
    let q: [&[f64]; 6] = [
        &[1.0, 0.5],
        &[0.8, -0.1],
        &[0.2, 0.9],
        &[-0.3, 0.4],
        &[0.7, 0.6],
        &[0.1, -0.5],
    ];
    let k: [&[f64]; 6] = [
        &[0.3, 0.7],
        &[0.6, 0.2],
        &[-0.1, 0.8],
        &[0.4, -0.3],
        &[0.9, 0.1],
        &[0.2, 0.5],
    ];
    let v: [&[f64]; 6] = [
        &[1.0, 0.0],
        &[0.0, 1.0],
        &[0.5, 0.5],
        &[0.8, 0.2],
        &[0.3, 0.7],
        &[0.6, 0.4],
    ];
    let scale = 1.0 / 2f32.sqrt();

    // The printed score tile of Q tile 0 x KV tile 0, before masking.
    let kernel = scaled_scores::build(&Spec::new().int("N", 16).int("D_", D as i64)).unwrap();
    let (qb, kb) = (
        HostBuffer::from_f32(F32, &pad(&q)),
        HostBuffer::from_f32(F32, &pad(&k)),
    );
    let s = HostBuffer::poisoned(F32, 16 * 16);
    let args = [
        KernelArg::Buffer(&qb),
        KernelArg::Buffer(&kb),
        KernelArg::Buffer(&s),
        KernelArg::I32(6),
        KernelArg::F32(scale),
    ];
    kiln::dsl::run(&kernel, Grid::new(1, 1, 1), &args).unwrap();
    let s = s.to_f64();
    let printed = [[0.460, 0.495, 0.212], [0.120, 0.325, -0.113]];
    for (i, row) in printed.iter().enumerate() {
        for (j, &value) in row.iter().enumerate() {
            assert_printed(s[i * 16 + j], value, 3);
        }
    }

    // Causal attention: query 0 copies V[0]; query 1 weighs keys 0 and 1 by 0.8146 : 1.
    let (o, lse) = attend(&q, &k, &v, true, scale, 2);
    assert_printed(o[0][0], 1.0, 3);
    assert_printed(o[0][1], 0.0, 3);
    assert_printed(o[1][0], 0.449, 3);
    assert_printed(o[1][1], 0.551, 3);
    assert_printed(lse[0], 0.460, 3);
    assert_printed((lse[1] - 0.325).exp(), 1.8146, 3);
}
