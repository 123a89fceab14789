//! Exhaustive checks of `kiln_codegen::layout::mma` (in the codegen test binary, which links LLVM once).

use kiln_codegen::layout::THREADS_PER_WARP;
use kiln_codegen::layout::mma::*;
use kiln_codegen::layout::swizzle::{SwizzledShared, is_conflict_free_16b};

const LANES: std::ops::Range<u32> = 0..THREADS_PER_WARP;

/// Shapes of the attention kernels' tiles: rows (BLOCK_M) x columns (BLOCK_N or head dim).
const ROWS: [usize; 2] = [64, 128];
const COLS: [usize; 4] = [32, 64, 128, 256];

/// Every warp arrangement used: the chooser's for 4 and 8 warps, and explicit N splits.
fn layouts_for(shape: [usize; 2]) -> Vec<MmaV2> {
    let mut layouts = Vec::new();
    for warps in [4, 8] {
        layouts.push(MmaV2::choose(shape, warps).unwrap());
    }
    for [wm, wn] in [[4, 1], [8, 1], [2, 2], [4, 2], [1, 4], [2, 4]] {
        let l = MmaV2::new(wm, wn);
        if l.check_acc_shape(shape).is_ok() && !layouts.contains(&l) {
            layouts.push(l);
        }
    }
    layouts
}

// ---- A CuTe layout evaluator, to check the PTX formulas against CUTLASS's tables. ----

/// A flat CuTe layout: modes `(size, stride)`, the first mode fastest.
fn cute(modes: &[(usize, usize)], index: usize) -> usize {
    let mut rest = index;
    let mut out = 0;
    for &(size, stride) in modes {
        out += (rest % size) * stride;
        rest /= size;
    }
    out
}

/// `(T32, V) -> index` of an MMA_Traits layout, with thread modes and value modes.
fn cute_tv(thr: &[(usize, usize)], val: &[(usize, usize)], t: u32, v: usize) -> usize {
    cute(thr, t as usize) + cute(val, v)
}

#[test]
fn fragments_match_ptx_formulas() {
    for lane in LANES {
        let g = (lane >> 2) as usize;
        let t = (lane % 4) as usize;
        // PTX: C/D.
        for i in 0..4 {
            let row = if i < 2 { g } else { g + 8 };
            assert_eq!(acc_fragment(lane, i), [row, t * 2 + (i & 1)]);
        }
        // PTX: A, a_i in register i / 2, half i % 2.
        for i in 0..8 {
            let row = if i < 2 || (4..6).contains(&i) {
                g
            } else {
                g + 8
            };
            let col = t * 2 + (i & 1) + if i >= 4 { 8 } else { 0 };
            assert_eq!(a_fragment(lane, i / 2, i % 2), [row, col]);
        }
        // PTX: B, b_i in register i / 2, half i % 2.
        for i in 0..4 {
            let row = t * 2 + (i & 1) + if i >= 2 { 8 } else { 0 };
            assert_eq!(b_fragment(lane, i / 2, i % 2), [row, g]);
        }
    }
}

#[test]
fn fragments_match_cutlass_sm80_traits() {
    // cute/atom/mma_traits_sm80.hpp, SM80_16x8x16_F32F16F16F32_TN; (m, n) / (m, k) / (n, k)
    // indices are column-major.
    let c_thr = [(4, 32), (8, 1)];
    let c_val = [(2, 16), (2, 8)];
    let a_thr = [(4, 32), (8, 1)];
    let a_val = [(2, 16), (2, 8), (2, 128)];
    let b_thr = [(4, 16), (8, 1)];
    let b_val = [(2, 8), (2, 64)];
    for lane in LANES {
        for v in 0..4 {
            let idx = cute_tv(&c_thr, &c_val, lane, v);
            assert_eq!(
                acc_fragment(lane, v),
                [idx % 16, idx / 16],
                "C lane {lane} v {v}"
            );
        }
        for v in 0..8 {
            let idx = cute_tv(&a_thr, &a_val, lane, v);
            assert_eq!(
                a_fragment(lane, v / 2, v % 2),
                [idx % 16, idx / 16],
                "A {lane} {v}"
            );
        }
        for v in 0..4 {
            let idx = cute_tv(&b_thr, &b_val, lane, v);
            let (n, k) = (idx % 8, idx / 8);
            assert_eq!(
                b_fragment(lane, v / 2, v % 2),
                [k, n],
                "B lane {lane} v {v}"
            );
        }
    }
}

#[test]
fn instruction_fragments_are_bijections_with_inverses() {
    let mut seen = [[false; 8]; 16];
    for lane in LANES {
        for reg in 0..4 {
            let [r, c] = acc_fragment(lane, reg);
            assert!(!seen[r][c]);
            seen[r][c] = true;
            assert_eq!(acc_fragment_inverse([r, c]), (lane, reg));
        }
    }
    let mut seen = [[false; 16]; 16];
    for lane in LANES {
        for reg in 0..4 {
            for half in 0..2 {
                let [m, k] = a_fragment(lane, reg, half);
                assert!(!seen[m][k]);
                seen[m][k] = true;
                assert_eq!(a_fragment_inverse([m, k]), (lane, reg, half));
            }
        }
    }
    let mut seen = [[false; 8]; 16];
    for lane in LANES {
        for reg in 0..2 {
            for half in 0..2 {
                let [k, n] = b_fragment(lane, reg, half);
                assert!(!seen[k][n]);
                seen[k][n] = true;
                assert_eq!(b_fragment_inverse([k, n]), (lane, reg, half));
            }
        }
    }
}

#[test]
fn ldmatrix_matches_cutlass_copy_traits() {
    // cute/atom/copy_traits_sm75.hpp: SrcLayout (32 threads, 128 bits) stride (128, 1):
    // thread s supplies source bits [128 s, 128 s + 128). DstLayouts map (thread, value) to
    // a source bit; bit b of the 16-bit element `elem` of row s is 128 s + 16 elem + b.
    let n_thr = [(32, 32)];
    let n_val = [(32, 1), (4, 1024)]; // SM75_U32x4_LDSM_N: (bit of the 32-bit reg, reg)
    let t_thr = [(4, 256), (8, 16)];
    let t_val = [(16, 1), (2, 128), (4, 1024)]; // SM75_U16x8_LDSM_T: (bit, half, reg)
    for lane in LANES {
        for reg in 0..4 {
            for half in 0..2 {
                let bit = cute(&n_thr, lane as usize) + cute(&n_val, 16 * half + 32 * reg);
                let expect = ((bit / 128) as u32, (bit % 128) / 16);
                assert_eq!(ldmatrix_source(lane, reg, half, false), expect);
                let bit = cute(&t_thr, lane as usize) + cute(&t_val, 16 * half + 32 * reg);
                let expect = ((bit / 128) as u32, (bit % 128) / 16);
                assert_eq!(ldmatrix_source(lane, reg, half, true), expect);
            }
        }
    }
    // PTX: threads 8j..8j+7 supply the rows of matrix j.
    for lane in LANES {
        let (matrix, row) = ldmatrix_address_row(lane);
        assert_eq!((matrix, row), (lane as usize / 8, lane as usize % 8));
        assert_eq!(ldmatrix_address_lane(matrix, row), lane);
    }
}

#[test]
fn accumulator_layout_is_a_bijection_with_its_inverse() {
    for rows in ROWS {
        for cols in COLS {
            let shape = [rows, cols];
            for layout in layouts_for(shape) {
                let regs = layout.acc_registers(shape);
                assert_eq!(regs * 32 * layout.num_warps() as usize, rows * cols);
                let mut seen = vec![false; rows * cols];
                for warp in 0..layout.num_warps() {
                    for lane in LANES {
                        for reg in 0..regs {
                            let [r, c] = layout.acc_position(shape, warp, lane, reg);
                            assert!(
                                !seen[r * cols + c],
                                "{layout:?} {shape:?}: [{r}, {c}] twice"
                            );
                            seen[r * cols + c] = true;
                            let slot = Slot {
                                warp,
                                lane,
                                reg,
                                half: 0,
                            };
                            assert_eq!(layout.acc_owner(shape, [r, c]), slot);
                            // Within one instruction tile, the PTX fragment.
                            let tile_base = [r - r % MMA_M, c - c % MMA_N];
                            assert_eq!(
                                acc_fragment(lane, reg % 4),
                                [r - tile_base[0], c - tile_base[1]]
                            );
                        }
                    }
                }
                assert!(seen.iter().all(|&s| s));
            }
        }
    }
}

#[test]
fn accumulator_example_128x64_four_warps() {
    let layout = MmaV2::choose([128, 64], 4).unwrap();
    assert_eq!(layout.warps_per_cta, [4, 1]);
    assert_eq!(layout.acc_reps([128, 64]), [2, 8]);
    assert_eq!(layout.acc_registers([128, 64]), 64);
    // Warp 1, lane 5 (g = 1, t = 1): rows 16 + 1 (+ 8, + 64), columns 2 + {0, 1} (+ 8 n).
    assert_eq!(layout.acc_position([128, 64], 1, 5, 0), [17, 2]);
    assert_eq!(layout.acc_position([128, 64], 1, 5, 1), [17, 3]);
    assert_eq!(layout.acc_position([128, 64], 1, 5, 2), [25, 2]);
    assert_eq!(layout.acc_position([128, 64], 1, 5, 3), [25, 3]);
    assert_eq!(layout.acc_position([128, 64], 1, 5, 4), [17, 10]);
    assert_eq!(layout.acc_position([128, 64], 1, 5, 32), [81, 2]);
    assert_eq!(MmaV2::choose([64, 64], 8).unwrap().warps_per_cta, [4, 2]);
    assert_eq!(MmaV2::choose([128, 64], 8).unwrap().warps_per_cta, [8, 1]);
    assert!(MmaV2::choose([8, 64], 4).is_err());
    assert!(MmaV2::new(4, 1).check_acc_shape([48, 64]).is_err());
}

#[test]
fn operand_layouts_cover_their_tiles_and_invert() {
    for rows in ROWS {
        for cols in COLS {
            for layout in layouts_for([rows, cols]) {
                // A: [rows, k]; B: [k, cols]; k over the attention head dims / key blocks.
                for k in COLS {
                    for (op, shape, copies) in [
                        (Operand::A, [rows, k], layout.warps_per_cta[1]),
                        (Operand::B, [k, cols], layout.warps_per_cta[0]),
                    ] {
                        let regs = layout.operand_registers(op, shape);
                        assert_eq!(
                            regs * K_WIDTH * 32 * layout.num_warps() as usize,
                            shape[0] * shape[1] * copies as usize
                        );
                        let mut holders = vec![Vec::new(); shape[0] * shape[1]];
                        for warp in 0..layout.num_warps() {
                            for lane in LANES {
                                for reg in 0..regs {
                                    for half in 0..K_WIDTH {
                                        let [r, c] = layout
                                            .operand_position(op, shape, warp, lane, reg, half);
                                        holders[r * shape[1] + c].push(Slot {
                                            warp,
                                            lane,
                                            reg,
                                            half,
                                        });
                                        // Within one instruction: the PTX fragment.
                                        let at = match op {
                                            Operand::A => a_fragment(lane, reg % 4, half),
                                            Operand::B => b_fragment(lane, reg % 2, half),
                                        };
                                        let tile = match op {
                                            Operand::A => [MMA_M, MMA_K],
                                            Operand::B => [MMA_K, MMA_N],
                                        };
                                        assert_eq!([r % tile[0], c % tile[1]], at);
                                    }
                                }
                            }
                        }
                        for r in 0..shape[0] {
                            for c in 0..shape[1] {
                                let h = &holders[r * shape[1] + c];
                                assert_eq!(h.len(), copies as usize, "{op:?} {shape:?} [{r},{c}]");
                                assert_eq!(*h, layout.operand_holders(op, shape, [r, c]));
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The operands a warp holds are exactly what its accumulator tiles need: for every
/// accumulator element of a warp, A's row and B's column are in the same warp's registers,
/// for every k.
#[test]
fn operands_feed_the_accumulator_of_the_same_warp() {
    for rows in ROWS {
        for cols in COLS {
            let shape = [rows, cols];
            for layout in layouts_for(shape) {
                let k = 32;
                for warp in 0..layout.num_warps() {
                    for reg in 0..layout.acc_registers(shape) {
                        let [m, n] = layout.acc_position(shape, warp, 0, reg);
                        for kk in 0..k {
                            let a = layout.operand_holders(Operand::A, [rows, k], [m, kk]);
                            assert!(a.iter().any(|s| s.warp == warp));
                            let b = layout.operand_holders(Operand::B, [k, cols], [kk, n]);
                            assert!(b.iter().any(|s| s.warp == warp));
                        }
                    }
                }
            }
        }
    }
}

/// FlashAttention-2: the S accumulator, packed in pairs, is register for register the A
/// operand of `P @ V`, for every thread of whole CTA tiles with warps along M.
#[test]
fn accumulator_is_the_next_a_operand() {
    let mut checked = 0;
    for rows in ROWS {
        for cols in COLS {
            let shape = [rows, cols];
            for layout in layouts_for(shape) {
                let Some(a_shape) = layout.acc_as_a_operand(shape) else {
                    assert!(layout.warps_per_cta[1] > 1);
                    // And it really fails there: some register holds another element.
                    let a_shape = shape;
                    let differs = (0..layout.num_warps()).any(|warp| {
                        LANES.into_iter().any(|lane| {
                            (0..layout.operand_registers(Operand::A, a_shape)).any(|reg| {
                                let (lo, _) = a_register_from_acc(reg);
                                lo >= layout.acc_registers(shape)
                                    || layout.operand_position(
                                        Operand::A,
                                        a_shape,
                                        warp,
                                        lane,
                                        reg,
                                        0,
                                    ) != layout.acc_position(shape, warp, lane, lo)
                            })
                        })
                    });
                    assert!(differs, "{layout:?} {shape:?}");
                    continue;
                };
                assert_eq!(a_shape, shape);
                let a_regs = layout.operand_registers(Operand::A, a_shape);
                assert_eq!(2 * a_regs, layout.acc_registers(shape));
                for warp in 0..layout.num_warps() {
                    for lane in LANES {
                        for reg in 0..a_regs {
                            let (lo, hi) = a_register_from_acc(reg);
                            for (half, acc_reg) in [(0, lo), (1, hi)] {
                                assert_eq!(
                                    layout.operand_position(
                                        Operand::A,
                                        a_shape,
                                        warp,
                                        lane,
                                        reg,
                                        half
                                    ),
                                    layout.acc_position(shape, warp, lane, acc_reg),
                                    "{layout:?} {shape:?} warp {warp} lane {lane} reg {reg}"
                                );
                            }
                        }
                    }
                }
                checked += 1;
            }
        }
    }
    // [64|128] x [32..256] with 4 warps along M, [128, *] with 8.
    assert!(checked >= 12, "{checked}");
}

/// Every way the attention kernels store an operand: A = Q `[m, k]` (k contiguous), A
/// stored transposed (m contiguous, backward kernels), B = K^T from K `[n, k]` (k
/// contiguous), B = V `[k, n]` (n contiguous).
fn storage_cases(rows: usize, cols: usize, k: usize) -> Vec<(Operand, [usize; 2], [usize; 2])> {
    vec![
        (Operand::A, [rows, k], [1, 0]),
        (Operand::A, [rows, k], [0, 1]),
        (Operand::B, [k, cols], [0, 1]),
        (Operand::B, [k, cols], [1, 0]),
    ]
}

/// ldmatrix from swizzled shared memory, simulated element by element: memory holds each
/// element's logical index at its swizzled offset; each lane supplies its row's address, the
/// hardware model hands out 16-bit elements of those rows; what lands in each register half
/// must be the dot-operand fragment. Also: every matrix's 8 rows are conflict free.
#[test]
fn ldmatrix_from_swizzled_shared_yields_the_operand_fragment() {
    for rows in ROWS {
        for cols in COLS {
            for layout in layouts_for([rows, cols]) {
                for k in COLS {
                    for (op, shape, order) in storage_cases(rows, cols, k) {
                        let shared = SwizzledShared::for_mma_operand(2, shape, order);
                        let mut memory = vec![usize::MAX; shared.len()];
                        for r in 0..shape[0] {
                            for c in 0..shape[1] {
                                memory[shared.offset([r, c])] = r * shape[1] + c;
                            }
                        }
                        let regs = layout.operand_registers(op, shape);
                        for warp in 0..layout.num_warps() {
                            let loads = layout.ldmatrix_loads(op, shape, order, warp);
                            let mut filled = vec![0; regs];
                            for load in &loads {
                                assert_eq!(load.trans, order[0] != op.k_dim());
                                let addrs: Vec<usize> = LANES
                                    .map(|lane| load.lane_byte_offset(&shared, 2, lane))
                                    .collect();
                                for matrix in 0..load.num() {
                                    let rows_of = &addrs[8 * matrix..8 * matrix + 8];
                                    assert!(
                                        is_conflict_free_16b(rows_of),
                                        "{op:?} {shape:?} {order:?}: {rows_of:?}"
                                    );
                                }
                                for lane in LANES {
                                    for (j, &reg) in load.dest.iter().enumerate() {
                                        filled[reg] += 1;
                                        for half in 0..K_WIDTH {
                                            let (src, elem) =
                                                ldmatrix_source(lane, j, half, load.trans);
                                            let byte = addrs[src as usize] + 2 * elem;
                                            let value = memory[byte / 2];
                                            let got = [value / shape[1], value % shape[1]];
                                            let want = layout
                                                .operand_position(op, shape, warp, lane, reg, half);
                                            assert_eq!(
                                                got, want,
                                                "{op:?} {shape:?} {order:?} {layout:?} \
                                                 warp {warp} lane {lane} reg {reg} half {half}"
                                            );
                                            assert_eq!(load.element_coords(lane, j, half), want);
                                        }
                                    }
                                }
                            }
                            // Each register loaded exactly once (by all 32 lanes).
                            assert!(filled.iter().all(|&f| f == 32), "{op:?} {shape:?}");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn ldmatrix_lane_offsets_have_a_closed_form() {
    for rows in ROWS {
        for cols in COLS {
            for layout in layouts_for([rows, cols]) {
                for k in COLS {
                    for (op, shape, order) in storage_cases(rows, cols, k) {
                        if op == Operand::B && layout.operand_reps(op, shape)[1] % 2 == 1 {
                            // Odd N repetitions pair K steps instead (still exact: see the
                            // swizzled-shared test); the closed form is for even ones.
                            continue;
                        }
                        for warp in 0..layout.num_warps() {
                            for load in layout.ldmatrix_loads(op, shape, order, warp) {
                                assert_eq!(load.num(), 4);
                                for lane in LANES {
                                    assert_eq!(
                                        load.lane_offset(lane),
                                        layout.ldmatrix_lane_offset(op, order, lane),
                                        "{op:?} {order:?} {layout:?} lane {lane}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // The classic A address: row lane % 16, column 8 * (lane / 16).
    let layout = MmaV2::new(4, 1);
    for lane in LANES {
        let l = lane as usize;
        assert_eq!(
            layout.ldmatrix_lane_offset(Operand::A, [1, 0], lane),
            [l % 16, 8 * (l / 16)]
        );
        assert_eq!(
            layout.ldmatrix_lane_offset(Operand::B, [1, 0], lane),
            [l % 16, 8 * (l / 16)]
        );
    }
    let load = &layout.ldmatrix_loads(Operand::B, [64, 64], [1, 0], 0)[0];
    assert_eq!(load.ptx(), "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16");
    let load = &layout.ldmatrix_loads(Operand::A, [64, 64], [1, 0], 0)[0];
    assert_eq!(load.ptx(), "ldmatrix.sync.aligned.m8n8.x4.shared.b16");
}

#[test]
fn odd_b_repetitions_use_x2_and_still_compose() {
    // B [16, 8] with one warp: 2 registers, one .x2.
    let layout = MmaV2::new(1, 1);
    for order in [[0, 1], [1, 0]] {
        let shape = [16, 8];
        let loads = layout.ldmatrix_loads(Operand::B, shape, order, 0);
        assert_eq!(loads.len(), 1);
        assert_eq!(loads[0].num(), 2);
        assert!(loads[0].ptx().contains(".x2"));
        for lane in LANES {
            for (j, &reg) in loads[0].dest.iter().enumerate() {
                for half in 0..2 {
                    assert_eq!(
                        loads[0].element_coords(lane, j, half),
                        layout.operand_position(Operand::B, shape, 0, lane, reg, half)
                    );
                }
            }
        }
    }
}

/// The mma layout's thread map (what the lowering and the emulator use for accumulators and
/// their elementwise math) puts every register where `MmaV2::acc_position` says, for every
/// arrangement of warps; a `[1, n]` or `[m, 1]` tile of the same class wraps onto row or
/// column 0, owned once.
#[test]
fn the_mma_thread_map_is_the_accumulator_map() {
    use kiln_codegen::layout::{Layout, MmaLayout};
    for shape in [[64, 64], [128, 64], [64, 128], [128, 256]] {
        for mma in layouts_for(shape) {
            let layout = MmaLayout::v2(mma);
            let map = layout.thread_map(&shape).unwrap();
            assert_eq!(map.registers.len(), mma.acc_registers(shape));
            for warp in 0..mma.num_warps() {
                for lane in LANES {
                    for reg in 0..map.registers.len() {
                        let position = map.position(warp, lane, reg);
                        assert!(position.owner);
                        assert_eq!(
                            position.coords,
                            mma.acc_position(shape, warp, lane, reg).to_vec(),
                            "{mma:?} {shape:?} warp {warp} lane {lane} reg {reg}"
                        );
                    }
                }
            }
            for narrow in [[1, shape[1]], [shape[0], 1]] {
                let map = Layout::Mma(layout.clone()).thread_map(&narrow).unwrap();
                let mut owners = vec![0; narrow[0] * narrow[1]];
                for warp in 0..mma.num_warps() {
                    for lane in LANES {
                        for reg in 0..map.registers.len() {
                            let p = map.position(warp, lane, reg);
                            owners[p.coords[0] * narrow[1] + p.coords[1]] += p.owner as usize;
                        }
                    }
                }
                assert!(owners.iter().all(|&n| n == 1), "{mma:?} {narrow:?}");
            }
        }
    }
}
