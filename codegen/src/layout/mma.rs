//! Tensor-core fragments on sm_80+: which lane holds which element of an
//! `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32` accumulator and operands, in
//! which register, and how `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16` delivers an
//! operand from shared memory.
//!
//! These pure functions are the single source of truth for both the `dot` lowering (which turns
//! them into index arithmetic on `%laneid` / warp id) and the CPU emulator (which evaluates them
//! per thread); neither should restate a fragment formula. Shared-memory offsets come from
//! [`super::swizzle`].
//!
//! # Conventions
//!
//! - **Coordinates** are `[row, col]` of the *logical* matrix: the accumulator `C`/`D` is
//!   `[m, n]`, operand A is `[m, k]`, operand B is `[k, n]` (`D = A * B + C`), whatever the
//!   storage order in shared memory.
//! - **Lanes** are `%laneid` in `0..32`; `g = lane / 4` is PTX's `groupID`, `t = lane % 4` its
//!   `threadID_in_group`. **Warps** are `thread_id / 32`; with `warps_per_cta = [wm, wn]` warp `w`
//!   sits at `[w / wn, w % wn]` (N fastest, Triton's Ampere warp order `{1, 0}`).
//! - **Accumulator registers** are f32: one instruction has `c0..c3` (PTX order); a thread's
//!   register `r` of a CTA tile is `c_{r % 4}` of repetition `r / 4`, repetitions ordered
//!   `rep_m * reps_n + rep_n` (N fastest).
//! - **Operand registers** are 32-bit pairs of 16-bit values (`<2 x half>` / `<2 x bfloat>`,
//!   `.f16x2`), `k_width = 2`: `half` 0 is the low 16 bits and the lower `k`. One instruction
//!   takes A in 4 registers (`a0..a7` in pairs) and B in 2 (`b0..b3`). A thread's A register `r`
//!   is register `r % 4` of repetition `r / 4` ordered `rep_m * reps_k + rep_k` (K fastest); B
//!   register `r` is register `r % 2` of repetition `rep_n * reps_k + rep_k` (K fastest).
//! - **CTA tiling** (Triton's `NvidiaMmaEncodingAttr` as a linear layout: instruction tile, then
//!   warps, then repetitions in registers): row `m` of the accumulator is `rep_m * 16 * wm +
//!   warp_m * 16 + (row within the 16x8 tile)`, column `n` is `rep_n * 8 * wn + warp_n * 8 +
//!   (col within)`. A is shared by the `wn` warps of a row of warps, B by the `wm` warps of a
//!   column.
//!
//! # Sources
//!
//! - PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (section 9.7.14.5.8 in
//!   PTX ISA 8.x/9.0; `docs.nvidia.com/cuda/parallel-thread-execution`, mirrored at
//!   `ptx.poole.ai/docs/09-instruction-set/14-warp-level-mma/mma/mma-fragments/m16n8k16`): A row
//!   `groupID` for `a_i`, `0 <= i < 2 || 4 <= i < 6`, else `groupID + 8`; col
//!   `threadID_in_group * 2 + (i & 1)` (`+ 8` for `i >= 4`); B row `threadID_in_group * 2 +
//!   (i & 1)` (`+ 8` for `i >= 2`), col `groupID`; C/D row `groupID` for `c0, c1`, `groupID + 8`
//!   for `c2, c3`, col `threadID_in_group * 2 + (i & 1)`.
//! - The same as CuTe layouts, NVIDIA/cutlass `include/cute/atom/mma_traits_sm80.hpp`
//!   (`SM80_16x8x16_F32F16F16F32_TN`: `ALayout`, `BLayout`, `CLayout = SM80_16x8_Row`); the tests
//!   evaluate those layouts independently and compare.
//! - PTX ISA, "Warp-level matrix load instruction: ldmatrix" (9.7.14.5.15): threads `8j..8j+7`
//!   supply the row addresses of matrix `j`; each thread receives fragments of a row, a group of
//!   four threads a whole row, matrix `j` in destination register `j`. The exact element
//!   placement, with and without `.trans`, is CuTe's `Copy_Traits<SM75_U32x4_LDSM_N>` and
//!   `Copy_Traits<SM75_U16x8_LDSM_T>` (NVIDIA/cutlass `include/cute/atom/copy_traits_sm75.hpp`),
//!   also evaluated in the tests.
//! - Triton `lib/Dialect/TritonGPU/IR/LinearLayoutConversions.cpp` (`nvidiaMmaTile`,
//!   `NvidiaMmaEncodingAttr::toLinearLayout`, `warpsNvidiaDot`, `nvidiaDotToLinearLayout`) for
//!   the register order within an instruction (k_width registers, 4 lanes, 8 lanes, then
//!   registers), warps, and operand broadcasting.

use super::THREADS_PER_WARP;
use super::swizzle::SwizzledShared;

/// Rows of one `m16n8k16` accumulator tile.
pub const MMA_M: usize = 16;
/// Columns of one accumulator tile.
pub const MMA_N: usize = 8;
/// The reduction depth of one instruction.
pub const MMA_K: usize = 16;
/// 16-bit operand elements per 32-bit register.
pub const K_WIDTH: usize = 2;
/// f32 accumulator registers per thread per instruction (`c0..c3`).
pub const ACC_REGS_PER_MMA: usize = 4;
/// 32-bit A registers per thread per instruction.
pub const A_REGS_PER_MMA: usize = 4;
/// 32-bit B registers per thread per instruction.
pub const B_REGS_PER_MMA: usize = 2;

fn group_id(lane: u32) -> usize {
    debug_assert!(lane < THREADS_PER_WARP);
    (lane >> 2) as usize
}

fn thread_in_group(lane: u32) -> usize {
    (lane & 3) as usize
}

// ------------------------------------------------------------------------------------------
// One instruction, one warp.
// ------------------------------------------------------------------------------------------

/// Accumulator element `c_reg` (`reg` in `0..4`) of `lane` within the 16x8 tile: `[row, col]` =
/// `[g + 8 * (reg / 2), 2 * t + reg % 2]`.
pub fn acc_fragment(lane: u32, reg: usize) -> [usize; 2] {
    assert!(lane < THREADS_PER_WARP && reg < ACC_REGS_PER_MMA);
    [
        group_id(lane) + 8 * (reg >> 1),
        2 * thread_in_group(lane) + (reg & 1),
    ]
}

/// The `(lane, reg)` holding accumulator element `[row, col]` of the 16x8 tile.
pub fn acc_fragment_inverse([row, col]: [usize; 2]) -> (u32, usize) {
    assert!(row < MMA_M && col < MMA_N);
    (((row % 8) * 4 + col / 2) as u32, (row / 8) * 2 + col % 2)
}

/// A element in register `reg` (`0..4`), `half` (`0..2`) of `lane`, within the 16x16 `[m, k]`
/// tile: `[g + 8 * (reg % 2), 2 * t + half + 8 * (reg / 2)]` (register `reg` holds `a_{2 reg}`
/// low and `a_{2 reg + 1}` high).
pub fn a_fragment(lane: u32, reg: usize, half: usize) -> [usize; 2] {
    assert!(lane < THREADS_PER_WARP && reg < A_REGS_PER_MMA && half < K_WIDTH);
    [
        group_id(lane) + 8 * (reg & 1),
        2 * thread_in_group(lane) + half + 8 * (reg >> 1),
    ]
}

/// The `(lane, reg, half)` holding A element `[m, k]` of the 16x16 tile.
pub fn a_fragment_inverse([m, k]: [usize; 2]) -> (u32, usize, usize) {
    assert!(m < MMA_M && k < MMA_K);
    (
        ((m % 8) * 4 + (k % 8) / 2) as u32,
        m / 8 + 2 * (k / 8),
        k % 2,
    )
}

/// B element in register `reg` (`0..2`), `half` of `lane`, within the 16x8 `[k, n]` tile:
/// `[2 * t + half + 8 * reg, g]`.
pub fn b_fragment(lane: u32, reg: usize, half: usize) -> [usize; 2] {
    assert!(lane < THREADS_PER_WARP && reg < B_REGS_PER_MMA && half < K_WIDTH);
    [2 * thread_in_group(lane) + half + 8 * reg, group_id(lane)]
}

/// The `(lane, reg, half)` holding B element `[k, n]` of the 16x8 tile.
pub fn b_fragment_inverse([k, n]: [usize; 2]) -> (u32, usize, usize) {
    assert!(k < MMA_K && n < MMA_N);
    ((n * 4 + (k % 8) / 2) as u32, k / 8, k % 2)
}

// ------------------------------------------------------------------------------------------
// ldmatrix: the hardware's side.
// ------------------------------------------------------------------------------------------

/// Rows (and 16-bit columns) of one `ldmatrix` matrix.
pub const LDMATRIX_ROWS: usize = 8;

/// The lane that supplies the address of row `row` of matrix `matrix` (`.x1`: matrix 0, `.x2`:
/// 0..2, `.x4`: 0..4). Each address is the start of a 16-byte row and must be 16-byte aligned.
pub fn ldmatrix_address_lane(matrix: usize, row: usize) -> u32 {
    assert!(matrix < 4 && row < LDMATRIX_ROWS);
    (LDMATRIX_ROWS * matrix + row) as u32
}

/// The `(matrix, row)` whose address `lane` supplies in an `.x4` load.
pub fn ldmatrix_address_row(lane: u32) -> (usize, usize) {
    assert!(lane < THREADS_PER_WARP);
    (lane as usize / LDMATRIX_ROWS, lane as usize % LDMATRIX_ROWS)
}

/// What `ldmatrix` puts in half `half` of destination register `reg` of `lane`: element `elem`
/// (a 16-bit index into the 16-byte row) of the row whose address lane `src_lane` supplied,
/// returned as `(src_lane, elem)`. Register `reg` comes from matrix `reg`.
///
/// - plain: lane `l` gets row `l / 4`, elements `2 * (l % 4) + {0, 1}`;
/// - `.trans`: lane `l` gets element `l / 4` of rows `2 * (l % 4) + {0, 1}` (the transpose).
pub fn ldmatrix_source(lane: u32, reg: usize, half: usize, trans: bool) -> (u32, usize) {
    assert!(lane < THREADS_PER_WARP && reg < 4 && half < K_WIDTH);
    let (g, t) = (group_id(lane), thread_in_group(lane));
    let (row, elem) = if trans {
        (2 * t + half, g)
    } else {
        (g, 2 * t + half)
    };
    (ldmatrix_address_lane(reg, row), elem)
}

// ------------------------------------------------------------------------------------------
// CTA level.
// ------------------------------------------------------------------------------------------

/// Operand A (`[m, k]`) or B (`[k, n]`) of an mma.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    A,
    B,
}

impl Operand {
    /// The dimension of the operand's logical shape that is K.
    pub fn k_dim(self) -> usize {
        match self {
            Operand::A => 1,
            Operand::B => 0,
        }
    }

    /// 32-bit registers per thread per instruction.
    pub fn regs_per_mma(self) -> usize {
        match self {
            Operand::A => A_REGS_PER_MMA,
            Operand::B => B_REGS_PER_MMA,
        }
    }
}

/// One register slot of one thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Slot {
    pub warp: u32,
    pub lane: u32,
    /// Register index in the thread's list for the tile.
    pub reg: usize,
    /// 16-bit half of an operand register (always 0 for the f32 accumulator).
    pub half: usize,
}

/// The mma v2 (`m16n8k16`) accumulator layout of a CTA: `warps_per_cta = [wm, wn]` warps tile
/// 16x8 instruction tiles along M and N, and a larger tile repeats that in registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaV2 {
    pub warps_per_cta: [u32; 2],
}

impl MmaV2 {
    pub fn new(warps_m: u32, warps_n: u32) -> MmaV2 {
        assert!(
            warps_m.is_power_of_two() && warps_n.is_power_of_two(),
            "warps_per_cta [{warps_m}, {warps_n}] must be powers of two"
        );
        MmaV2 {
            warps_per_cta: [warps_m, warps_n],
        }
    }

    /// The layout for an accumulator of `shape` with `num_warps` warps: as many warps along M as
    /// its 16-row tiles allow (all of them when they fit, which attention needs: see
    /// [`Self::acc_as_a_operand`]), the rest along N.
    pub fn choose(shape: [usize; 2], num_warps: u32) -> Result<MmaV2, String> {
        if !num_warps.is_power_of_two() {
            return Err(format!("{num_warps} warps: not a power of two"));
        }
        let m_tiles = shape[0] / MMA_M;
        if m_tiles == 0 {
            return Err(format!("{shape:?}: fewer than {MMA_M} rows"));
        }
        let mut warps_m = 1;
        while warps_m < num_warps && (warps_m as usize) * 2 <= m_tiles {
            warps_m *= 2;
        }
        let layout = MmaV2::new(warps_m, num_warps / warps_m);
        layout.check_acc_shape(shape)?;
        Ok(layout)
    }

    pub fn num_warps(&self) -> u32 {
        self.warps_per_cta[0] * self.warps_per_cta[1]
    }

    fn wm(&self) -> usize {
        self.warps_per_cta[0] as usize
    }

    fn wn(&self) -> usize {
        self.warps_per_cta[1] as usize
    }

    /// `[warp_m, warp_n]` of `warp` (N fastest).
    pub fn warp_coords(&self, warp: u32) -> [usize; 2] {
        assert!(
            warp < self.num_warps(),
            "warp {warp} of {}",
            self.num_warps()
        );
        [
            (warp / self.warps_per_cta[1]) as usize,
            (warp % self.warps_per_cta[1]) as usize,
        ]
    }

    /// The warp at `[warp_m, warp_n]`.
    pub fn warp_id(&self, [warp_m, warp_n]: [usize; 2]) -> u32 {
        assert!(warp_m < self.wm() && warp_n < self.wn());
        (warp_m * self.wn() + warp_n) as u32
    }

    /// The accumulator extent one pass of all warps covers: `[16 * wm, 8 * wn]`.
    pub fn cta_tile(&self) -> [usize; 2] {
        [MMA_M * self.wm(), MMA_N * self.wn()]
    }

    // ---- accumulator ----

    /// Whether an accumulator of `shape` tiles exactly (no wrapping, no replication).
    pub fn check_acc_shape(&self, shape: [usize; 2]) -> Result<(), String> {
        let tile = self.cta_tile();
        if shape[0] == 0
            || !shape[0].is_multiple_of(tile[0])
            || shape[1] == 0
            || !shape[1].is_multiple_of(tile[1])
        {
            return Err(format!(
                "accumulator {shape:?} is not a multiple of the mma CTA tile {tile:?} \
                 (warps_per_cta {:?})",
                self.warps_per_cta
            ));
        }
        Ok(())
    }

    /// Repetitions of the CTA tile `[reps_m, reps_n]` (each warp runs `reps_m * reps_n`
    /// instructions per 16-deep K step).
    pub fn acc_reps(&self, shape: [usize; 2]) -> [usize; 2] {
        self.check_acc_shape(shape).unwrap();
        let tile = self.cta_tile();
        [shape[0] / tile[0], shape[1] / tile[1]]
    }

    /// f32 registers per thread for an accumulator of `shape`.
    pub fn acc_registers(&self, shape: [usize; 2]) -> usize {
        let [rm, rn] = self.acc_reps(shape);
        rm * rn * ACC_REGS_PER_MMA
    }

    /// The thread-dependent part of every accumulator position of (`warp`, `lane`):
    /// `[16 * warp_m + g, 8 * warp_n + 2 * t]`.
    pub fn acc_thread_base(&self, warp: u32, lane: u32) -> [usize; 2] {
        let [wm_i, wn_i] = self.warp_coords(warp);
        [
            MMA_M * wm_i + group_id(lane),
            MMA_N * wn_i + 2 * thread_in_group(lane),
        ]
    }

    /// The thread-independent part of register `reg`'s position: `[rep_m * 16 * wm + 8 * (i /
    /// 2), rep_n * 8 * wn + i % 2]` for `i = reg % 4`.
    pub fn acc_register_offset(&self, shape: [usize; 2], reg: usize) -> [usize; 2] {
        let [rm, rn] = self.acc_reps(shape);
        assert!(
            reg < rm * rn * ACC_REGS_PER_MMA,
            "register {reg} of {shape:?}"
        );
        let (rep, i) = (reg / ACC_REGS_PER_MMA, reg % ACC_REGS_PER_MMA);
        let tile = self.cta_tile();
        [
            (rep / rn) * tile[0] + 8 * (i >> 1),
            (rep % rn) * tile[1] + (i & 1),
        ]
    }

    /// Where accumulator register `reg` of (`warp`, `lane`) sits in a tile of `shape`.
    pub fn acc_position(&self, shape: [usize; 2], warp: u32, lane: u32, reg: usize) -> [usize; 2] {
        let base = self.acc_thread_base(warp, lane);
        let offset = self.acc_register_offset(shape, reg);
        [base[0] + offset[0], base[1] + offset[1]]
    }

    /// The one slot holding accumulator element `[row, col]`: the inverse of
    /// [`Self::acc_position`].
    pub fn acc_owner(&self, shape: [usize; 2], [row, col]: [usize; 2]) -> Slot {
        let [_, rn] = self.acc_reps(shape);
        assert!(
            row < shape[0] && col < shape[1],
            "{:?} outside {shape:?}",
            [row, col]
        );
        let tile = self.cta_tile();
        let (rep_m, in_m) = (row / tile[0], row % tile[0]);
        let (rep_n, in_n) = (col / tile[1], col % tile[1]);
        let warp = self.warp_id([in_m / MMA_M, in_n / MMA_N]);
        let (lane, i) = acc_fragment_inverse([in_m % MMA_M, in_n % MMA_N]);
        Slot {
            warp,
            lane,
            reg: (rep_m * rn + rep_n) * ACC_REGS_PER_MMA + i,
            half: 0,
        }
    }

    // ---- dot operands (k_width = 2) ----

    /// Whether operand `op` of logical `shape` (`[m, k]` for A, `[k, n]` for B) tiles exactly.
    pub fn check_operand_shape(&self, op: Operand, shape: [usize; 2]) -> Result<(), String> {
        let tile = self.cta_tile();
        let need = match op {
            Operand::A => [tile[0], MMA_K],
            Operand::B => [MMA_K, tile[1]],
        };
        if shape[0] == 0
            || !shape[0].is_multiple_of(need[0])
            || shape[1] == 0
            || !shape[1].is_multiple_of(need[1])
        {
            return Err(format!(
                "operand {op:?} {shape:?} is not a multiple of {need:?} (warps_per_cta {:?})",
                self.warps_per_cta
            ));
        }
        Ok(())
    }

    /// Repetitions of operand `op`: `[reps_m, reps_k]` for A, `[reps_k, reps_n]` for B.
    pub fn operand_reps(&self, op: Operand, shape: [usize; 2]) -> [usize; 2] {
        self.check_operand_shape(op, shape).unwrap();
        let tile = self.cta_tile();
        match op {
            Operand::A => [shape[0] / tile[0], shape[1] / MMA_K],
            Operand::B => [shape[0] / MMA_K, shape[1] / tile[1]],
        }
    }

    /// 32-bit registers (pairs of 16-bit elements) per thread for operand `op` of `shape`.
    pub fn operand_registers(&self, op: Operand, shape: [usize; 2]) -> usize {
        let [r0, r1] = self.operand_reps(op, shape);
        r0 * r1 * op.regs_per_mma()
    }

    /// The thread-dependent part of every operand position of (`warp`, `lane`): A `[16 * warp_m
    /// + g, 2 * t]`, B `[2 * t, 8 * warp_n + g]`.
    pub fn operand_thread_base(&self, op: Operand, warp: u32, lane: u32) -> [usize; 2] {
        let [wm_i, wn_i] = self.warp_coords(warp);
        let (g, t) = (group_id(lane), thread_in_group(lane));
        match op {
            Operand::A => [MMA_M * wm_i + g, 2 * t],
            Operand::B => [2 * t, MMA_N * wn_i + g],
        }
    }

    /// The thread-independent part of register `reg`, `half`: A `[rep_m * 16 * wm + 8 * (j %
    /// 2), rep_k * 16 + 8 * (j / 2) + half]` (`j = reg % 4`), B `[rep_k * 16 + 8 * j + half,
    /// rep_n * 8 * wn]` (`j = reg % 2`).
    pub fn operand_register_offset(
        &self,
        op: Operand,
        shape: [usize; 2],
        reg: usize,
        half: usize,
    ) -> [usize; 2] {
        let reps = self.operand_reps(op, shape);
        let per = op.regs_per_mma();
        assert!(reg < reps[0] * reps[1] * per && half < K_WIDTH);
        let (rep, j) = (reg / per, reg % per);
        let tile = self.cta_tile();
        match op {
            Operand::A => {
                let (rep_m, rep_k) = (rep / reps[1], rep % reps[1]);
                [
                    rep_m * tile[0] + 8 * (j & 1),
                    rep_k * MMA_K + 8 * (j >> 1) + half,
                ]
            }
            Operand::B => {
                let (rep_n, rep_k) = (rep / reps[0], rep % reps[0]);
                [rep_k * MMA_K + 8 * j + half, rep_n * tile[1]]
            }
        }
    }

    /// Where `half` of operand register `reg` of (`warp`, `lane`) sits in operand `op` of
    /// `shape`.
    pub fn operand_position(
        &self,
        op: Operand,
        shape: [usize; 2],
        warp: u32,
        lane: u32,
        reg: usize,
        half: usize,
    ) -> [usize; 2] {
        let base = self.operand_thread_base(op, warp, lane);
        let offset = self.operand_register_offset(op, shape, reg, half);
        [base[0] + offset[0], base[1] + offset[1]]
    }

    /// Every slot holding operand element `coords` (A is replicated over the `wn` warps of a row
    /// of warps, B over the `wm` warps of a column), warps ascending: the inverse of
    /// [`Self::operand_position`].
    pub fn operand_holders(&self, op: Operand, shape: [usize; 2], coords: [usize; 2]) -> Vec<Slot> {
        let reps = self.operand_reps(op, shape);
        assert!(
            coords[0] < shape[0] && coords[1] < shape[1],
            "{coords:?} outside {shape:?}"
        );
        let tile = self.cta_tile();
        match op {
            Operand::A => {
                let [m, k] = coords;
                let (rep_m, in_m) = (m / tile[0], m % tile[0]);
                let (lane, j, half) = a_fragment_inverse([in_m % MMA_M, k % MMA_K]);
                let reg = (rep_m * reps[1] + k / MMA_K) * A_REGS_PER_MMA + j;
                (0..self.wn())
                    .map(|wn_i| Slot {
                        warp: self.warp_id([in_m / MMA_M, wn_i]),
                        lane,
                        reg,
                        half,
                    })
                    .collect()
            }
            Operand::B => {
                let [k, n] = coords;
                let (rep_n, in_n) = (n / tile[1], n % tile[1]);
                let (lane, j, half) = b_fragment_inverse([k % MMA_K, in_n % MMA_N]);
                let reg = (rep_n * reps[0] + k / MMA_K) * B_REGS_PER_MMA + j;
                (0..self.wm())
                    .map(|wm_i| Slot {
                        warp: self.warp_id([wm_i, in_n / MMA_N]),
                        lane,
                        reg,
                        half,
                    })
                    .collect()
            }
        }
    }

    // ---- FlashAttention-2: the accumulator is the next A operand ----

    /// When the f32 accumulator of `acc_shape` (`S = Q K^T`, `[m, n]`), rounded to 16-bit pairs,
    /// is exactly the A operand (`[m, k]` with `k = n`, same parent layout) of the next mma
    /// (`P @ V`): then A register `r` of every thread is `pack(acc[2r], acc[2r + 1])` (low half
    /// first; [`a_register_from_acc`]) and no data moves. Returns the A operand's shape, or
    /// `None` when the identity does not hold: warps split N (`wn > 1`: a warp then holds
    /// columns `8 * warp_n + 8 * wn * i`, never a whole 16-deep K step), or N is not a multiple
    /// of 16.
    pub fn acc_as_a_operand(&self, acc_shape: [usize; 2]) -> Option<[usize; 2]> {
        (self.warps_per_cta[1] == 1
            && self.check_acc_shape(acc_shape).is_ok()
            && acc_shape[1].is_multiple_of(MMA_K))
        .then_some(acc_shape)
    }

    // ---- ldmatrix plans ----

    /// The `ldmatrix` loads that fill `warp`'s registers of operand `op` (logical `shape`) from
    /// a shared tile whose contiguous dimension is `order[0]`: one 8x8 matrix per operand
    /// register, four per `.x4` (a last `.x2` if the count is not a multiple of four), `.trans`
    /// exactly when K is not the contiguous dimension (A stored `[k, m]`, or B stored `[k, n]`
    /// like V in `P @ V`; B stored `[n, k]`, like K in `Q K^T`, is plain).
    ///
    /// A loads go in register order (one `.x4` per 16x16 `(rep_m, rep_k)` block, lane `l`
    /// addressing row `l % 16`, column `8 * (l / 16)` of it in `[m, k]` storage); B loads go by
    /// `rep_k`, then pairs of `rep_n` (an `.x4` covers 16 deep x two 8-wide N tiles).
    pub fn ldmatrix_loads(
        &self,
        op: Operand,
        shape: [usize; 2],
        order: [usize; 2],
        warp: u32,
    ) -> Vec<Ldmatrix> {
        assert!(order == [0, 1] || order == [1, 0], "order {order:?}");
        let reps = self.operand_reps(op, shape);
        let regs: Vec<usize> = match op {
            Operand::A => (0..self.operand_registers(op, shape)).collect(),
            Operand::B => {
                let [reps_k, reps_n] = reps;
                let mut regs = Vec::new();
                for rep_k in 0..reps_k {
                    for rep_n in 0..reps_n {
                        for j in 0..B_REGS_PER_MMA {
                            regs.push((rep_n * reps_k + rep_k) * B_REGS_PER_MMA + j);
                        }
                    }
                }
                regs
            }
        };
        let trans = order[0] != op.k_dim();
        regs.chunks(4)
            .map(|dest| Ldmatrix {
                trans,
                order,
                // Lane 0 holds the first element of each 8x8 block (g = t = 0, half 0).
                origins: dest
                    .iter()
                    .map(|&reg| self.operand_position(op, shape, warp, 0, reg, 0))
                    .collect(),
                dest: dest.to_vec(),
            })
            .collect()
    }

    /// The closed form of [`Ldmatrix::lane_coords`] minus the load's first origin, for the
    /// `.x4` loads of [`Self::ldmatrix_loads`] (B: when its N repetitions are even, as in every
    /// attention shape): what the lowering adds to a per-load constant.
    ///
    /// - A, K contiguous: `[l % 16, 8 * (l / 16)]`; A, M contiguous: `[8 * ((l / 8) % 2), 8 *
    ///   (l / 16) + l % 8]`;
    /// - B, K contiguous: `[8 * ((l / 8) % 2), 8 * wn * (l / 16) + l % 8]`; B, N contiguous:
    ///   `[l % 16, 8 * wn * (l / 16)]`.
    pub fn ldmatrix_lane_offset(&self, op: Operand, order: [usize; 2], lane: u32) -> [usize; 2] {
        let (matrix, row) = ldmatrix_address_row(lane);
        let mut offset = match op {
            Operand::A => [8 * (matrix & 1), 8 * (matrix >> 1)],
            Operand::B => [8 * (matrix & 1), MMA_N * self.wn() * (matrix >> 1)],
        };
        offset[order[1]] += row;
        offset
    }
}

/// The two accumulator registers (low half, high half) that, rounded to 16 bits and packed, are
/// A register `reg` when [`MmaV2::acc_as_a_operand`] holds.
pub fn a_register_from_acc(reg: usize) -> (usize, usize) {
    (2 * reg, 2 * reg + 1)
}

/// One `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{.trans}.shared.b16` of a warp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ldmatrix {
    pub trans: bool,
    /// The shared tile's dimension order (fastest first) the load was planned for.
    pub order: [usize; 2],
    /// Logical operand coordinates of element `[0, 0]` of each 8x8 matrix (its row 0 starts
    /// there; row `i` is `i` further along the strided dimension `order[1]`).
    pub origins: Vec<[usize; 2]>,
    /// The operand register each destination register (= matrix) fills.
    pub dest: Vec<usize>,
}

impl Ldmatrix {
    /// Matrices loaded: 1, 2 or 4.
    pub fn num(&self) -> usize {
        self.origins.len()
    }

    /// The instruction, e.g. `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`.
    pub fn ptx(&self) -> String {
        format!(
            "ldmatrix.sync.aligned.m8n8.x{}{}.shared.b16",
            self.num(),
            if self.trans { ".trans" } else { "" }
        )
    }

    /// Logical coordinates of the start of the 16-byte row whose address `lane` supplies. Lanes
    /// past `8 * num()` supply nothing; they repeat the lower lanes' addresses (valid, and what
    /// PTX asks of sm_75).
    pub fn lane_coords(&self, lane: u32) -> [usize; 2] {
        assert!(lane < THREADS_PER_WARP);
        let (matrix, row) = ldmatrix_address_row(lane % (LDMATRIX_ROWS * self.num()) as u32);
        let mut coords = self.origins[matrix];
        coords[self.order[1]] += row;
        coords
    }

    /// [`Self::lane_coords`] relative to the first matrix's origin.
    pub fn lane_offset(&self, lane: u32) -> [usize; 2] {
        let c = self.lane_coords(lane);
        [c[0] - self.origins[0][0], c[1] - self.origins[0][1]]
    }

    /// The byte offset, in `shared`, of the row `lane` supplies: its `ldmatrix` address minus
    /// the tile's base address. Panics if those 8 elements are not one contiguous 16-byte run.
    pub fn lane_byte_offset(&self, shared: &SwizzledShared, elem_bytes: usize, lane: u32) -> usize {
        assert_eq!(
            shared.order, self.order,
            "load planned for another storage order"
        );
        assert_eq!(elem_bytes, 2, "ldmatrix .b16 moves 16-bit elements");
        let coords = self.lane_coords(lane);
        assert!(
            shared.is_contiguous_run(coords, LDMATRIX_ROWS),
            "row at {coords:?} is not contiguous in {shared:?}"
        );
        shared.offset(coords) * elem_bytes
    }

    /// The logical coordinates of what lands in `half` of destination register `reg` of `lane`:
    /// the hardware's delivery ([`ldmatrix_source`]) composed with the addresses
    /// ([`Self::lane_coords`]).
    pub fn element_coords(&self, lane: u32, reg: usize, half: usize) -> [usize; 2] {
        assert!(reg < self.num());
        let (src_lane, elem) = ldmatrix_source(lane, reg, half, self.trans);
        let mut coords = self.lane_coords(src_lane);
        coords[self.order[0]] += elem;
        coords
    }
}
