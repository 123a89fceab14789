//! Exhaustive checks of `kiln_codegen::layout::swizzle` (in the codegen test binary, which links LLVM once).

use kiln_codegen::layout::swizzle::*;

const F16: usize = 2;
const ROW_LENS: [usize; 4] = [32, 64, 128, 256];

#[test]
fn bank_model() {
    assert_eq!(LANES_PER_PHASE, 8);
    assert_eq!(bank(0), 0);
    assert_eq!(bank(4), 1);
    assert_eq!(bank(128), 0);
    assert_eq!(bank(130), 0);
    let straight: Vec<usize> = (0..8).map(|i| i * 16).collect();
    assert!(is_conflict_free_16b(&straight));
    let strided: Vec<usize> = (0..8).map(|i| i * 128).collect();
    assert!(!is_conflict_free_16b(&strided));
    let misaligned: Vec<usize> = (0..8).map(|i| i * 16 + 4).collect();
    assert!(!is_conflict_free_16b(&misaligned));
}

#[test]
fn chooser_matches_triton_ampere_rule() {
    // (row length, per_phase, max_phase) for f16 / bf16; vec is always 8 (16 bytes).
    let expected = [(16, 4, 2), (32, 2, 4), (64, 1, 8), (128, 1, 8), (256, 1, 8)];
    for (row_len, per_phase, max_phase) in expected {
        for order in [[1, 0], [0, 1]] {
            let mut shape = [64; 2];
            shape[order[0]] = row_len;
            let s = SwizzledShared::for_mma_operand(F16, shape, order);
            assert_eq!(
                (s.vec, s.per_phase, s.max_phase),
                (8, per_phase, max_phase),
                "row {row_len}"
            );
            // Triton: perPhase = 128 / (rowLen * 2) (min 1), maxPhase = 8 / perPhase.
            let triton_per_phase = (128 / (row_len * F16)).max(1);
            assert_eq!(s.per_phase, triton_per_phase);
            assert_eq!(s.max_phase, 8 / triton_per_phase);
        }
    }
    // 4-byte elements: still 16-byte vectors.
    let f32_tile = SwizzledShared::for_mma_operand(4, [64, 32], [1, 0]);
    assert_eq!(
        (f32_tile.vec, f32_tile.per_phase, f32_tile.max_phase),
        (4, 1, 8)
    );
}

#[test]
fn offset_is_a_bijection_and_coords_its_inverse() {
    for &row_len in &[8, 16, 32, 64, 128, 256] {
        for rows in [8, 64, 128] {
            for order in [[1, 0], [0, 1]] {
                let mut shape = [rows; 2];
                shape[order[0]] = row_len;
                let s = SwizzledShared::for_mma_operand(F16, shape, order);
                let mut seen = vec![false; s.len()];
                for d0 in 0..shape[0] {
                    for d1 in 0..shape[1] {
                        let off = s.offset([d0, d1]);
                        assert!(!seen[off], "{s:?}: offset {off} twice");
                        seen[off] = true;
                        assert_eq!(s.coords(off), [d0, d1]);
                        // Rows stay rows: the swizzle permutes within a storage row.
                        assert_eq!(off / row_len, [d0, d1][order[1]]);
                    }
                }
                assert!(seen.iter().all(|&b| b));
            }
        }
    }
}

#[test]
fn triton_doc_example() {
    // TritonGPUAttrDefs.td: vec = 2, per_phase = 2, rows 2 and 3 start with A_{r,2} A_{r,3}.
    let s = SwizzledShared::new(2, 2, 2, [1, 0], [4, 4]);
    let row = |r: usize| -> Vec<[usize; 2]> { (0..4).map(|o| s.coords(r * 4 + o)).collect() };
    assert_eq!(row(0), [[0, 0], [0, 1], [0, 2], [0, 3]]);
    assert_eq!(row(1), [[1, 0], [1, 1], [1, 2], [1, 3]]);
    assert_eq!(row(2), [[2, 2], [2, 3], [2, 0], [2, 1]]);
    assert_eq!(row(3), [[3, 2], [3, 3], [3, 0], [3, 1]]);
}

#[test]
fn equals_cutlass_swizzle() {
    let expected = [
        (32, (2, 3, 3)),
        (64, (3, 3, 3)),
        (128, (3, 3, 4)),
        (256, (3, 3, 5)),
    ];
    for (row_len, (b, m, s)) in expected {
        let tile = SwizzledShared::for_mma_operand(F16, [128, row_len], [1, 0]);
        let cute = tile.cute_swizzle().expect("has a CUTLASS form");
        assert_eq!(cute, CuteSwizzle { b, m, s }, "row {row_len}");
        for r in 0..128 {
            for c in 0..row_len {
                assert_eq!(tile.offset([r, c]), cute.apply(r * row_len + c));
            }
        }
    }
}

/// (a) A blocked layout writing the tile: each thread stores 8 contiguous f16 (16 bytes)
/// along the row, the lanes of a warp along the row then down the rows, warps down the rows.
/// Every phase of 8 lanes hits each bank once.
#[test]
fn blocked_16_byte_stores_are_conflict_free() {
    for row_len in ROW_LENS {
        for rows in [64, 128] {
            for num_warps in [4, 8] {
                let s = SwizzledShared::for_mma_operand(F16, [rows, row_len], [1, 0]);
                let per_thread = ACCESS_BYTES / F16;
                let lanes_per_row = (row_len / per_thread).min(32);
                let rows_per_warp = 32 / lanes_per_row;
                let threads = 32 * num_warps;
                let passes = rows * row_len / (threads * per_thread);
                for pass in 0..passes {
                    for warp in 0..num_warps {
                        let addr = |lane: usize| {
                            let row =
                                (pass * num_warps + warp) * rows_per_warp + lane / lanes_per_row;
                            let col = (lane % lanes_per_row) * per_thread;
                            assert!(s.is_contiguous_run([row, col], per_thread));
                            s.offset([row, col]) * F16
                        };
                        for phase in 0..4 {
                            let addrs: Vec<usize> = (phase * 8..phase * 8 + 8).map(addr).collect();
                            assert!(
                                is_conflict_free_16b(&addrs),
                                "row {row_len}, pass {pass}, warp {warp}, phase {phase}: {addrs:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// (b) The 8 row addresses of an `ldmatrix` 8x8 matrix: 8 consecutive storage rows (from a
/// multiple of 8) at one 16-byte column chunk. Every such matrix hits each bank once; without
/// the swizzle the eight rows share banks (the check is not vacuous).
#[test]
fn ldmatrix_row_reads_are_conflict_free() {
    for row_len in ROW_LENS {
        for order in [[1, 0], [0, 1]] {
            let mut shape = [128; 2];
            shape[order[0]] = row_len;
            let s = SwizzledShared::for_mma_operand(F16, shape, order);
            let plain = SwizzledShared::unswizzled(order, shape);
            for row0 in (0..s.rows()).step_by(8) {
                for col in (0..row_len).step_by(8) {
                    let at = |layout: &SwizzledShared, i: usize| {
                        let mut c = [0; 2];
                        c[order[1]] = row0 + i;
                        c[order[0]] = col;
                        assert!(layout.is_contiguous_run(c, 8));
                        layout.offset(c) * F16
                    };
                    let addrs: Vec<usize> = (0..8).map(|i| at(&s, i)).collect();
                    assert!(is_conflict_free_16b(&addrs), "row {row_len}: {addrs:?}");
                    let plain_addrs: Vec<usize> = (0..8).map(|i| at(&plain, i)).collect();
                    assert!(
                        !is_conflict_free_16b(&plain_addrs),
                        "unswizzled row {row_len} should conflict"
                    );
                }
            }
        }
    }
}
