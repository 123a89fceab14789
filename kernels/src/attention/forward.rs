//! FlashAttention forward, written in the DSL (seed 001's `_fwd_kernel`, grown to kiln's
//! conventions): one program per (query block, batch x query head).
//!
//! Online softmax in base 2: the row max is taken of unscaled scores and each weight is one FFMA
//! and an `exp2`, `exp2(qk * scale - m)` with `scale = softmax_scale * log2(e)` (a negative
//! scale's sign goes into Q). Keys outside the sequence or the causal mask are `-inf` before the
//! row max. Only the last key tiles need a mask: the loop tests a scalar and masks just those. A
//! causal block stops at its last row's diagonal. The LSE it writes is natural-log; rows that see
//! no key get O = 0 and LSE = -inf.
//!
//! With `OVERLAP_SOFTMAX` (the configuration's `wgmma`), each iteration starts the next key
//! block's scores and this block's `P @ V` on the tensor cores, then computes the next block's
//! softmax while `P @ V` runs (FlashAttention-3's intra-warpgroup overlap): `dot`s on `wgmma`
//! are waited for only where their results are used (in the PTX; ptxas moves the wait for
//! `P @ V` up to the row max, docs/PERF.md). The loop then runs one block ahead and
//! carries P. It is two loops with one body, as a branch in it would make ptxas wait for every
//! `wgmma`: the first while the next block needs no mask, the second masking every block. With
//! `LAST_BLOCK_APART` the last block's `P @ V` comes after them, its V tile loaded beside Q
//! (one more V tile in shared memory); without, the second loop's last iteration also scores a
//! block past the end, which the mask empties: work for nothing, up to 10% of a program of 8
//! key blocks (docs/PERF.md, 2026-11-26, eighth session).
//!
//! With `PERSISTENT` (a configuration with a producer, `kiln tune`'s `:persistent`; the table's
//! D64 and D128 forwards below 4k keys a program and D64's causal one at every length,
//! 1.03-1.22x the blocks before there: docs/PERF.md, fifteenth and sixteenth sessions) one
//! program an SM loops over every head's query blocks (`persistent` below; causal, over pairs
//! of them), its producer copying each block's Q and first K tile while the block before
//! finishes; kiln-codegen puts a block's first K and last V tiles in a slot of the key
//! loops' ring, and its output goes out by TMA from a tile of its own.
//!
//! With `SPLIT` (FlashDecoding, for calls whose query blocks are too few to fill the GPU: a
//! decode step, in 16-row blocks, `AttentionConfig::split_decode`; short queries against
//! long keys; `plan::forward_splits` decides) a program takes one of `num_programs(2)` equal
//! shares of the keys and writes its part, O divided by its own row sum (in f32: `OUT`) and its
//! LSE, into a workspace; [`attention_fwd_combine`] weighs the parts by their LSEs into O, LSE.
//! On sm_90a the combine launches as the split kernel's programmatic dependent: it may start as
//! soon as every split program has (`launch_dependent_grids`), and waits for their end before it
//! reads (`wait_for_prior_grids`).

use kiln_dsl::{kernel, kernel_fn};

use super::common::{
    check_head_dim, head_base, head_rows_from, key_blocks, key_range, mask_scores, query_block,
    row_block,
};

#[kernel]
pub fn attention_fwd<
    T,
    OUT,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const CAUSAL: bool,
    const OVERLAP_SOFTMAX: bool,
    const LAST_BLOCK_APART: bool,
    const PERSISTENT: bool,
    const SPLIT: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    o: Ptr<OUT>,
    lse: Ptr<f32>,
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
    softmax_scale: f32,
) {
    check_head_dim::<HEAD_DIM>();
    if SPLIT {
        // The combine waits for this kernel's end at its start: it may launch now.
        launch_dependent_grids();
    }
    if PERSISTENT {
        static_assert(
            OVERLAP_SOFTMAX && LAST_BLOCK_APART && !SPLIT,
            "a persistent forward overlaps its softmax, does its last block's P @ V apart and \
             takes every key of its blocks",
        );
        persistent::<T, OUT, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL>(
            q,
            k,
            v,
            o,
            lse,
            seqlen_q,
            seqlen_k,
            heads_q,
            group,
            batches,
            heads_kv,
            q_batch_stride,
            q_seq_stride,
            q_head_stride,
            k_batch_stride,
            k_seq_stride,
            k_head_stride,
            v_batch_stride,
            v_seq_stride,
            v_head_stride,
            o_batch_stride,
            o_seq_stride,
            o_head_stride,
            softmax_scale,
        );
    } else {
        query_block_forward::<
            T,
            OUT,
            HEAD_DIM,
            BLOCK_M,
            BLOCK_N,
            CAUSAL,
            OVERLAP_SOFTMAX,
            LAST_BLOCK_APART,
            SPLIT,
        >(
            q,
            k,
            v,
            o,
            lse,
            seqlen_q,
            seqlen_k,
            heads_q,
            group,
            batches,
            heads_kv,
            q_batch_stride,
            q_seq_stride,
            q_head_stride,
            k_batch_stride,
            k_seq_stride,
            k_head_stride,
            v_batch_stride,
            v_seq_stride,
            v_head_stride,
            o_batch_stride,
            o_seq_stride,
            o_head_stride,
            softmax_scale,
            query_block::<CAUSAL>(),
            program_id(1),
        );
    }
}

/// The split forward's last step, one program per (query row, batch x query head): each split
/// wrote its keys' O (divided by its own row sum) and LSE into a workspace, `o_parts`
/// `[splits * batches, seqlen_q, heads_q, HEAD_DIM]` (split s's batches after the splits
/// before, with the given strides) and `lse_parts` `[splits * batches, heads_q, seqlen_q]`;
/// this writes `O = sum_s exp(lse_s - lse) O_s` and `lse = log sum_s exp(lse_s)`. A split that
/// saw none of a row's keys has `lse_s = -inf`, weight 0; a row no split saw gets O = 0 and
/// LSE = -inf, as an unsplit forward gives it. The row's parts are the rows of one tile,
/// `SPLIT_BLOCK` splits at a time: loaded together, not one split's after another's, so that a
/// decode step's few programs wait for memory once (FlashDecoding's combine).
#[kernel]
pub fn attention_fwd_combine<T, const HEAD_DIM: usize, const SPLIT_BLOCK: usize>(
    o_parts: Ptr<f32>,
    lse_parts: Ptr<f32>,
    o: Ptr<T>,
    lse: Ptr<f32>,
    seqlen_q: i32,
    heads_q: i32,
    batches: i32,
    splits: i32,
    part_batch_stride: i64,
    part_seq_stride: i64,
    part_head_stride: i64,
    o_batch_stride: i64,
    o_seq_stride: i64,
    o_head_stride: i64,
) {
    check_head_dim::<HEAD_DIM>();
    // Launched as the split kernel's programmatic dependent (sm_90): its programs start while
    // the split kernel's last ones run, and wait here until their parts are written.
    wait_for_prior_grids();
    let row = program_id(0);
    let batch_head = program_id(1);
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let offs_d = arange(0, HEAD_DIM).expand_dims(0);
    // Online over the tiles of splits, in base 2 as the forward's row max is: `m` the largest
    // LSE so far, `l` the sum of each split's weight relative to it. One-element tiles: the
    // row's, as `store_rows` takes a block of rows.
    let mut m = full([1], f32::NEG_INFINITY, f32);
    let mut l = zeros([1], f32);
    let mut acc = zeros([1, HEAD_DIM], f32);
    for first in (0..splits).step_by(SPLIT_BLOCK) {
        let split = first + arange(0, SPLIT_BLOCK);
        let inside = split < splits;
        let part_batch = (split * batches + batch).to::<i64>();
        let lse_rows = lse_parts + (part_batch * heads_q + head) * seqlen_q + row;
        let lse_s =
            (load(lse_rows, inside, f32::NEG_INFINITY) * f32::consts::LOG2_E).expand_dims(1);
        let part_rows = o_parts
            + part_batch * part_batch_stride
            + head.to::<i64>() * part_head_stride
            + row.to::<i64>() * part_seq_stride;
        let o_s = load(
            part_rows.expand_dims(1) + offs_d,
            inside.expand_dims(1),
            0.0,
        );
        let m_new = maximum(m, lse_s.max(0));
        let m_safe = where_(m_new == f32::NEG_INFINITY, 0.0, m_new);
        let alpha = exp2(m - m_safe);
        let weight = exp2(lse_s - m_safe.expand_dims(0));
        l = l * alpha + weight.sum(0);
        acc = acc * alpha.expand_dims(1) + (o_s * weight).sum(0).expand_dims(0);
        m = m_new;
    }
    store_rows::<T, HEAD_DIM, 1>(
        acc,
        l,
        m,
        o,
        lse,
        seqlen_q,
        heads_q,
        batches,
        o_batch_stride,
        o_seq_stride,
        o_head_stride,
        row,
        row + arange(0, 1),
        batch,
        head,
        batch_head,
    );
}

/// One program's block of query rows, `start_m`, of query head `batch_head` (batch x heads).
#[kernel_fn]
fn query_block_forward<
    T,
    OUT,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const CAUSAL: bool,
    const OVERLAP_SOFTMAX: bool,
    const LAST_BLOCK_APART: bool,
    const SPLIT: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    o: Ptr<OUT>,
    lse: Ptr<f32>,
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
    softmax_scale: f32,
    start_m: i32,
    batch_head: i32,
) {
    let batch = batch_head / heads_q;
    let head = batch_head % heads_q;
    let head_kv = head / group;

    let q_base = head_base::<T>(q, batch, head, q_batch_stride, q_head_stride);

    let q_block =
        row_block::<T, HEAD_DIM, BLOCK_M>(q_base, seqlen_q, q_seq_stride, start_m * BLOCK_M);
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

    // Scores are `qk_scale * (q . k)` in base 2. The kernel folds the scale into the exponent's
    // FFMA, `exp2(qk * scale - m)`, which takes the row max of unscaled scores: that is the max
    // of scaled ones only for a scale >= 0, so a negative scale's sign goes into Q instead, and a
    // zero scale becomes the smallest normal one (it rounds every product to the same result).
    let offs_m = start_m * BLOCK_M + arange(0, BLOCK_M);
    // Query row i sees key j iff j <= i + shift (the mask is aligned bottom-right).
    let shift = seqlen_k - seqlen_q;
    // Key tiles before `full_end` need no mask; a causal block ends at its last row's diagonal.
    let (block_end, block_full_end) =
        key_range::<BLOCK_M, BLOCK_N, CAUSAL>(start_m, shift, seqlen_k);
    // Split, this program takes its share of the keys ([`split_share`]), `key_start..end_n`
    // within the block's own (empty, `end_n = key_start`, where a causal block ends before it);
    // keys past `end_n` are masked as keys past the sequence are (`key_bound`).
    let share = if SPLIT {
        split_share::<BLOCK_N>(seqlen_k)
    } else {
        0
    };
    let key_start = if SPLIT { program_id(2) * share } else { 0 };
    let end_n = if SPLIT {
        maximum(minimum(block_end, key_start + share), key_start)
    } else {
        block_end
    };
    let full_end = if SPLIT {
        minimum(block_full_end, end_n)
    } else {
        block_full_end
    };
    let key_bound = if SPLIT { end_n } else { seqlen_k };
    if SPLIT {
        k_block = advance(k_block, [key_start, 0]);
        v_block = advance(v_block, [key_start, 0]);
    }
    // With OVERLAP_SOFTMAX the loops start one key block in, after the first block's softmax,
    // the unmasked one ending a block early. Their bounds and blocks are computed before Q's
    // load: kiln-codegen issues the first loop's copies as soon as what they need exists, so
    // its first K and V tiles load beside Q and the first block's scores.
    // With LAST_BLOCK_APART they stop at `loops_end`, the last block's start; its P @ V follows
    // them.
    let k_first = k_block;
    let mut unmasked_end = full_end;
    let mut loops_end = end_n;
    if OVERLAP_SOFTMAX {
        k_block = advance(k_block, [BLOCK_N, 0]);
        unmasked_end = maximum(full_end - BLOCK_N, key_start);
        if LAST_BLOCK_APART {
            loops_end = if SPLIT {
                maximum(cdiv(end_n, BLOCK_N) - 1, key_start / BLOCK_N) * BLOCK_N
            } else {
                maximum(cdiv(end_n, BLOCK_N) - 1, 0) * BLOCK_N
            };
        }
        // A split's unmasked tiles may reach past its last block's start.
        if SPLIT {
            unmasked_end = minimum(unmasked_end, loops_end);
        }
    }
    let scale = softmax_scale * f32::consts::LOG2_E;
    let q_sign = where_(scale < 0.0, -1.0, 1.0);
    // The first K and last V tiles are loaded before Q, so that their latencies overlap Q's
    // (on `wgmma`, kiln-codegen copies them with TMA and waits where they are first read). A
    // program that sees no key loads V rows past the end, zeros: its P @ V is then 0 * 0, never
    // 0 * an input's inf.
    let k_first_tile = if OVERLAP_SOFTMAX {
        load(k_first, [0])
    } else {
        zeros([BLOCK_N, HEAD_DIM], T)
    };
    let v_last = if OVERLAP_SOFTMAX && LAST_BLOCK_APART {
        // `v_block` starts at `key_start`.
        let first_row = where_(end_n > key_start, loops_end, seqlen_k);
        load(advance(v_block, [first_row - key_start, 0]), [0])
    } else {
        zeros([BLOCK_N, HEAD_DIM], T)
    };
    let q_tile = (load(q_block, [0]).to::<f32>() * q_sign).to::<T>();
    let qk_scale = maximum(abs(scale), f32::MIN_POSITIVE);

    let mut m_i = full([BLOCK_M], f32::NEG_INFINITY, f32);
    let mut l_i = zeros([BLOCK_M], f32);
    let mut acc = zeros([BLOCK_M, HEAD_DIM], f32);
    if OVERLAP_SOFTMAX {
        // The first block's softmax before the loops; each iteration multiplies P by V and
        // starts the next block's ([`key_blocks_overlapped`]).
        let qk = scores::<CAUSAL, BLOCK_N>(
            dot(q_tile, trans(k_first_tile)),
            key_start,
            full_end,
            offs_m,
            shift,
            key_bound,
        );
        let (m_out, l_out, acc_out, p_out) =
            key_blocks_overlapped::<T, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL>(
                qk,
                q_tile,
                k_block,
                v_block,
                key_start,
                unmasked_end,
                loops_end,
                offs_m,
                shift,
                key_bound,
                qk_scale,
                m_i,
            );
        m_i = m_out;
        l_i = l_out;
        acc = acc_out;
        if LAST_BLOCK_APART {
            acc = dot(p_out, v_last, acc);
        }
    } else {
        for start_n in (key_start..end_n).step_by(BLOCK_N) {
            let k_tile = load(k_block, [0]);
            let v_tile = load(v_block, [0]);
            let qk = scores::<CAUSAL, BLOCK_N>(
                dot(q_tile, trans(k_tile)),
                start_n,
                full_end,
                offs_m,
                shift,
                key_bound,
            );
            let (m_new, p, alpha) = softmax_step(qk, qk_scale, m_i);
            l_i = l_i * alpha + p.sum(1);
            acc = dot(p.to::<T>(), v_tile, acc * alpha.expand_dims(1));
            m_i = m_new;
            k_block = advance(k_block, [BLOCK_N, 0]);
            v_block = advance(v_block, [BLOCK_N, 0]);
        }
    }

    // Split, the output is split `program_id(2)`'s part of the workspace, whose batches come
    // after the parts before ([`attention_fwd_combine`] reads them).
    let out_batches = if SPLIT {
        batches * num_programs(2)
    } else {
        batches
    };
    let out_batch = if SPLIT {
        program_id(2) * batches + batch
    } else {
        batch
    };
    store_rows::<OUT, HEAD_DIM, BLOCK_M>(
        acc,
        l_i,
        m_i,
        o,
        lse,
        seqlen_q,
        heads_q,
        out_batches,
        o_batch_stride,
        o_seq_stride,
        o_head_stride,
        start_m,
        offs_m,
        out_batch,
        head,
        if SPLIT {
            out_batch * heads_q + head
        } else {
            batch_head
        },
    );
}

/// Split `num_programs(2)` ways, how many keys each split of a query block takes: an equal
/// share of the whole sequence's key blocks (the last split's may be shorter or empty).
#[kernel_fn]
fn split_share<const BLOCK_N: usize>(seqlen_k: i32) -> i32 {
    cdiv(cdiv(seqlen_k, BLOCK_N), num_programs(2)) * BLOCK_N
}

/// A persistent forward: each program takes every `num_programs(0)`-th slot of query blocks
/// ([`persistent_tile`]), its producer copying a block's Q and first K tile (and the previous
/// block's last V tile) while the consumers finish the block before. Each block's last `P @ V`
/// and output come at the top of the next iteration, issued before the next block's first
/// scores and written while those run; an iteration past the last block finishes it. The block
/// "before" the first and the one "after" the last lie past the end: what they load is zeros
/// and what they store nothing (so do slots that are no block). Q goes to the tensor cores as
/// loaded, so the scale must be >= 0 (the launch gives a negative one to a kernel that is not
/// persistent: `plan::forward`).
#[kernel_fn]
fn persistent<
    T,
    OUT,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const CAUSAL: bool,
>(
    q: Ptr<T>,
    k: Ptr<T>,
    v: Ptr<T>,
    o: Ptr<OUT>,
    lse: Ptr<f32>,
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
    softmax_scale: f32,
) {
    let m_blocks = cdiv(seqlen_q, BLOCK_M);
    let heads = batches * heads_q;
    let programs = num_programs(0);
    let shift = seqlen_k - seqlen_q;
    let qk_scale = maximum(softmax_scale * f32::consts::LOG2_E, f32::MIN_POSITIVE);
    // The block before: none, one past the end.
    let mut prev_m = m_blocks;
    let mut prev_head = 0;
    let mut prev_v_row = seqlen_k;
    let mut m_i = full([BLOCK_M], f32::NEG_INFINITY, f32);
    let mut l_i = zeros([BLOCK_M], f32);
    let mut acc = zeros([BLOCK_M, HEAD_DIM], f32);
    let mut p_t = zeros([BLOCK_M, BLOCK_N], T);
    let slots = persistent_slots::<CAUSAL>(m_blocks, heads);
    for slot in (program_id(0)..slots + programs).step_by(programs) {
        let (tile_m, tile_head, real) = persistent_tile::<CAUSAL>(slot, m_blocks, heads);
        let start_m = where_(real, tile_m, m_blocks);
        let batch_head = where_(real, tile_head, 0);
        let batch = batch_head / heads_q;
        let head = batch_head % heads_q;
        let (k_block, v_block) = key_blocks::<T, HEAD_DIM, BLOCK_N>(
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
            head / group,
        );
        let offs_m = start_m * BLOCK_M + arange(0, BLOCK_M);
        let (tile_end, tile_full_end) =
            key_range::<BLOCK_M, BLOCK_N, CAUSAL>(start_m, shift, seqlen_k);
        let end_n = where_(real, tile_end, 0);
        let full_end = where_(real, tile_full_end, 0);
        let unmasked_end = maximum(full_end - BLOCK_N, 0);
        let loops_end = maximum(cdiv(end_n, BLOCK_N) - 1, 0) * BLOCK_N;
        // The producer copies in this order: the first K tile (freed earliest), the block
        // before's last V tile, then Q (two tiles by turns where shared memory has room, so
        // that it waits for the block before the block before; else for the block before's
        // key loops to end).
        let k_first_tile = load(k_block, [0]);
        let prev_batch = prev_head / heads_q;
        let prev_head_q = prev_head % heads_q;
        let v_last = load(
            head_rows_from::<T, HEAD_DIM, BLOCK_N>(
                v,
                batches,
                heads_kv,
                seqlen_k,
                v_batch_stride,
                v_head_stride,
                v_seq_stride,
                prev_batch,
                prev_head_q / group,
                prev_v_row,
            ),
            [0],
        );
        let q_tile = load(
            head_rows_from::<T, HEAD_DIM, BLOCK_M>(
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
            ),
            [0],
        );
        // The block before's last P @ V and this block's first scores, then the block before's
        // output. Nothing stands between the two `dot`s (the scores' zeros come first), so the
        // warpgroups take one turn for both; with one each, each waited for the other's first
        // (D64 1.02-1.05x at 1k-2k without). Up to head dim 64 the product goes first and the
        // output is written while the scores run; at 128 the scores go first, which ptxas
        // schedules into a key loop 8 instructions shorter: 1.01-1.03x at every length (runs
        // 223-224, docs/PERF.md, eighteenth session).
        let no_scores = zeros([BLOCK_M, BLOCK_N], f32);
        if HEAD_DIM <= 64 {
            acc = dot(p_t, v_last, acc);
        }
        let qk = dot(q_tile, trans(k_first_tile), no_scores);
        if HEAD_DIM > 64 {
            acc = dot(p_t, v_last, acc);
        }
        store_rows::<OUT, HEAD_DIM, BLOCK_M>(
            acc,
            l_i,
            m_i,
            o,
            lse,
            seqlen_q,
            heads_q,
            batches,
            o_batch_stride,
            o_seq_stride,
            o_head_stride,
            prev_m,
            prev_m * BLOCK_M + arange(0, BLOCK_M),
            prev_batch,
            prev_head_q,
            prev_head,
        );
        let qk = scores::<CAUSAL, BLOCK_N>(qk, 0, full_end, offs_m, shift, seqlen_k);
        let (m_out, l_out, acc_out, p_out) =
            key_blocks_overlapped::<T, HEAD_DIM, BLOCK_M, BLOCK_N, CAUSAL>(
                qk,
                q_tile,
                advance(k_block, [BLOCK_N, 0]),
                v_block,
                0,
                unmasked_end,
                loops_end,
                offs_m,
                shift,
                seqlen_k,
                qk_scale,
                full([BLOCK_M], f32::NEG_INFINITY, f32),
            );
        m_i = m_out;
        l_i = l_out;
        acc = acc_out;
        p_t = p_out;
        prev_m = start_m;
        prev_head = batch_head;
        prev_v_row = where_(end_n > 0, loops_end, seqlen_k);
    }
}

/// The slots a persistent forward's programs take between them, `num_programs(0)` a round:
/// without a mask one per tile; causal, two rounds for each round of pairs of blocks
/// ([`persistent_tile`]).
#[kernel_fn]
fn persistent_slots<const CAUSAL: bool>(m_blocks: i32, heads: i32) -> i32 {
    let programs = num_programs(0);
    if CAUSAL {
        2 * cdiv(heads * cdiv(m_blocks, 2), programs) * programs
    } else {
        m_blocks * heads
    }
}

/// The query block and head (batch x query head) of slot `slot` of a persistent forward, whose
/// programs each take every `num_programs(0)`-th slot, and whether it is a block at all.
/// Without a mask the slots are the tiles, one head's blocks after another. Causal, a program
/// takes a pair of one head's blocks, `j` and `m_blocks - 1 - j`, whose keys add up to the same
/// for every pair (the longer in one round, the shorter in the next), so that equal shares of
/// pairs are equal shares of work; the programs running at once take neighbouring pairs, a few
/// heads' whose K and V the L2 cache holds (the longest blocks of every head first had every
/// program on a head of its own, and the GPU ran 5% slower under its power cap: docs/PERF.md,
/// fifteenth and sixteenth sessions). A middle block (`m_blocks` odd) pairs with none. A launch
/// runs at most one program a pair (`plan::Launch`), so with fewer pairs than SMs each program
/// takes both blocks of its pair one after the other (choosing single blocks there at run time
/// cost D64's causal forward 4% everywhere: ptxas spilled 28 bytes instead of 8, run 206).
#[kernel_fn]
fn persistent_tile<const CAUSAL: bool>(slot: i32, m_blocks: i32, heads: i32) -> (i32, i32, bool) {
    let programs = num_programs(0);
    let round = slot / programs;
    let pairs = cdiv(m_blocks, 2);
    let pair = round / 2 * programs + program_id(0);
    let j = pair % pairs;
    let longer = m_blocks - 1 - j;
    let first = round % 2 == 0;
    let start_m = if CAUSAL {
        where_(first, longer, j)
    } else {
        slot % m_blocks
    };
    let head = if CAUSAL {
        pair / pairs
    } else {
        slot / m_blocks
    };
    let real = if CAUSAL {
        pair < heads * pairs && (first || j < longer)
    } else {
        slot < m_blocks * heads
    };
    (start_m, head, real)
}

/// With `OVERLAP_SOFTMAX`, from the first key block's masked scores `qk` (the block at
/// `key_start`): its softmax (from the row max `m_start`, all `-inf`), then the key blocks from
/// `k_block` and `v_block` (the second key block's and the first value block's) up to
/// `loops_end`, each iteration starting the next block's scores and this block's `P @ V`. Keys
/// from `key_bound` on are masked.
/// Returns the row max, row sum, accumulator and the last block's weights P, whose `P @ V` is
/// the caller's (the last V tile apart, or the block past the end's zeros).
#[kernel_fn]
fn key_blocks_overlapped<
    T,
    const HEAD_DIM: usize,
    const BLOCK_M: usize,
    const BLOCK_N: usize,
    const CAUSAL: bool,
>(
    qk: Tile<f32>,
    q_tile: Tile<T>,
    k_block: BlockPtr<T>,
    v_block: BlockPtr<T>,
    key_start: i32,
    unmasked_end: i32,
    loops_end: i32,
    offs_m: Tile<i32>,
    shift: i32,
    key_bound: i32,
    qk_scale: f32,
    m_start: Tile<f32>,
) -> (Tile<f32>, Tile<f32>, Tile<f32>, Tile<T>) {
    let (m_new, p, _) = softmax_step(qk, qk_scale, m_start);
    let mut l_i = p.sum(1);
    let mut m_i = m_new;
    let mut p_t = p.to::<T>();
    let mut acc = zeros([BLOCK_M, HEAD_DIM], f32);
    let mut k_block = k_block;
    let mut v_block = v_block;
    // Two loops with one body: the first while the next block needs no mask, the second
    // masking every block without a branch (ptxas waits for every wgmma where control flow
    // joins).
    for _ in (key_start..unmasked_end).step_by(BLOCK_N) {
        // Issued in this order so that waiting for the scores leaves P @ V running.
        let qk = dot(q_tile, trans(load(k_block, [0])));
        acc = dot(p_t, load(v_block, [0]), acc);
        let (m_new, p, alpha) = softmax_step(qk, qk_scale, m_i);
        l_i = l_i * alpha + p.sum(1);
        acc = acc * alpha.expand_dims(1);
        m_i = m_new;
        p_t = p.to::<T>();
        k_block = advance(k_block, [BLOCK_N, 0]);
        v_block = advance(v_block, [BLOCK_N, 0]);
    }
    for start_n in (unmasked_end..loops_end).step_by(BLOCK_N) {
        let qk = dot(q_tile, trans(load(k_block, [0])));
        acc = dot(p_t, load(v_block, [0]), acc);
        let offs_n = start_n + BLOCK_N + arange(0, BLOCK_N);
        let qk = mask_scores::<CAUSAL>(qk, offs_m, offs_n, shift, key_bound);
        let (m_new, p, alpha) = softmax_step(qk, qk_scale, m_i);
        l_i = l_i * alpha + p.sum(1);
        acc = acc * alpha.expand_dims(1);
        m_i = m_new;
        p_t = p.to::<T>();
        k_block = advance(k_block, [BLOCK_N, 0]);
        v_block = advance(v_block, [BLOCK_N, 0]);
    }
    (m_i, l_i, acc, p_t)
}

/// Writes block `start_m` of query head `batch_head`'s output, `acc / l` (0 where a row saw no
/// key, `l = 0`), and its natural-log LSE, `-inf` there; rows past `seqlen_q` are not written.
#[kernel_fn]
fn store_rows<OUT, const HEAD_DIM: usize, const BLOCK_M: usize>(
    acc: Tile<f32>,
    l_i: Tile<f32>,
    m_i: Tile<f32>,
    o: Ptr<OUT>,
    lse: Ptr<f32>,
    seqlen_q: i32,
    heads_q: i32,
    batches: i32,
    o_batch_stride: i64,
    o_seq_stride: i64,
    o_head_stride: i64,
    start_m: i32,
    offs_m: Tile<i32>,
    batch: i32,
    head: i32,
    batch_head: i32,
) {
    let seen = l_i > 0.0;
    let l_safe = where_(seen, l_i, 1.0);
    let o_block = head_rows_from::<OUT, HEAD_DIM, BLOCK_M>(
        o,
        batches,
        heads_q,
        seqlen_q,
        o_batch_stride,
        o_head_stride,
        o_seq_stride,
        batch,
        head,
        start_m * BLOCK_M,
    );
    // One reciprocal a row and a multiply an element: a division each would be IEEE's, with
    // its slow path, 64 times a thread at head dim 128.
    let inv_l = 1.0 / l_safe;
    store(o_block, acc * inv_l.expand_dims(1), [0]);
    let lse_row = where_(
        seen,
        (m_i + log2(l_safe)) * f32::consts::LN_2,
        f32::NEG_INFINITY,
    );
    let lse_rows = lse + batch_head.to::<i64>() * seqlen_q + offs_m;
    store(lse_rows, lse_row, offs_m < seqlen_q);
}

/// The scores of the key block at `start_n`, masked where it is one of the last blocks (from
/// `full_end`).
#[kernel_fn]
fn scores<const CAUSAL: bool, const BLOCK_N: usize>(
    qk: Tile<f32>,
    start_n: i32,
    full_end: i32,
    offs_m: Tile<i32>,
    shift: i32,
    seqlen_k: i32,
) -> Tile<f32> {
    if start_n >= full_end {
        let offs_n = start_n + arange(0, BLOCK_N);
        mask_scores::<CAUSAL>(qk, offs_m, offs_n, shift, seqlen_k)
    } else {
        qk
    }
}

/// One online-softmax step over unscaled scores `qk` from the running row max `m_i` (of scaled
/// scores, base 2; `qk_scale > 0`): the new max, the block's weights `exp2(qk * qk_scale - m)`
/// (one FFMA each) and the factor that rescales what came before.
#[kernel_fn]
fn softmax_step(qk: Tile<f32>, qk_scale: f32, m_i: Tile<f32>) -> (Tile<f32>, Tile<f32>, Tile<f32>) {
    let m_new = maximum(m_i, qk.max(1) * qk_scale);
    // A row with no visible key so far keeps m = -inf: subtracting 0 instead gives p = 0, not NaN.
    let m_safe = where_(m_new == f32::NEG_INFINITY, 0.0, m_new);
    let p = exp2(fma(qk, qk_scale, -m_safe.expand_dims(1)));
    let alpha = exp2(m_i - m_safe);
    (m_new, p, alpha)
}
