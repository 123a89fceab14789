//! FlashAttention backward, split as in seed 001: a preprocessing kernel (`delta = rowsum(dO * O)`),
//! a dQ kernel that walks key tiles, and a dK/dV kernel that walks query tiles. No atomics: each
//! output element is written by exactly one program, so the backward pass is deterministic.
//!
//! Both gradient kernels recompute `P = exp2(s * log2(e) - lse * log2(e))` from the forward's
//! natural-log LSE. A row with LSE = -inf saw no key: it gets `+inf` in place of its LSE, so its
//! `P` is `exp2(-inf) = 0` and never `exp2(x - (-inf))`.

use kiln_dsl::kernel;

/// `delta[b, h, i] = sum_d dO[b, i, h, d] * O[b, i, h, d]`, in f32.
#[kernel]
pub fn attention_bwd_preprocess<T, const HEAD_DIM: usize, const BLOCK_M: usize>(
    o: Ptr<T>,
    d_o: Ptr<T>,
    delta: Ptr<f32>,
    seqlen_q: i32,
    heads_q: i32,
    o_batch_stride: i64,
    o_seq_stride: i64,
    o_head_stride: i64,
    do_batch_stride: i64,
    do_seq_stride: i64,
    do_head_stride: i64,
) {
    let start_m = program_id(0);
    let batch_head = program_id(1);
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let o_base = o + batch * o_batch_stride + head * o_head_stride;
    let do_base = d_o + batch * do_batch_stride + head * do_head_stride;
    let o_block = make_block_ptr(
        o_base,
        [seqlen_q, HEAD_DIM],
        [o_seq_stride, 1],
        [start_m * BLOCK_M, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    let do_block = make_block_ptr(
        do_base,
        [seqlen_q, HEAD_DIM],
        [do_seq_stride, 1],
        [start_m * BLOCK_M, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    let o_tile = load(o_block, [0]).to::<f32>();
    let do_tile = load(do_block, [0]).to::<f32>();
    let offs_m = start_m * BLOCK_M + arange(0, BLOCK_M);
    let rows = delta + batch_head.to::<i64>() * seqlen_q + offs_m;
    store(rows, sum(o_tile * do_tile, 1), offs_m < seqlen_q);
}

/// dQ for one (query block, batch x query head): `dQ = scale * sum_j dS_ij K_j`.
#[kernel]
pub fn attention_bwd_dq<
    T,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const CAUSAL: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    d_o: Ptr<T>,
    dq: Ptr<T>,
    lse: Ptr<f32>,
    delta: Ptr<f32>,
    seqlen_q: i32,
    seqlen_k: i32,
    heads_q: i32,
    group: i32,
    q_batch_stride: i64,
    q_seq_stride: i64,
    q_head_stride: i64,
    k_batch_stride: i64,
    k_seq_stride: i64,
    k_head_stride: i64,
    v_batch_stride: i64,
    v_seq_stride: i64,
    v_head_stride: i64,
    do_batch_stride: i64,
    do_seq_stride: i64,
    do_head_stride: i64,
    dq_batch_stride: i64,
    dq_seq_stride: i64,
    dq_head_stride: i64,
    softmax_scale: f32,
) {
    static_assert(
        HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
        "attention supports head dims 32, 64, 128 and 256",
    );
    let start_m = program_id(0);
    let batch_head = program_id(1);
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let head_kv = head / group;

    let q_base = q + batch * q_batch_stride + head * q_head_stride;
    let k_base = k + batch * k_batch_stride + head_kv * k_head_stride;
    let v_base = v + batch * v_batch_stride + head_kv * v_head_stride;
    let do_base = d_o + batch * do_batch_stride + head * do_head_stride;
    let dq_base = dq + batch * dq_batch_stride + head * dq_head_stride;

    let q_block = make_block_ptr(
        q_base,
        [seqlen_q, HEAD_DIM],
        [q_seq_stride, 1],
        [start_m * BLOCK_M, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    let do_block = make_block_ptr(
        do_base,
        [seqlen_q, HEAD_DIM],
        [do_seq_stride, 1],
        [start_m * BLOCK_M, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    let mut k_block = make_block_ptr(
        k_base,
        [seqlen_k, HEAD_DIM],
        [k_seq_stride, 1],
        [0, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    let mut v_block = make_block_ptr(
        v_base,
        [seqlen_k, HEAD_DIM],
        [v_seq_stride, 1],
        [0, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    let q_tile = load(q_block, [0]);
    let do_tile = load(do_block, [0]);

    let offs_m = start_m * BLOCK_M + arange(0, BLOCK_M);
    let row_ok = offs_m < seqlen_q;
    let row_base = batch_head.to::<i64>() * seqlen_q;
    let lse_row = load(lse + row_base + offs_m, row_ok, 0.0);
    let delta_row = load(delta + row_base + offs_m, row_ok, 0.0);
    let lse_log2 = where_(
        lse_row == f32::NEG_INFINITY,
        f32::INFINITY,
        lse_row * f32::consts::LOG2_E,
    );
    let qk_scale = softmax_scale * f32::consts::LOG2_E;
    let shift = seqlen_k - seqlen_q;

    let mut end_n = seqlen_k;
    let mut full_end = seqlen_k / BLOCK_N * BLOCK_N;
    if CAUSAL {
        end_n = minimum(seqlen_k, maximum((start_m + 1) * BLOCK_M + shift, 0));
        full_end = minimum(
            full_end,
            maximum(start_m * BLOCK_M + shift + 1, 0) / BLOCK_N * BLOCK_N,
        );
    }

    let mut dq_acc = zeros([BLOCK_M, HEAD_DIM], f32);
    for start_n in (0..end_n).step_by(BLOCK_N) {
        let k_tile = load(k_block, [0]);
        let v_tile = load(v_block, [0]);
        let mut qk = dot(q_tile, trans(k_tile)) * qk_scale;
        if start_n >= full_end {
            let offs_n = start_n + arange(0, BLOCK_N);
            let mut visible = offs_n.expand_dims(0) < seqlen_k;
            if CAUSAL {
                visible = visible && offs_n.expand_dims(0) <= offs_m.expand_dims(1) + shift;
            }
            qk = where_(visible, qk, f32::NEG_INFINITY);
        }
        let p = exp2(qk - lse_log2.expand_dims(1));
        let dp = dot(do_tile, trans(v_tile));
        let ds = p * (dp - delta_row.expand_dims(1));
        dq_acc = dot(ds.to::<T>(), k_tile, dq_acc);
        k_block = advance(k_block, [BLOCK_N, 0]);
        v_block = advance(v_block, [BLOCK_N, 0]);
    }
    let dq_block = make_block_ptr(
        dq_base,
        [seqlen_q, HEAD_DIM],
        [dq_seq_stride, 1],
        [start_m * BLOCK_M, 0],
        [BLOCK_M, HEAD_DIM],
        [1, 0],
    );
    store(dq_block, dq_acc * softmax_scale, [0]);
}

/// dK and dV for one (key block, batch x kv head), summed over the query heads of its group:
/// `dV = sum_i P_ij dO_i`, `dK = scale * sum_i dS_ij Q_i`.
///
/// Query rows past `seqlen_q` load as zeros with `dO = 0` and `delta = 0`, so they add nothing
/// (seed 001's implicit masking); keys past `seqlen_k` and the causal mask are masked with `-inf`.
#[kernel]
pub fn attention_bwd_dkdv<
    T,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const CAUSAL: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    d_o: Ptr<T>,
    dk: Ptr<T>,
    dv: Ptr<T>,
    lse: Ptr<f32>,
    delta: Ptr<f32>,
    seqlen_q: i32,
    seqlen_k: i32,
    heads_kv: i32,
    group: i32,
    q_batch_stride: i64,
    q_seq_stride: i64,
    q_head_stride: i64,
    k_batch_stride: i64,
    k_seq_stride: i64,
    k_head_stride: i64,
    v_batch_stride: i64,
    v_seq_stride: i64,
    v_head_stride: i64,
    do_batch_stride: i64,
    do_seq_stride: i64,
    do_head_stride: i64,
    dk_batch_stride: i64,
    dk_seq_stride: i64,
    dk_head_stride: i64,
    dv_batch_stride: i64,
    dv_seq_stride: i64,
    dv_head_stride: i64,
    softmax_scale: f32,
) {
    static_assert(
        HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
        "attention supports head dims 32, 64, 128 and 256",
    );
    let start_n = program_id(0);
    let batch_head_kv = program_id(1);
    let batch = batch_head_kv / heads_kv;
    let head_kv = batch_head_kv % heads_kv;

    let k_base = k + batch * k_batch_stride + head_kv * k_head_stride;
    let v_base = v + batch * v_batch_stride + head_kv * v_head_stride;
    let k_block = make_block_ptr(
        k_base,
        [seqlen_k, HEAD_DIM],
        [k_seq_stride, 1],
        [start_n * BLOCK_N, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    let v_block = make_block_ptr(
        v_base,
        [seqlen_k, HEAD_DIM],
        [v_seq_stride, 1],
        [start_n * BLOCK_N, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    let k_tile = load(k_block, [0]);
    let v_tile = load(v_block, [0]);

    let first_key = start_n * BLOCK_N;
    let offs_n = first_key + arange(0, BLOCK_N);
    let qk_scale = softmax_scale * f32::consts::LOG2_E;
    let shift = seqlen_k - seqlen_q;
    // A key block that runs past seqlen_k needs its key mask on every query tile.
    let partial_keys = first_key + BLOCK_N > seqlen_k;
    // Causal: query rows before `begin_m` see none of these keys; from `full_m` on they see all.
    let mut begin_m = 0;
    let mut full_m = 0;
    if CAUSAL {
        begin_m = maximum(first_key - shift, 0) / BLOCK_M * BLOCK_M;
        full_m = first_key + BLOCK_N - 1 - shift;
    }

    let mut dk_acc = zeros([BLOCK_N, HEAD_DIM], f32);
    let mut dv_acc = zeros([BLOCK_N, HEAD_DIM], f32);
    for member in 0..group {
        let head = head_kv * group + member;
        let q_base = q + batch * q_batch_stride + head * q_head_stride;
        let do_base = d_o + batch * do_batch_stride + head * do_head_stride;
        let row_base = (batch * (heads_kv * group) + head).to::<i64>() * seqlen_q;
        let mut q_block = make_block_ptr(
            q_base,
            [seqlen_q, HEAD_DIM],
            [q_seq_stride, 1],
            [begin_m, 0],
            [BLOCK_M, HEAD_DIM],
            [1, 0],
        );
        let mut do_block = make_block_ptr(
            do_base,
            [seqlen_q, HEAD_DIM],
            [do_seq_stride, 1],
            [begin_m, 0],
            [BLOCK_M, HEAD_DIM],
            [1, 0],
        );
        for start_m in (begin_m..seqlen_q).step_by(BLOCK_M) {
            let q_tile = load(q_block, [0]);
            let do_tile = load(do_block, [0]);
            let offs_m = start_m + arange(0, BLOCK_M);
            let row_ok = offs_m < seqlen_q;
            let lse_row = load(lse + row_base + offs_m, row_ok, 0.0);
            let delta_row = load(delta + row_base + offs_m, row_ok, 0.0);
            let lse_log2 = where_(
                lse_row == f32::NEG_INFINITY,
                f32::INFINITY,
                lse_row * f32::consts::LOG2_E,
            );
            let mut qk = dot(q_tile, trans(k_tile)) * qk_scale;
            let mut needs_mask = partial_keys;
            if CAUSAL {
                needs_mask = needs_mask || start_m < full_m;
            }
            if needs_mask {
                let mut visible = offs_n.expand_dims(0) < seqlen_k;
                if CAUSAL {
                    visible = visible && offs_n.expand_dims(0) <= offs_m.expand_dims(1) + shift;
                }
                qk = where_(visible, qk, f32::NEG_INFINITY);
            }
            let p = exp2(qk - lse_log2.expand_dims(1));
            dv_acc = dot(trans(p.to::<T>()), do_tile, dv_acc);
            let dp = dot(do_tile, trans(v_tile));
            let ds = p * (dp - delta_row.expand_dims(1));
            dk_acc = dot(trans(ds.to::<T>()), q_tile, dk_acc);
            q_block = advance(q_block, [BLOCK_M, 0]);
            do_block = advance(do_block, [BLOCK_M, 0]);
        }
    }
    let dk_base = dk + batch * dk_batch_stride + head_kv * dk_head_stride;
    let dv_base = dv + batch * dv_batch_stride + head_kv * dv_head_stride;
    let dk_block = make_block_ptr(
        dk_base,
        [seqlen_k, HEAD_DIM],
        [dk_seq_stride, 1],
        [first_key, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    let dv_block = make_block_ptr(
        dv_base,
        [seqlen_k, HEAD_DIM],
        [dv_seq_stride, 1],
        [first_key, 0],
        [BLOCK_N, HEAD_DIM],
        [1, 0],
    );
    store(dk_block, dk_acc * softmax_scale, [0]);
    store(dv_block, dv_acc, [0]);
}
