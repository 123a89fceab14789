//! Pointer arithmetic, loads and stores, one register at a time, and block pointers as
//! per-thread address arithmetic. A mask or a boundary check is the access's predicate: a lane
//! whose predicate is false never touches memory. A store or atomic add is made only by the owner
//! of each element (the first of the threads holding a copy; thread 0 for a scalar). A store
//! the layout stage gave to TMA goes through shared memory ([`crate::layout::tma_store`]).

use kiln_dsl::ir::{Inst as TileInst, Value};
use kiln_dsl::types::DType;

use super::dot::{Addressing, SharedBase, SharedTile, aligned_tile_bytes};
use super::producer::Role;
use super::turns::{FIRST_TURN, WARPGROUP_THREADS};
use super::{Lowering, Result, memory_type, unsupported};
use crate::layout::wgmma::WARPS_PER_WARPGROUP;
use crate::layout::{Layout, MmaLayout, THREADS_PER_WARP, ThreadMap, TmaStore};
use crate::thread::ir::{Cast, IntCmp, IntOp, Op, Reg, Space, Type};

/// A block pointer's registers: base, then shape, strides and offsets per dimension (i64).
pub(super) struct BlockRegs {
    pub base: Reg,
    pub shape: Vec<Reg>,
    pub strides: Vec<Reg>,
    pub offsets: Vec<Reg>,
}

impl BlockRegs {
    pub fn from_regs(regs: &[Reg]) -> BlockRegs {
        let rank = (regs.len() - 1) / 3;
        BlockRegs {
            base: regs[0],
            shape: regs[1..1 + rank].to_vec(),
            strides: regs[1 + rank..1 + 2 * rank].to_vec(),
            offsets: regs[1 + 2 * rank..].to_vec(),
        }
    }

    fn into_regs(self) -> Vec<Reg> {
        let mut regs = vec![self.base];
        regs.extend(self.shape);
        regs.extend(self.strides);
        regs.extend(self.offsets);
        regs
    }
}

impl Lowering<'_> {
    /// `ptr + offset` elements of the pointee, the offset sign-extended (the interpreter's i64
    /// arithmetic).
    pub(super) fn add_ptr(&mut self, ptr: Value, offset: Value) -> Result<Vec<Reg>> {
        let elem = memory_type(self.dtype(ptr));
        let (ptrs, offsets) = (self.regs(ptr)?, self.regs(offset)?);
        Ok(ptrs
            .into_iter()
            .zip(offsets)
            .map(|(p, o)| self.ptr_add(p, o, elem))
            .collect())
    }

    fn ptr_add(&mut self, ptr: Reg, offset: Reg, elem: Type) -> Reg {
        let ty = self.ty(ptr);
        self.emit(Op::PtrAdd { ptr, offset, elem }, ty)
    }

    /// Loads one register of `dtype` at `ptr` where `pred` holds, `other` (or zero) elsewhere.
    pub(super) fn load_register(
        &mut self,
        ptr: Reg,
        dtype: DType,
        pred: Option<Reg>,
        other: Option<Reg>,
    ) -> Reg {
        if dtype != DType::I1 {
            return self.emit(Op::Load { ptr, pred, other }, memory_type(dtype));
        }
        let other = other.map(|o| self.emit(Op::Cast(Cast::ZExt, o), Type::I8));
        let byte = self.emit(Op::Load { ptr, pred, other }, Type::I8);
        let zero = self.int_const(Type::I8, 0);
        self.icmp(IntCmp::Ne, byte, zero)
    }

    pub(super) fn store_register(&mut self, ptr: Reg, value: Reg, pred: Option<Reg>) {
        let value = match self.ty(value) {
            Type::I1 => self.emit(Op::Cast(Cast::ZExt, value), Type::I8),
            _ => value,
        };
        self.emit_effect(Op::Store { ptr, value, pred });
    }

    pub(super) fn load(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
    ) -> Result<Vec<Reg>> {
        let dtype = self.result_dtype(inst)?;
        let ptrs = self.regs(ptr)?;
        let masks = mask.map(|m| self.regs(m)).transpose()?;
        let others = other.map(|o| self.regs(o)).transpose()?;
        Ok((0..ptrs.len())
            .map(|i| {
                let pred = masks.as_ref().map(|m| m[i]);
                let other = others.as_ref().filter(|_| pred.is_some()).map(|o| o[i]);
                self.load_register(ptrs[i], dtype, pred, other)
            })
            .collect())
    }

    /// The predicate under which this thread stores each register of `ptr`: its owner's, and
    /// thread 0 for a scalar.
    fn owners(&mut self, inst: &TileInst, value: Value) -> Result<Vec<Option<Reg>>> {
        match self.value_map(inst, value)? {
            Some(map) => Ok(self.positions(&map).into_iter().map(|p| p.owner).collect()),
            None => {
                let zero = self.i32_const(0);
                Ok(vec![Some(self.icmp(IntCmp::Eq, self.tid, zero))])
            }
        }
    }

    /// A store, or with `accumulate` an `atomic_add`; either way only each element's owner
    /// writes it, so an element several threads hold is added once.
    pub(super) fn store(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        value: Value,
        mask: Option<Value>,
        accumulate: bool,
    ) -> Result<()> {
        let owners = self.owners(inst, ptr)?;
        let (ptrs, values) = (self.regs(ptr)?, self.regs(value)?);
        let masks = mask.map(|m| self.regs(m)).transpose()?;
        for (i, (&address, &stored)) in ptrs.iter().zip(&values).enumerate() {
            let pred = self.and_pred(masks.as_ref().map(|m| m[i]), owners[i]);
            if accumulate {
                self.emit_effect(Op::AtomicAdd {
                    ptr: address,
                    values: vec![stored],
                    pred,
                });
            } else {
                self.store_register(address, stored, pred);
            }
        }
        Ok(())
    }

    /// `atomic_arrive`: each thread's writes fenced GPU-wide and the block met, thread 0 adds 1
    /// (acquiring and releasing) and hands the value before to every thread through shared
    /// memory, the block meets again (the scratch is free after it), and each thread fences
    /// before what it reads next: CUDA's threadfence-reduction pattern.
    pub(super) fn atomic_arrive(&mut self, inst: &TileInst, ptr: Value) -> Result<Reg> {
        if self.role != Role::Whole {
            return Err(unsupported(
                inst,
                "`atomic_arrive` meets the whole block at a barrier, which a program with a \
                 producer warpgroup does not",
            ));
        }
        // A TMA store's writes are the async proxy's, which the fence does not order.
        if self.bulk_stores {
            return Err(unsupported(
                inst,
                "`atomic_arrive` after a store by TMA would not order that store's writes: \
                 store through pointers before an arrival",
            ));
        }
        let ptr = self.reg(ptr)?;
        self.emit_effect(Op::FenceGpu);
        self.barrier();
        let zero = self.int_const(Type::I32, 0);
        let first = self.emit(Op::IntCmp(IntCmp::Eq, self.tid, zero), Type::I1);
        let before = self.emit(Op::AtomicArrive { ptr, pred: first }, Type::I32);
        let base = self.scratch_base();
        self.reserve_shared(inst, 4)?;
        let slot = self.shared_slot(base, zero, Type::I32);
        self.emit_effect(Op::Store {
            ptr: slot,
            value: before,
            pred: Some(first),
        });
        self.barrier();
        let value = self.emit(
            Op::Load {
                ptr: slot,
                pred: None,
                other: None,
            },
            Type::I32,
        );
        self.barrier();
        self.emit_effect(Op::FenceGpu);
        Ok(value)
    }

    /// An i64 register of a scalar integer value (block pointer fields are i64 in the IR).
    fn scalar_i64(&mut self, value: Value) -> Result<Reg> {
        let reg = self.reg(value)?;
        Ok(match self.ty(reg) {
            Type::I64 => reg,
            _ => self.emit(Op::Cast(Cast::SExt, reg), Type::I64),
        })
    }

    /// A block pointer's registers; the array dimensions before the block's last `rank` are
    /// indexed by their offsets, folded into the base.
    pub(super) fn make_block_ptr(
        &mut self,
        base: Value,
        shape: &[Value],
        strides: &[Value],
        offsets: &[Value],
        rank: usize,
    ) -> Result<Vec<Reg>> {
        let mut fields = |values: &[Value]| -> Result<Vec<Reg>> {
            values.iter().map(|&v| self.scalar_i64(v)).collect()
        };
        let (shape, strides, offsets) = (fields(shape)?, fields(strides)?, fields(offsets)?);
        let lead = shape.len() - rank;
        let elem = memory_type(self.dtype(base));
        let mut base = self.reg(base)?;
        for d in 0..lead {
            let offset = self.int(IntOp::Mul, offsets[d], strides[d]);
            base = self.ptr_add(base, offset, elem);
        }
        let block = BlockRegs {
            base,
            shape: shape[lead..].to_vec(),
            strides: strides[lead..].to_vec(),
            offsets: offsets[lead..].to_vec(),
        };
        Ok(block.into_regs())
    }

    pub(super) fn advance(&mut self, ptr: Value, offsets: &[Value]) -> Result<Vec<Reg>> {
        let mut block = BlockRegs::from_regs(&self.regs(ptr)?);
        for (offset, &delta) in block.offsets.iter_mut().zip(offsets) {
            let delta = self.scalar_i64(delta)?;
            *offset = self.int(IntOp::Add, *offset, delta);
        }
        Ok(block.into_regs())
    }

    /// The address of the element at `coords` (i32, within the block) of `block`, and whether
    /// it lies inside the array along every checked dimension (`None`: nothing is checked).
    fn block_address(
        &mut self,
        block: &BlockRegs,
        elem: Type,
        coords: &[Reg],
        boundary_check: &[usize],
    ) -> (Reg, Option<Reg>) {
        let zero = self.int_const(Type::I64, 0);
        let mut linear = zero;
        let mut inside: Option<Reg> = None;
        for (d, &coord) in coords.iter().enumerate() {
            let coord = self.emit(Op::Cast(Cast::SExt, coord), Type::I64);
            let index = self.int(IntOp::Add, block.offsets[d], coord);
            let scaled = self.int(IntOp::Mul, index, block.strides[d]);
            linear = self.int(IntOp::Add, linear, scaled);
            if boundary_check.contains(&d) {
                let above = self.icmp(IntCmp::Sge, index, zero);
                let below = self.icmp(IntCmp::Slt, index, block.shape[d]);
                let both = self.int(IntOp::And, above, below);
                inside = self.and_pred(inside, Some(both));
            }
        }
        (self.ptr_add(block.base, linear, elem), inside)
    }

    /// The address and in-bounds predicate of each `vector`-register run of `map` through
    /// `block`. Where the map is exclusive, a run sits a constant distance from the thread's
    /// first element: the thread's address and bounds are computed once and each run adds its
    /// constant, rather than each run computing (and LLVM hoisting out of a loop) a full
    /// 64-bit address and row check of its own.
    pub(super) fn block_addresses(
        &mut self,
        block: &BlockRegs,
        elem: Type,
        map: &ThreadMap,
        vector: usize,
        boundary_check: &[usize],
    ) -> Vec<(Reg, Option<Reg>)> {
        if !map.is_exclusive() {
            let positions = self.positions(map);
            return positions
                .chunks(vector)
                .map(|chunk| self.block_address(block, elem, &chunk[0].coords, boundary_check))
                .collect();
        }
        let bases = self.thread_bases(map);
        let mut linear = self.int_const(Type::I64, 0);
        let mut starts = Vec::new();
        for (d, &base) in bases.iter().enumerate() {
            let base = self.emit(Op::Cast(Cast::SExt, base), Type::I64);
            let start = self.int(IntOp::Add, block.offsets[d], base);
            let scaled = self.int(IntOp::Mul, start, block.strides[d]);
            linear = self.int(IntOp::Add, linear, scaled);
            starts.push(start);
        }
        let thread_address = self.ptr_add(block.base, linear, elem);
        // Run offsets are small and non-negative, so `start + offset` in `[0, shape)` is
        // `offset` in `[-start, shape - start)` with both ends clamped to i32: two 32-bit
        // registers per checked dimension, compared with constants.
        let bounds: Vec<Option<(Reg, Reg)>> = (0..map.rank())
            .map(|d| {
                boundary_check.contains(&d).then(|| {
                    let zero = self.int_const(Type::I64, 0);
                    let low = self.int(IntOp::Sub, zero, starts[d]);
                    let high = self.int(IntOp::Sub, block.shape[d], starts[d]);
                    (self.clamp_to_i32(low), self.clamp_to_i32(high))
                })
            })
            .collect();
        map.registers
            .chunks(vector)
            .map(|run| {
                let mut distance: Option<Reg> = None;
                let mut inside: Option<Reg> = None;
                for (d, &offset) in run[0].iter().enumerate() {
                    let offset = offset as i64;
                    if offset != 0 {
                        let offset = self.int_const(Type::I64, offset);
                        let scaled = self.int(IntOp::Mul, offset, block.strides[d]);
                        distance = Some(match distance {
                            Some(sum) => self.int(IntOp::Add, sum, scaled),
                            None => scaled,
                        });
                    }
                    if let Some((low, high)) = bounds[d] {
                        let offset = self.i32_const(offset);
                        let above = self.icmp(IntCmp::Sge, offset, low);
                        let below = self.icmp(IntCmp::Slt, offset, high);
                        let both = self.int(IntOp::And, above, below);
                        inside = self.and_pred(inside, Some(both));
                    }
                }
                let address = match distance {
                    Some(distance) => self.ptr_add(thread_address, distance, elem),
                    None => thread_address,
                };
                (address, inside)
            })
            .collect()
    }

    /// An i64 register clamped to the i32 range and truncated.
    fn clamp_to_i32(&mut self, value: Reg) -> Reg {
        let min = self.int_const(Type::I64, i32::MIN as i64);
        let max = self.int_const(Type::I64, i32::MAX as i64);
        let clamped = self.int(IntOp::SMax, value, min);
        let clamped = self.int(IntOp::SMin, clamped, max);
        self.emit(Op::Cast(Cast::Trunc, clamped), Type::I32)
    }

    /// The thread map of a block access of `value` through `ptr`, and how many registers one
    /// vector access moves (1: scalar accesses): a run of the map along the block's stride-1
    /// dimension, 16 bytes at most, that the divisibility analysis proves aligned.
    fn block_access(
        &self,
        inst: &TileInst,
        ptr: Value,
        value: Value,
        boundary_check: &[usize],
    ) -> Result<(ThreadMap, usize)> {
        let map = self.value_map(inst, value)?.ok_or_else(|| {
            unsupported(
                inst,
                "expected a tile through a block pointer, got a scalar",
            )
        })?;
        let dtype = self.dtype(ptr);
        if dtype == DType::I1 {
            return Ok((map, 1));
        }
        let divisibility = &self.layouts.divisibility;
        let vector = divisibility.widest_vector(ptr, &map, boundary_check, dtype.size_bytes());
        Ok((map, vector))
    }

    /// Reads a block; elements outside the array along checked dimensions read zero.
    pub(super) fn load_block(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        boundary_check: &[usize],
    ) -> Result<Vec<Reg>> {
        let dtype = self.result_dtype(inst)?;
        let (map, vector) = self.block_access(inst, ptr, inst.results[0], boundary_check)?;
        let block = BlockRegs::from_regs(&self.regs(ptr)?);
        let elem = memory_type(self.dtype(ptr));
        let mut regs = Vec::new();
        for (address, inside) in self.block_addresses(&block, elem, &map, vector, boundary_check) {
            if vector == 1 {
                regs.push(self.load_register(address, dtype, inside, None));
            } else {
                regs.extend(self.emit_multi(
                    Op::LoadVector {
                        ptr: address,
                        pred: inside,
                    },
                    &vec![elem; vector],
                ));
            }
        }
        Ok(regs)
    }

    /// A block store by TMA: every thread writes its elements into a swizzled shared tile where
    /// the drained loops' buffers were, the block meets at a barrier (after fencing the async
    /// proxy), and one lane of warp 0 copies the tile out by slabs of the map's box, which
    /// leaves out what lies outside the array. Where the tile is stored in bands, each
    /// warpgroup does so for its own rows, meeting only its warps (on a named barrier after
    /// the turns' ones). The issuing lanes wait for the copies to have read shared memory at
    /// the program's end ([`Op::BulkWaitRead`]).
    ///
    /// A reduction (an `atomic_add` by TMA) or a store inside a loop goes through the tile such
    /// stores share: before writing it, the issuing lanes wait for the last one's reads and meet
    /// the threads that write their rows.
    pub(super) fn store_block_by_tma(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        store: &TmaStore,
    ) -> Result<()> {
        let shape = self.shape(store.value);
        let [rows, cols] = <[usize; 2]>::try_from(shape.as_slice())
            .map_err(|_| unsupported(inst, "expected a 2-D tile to store by TMA"))?;
        let regs = self.regs(store.value)?;
        // One warpgroup's tile: its own warps' fragments, wherever the warpgroup is.
        let map = match store.by_one_warpgroup {
            true => Some(self.map(
                inst,
                &Layout::Mma(MmaLayout::v3(WARPS_PER_WARPGROUP)),
                &shape,
            )?),
            false => self.value_map(inst, store.value)?,
        }
        .ok_or_else(|| unsupported(inst, "expected a tile to store by TMA"))?;
        let start = if store.own_tile {
            self.reduction_tile
        } else {
            let start = self.next_buffer + self.tma_store_bytes;
            self.tma_store_bytes += aligned_tile_bytes(self.kernel, self.layouts, store.value);
            start
        };
        self.bulk_stores = true;
        let tile = SharedTile {
            base: SharedBase::Fixed(start),
            layout: store.shared.swizzled([rows, cols]),
            elem: memory_type(self.dtype(store.value)),
        };
        if store.by_one_warpgroup {
            // The owner met the others after their last reductions' reads
            // ([`Self::one_warpgroup_dot`]).
        } else if store.own_tile {
            // The last store from it may still read the tile (every thread waits: only the
            // issuing lanes have bulk groups).
            self.emit_effect(Op::BulkWaitRead);
            self.band_barrier(store.bands, false);
        } else if self.pending.reads || self.pending.writes {
            // The TMA loops before it ended at a barrier; anything staged since may still be
            // read.
            self.barrier();
        }
        self.write_tile(&map, &regs, &tile, Addressing::Shared);
        // The first warp of each band's warpgroup issues its copies, once the warpgroup's
        // writes are fenced and met (the whole block's where one band is all rows; one
        // warpgroup's own, a barrier of each, where it wrote the whole tile).
        let barrier_bands = match store.by_one_warpgroup {
            true => (self.layouts.num_warps / WARPS_PER_WARPGROUP) as usize,
            false => store.bands,
        };
        let met = self.band_barrier(barrier_bands, true);
        let in_group = match met {
            None => self.tid,
            Some(_) => {
                let mask = self.i32_const(WARPGROUP_THREADS as i64 - 1);
                self.int(IntOp::And, self.tid, mask)
            }
        };
        // A band of rows each, or, by one warpgroup, the whole tile.
        let warpgroup = met.filter(|_| !store.by_one_warpgroup);
        let warp_size = self.i32_const(THREADS_PER_WARP as i64);
        let warps = self.icmp(IntCmp::Ult, in_group, warp_size);
        // The shared tile's storage rows and row length: the value's columns and rows where it
        // is stored transposed.
        let transposed = store.transposed();
        let (storage_rows, row_len) = if transposed {
            (cols, rows)
        } else {
            (rows, cols)
        };
        let slab = self.slab_elems(store.map, row_len);
        let elem_bytes = tile.elem.bytes() as usize;
        let slab_bytes = storage_rows * slab * elem_bytes;
        // A warpgroup's band: its rows of every slab, contiguous in each (a slab holds every
        // row, a row one span); or, stored transposed, whole slabs one after the other.
        let slabs = row_len / slab;
        let (count, band_bytes, first_row, first_slab) = match warpgroup {
            None => (slabs, 0, None, None),
            Some(w) if transposed => {
                let count = slabs / store.bands;
                (
                    count,
                    count * slab_bytes,
                    None,
                    Some(self.mul_const(w, count)),
                )
            }
            Some(w) => {
                let band_rows = rows / store.bands;
                let band_bytes = band_rows * slab * elem_bytes;
                (slabs, band_bytes, Some(self.mul_const(w, band_rows)), None)
            }
        };
        let band_start = warpgroup.map(|w| self.mul_const(w, band_bytes));
        let block = BlockRegs::from_regs(&self.regs(ptr)?);
        let [row_at, col_at] = if transposed {
            [block.offsets[1], block.offsets[0]]
        } else {
            [block.offsets[0], block.offsets[1]]
        };
        let mut row = self.tma_coord(row_at);
        if let Some(first) = first_row {
            row = self.int(IntOp::Add, row, first);
        }
        let mut col = self.tma_coord(col_at);
        if let Some(first) = first_slab {
            let first_col = self.mul_const(first, slab);
            col = self.int(IntOp::Add, col, first_col);
        }
        let lead = self.leading_coords(&store.leading)?;
        for s in 0..count {
            let mut src = self.emit(
                Op::SharedAddress {
                    offset: start + (s * slab_bytes) as u32,
                },
                Type::Ptr(Space::Shared),
            );
            if let Some(offset) = band_start {
                src = self.emit(
                    Op::PtrAdd {
                        ptr: src,
                        offset,
                        elem: Type::I8,
                    },
                    Type::Ptr(Space::Shared),
                );
            }
            let coords = self.tma_slab([row, col], &lead, s * slab);
            self.emit_effect(Op::TmaStore {
                src,
                map: store.map,
                coords,
                warps,
                add: store.reduce,
            });
        }
        Ok(())
    }

    /// `r * n`, in `r`'s type.
    fn mul_const(&mut self, r: Reg, n: usize) -> Reg {
        let n = self.i32_const(n as i64);
        self.int(IntOp::Mul, r, n)
    }

    /// Where a tile goes through shared memory in `bands` bands of rows: with one band, a
    /// barrier of the block; with more, each warpgroup meets its own warps on a named barrier
    /// after the turns' ones and gets its index (the band it holds). After the tile's writes
    /// (`written`) both fence the async proxy first, which the TMA copies read.
    fn band_barrier(&mut self, bands: usize, written: bool) -> Option<Reg> {
        if bands == 1 {
            // The block's barrier fences where staged writes are pending.
            self.pending.writes |= written;
            self.barrier();
            return None;
        }
        let warpgroup = self.warpgroup();
        let free = self.i32_const(FIRST_TURN + bands as i64);
        let id = self.int(IntOp::Add, warpgroup, free);
        if written {
            self.emit_effect(Op::FenceProxyAsync);
        }
        self.emit_effect(Op::NamedBarrier {
            id,
            threads: WARPGROUP_THREADS,
            wait: true,
            pred: None,
        });
        Some(warpgroup)
    }

    /// The elements of one TMA copy's rows through tensor map `map` (the box's last dimension,
    /// one swizzle span), or `row_len` where the map has no box.
    pub(super) fn slab_elems(&self, map: usize, row_len: usize) -> usize {
        self.layouts.tensor_maps[map]
            .box_shape
            .last()
            .map_or(row_len, |&elems| elems as usize)
    }

    /// The coordinates, innermost first, of the TMA copy (one slab) `first_col` columns on
    /// from the tile's `row` and `col` (i32); `lead`: its array's leading dimensions'
    /// ([`Self::leading_coords`]).
    pub(super) fn tma_slab(
        &mut self,
        [row, col]: [Reg; 2],
        lead: &[Reg],
        first_col: usize,
    ) -> Vec<Reg> {
        let first_col = self.i32_const(first_col as i64);
        let mut coords = vec![self.int(IntOp::Add, col, first_col), row];
        coords.extend(lead);
        coords
    }

    /// A TMA coordinate: an integer register as i32.
    pub(super) fn tma_coord(&mut self, r: Reg) -> Reg {
        match self.ty(r) {
            Type::I32 => r,
            _ => self.emit(Op::Cast(Cast::Trunc, r), Type::I32),
        }
    }

    /// The TMA coordinates of an array's leading dimensions, indexed by the `make_block_ptr`
    /// offsets `leading` (outermost first): innermost first, as the copies take them.
    pub(super) fn leading_coords(&mut self, leading: &[Value]) -> Result<Vec<Reg>> {
        let mut coords = Vec::new();
        for &v in leading.iter().rev() {
            let r = self.reg(v)?;
            coords.push(self.tma_coord(r));
        }
        Ok(coords)
    }

    /// A block store, or with `accumulate` a block atomic add (vectors of at most the target's
    /// [`Lowering::max_atomic_vector`]).
    pub(super) fn store_block(
        &mut self,
        inst: &TileInst,
        ptr: Value,
        value: Value,
        boundary_check: &[usize],
        accumulate: bool,
    ) -> Result<()> {
        let (map, mut vector) = self.block_access(inst, ptr, value, boundary_check)?;
        if accumulate {
            // A run splits into shorter runs evenly: its lengths are powers of two.
            vector = vector.min(self.max_atomic_vector);
        }
        let block = BlockRegs::from_regs(&self.regs(ptr)?);
        let elem = memory_type(self.dtype(ptr));
        // Every thread owns what it holds under an exclusive map: no positions to compute.
        let owners: Vec<Option<Reg>> = if map.is_exclusive() {
            vec![None; map.registers.len()]
        } else {
            self.positions(&map).iter().map(|p| p.owner).collect()
        };
        let values = self.regs(value)?;
        let addresses = self.block_addresses(&block, elem, &map, vector, boundary_check);
        for (((address, inside), owner), stored) in addresses
            .into_iter()
            .zip(owners.chunks(vector))
            .zip(values.chunks(vector))
        {
            // The elements of a run have one owner: its first element's.
            let pred = self.and_pred(inside, owner[0]);
            if accumulate {
                self.emit_effect(Op::AtomicAdd {
                    ptr: address,
                    values: stored.to_vec(),
                    pred,
                });
            } else if vector == 1 {
                self.store_register(address, stored[0], pred);
            } else {
                self.emit_effect(Op::StoreVector {
                    ptr: address,
                    values: stored.to_vec(),
                    pred,
                });
            }
        }
        Ok(())
    }
}
