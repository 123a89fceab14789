//! FlashAttention backward, split as in seed 001 but in two kernels: a dQ kernel that walks key
//! tiles and also writes two statistics of its query rows, `delta = rowsum(dO * O)` and the LSE
//! in base 2 (seed 001's preprocessing, done where dO is read anyway: one launch and one pass
//! over dO fewer), then a dK/dV kernel that walks query tiles and reads them. No atomics: each
//! output element is written by exactly one program, so the split backward is deterministic.
//!
//! Or fused, as FlashAttention-2 and 3 do (`KILN_FLAG_FUSED_BACKWARD`): a preprocessing kernel
//! writes the statistics and zeroes an f32 dQ accumulator, the dK/dV walk adds each tile's `dS K`
//! into it with atomic adds (no second pass over the keys), and a last kernel scales and rounds
//! it into dQ. The order of the adds varies, so dQ may differ in its last bits from run to run.
//!
//! Both gradient kernels recompute `P = exp2(s * log2(e) - lse * log2(e))`, one FFMA and an `exp2`
//! a score, from the forward's natural-log LSE in base 2. A row with LSE = -inf saw no key: it
//! gets `+inf` in place of its LSE, so its `P` is `exp2(-inf) = 0` and never `exp2(x - (-inf))`.
//! dK/dV computes key-major (`S^T = K Q^T`, FlashAttention-3's form), so that every product takes
//! its A operand from registers; it wants each query tile's statistics in the scores' column
//! layout, which its loop streams with the tiles ([`stats_blocks`]).

use kiln_dsl::{kernel, kernel_fn};

use super::common::{
    check_head_dim, head_base, head_rows, head_rows_from, key_blocks, key_range, lse_log2,
    mask_scores, query_block, row_block, stats_blocks, visible_by_key,
};

/// The fused backward's preprocessing of `BLOCK_M` query rows: their `delta = rowsum(dO * O)`
/// and LSE in base 2 (see [`lse_log2`]) into the statistics arrays dK/dV reads ([`stats_blocks`]),
/// and their rows of the dQ accumulator zeroed.
#[kernel]
pub fn attention_bwd_preprocess<T, const HEAD_DIM: usize, const BLOCK_M: usize>(
    o: Ptr<T>,
    d_o: Ptr<T>,
    lse: Ptr<f32>,
    lse_base2: Ptr<f32>,
    delta: Ptr<f32>,
    dq_accum: Ptr<f32>,
    seqlen_q: i32,
    heads_q: i32,
    batches: i32,
    o_batch_stride: i64,
    o_seq_stride: i64,
    o_head_stride: i64,
    do_batch_stride: i64,
    do_seq_stride: i64,
    do_head_stride: i64,
    stats_batch_stride: i64,
    stats_head_stride: i64,
) {
    let start_m = program_id(0);
    let batch_head = program_id(1);
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let o_base = head_base::<T>(o, batch, head, o_batch_stride, o_head_stride);
    let do_base = head_base::<T>(d_o, batch, head, do_batch_stride, do_head_stride);
    let o_block =
        row_block::<T, HEAD_DIM, BLOCK_M>(o_base, seqlen_q, o_seq_stride, start_m * BLOCK_M);
    let do_block =
        row_block::<T, HEAD_DIM, BLOCK_M>(do_base, seqlen_q, do_seq_stride, start_m * BLOCK_M);
    let offs_m = start_m * BLOCK_M + arange(0, BLOCK_M);
    let row_base = batch_head.to::<i64>() * seqlen_q;
    let lse_row = load(lse + row_base + offs_m, offs_m < seqlen_q, 0.0);
    store_row_stats::<BLOCK_M>(
        lse_base2,
        delta,
        lse_log2(lse_row),
        row_delta::<T>(load(o_block, [0]), load(do_block, [0])),
        batches,
        heads_q,
        seqlen_q,
        stats_batch_stride,
        stats_head_stride,
        batch,
        head,
        start_m * BLOCK_M,
    );
    let accum =
        dq_accum_block::<HEAD_DIM, BLOCK_M>(dq_accum, row_base, seqlen_q, start_m * BLOCK_M);
    store(accum, zeros([BLOCK_M, HEAD_DIM], f32), [0]);
}

/// Stores the statistics of `BLOCK_M` query rows of one head from `first_row` that dK/dV reads
/// ([`stats_blocks`]): their LSE in base 2 and their delta.
#[kernel_fn]
fn store_row_stats<const BLOCK_M: usize>(
    lse_base2: Ptr<f32>,
    delta: Ptr<f32>,
    lse_row: Tile<f32>,
    delta_row: Tile<f32>,
    batches: i32,
    heads_q: i32,
    seqlen_q: i32,
    stats_batch_stride: i64,
    stats_head_stride: i64,
    batch: i32,
    head: i32,
    first_row: i32,
) {
    let (lse_block, delta_block) = stats_blocks::<BLOCK_M>(
        lse_base2,
        delta,
        batches,
        heads_q,
        seqlen_q,
        stats_batch_stride,
        stats_head_stride,
        batch,
        head,
        first_row,
    );
    store(lse_block, lse_row, [0]);
    store(delta_block, delta_row, [0]);
}

/// `delta[i] = sum_d dO[i, d] * O[i, d]` of a block of rows, in f32: the term each row's `dS`
/// subtracts (`dS = P * (dP - delta)`).
#[kernel_fn]
fn row_delta<T>(o_tile: Tile<T>, do_tile: Tile<T>) -> Tile<f32> {
    sum(o_tile.to::<f32>() * do_tile.to::<f32>(), 1)
}

/// dQ of the fused backward for one (query block, batch x query head): `dQ = scale * dq_accum`,
/// rounded to `T`.
#[kernel]
pub fn attention_bwd_dq_convert<T, const HEAD_DIM: usize, const BLOCK_M: usize>(
    dq_accum: Ptr<f32>,
    dq: Ptr<T>,
    seqlen_q: i32,
    heads_q: i32,
    dq_batch_stride: i64,
    dq_seq_stride: i64,
    dq_head_stride: i64,
    softmax_scale: f32,
) {
    let start_m = program_id(0);
    let batch_head = program_id(1);
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let row_base = batch_head.to::<i64>() * seqlen_q;
    let accum =
        dq_accum_block::<HEAD_DIM, BLOCK_M>(dq_accum, row_base, seqlen_q, start_m * BLOCK_M);
    let dq_base = head_base::<T>(dq, batch, head, dq_batch_stride, dq_head_stride);
    let dq_block =
        row_block::<T, HEAD_DIM, BLOCK_M>(dq_base, seqlen_q, dq_seq_stride, start_m * BLOCK_M);
    store(dq_block, load(accum, [0]) * softmax_scale, [0]);
}

/// `BLOCK_M` query rows from `first_row` of one head of the fused backward's dQ accumulator, a
/// packed `[batch, heads_q, seqlen_q, HEAD_DIM]` f32 array whose head starts at row `row_base`
/// (`(batch * heads_q + head) * seqlen_q`); rows past `seqlen_q` are outside it.
#[kernel_fn]
fn dq_accum_block<const HEAD_DIM: usize, const BLOCK_M: usize>(
    dq_accum: Ptr<f32>,
    row_base: i64,
    seqlen_q: i32,
    first_row: i32,
) -> BlockPtr<f32> {
    row_block::<f32, HEAD_DIM, BLOCK_M>(
        dq_accum + row_base * HEAD_DIM,
        seqlen_q,
        HEAD_DIM,
        first_row,
    )
}

/// dQ for one (query block, batch x query head): `dQ = scale * sum_j dS_ij K_j`; it also writes
/// the block's `delta = rowsum(dO * O)`, which it uses, and LSE in base 2, into the statistics
/// arrays the dK/dV kernel after it reads ([`stats_blocks`]).
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
    o: Ptr<T>,
    d_o: Ptr<T>,
    dq: Ptr<T>,
    lse: Ptr<f32>,
    lse_base2: Ptr<f32>,
    delta: Ptr<f32>,
    seqlen_q: i32,
    seqlen_k: i32,
    heads_q: i32,
    group: i32,
    batches: i32,
    heads_kv: i32,
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
    do_batch_stride: i64,
    do_seq_stride: i64,
    do_head_stride: i64,
    dq_batch_stride: i64,
    dq_seq_stride: i64,
    dq_head_stride: i64,
    stats_batch_stride: i64,
    stats_head_stride: i64,
    softmax_scale: f32,
) {
    check_head_dim::<HEAD_DIM>();
    let start_m = query_block::<CAUSAL>();
    let batch_head = program_id(1);
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let head_kv = head / group;

    let o_base = head_base::<T>(o, batch, head, o_batch_stride, o_head_stride);
    let do_base = head_base::<T>(d_o, batch, head, do_batch_stride, do_head_stride);

    // Described whole: only `dot`s read Q, so on `wgmma` kiln-codegen copies it with TMA.
    let q_block = head_rows_from::<T, HEAD_DIM, BLOCK_M>(
        q,
        batches,
        heads_q,
        seqlen_q,
        q_batch_stride,
        q_head_stride,
        q_seq_stride,
        batch,
        head,
        start_m * BLOCK_M,
    );
    let o_block =
        row_block::<T, HEAD_DIM, BLOCK_M>(o_base, seqlen_q, o_seq_stride, start_m * BLOCK_M);
    let do_block =
        row_block::<T, HEAD_DIM, BLOCK_M>(do_base, seqlen_q, do_seq_stride, start_m * BLOCK_M);
    let (mut k_block, mut v_block) = key_blocks::<T, HEAD_DIM, BLOCK_N>(
        k,
        v,
        batches,
        heads_kv,
        seqlen_k,
        k_batch_stride,
        k_head_stride,
        k_seq_stride,
        v_batch_stride,
        v_head_stride,
        v_seq_stride,
        batch,
        head_kv,
    );
    let q_tile = load(q_block, [0]);
    let do_tile = load(do_block, [0]);

    let offs_m = start_m * BLOCK_M + arange(0, BLOCK_M);
    let row_ok = offs_m < seqlen_q;
    let row_base = batch_head.to::<i64>() * seqlen_q;
    let lse_row = load(lse + row_base + offs_m, row_ok, 0.0);
    let lse_row = lse_log2(lse_row);
    let delta_row = row_delta::<T>(load(o_block, [0]), do_tile);
    store_row_stats::<BLOCK_M>(
        lse_base2,
        delta,
        lse_row,
        delta_row,
        batches,
        heads_q,
        seqlen_q,
        stats_batch_stride,
        stats_head_stride,
        batch,
        head,
        start_m * BLOCK_M,
    );
    let lse_neg = -lse_row.expand_dims(1);
    let qk_scale = softmax_scale * f32::consts::LOG2_E;
    let shift = seqlen_k - seqlen_q;
    let (end_n, full_end) = key_range::<BLOCK_M, BLOCK_N, CAUSAL>(start_m, shift, seqlen_k);

    let mut dq_acc = zeros([BLOCK_M, HEAD_DIM], f32);
    for start_n in (0..end_n).step_by(BLOCK_N) {
        let k_tile = load(k_block, [0]);
        let v_tile = load(v_block, [0]);
        let qk = dot(q_tile, trans(k_tile));
        // Up to 128 x 64 score tiles dP is issued beside the scores and runs while P is
        // computed: dQ 1.01-1.06x at D64 on sm_90a, 1.01-1.03x on sm_80; at D128's 128 x 128
        // 0.88-0.96x (run 107, docs/PERF.md, tenth session; two warpgroups of 64 x 128 each,
        // 0.88-0.95x again in run 243, twentieth session).
        let early_dp = BLOCK_M * BLOCK_N <= 128 * 64;
        let mut dp = if early_dp {
            dot(do_tile, trans(v_tile))
        } else {
            0.0
        };
        // The exponent in one FFMA a score; a masked score's is -inf.
        let s = fma(qk, qk_scale, lse_neg);
        let s = if start_n >= full_end {
            let offs_n = start_n + arange(0, BLOCK_N);
            mask_scores::<CAUSAL>(s, offs_m, offs_n, shift, seqlen_k)
        } else {
            s
        };
        let p = exp2(s);
        if !early_dp {
            dp = dot(do_tile, trans(v_tile));
        }
        let ds = p * (dp - delta_row.expand_dims(1));
        dq_acc = dot(ds.to::<T>(), k_tile, dq_acc);
        k_block = advance(k_block, [BLOCK_N, 0]);
        v_block = advance(v_block, [BLOCK_N, 0]);
    }
    let dq_block = head_rows_from::<T, HEAD_DIM, BLOCK_M>(
        dq,
        batches,
        heads_q,
        seqlen_q,
        dq_batch_stride,
        dq_head_stride,
        dq_seq_stride,
        batch,
        head,
        start_m * BLOCK_M,
    );
    store(dq_block, dq_acc * softmax_scale, [0]);
}

/// dK and dV for one (key block, batch x kv head), summed over the query heads of its group:
/// `dV = sum_i P_ij dO_i`, `dK = scale * sum_i dS_ij Q_i`; with `ACCUMULATE_DQ` (the fused
/// backward) each query tile's `dS_ij K_j` is also added into `dq_accum` (zeroed by the
/// preprocessing kernel) with f32 atomic adds: on `wgmma` one TMA reduction a slab of the tile,
/// from shared memory, as FlashAttention-3 adds its dQ. Without it, `dq_accum` is never touched.
///
/// With `EARLY_DP` dP's product is issued beside the scores' and runs while P is computed
/// ([`super::dkdv_early_dp`]).
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
    const ACCUMULATE_DQ: bool,
    const KEY_MAJOR: bool,
    const EARLY_DP: bool,
    const DQ_BY_TURNS: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    d_o: Ptr<T>,
    dk: Ptr<T>,
    dv: Ptr<T>,
    lse_base2: Ptr<f32>,
    delta: Ptr<f32>,
    dq_accum: Ptr<f32>,
    seqlen_q: i32,
    seqlen_k: i32,
    heads_kv: i32,
    group: i32,
    batches: i32,
    heads_q: i32,
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
    stats_batch_stride: i64,
    stats_head_stride: i64,
    dq_accum_batch_stride: i64,
    dq_accum_head_stride: i64,
    softmax_scale: f32,
) {
    check_head_dim::<HEAD_DIM>();
    let start_n = program_id(0);
    let batch_head_kv = program_id(1);
    let batch = batch_head_kv / heads_kv;
    let head_kv = batch_head_kv % heads_kv;

    // Through registers: described whole (`head_rows_from`), K and V would be one-shot TMA
    // copies, which made ptxas spill in the D64 loop (132-164 bytes against 16-24), 9-14% slower
    // (docs/PERF.md, 2026-11-26, ninth session).
    let k_base = head_base::<T>(k, batch, head_kv, k_batch_stride, k_head_stride);
    let v_base = head_base::<T>(v, batch, head_kv, v_batch_stride, v_head_stride);
    let k_block =
        row_block::<T, HEAD_DIM, BLOCK_N>(k_base, seqlen_k, k_seq_stride, start_n * BLOCK_N);
    let v_block =
        row_block::<T, HEAD_DIM, BLOCK_N>(v_base, seqlen_k, v_seq_stride, start_n * BLOCK_N);
    let k_tile = load(k_block, [0]);
    let v_tile = load(v_block, [0]);

    let first_key = start_n * BLOCK_N;
    let offs_n = first_key + arange(0, BLOCK_N);
    let qk_scale = softmax_scale * f32::consts::LOG2_E;
    let shift = seqlen_k - seqlen_q;
    // A key block that runs past seqlen_k needs its key mask on every query tile.
    let partial_keys = first_key + BLOCK_N > seqlen_k;
    // Causal: query rows before `begin_m` see none of these keys; from `full_m` on they see all.
    let begin_m = if CAUSAL {
        maximum(first_key - shift, 0) / BLOCK_M * BLOCK_M
    } else {
        0
    };
    let full_m = if CAUSAL {
        first_key + BLOCK_N - 1 - shift
    } else {
        0
    };

    let mut dk_acc = zeros([BLOCK_N, HEAD_DIM], f32);
    let mut dv_acc = zeros([BLOCK_N, HEAD_DIM], f32);
    for member in 0..group {
        let head = head_kv * group + member;
        // Described whole: the query loop may stream Q and dO with TMA.
        let q_rows = head_rows::<T, HEAD_DIM, BLOCK_M>(
            q,
            batches,
            heads_q,
            seqlen_q,
            q_batch_stride,
            q_head_stride,
            q_seq_stride,
            batch,
            head,
        );
        let do_rows = head_rows::<T, HEAD_DIM, BLOCK_M>(
            d_o,
            batches,
            heads_q,
            seqlen_q,
            do_batch_stride,
            do_head_stride,
            do_seq_stride,
            batch,
            head,
        );
        // Key-major, each query tile's statistics are read in the scores' column layout (16 to
        // 32 columns a thread): described whole, the query loop streams them with TMA too, into
        // shared memory, rather than each thread loading its columns from global memory when
        // the scores want them (docs/PERF.md, 2026-11-26, tenth session).
        let stats_row =
            batch.to::<i64>() * stats_batch_stride + head.to::<i64>() * stats_head_stride;
        let (mut lse_block, mut delta_block) = stats_blocks::<BLOCK_M>(
            lse_base2,
            delta,
            batches,
            heads_q,
            seqlen_q,
            stats_batch_stride,
            stats_head_stride,
            batch,
            head,
            begin_m,
        );
        let mut q_block = advance(q_rows, [begin_m, 0]);
        let mut do_block = advance(do_rows, [begin_m, 0]);
        for start_m in (begin_m..seqlen_q).step_by(BLOCK_M) {
            let q_tile = load(q_block, [0]);
            let do_tile = load(do_block, [0]);
            let offs_m = start_m + arange(0, BLOCK_M);
            let needs_mask = if CAUSAL {
                partial_keys || start_m < full_m
            } else {
                partial_keys
            };
            if !KEY_MAJOR {
                // Query-major: dQ's `dS K` takes dS from the accumulators as its A operand
                // (key-major, dS^T went through shared memory: fused 0.79-0.98x, run 103), and
                // `mma.sync` reads every operand from registers anyway (key-major there: D64
                // dK/dV 0.74-0.86x, run 110). Its statistics in the rows' layout, two a thread,
                // are plain loads.
                let row_ok = offs_m < seqlen_q;
                let lse_row = load(lse_base2 + stats_row + offs_m, row_ok, 0.0);
                let delta_row = load(delta + stats_row + offs_m, row_ok, 0.0);
                let qk = dot(q_tile, trans(k_tile));
                let mut dp = if EARLY_DP {
                    dot(do_tile, trans(v_tile))
                } else {
                    0.0
                };
                // The exponent in one FFMA a score; a masked score's is -inf.
                let s = fma(qk, qk_scale, -lse_row.expand_dims(1));
                let s = if needs_mask {
                    mask_scores::<CAUSAL>(s, offs_m, offs_n, shift, seqlen_k)
                } else {
                    s
                };
                let p = exp2(s);
                dv_acc = dot(trans(p.to::<T>()), do_tile, dv_acc);
                if !EARLY_DP {
                    dp = dot(do_tile, trans(v_tile));
                }
                let ds = (p * (dp - delta_row.expand_dims(1))).to::<T>();
                dk_acc = dot(trans(ds), q_tile, dk_acc);
                if ACCUMULATE_DQ {
                    // Described whole: on `wgmma` the tile is added by TMA, from shared memory.
                    let accum = head_rows_from::<f32, HEAD_DIM, BLOCK_M>(
                        dq_accum,
                        batches,
                        heads_q,
                        seqlen_q,
                        dq_accum_batch_stride,
                        dq_accum_head_stride,
                        HEAD_DIM as i64,
                        batch,
                        head,
                        start_m,
                    );
                    atomic_add(accum, dot(ds, k_tile), [0]);
                }
            } else {
                // Key-major (`K Q^T`, FlashAttention-3's form): `P^T dO` and `dS^T Q` take P^T
                // and dS^T from the accumulators as their A operands, and no P or dS goes
                // through shared memory (1.05-1.21x, run 101).
                // Its statistics (16 columns a thread of each) read at the top, before the
                // products, whose operands then hold up their loads from shared memory no
                // more: the fused D128 1.04-1.06x against reading each where it is used, which
                // its registers once asked for (run 271; run 151 before its lean producer).
                let lse_row = load(lse_block, [0]);
                let delta_row = load(delta_block, [0]);
                let qk_t = dot(k_tile, trans(q_tile));
                let mut dp_t = if EARLY_DP {
                    dot(v_tile, trans(do_tile))
                } else {
                    0.0
                };
                let s_t = fma(qk_t, qk_scale, -lse_row.expand_dims(0));
                let s_t = if needs_mask {
                    where_(
                        visible_by_key::<CAUSAL>(offs_n, offs_m, shift, seqlen_k),
                        s_t,
                        f32::NEG_INFINITY,
                    )
                } else {
                    s_t
                };
                let p_t = exp2(s_t);
                dv_acc = dot(p_t.to::<T>(), do_tile, dv_acc);
                if !EARLY_DP {
                    dp_t = dot(v_tile, trans(do_tile));
                }
                let ds_t = (p_t * (dp_t - delta_row.expand_dims(0))).to::<T>();
                if ACCUMULATE_DQ && DQ_BY_TURNS {
                    dk_acc = dot(ds_t, q_tile, dk_acc);
                    // `dQ = dS K` whole (N = HEAD_DIM) by one warpgroup of a query tile's 64
                    // rows, the warpgroups taking turns, while the others go on to the next
                    // tile (cuDNN's form); its one use the reduction right after it.
                    let accum = head_rows_from::<f32, HEAD_DIM, BLOCK_M>(
                        dq_accum,
                        batches,
                        heads_q,
                        seqlen_q,
                        dq_accum_batch_stride,
                        dq_accum_head_stride,
                        HEAD_DIM as i64,
                        batch,
                        head,
                        start_m,
                    );
                    atomic_add(accum, dot(trans(ds_t), k_tile), [0]);
                } else {
                    // Transposed, `dQ^T = K^T dS^T`: its rows are the head dim's, which the
                    // warpgroups share however few the query rows (FlashAttention-3's form).
                    // Before dK's product, so that its tile is written out while that one runs.
                    let dq_t = if ACCUMULATE_DQ {
                        dot(trans(k_tile), ds_t)
                    } else {
                        zeros([HEAD_DIM, BLOCK_M], f32)
                    };
                    dk_acc = dot(ds_t, q_tile, dk_acc);
                    if ACCUMULATE_DQ {
                        // Added through a transposed view of the accumulator.
                        let accum = make_block_ptr(
                            dq_accum,
                            [batches, heads_q, HEAD_DIM as i32, seqlen_q],
                            [
                                dq_accum_batch_stride,
                                dq_accum_head_stride,
                                1,
                                HEAD_DIM as i64,
                            ],
                            [batch, head, 0, start_m],
                            [HEAD_DIM, BLOCK_M],
                            [0, 1],
                        );
                        atomic_add(accum, dq_t, [1]);
                    }
                }
            }
            q_block = advance(q_block, [BLOCK_M, 0]);
            do_block = advance(do_block, [BLOCK_M, 0]);
            lse_block = advance(lse_block, [BLOCK_M]);
            delta_block = advance(delta_block, [BLOCK_M]);
        }
    }
    // Not described whole (`head_rows_from`): by TMA, dK and dV made ptxas spill in the D64 loop,
    // 10% slower (docs/PERF.md, 2026-11-26). kiln-codegen moves them into the coalescing layout
    // through the drained buffers instead, 16-byte stores (1.02-1.14x at 1k-4k, run 331).
    let dk_base = head_base::<T>(dk, batch, head_kv, dk_batch_stride, dk_head_stride);
    let dv_base = head_base::<T>(dv, batch, head_kv, dv_batch_stride, dv_head_stride);
    let dk_block = row_block::<T, HEAD_DIM, BLOCK_N>(dk_base, seqlen_k, dk_seq_stride, first_key);
    let dv_block = row_block::<T, HEAD_DIM, BLOCK_N>(dv_base, seqlen_k, dv_seq_stride, first_key);
    store(dk_block, dk_acc * softmax_scale, [0]);
    store(dv_block, dv_acc, [0]);
}
