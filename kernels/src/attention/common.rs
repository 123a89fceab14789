//! What the attention kernels share, written once as `#[kernel_fn]`s: each is inlined into the
//! kernel that calls it when that kernel is built, so the kernels' IR is what it would be with the
//! code written out in each.
//!
//! Tensors are `[batch, seqlen, heads, head_dim]` with element strides, head_dim contiguous. The
//! causal mask is aligned bottom-right: query row i sees key j iff `j <= i + shift`, with
//! `shift = seqlen_k - seqlen_q`.

use kiln_dsl::kernel_fn;

/// Refuses, when a kernel is built, a head dim kiln has no attention kernels for.
#[kernel_fn]
pub fn check_head_dim<const HEAD_DIM: usize>() {
    static_assert(
        HEAD_DIM == 32 || HEAD_DIM == 64 || HEAD_DIM == 128 || HEAD_DIM == 256,
        "attention supports head dims 32, 64, 128 and 256",
    );
}

/// The first element of head `head` of batch `batch` of a `[batch, seqlen, heads, head_dim]`
/// tensor at `ptr`.
#[kernel_fn]
pub fn head_base<T>(
    ptr: Ptr<T>,
    batch: i32,
    head: i32,
    batch_stride: i64,
    head_stride: i64,
) -> Ptr<T> {
    ptr + batch * batch_stride + head * head_stride
}

/// A block pointer to `ROWS` rows of one head, `[first_row, first_row + ROWS) x [0, HEAD_DIM)`
/// of the `[seqlen, HEAD_DIM]` rows at `base` (from [`head_base`]); rows past `seqlen` load as 0.
#[kernel_fn]
pub fn row_block<T, const HEAD_DIM: usize, const ROWS: usize>(
    base: Ptr<T>,
    seqlen: i32,
    seq_stride: i64,
    first_row: i32,
) -> BlockPtr<T> {
    make_block_ptr(
        base,
        [seqlen, HEAD_DIM],
        [seq_stride, 1],
        [first_row, 0],
        [ROWS, HEAD_DIM],
        [1, 0],
    )
}

/// [`row_block`] of head `head` of batch `batch`, described with the whole `[batches, seqlen,
/// heads, HEAD_DIM]` tensor at `ptr` (its leading dimensions indexed): where the kernel's
/// arguments describe the tensor, kiln-codegen may copy its tiles with Hopper's TMA.
#[kernel_fn]
pub fn head_rows<T, const HEAD_DIM: usize, const ROWS: usize>(
    ptr: Ptr<T>,
    batches: i32,
    heads: i32,
    seqlen: i32,
    batch_stride: i64,
    head_stride: i64,
    seq_stride: i64,
    batch: i32,
    head: i32,
) -> BlockPtr<T> {
    make_block_ptr(
        ptr,
        [batches, heads, seqlen, HEAD_DIM],
        [batch_stride, head_stride, seq_stride, 1],
        [batch, head, 0, 0],
        [ROWS, HEAD_DIM],
        [1, 0],
    )
}

/// [`head_rows`] from row `first_row` on: a block of one head's rows, as [`row_block`], that
/// kiln-codegen may store with TMA.
#[kernel_fn]
pub fn head_rows_from<T, const HEAD_DIM: usize, const ROWS: usize>(
    ptr: Ptr<T>,
    batches: i32,
    heads: i32,
    seqlen: i32,
    batch_stride: i64,
    head_stride: i64,
    seq_stride: i64,
    batch: i32,
    head: i32,
    first_row: i32,
) -> BlockPtr<T> {
    advance(
        head_rows::<T, HEAD_DIM, ROWS>(
            ptr,
            batches,
            heads,
            seqlen,
            batch_stride,
            head_stride,
            seq_stride,
            batch,
            head,
        ),
        [first_row, 0],
    )
}

/// `ROWS` rows of one head, from row `first_row`, of the backward's two per-row statistics: block
/// pointers into the f32 `[batches, heads, seqlen]` arrays of the LSE in base 2 at `lse_base2`
/// and of delta at `delta`, whose heads are `head_stride` apart (`seqlen` rounded up, so that
/// every head starts 32-byte aligned); rows past `seqlen` load as 0. Described whole, so that
/// kiln-codegen may copy them with TMA.
#[kernel_fn]
pub fn stats_blocks<const ROWS: usize>(
    lse_base2: Ptr<f32>,
    delta: Ptr<f32>,
    batches: i32,
    heads: i32,
    seqlen: i32,
    batch_stride: i64,
    head_stride: i64,
    batch: i32,
    head: i32,
    first_row: i32,
) -> (BlockPtr<f32>, BlockPtr<f32>) {
    let lse_block = make_block_ptr(
        lse_base2,
        [batches, heads, seqlen],
        [batch_stride, head_stride, 1],
        [batch, head, first_row],
        [ROWS],
        [0],
    );
    let delta_block = make_block_ptr(
        delta,
        [batches, heads, seqlen],
        [batch_stride, head_stride, 1],
        [batch, head, first_row],
        [ROWS],
        [0],
    );
    (lse_block, delta_block)
}

/// The K and V blocks of the first `BLOCK_N` keys of kv head `head_kv` of batch `batch`
/// ([`head_rows`]): what the forward and dQ stream, with TMA where they run on `wgmma`.
#[kernel_fn]
pub fn key_blocks<T, const HEAD_DIM: usize, const BLOCK_N: usize>(
    k: Ptr<T>,
    v: Ptr<T>,
    batches: i32,
    heads_kv: i32,
    seqlen_k: i32,
    k_batch_stride: i64,
    k_head_stride: i64,
    k_seq_stride: i64,
    v_batch_stride: i64,
    v_head_stride: i64,
    v_seq_stride: i64,
    batch: i32,
    head_kv: i32,
) -> (BlockPtr<T>, BlockPtr<T>) {
    let k_block = head_rows::<T, HEAD_DIM, BLOCK_N>(
        k,
        batches,
        heads_kv,
        seqlen_k,
        k_batch_stride,
        k_head_stride,
        k_seq_stride,
        batch,
        head_kv,
    );
    let v_block = head_rows::<T, HEAD_DIM, BLOCK_N>(
        v,
        batches,
        heads_kv,
        seqlen_k,
        v_batch_stride,
        v_head_stride,
        v_seq_stride,
        batch,
        head_kv,
    );
    (k_block, v_block)
}

/// The query block this forward or dQ program holds. Causal, a block's work grows with its
/// index, so programs take the last (longest) blocks first: the grid's last wave then runs the
/// shortest ones instead of leaving most SMs idle while the longest finish (H100: dQ +1-5% at
/// 16k; the forward, one program of 128 x 128 per SM, +8% at D128 16k and +3.5% at 4k,
/// docs/PERF.md, 2026-11-26).
#[kernel_fn]
pub fn query_block<const CAUSAL: bool>() -> i32 {
    if CAUSAL {
        num_programs(0) - 1 - program_id(0)
    } else {
        program_id(0)
    }
}

/// The keys query block `start_m` visits, `0..end_n`, and `full_end`, where the key tiles that
/// need no mask end (a multiple of `BLOCK_N`): tiles past `seqlen_k`, and causal, tiles that cross
/// the diagonal of the block's first row, need one. A causal block ends at its last row's
/// diagonal.
#[kernel_fn]
pub fn key_range<const BLOCK_M: usize, const BLOCK_N: usize, const CAUSAL: bool>(
    start_m: i32,
    shift: i32,
    seqlen_k: i32,
) -> (i32, i32) {
    let full_tiles_end = seqlen_k / BLOCK_N * BLOCK_N;
    let end_n = if CAUSAL {
        minimum(seqlen_k, maximum((start_m + 1) * BLOCK_M + shift, 0))
    } else {
        seqlen_k
    };
    let full_end = if CAUSAL {
        minimum(
            full_tiles_end,
            maximum(start_m * BLOCK_M + shift + 1, 0) / BLOCK_N * BLOCK_N,
        )
    } else {
        full_tiles_end
    };
    (end_n, full_end)
}

/// Which keys `offs_n` the query rows `offs_m` see, as a `[rows, keys]` mask: keys inside the
/// sequence and, causal, on or before each row's diagonal. Causal, each row's bound is folded
/// first (`j < min(i + shift + 1, seqlen_k)`), so that each score costs one compare.
#[kernel_fn]
pub fn visible<const CAUSAL: bool>(
    offs_m: Tile<i32>,
    offs_n: Tile<i32>,
    shift: i32,
    seqlen_k: i32,
) -> Tile<bool> {
    if CAUSAL {
        let end = minimum(offs_m + shift + 1, seqlen_k);
        offs_n.expand_dims(0) < end.expand_dims(1)
    } else {
        offs_n.expand_dims(0) < seqlen_k
    }
}

/// [`visible`] transposed, as a `[keys, rows]` mask for scores computed key-major (dK/dV's
/// `K Q^T`). Causal, each key's first visible row is folded first (`i >= j - shift`; a key past
/// `seqlen_k` has none), so that each score still costs one compare.
#[kernel_fn]
pub fn visible_by_key<const CAUSAL: bool>(
    offs_n: Tile<i32>,
    offs_m: Tile<i32>,
    shift: i32,
    seqlen_k: i32,
) -> Tile<bool> {
    let key_in = offs_n < seqlen_k;
    if CAUSAL {
        // i32::MAX: no row (the DSL takes float constants only by path).
        let first_row = where_(key_in, offs_n - shift, 2147483647);
        offs_m.expand_dims(0) >= first_row.expand_dims(1)
    } else {
        key_in.expand_dims(1)
    }
}

/// The scores `qk` of rows `offs_m` and keys `offs_n` (or the backward's exponents), `-inf` where
/// the row does not see the key (see [`visible`]), so that the softmax gives those keys no weight.
#[kernel_fn]
pub fn mask_scores<const CAUSAL: bool>(
    qk: Tile<f32>,
    offs_m: Tile<i32>,
    offs_n: Tile<i32>,
    shift: i32,
    seqlen_k: i32,
) -> Tile<f32> {
    where_(
        visible::<CAUSAL>(offs_m, offs_n, shift, seqlen_k),
        qk,
        f32::NEG_INFINITY,
    )
}

/// The forward's natural-log LSE of query rows in base 2, for `P = exp2(s * log2(e) - lse_log2)`.
/// A row that saw no key (LSE = -inf) gets `+inf`, so that its `P` is `exp2(-inf) = 0`, never
/// `exp2(x - (-inf))`.
#[kernel_fn]
pub fn lse_log2(lse_row: Tile<f32>) -> Tile<f32> {
    where_(
        lse_row == f32::NEG_INFINITY,
        f32::INFINITY,
        lse_row * f32::consts::LOG2_E,
    )
}
