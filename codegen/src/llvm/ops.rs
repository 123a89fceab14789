//! One thread-program instruction at a time, into LLVM IR.

use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{BasicValue, BasicValueEnum, InstructionOpcode, VectorValue};
use inkwell::{FloatPredicate, IntPredicate};

use super::{Result, Translation};
use crate::thread::{
    Cast, Constant, FloatCmp, FloatOp, Inst, IntCmp, IntOp, Math, Op, ShuffleMode, Special,
    grid_control_ptx,
};
use crate::{CodegenError, Stage, Target};

/// `shfl.sync`'s operands for a whole warp: every lane takes part, lanes clamp at 31.
const FULL_WARP: u64 = 0xffff_ffff;
const CLAMP: u64 = 0x1f;

impl<'ctx> Translation<'_, 'ctx> {
    pub(super) fn inst(&mut self, inst: &Inst) -> Result<()> {
        let value = match &inst.op {
            Op::For {
                lower,
                upper,
                step,
                init,
                iv,
                params,
                body,
            } => {
                let results = self.for_loop(*lower, *upper, *step, init, *iv, params, body)?;
                for (&r, v) in inst.results.iter().zip(results) {
                    self.bind(r, v);
                }
                return Ok(());
            }
            Op::If {
                cond,
                then_block,
                else_block,
            } => {
                let results = self.if_else(*cond, then_block, else_block)?;
                for (&r, v) in inst.results.iter().zip(results) {
                    self.bind(r, v);
                }
                return Ok(());
            }
            Op::Store { ptr, value, pred } => return self.store(*ptr, *value, *pred),
            Op::AtomicAdd { ptr, values, pred } => return self.atomic_add(*ptr, values, *pred),
            Op::StoreVector { ptr, values, pred } => {
                let vector_type = self.vector_type(self.ty(values[0]), values.len())?;
                let i32_type = self.context.i32_type();
                let mut vector = vector_type.get_poison();
                for (i, &value) in values.iter().enumerate() {
                    let index = i32_type.const_int(i as u64, false);
                    vector =
                        self.builder
                            .build_insert_element(vector, self.value(value)?, index, "")?;
                }
                let bytes = self.program.ty(values[0]).bytes() * values.len() as u32;
                return self.vector_store(*ptr, vector.into(), bytes, *pred);
            }
            Op::LoadVector { ptr, pred } => {
                let first = inst.results.first().copied().ok_or_else(|| {
                    CodegenError::internal(Stage::Llir, "a vector load without results")
                })?;
                let count = inst.results.len();
                let vector_type = self.vector_type(self.ty(first), count)?;
                let bytes = self.program.ty(first).bytes() * count as u32;
                let vector = self.vector_load(*ptr, vector_type.into(), bytes, *pred)?;
                let i32_type = self.context.i32_type();
                for (i, &result) in inst.results.iter().enumerate() {
                    let index = i32_type.const_int(i as u64, false);
                    let element = self.builder.build_extract_element(
                        vector.into_vector_value(),
                        index,
                        "",
                    )?;
                    self.bind(result, element);
                }
                return Ok(());
            }
            // `cp.async` has NVVM intrinsics (sm_80, PTX 7.0); LLVM gives them their memory
            // effects from their names.
            Op::CpAsync {
                dst,
                src,
                src_bytes,
            } => {
                let args = [
                    self.value(*dst)?,
                    self.value(*src)?,
                    self.value(*src_bytes)?,
                ];
                return self.call_declared_void("llvm.nvvm.cp.async.cg.shared.global.16.s", &args);
            }
            Op::CpAsyncCommit => {
                return self.call_declared_void("llvm.nvvm.cp.async.commit.group", &[]);
            }
            Op::CpAsyncWait { pending } => {
                let pending = self.context.i32_type().const_int(*pending as u64, false);
                return self.call_declared_void("llvm.nvvm.cp.async.wait.group", &[pending.into()]);
            }
            Op::Ldmatrix { ptr, count, trans } => {
                let values = self.ldmatrix(*ptr, *count, *trans, inst)?;
                for (&r, v) in inst.results.iter().zip(values) {
                    self.bind(r, v);
                }
                return Ok(());
            }
            Op::Mma { a, b, c } => {
                let values = self.mma(a, b, c)?;
                for (&r, v) in inst.results.iter().zip(values) {
                    self.bind(r, v);
                }
                return Ok(());
            }
            Op::Barrier => return self.call_intrinsic_void("llvm.nvvm.barrier0"),
            Op::NamedBarrier {
                id,
                threads,
                wait,
                pred,
            } => {
                let kind = if *wait { "sync" } else { "arrive" };
                let statement = format!("bar.{kind} $0, {threads};");
                let id = self.value(*id)?;
                // `.aligned` (`bar`) even where predicated: the predicate is the same in every
                // thread of a warpgroup, as in CUTLASS and FlashAttention-3, though the ISA
                // asks it of the whole CTA. `barrier.cta` without `.aligned` made ptxas wrap
                // the forward in convergence barriers, 5-10% slower (docs/PERF.md, run 40).
                return match pred {
                    Some(pred) => self.predicated_asm(&statement, &[id], *pred),
                    None => self
                        .asm(&statement, &["r".to_string()], &[], &[id])
                        .map(drop),
                };
            }
            Op::FenceProxyAsync | Op::WgmmaFence | Op::WgmmaCommit => {
                let statement = match &inst.op {
                    Op::FenceProxyAsync => "fence.proxy.async.shared::cta;",
                    Op::WgmmaFence => "wgmma.fence.sync.aligned;",
                    _ => "wgmma.commit_group.sync.aligned;",
                };
                self.asm(statement, &[], &[], &[])?;
                return Ok(());
            }
            Op::KeepLive(regs) => {
                // `%nsmid` is never 0, which ptxas cannot know: the stores stay, never run. Their
                // address is any: the registers came from a shared tile, so the kernel declares
                // `kiln_shared`.
                let (words, _) = self.asm_operands(regs)?;
                let names: Vec<String> = (0..words.len()).map(|w| format!("${w}")).collect();
                let mut stores: Vec<String> = names
                    .chunks_exact(4)
                    .map(|four| {
                        format!(
                            "@never st.shared.v4.b32 [kiln_shared], {{{}}};",
                            four.join(", ")
                        )
                    })
                    .collect();
                stores.extend(
                    names
                        .chunks_exact(4)
                        .remainder()
                        .iter()
                        .map(|one| format!("@never st.shared.b32 [kiln_shared], {one};")),
                );
                let asm = format!(
                    "{{\n\t.reg .pred never;\n\t.reg .b32 sms;\n\tmov.u32 sms, %nsmid;\n\t\
                     setp.eq.u32 never, sms, 0;\n\t{}\n\t}}",
                    stores.join("\n\t")
                );
                self.asm(&asm, &asm_constraints(&words), &[], &words)?;
                return Ok(());
            }
            Op::MbarrierInit { bar, count, pred } => {
                let asm = format!("mbarrier.init.shared::cta.b64 [$0], {count};");
                return self.predicated_asm(&asm, &[self.shared_word(*bar)?], *pred);
            }
            Op::FenceMbarrierInit => {
                self.asm("fence.mbarrier_init.release.cluster;", &[], &[], &[])?;
                return Ok(());
            }
            Op::GridControl(control) => {
                self.asm(&format!("{};", grid_control_ptx(*control)), &[], &[], &[])?;
                return Ok(());
            }
            Op::FenceGpu => {
                self.asm("fence.acq_rel.gpu;", &[], &[], &[])?;
                return Ok(());
            }
            Op::SetMaxNreg { increase, regs } => {
                let way = if *increase { "inc" } else { "dec" };
                let asm = format!("setmaxnreg.{way}.sync.aligned.u32 {regs};");
                self.asm(&asm, &[], &[], &[])?;
                return Ok(());
            }
            Op::MbarrierArriveExpectTx { bar, bytes, pred } => {
                let asm = format!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [$0], {bytes};");
                return self.predicated_asm(&asm, &[self.shared_word(*bar)?], *pred);
            }
            Op::MbarrierInval { bar, pred } => {
                let asm = "mbarrier.inval.shared::cta.b64 [$0];";
                return self.predicated_asm(asm, &[self.shared_word(*bar)?], *pred);
            }
            Op::MbarrierArrive { bar } => {
                let asm = "mbarrier.arrive.shared::cta.b64 _, [$0];";
                self.asm(asm, &["r".to_string()], &[], &[self.shared_word(*bar)?])?;
                return Ok(());
            }
            Op::MbarrierWait { bar, parity, warps } => {
                // A loop of its own in the statement: `try_wait` returns after a while either way.
                let wait = "kiln_wait_${:uid}:\n\t\
                            mbarrier.try_wait.parity.shared::cta.b64 done, [$0], $1;\n\t\
                            @!done bra kiln_wait_${:uid};";
                let mut inputs = vec![self.shared_word(*bar)?, self.value(*parity)?];
                let asm = match warps {
                    None => format!("{{\n\t.reg .pred done;\n{wait}\n\t}}"),
                    Some(warps) => {
                        let warps = self.value(*warps)?.into_int_value();
                        let warps =
                            self.builder
                                .build_int_z_extend(warps, self.context.i32_type(), "")?;
                        inputs.push(warps.into());
                        // Skipped by whole warps, as `vote.sync` makes plain to ptxas.
                        format!(
                            "{{\n\t.reg .pred done;\n\t.reg .pred waits;\n\t\
                             setp.ne.b32 waits, $2, 0;\n\t\
                             vote.sync.any.pred waits, waits, -1;\n\t\
                             @!waits bra kiln_waited_${{:uid}};\n{wait}\n\
                             kiln_waited_${{:uid}}:\n\t}}"
                        )
                    }
                };
                let constraints = vec!["r".to_string(); inputs.len()];
                self.asm(&asm, &constraints, &[], &inputs)?;
                return Ok(());
            }
            Op::TmaLoad { copies, bar, warps } => {
                let mut inputs = vec![self.shared_word(*bar)?];
                let mut statements = Vec::new();
                for copy in copies {
                    let first = inputs.len();
                    let (operands, tensor) =
                        self.tma_operands(first, copy.dst, copy.map, &copy.coords)?;
                    inputs.extend(operands);
                    statements.push(format!(
                        "cp.async.bulk.tensor.{}d.shared::cluster.global.tile.mbarrier::\
                         complete_tx::bytes [${first}], {}, [$0];",
                        copy.coords.len(),
                        tensor,
                    ));
                }
                return self.in_one_lane_per_warp(&statements, inputs, *warps);
            }
            Op::TmaStore {
                src,
                map,
                coords,
                warps,
                add,
            } => {
                let (inputs, tensor) = self.tma_operands(0, *src, *map, coords)?;
                let copy = if *add {
                    format!(
                        "cp.reduce.async.bulk.tensor.{}d.global.shared::cta.add.tile.bulk_group \
                         {tensor}, [$0];",
                        coords.len(),
                    )
                } else {
                    format!(
                        "cp.async.bulk.tensor.{}d.global.shared::cta.bulk_group {tensor}, [$0];",
                        coords.len(),
                    )
                };
                let commit = "cp.async.bulk.commit_group;".to_string();
                return self.in_one_lane_per_warp(&[copy, commit], inputs, *warps);
            }
            Op::BulkWaitRead => {
                self.asm("cp.async.bulk.wait_group.read 0;", &[], &[], &[])?;
                return Ok(());
            }
            Op::WgmmaWait { pending, values } => {
                let asm = format!("wgmma.wait_group.sync.aligned {pending};");
                let values = self.pass_through(&asm, values)?;
                for (&r, v) in inst.results.iter().zip(values) {
                    self.bind(r, v);
                }
                return Ok(());
            }
            Op::Wgmma {
                steps,
                trans_b,
                acc,
                accumulate,
                elem,
            } => {
                let values = self.wgmma(steps, *trans_b, acc, *accumulate, *elem)?;
                for (&r, v) in inst.results.iter().zip(values) {
                    self.bind(r, v);
                }
                return Ok(());
            }
            Op::Yield(_) => {
                return Err(CodegenError::internal(
                    Stage::Llir,
                    "a yield that does not end its block",
                ));
            }
            op => {
                let result = inst.results.first().copied().ok_or_else(|| {
                    CodegenError::internal(Stage::Llir, "a value op without a result")
                })?;
                self.value_op(op, result)?
            }
        };
        self.bind(inst.results[0], value);
        Ok(())
    }

    fn value_op(&mut self, op: &Op, result: crate::thread::Reg) -> Result<BasicValueEnum<'ctx>> {
        let b = &self.builder;
        let ty = self.ty(result);
        Ok(match op {
            Op::Const(Constant::Int(v)) => ty.into_int_type().const_int(*v as u64, true).into(),
            Op::Const(Constant::Float(v)) => ty.into_float_type().const_float(*v).into(),
            Op::Special(special) => self.special(*special)?,
            Op::AtomicArrive { ptr, pred } => {
                let ptr = self.value(*ptr)?.into_pointer_value();
                let address = b.build_ptr_to_int(ptr, self.context.i64_type(), "")?;
                let flag = self.asm_flag(*pred)?;
                let asm = "{\n\t.reg .pred arrive;\n\tsetp.ne.b32 arrive, $2, 0;\n\t\
                           mov.u32 $0, 0;\n\t\
                           @arrive atom.acq_rel.gpu.global.add.u32 $0, [$1], 1;\n\t}";
                let constraints = ["=r", "l", "r"].map(str::to_string);
                self.asm(asm, &constraints, &[ty], &[address.into(), flag])?[0]
            }
            Op::Int(op, x, y) => {
                let (x, y) = (
                    self.value(*x)?.into_int_value(),
                    self.value(*y)?.into_int_value(),
                );
                match op {
                    IntOp::Add => b.build_int_add(x, y, "")?,
                    IntOp::Sub => b.build_int_sub(x, y, "")?,
                    IntOp::Mul => b.build_int_mul(x, y, "")?,
                    IntOp::SDiv => b.build_int_signed_div(x, y, "")?,
                    IntOp::SRem => b.build_int_signed_rem(x, y, "")?,
                    IntOp::And => b.build_and(x, y, "")?,
                    IntOp::Or => b.build_or(x, y, "")?,
                    IntOp::Xor => b.build_xor(x, y, "")?,
                    IntOp::Shl => b.build_left_shift(x, y, "")?,
                    IntOp::AShr => b.build_right_shift(x, y, true, "")?,
                    IntOp::LShr => b.build_right_shift(x, y, false, "")?,
                    IntOp::SMax | IntOp::SMin => {
                        let name = if *op == IntOp::SMax {
                            "llvm.smax"
                        } else {
                            "llvm.smin"
                        };
                        return self.call_intrinsic(name, &[ty], &[x.into(), y.into()]);
                    }
                }
                .into()
            }
            Op::IntAbs(x) => {
                // `is_int_min_poison = false`: the minimum stays itself, as `wrapping_abs`.
                let no_poison = self.context.bool_type().const_zero();
                return self.call_intrinsic(
                    "llvm.abs",
                    &[ty],
                    &[self.value(*x)?, no_poison.into()],
                );
            }
            // No fast-math flags: LLVM keeps each op correctly rounded (`add.rn`, `div.rn`) and
            // never contracts a multiply and an add into an fma, which would round once.
            Op::Float(op, x, y) => {
                let (x, y) = (
                    self.value(*x)?.into_float_value(),
                    self.value(*y)?.into_float_value(),
                );
                match op {
                    FloatOp::Add => b.build_float_add(x, y, "")?.into(),
                    FloatOp::Sub => b.build_float_sub(x, y, "")?.into(),
                    FloatOp::Mul => b.build_float_mul(x, y, "")?.into(),
                    FloatOp::Div => b.build_float_div(x, y, "")?.into(),
                    FloatOp::Max => {
                        self.call_intrinsic("llvm.maxnum", &[ty], &[x.into(), y.into()])?
                    }
                    FloatOp::Min => {
                        self.call_intrinsic("llvm.minnum", &[ty], &[x.into(), y.into()])?
                    }
                }
            }
            Op::Math(math, x) => self.math(*math, self.value(*x)?)?,
            Op::IntCmp(cmp, x, y) => {
                let predicate = match cmp {
                    IntCmp::Eq => IntPredicate::EQ,
                    IntCmp::Ne => IntPredicate::NE,
                    IntCmp::Slt => IntPredicate::SLT,
                    IntCmp::Sle => IntPredicate::SLE,
                    IntCmp::Sgt => IntPredicate::SGT,
                    IntCmp::Sge => IntPredicate::SGE,
                    IntCmp::Ult => IntPredicate::ULT,
                    IntCmp::Ule => IntPredicate::ULE,
                    IntCmp::Ugt => IntPredicate::UGT,
                    IntCmp::Uge => IntPredicate::UGE,
                };
                let (x, y) = (
                    self.value(*x)?.into_int_value(),
                    self.value(*y)?.into_int_value(),
                );
                b.build_int_compare(predicate, x, y, "")?.into()
            }
            Op::FloatCmp(cmp, x, y) => {
                let predicate = match cmp {
                    FloatCmp::Olt => FloatPredicate::OLT,
                    FloatCmp::Ole => FloatPredicate::OLE,
                    FloatCmp::Ogt => FloatPredicate::OGT,
                    FloatCmp::Oge => FloatPredicate::OGE,
                    FloatCmp::Oeq => FloatPredicate::OEQ,
                    FloatCmp::Une => FloatPredicate::UNE,
                };
                let (x, y) = (
                    self.value(*x)?.into_float_value(),
                    self.value(*y)?.into_float_value(),
                );
                b.build_float_compare(predicate, x, y, "")?.into()
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => b.build_select(
                self.value(*cond)?.into_int_value(),
                self.value(*if_true)?,
                self.value(*if_false)?,
                "",
            )?,
            // `llvm.fma` rounds once; NVPTX selects `fma.rn.f32`.
            Op::Fma { a, b, c } => self.call_intrinsic(
                "llvm.fma",
                &[self.context.f32_type().into()],
                &[self.value(*a)?, self.value(*b)?, self.value(*c)?],
            )?,
            Op::Cast(cast, x) => self.cast(*cast, self.value(*x)?, ty)?,
            Op::PtrAdd { ptr, offset, elem } => {
                let elem = super::llvm_type(self.context, *elem);
                // Safety: a GEP without `inbounds` is plain address arithmetic; it never reads
                // memory (masked-off lanes may point anywhere).
                unsafe {
                    b.build_gep(
                        elem,
                        self.value(*ptr)?.into_pointer_value(),
                        &[self.value(*offset)?.into_int_value()],
                        "",
                    )?
                }
                .into()
            }
            Op::SharedAddress { offset } => {
                let shared = self.shared.ok_or_else(|| {
                    CodegenError::internal(Stage::Llir, "shared memory used but not reserved")
                })?;
                let offset = self.context.i32_type().const_int(*offset as u64, false);
                // Safety: address arithmetic inside the shared array.
                unsafe {
                    b.build_gep(
                        self.context.i8_type(),
                        shared.as_pointer_value(),
                        &[offset],
                        "",
                    )?
                }
                .into()
            }
            Op::Load { ptr, pred, other } => self.load(*ptr, *pred, *other, ty)?,
            Op::Shuffle { mode, value, lane } => {
                let suffix = if self.program.ty(*value).is_float() {
                    "f32"
                } else {
                    "i32"
                };
                let mode = match mode {
                    ShuffleMode::Bfly => "bfly",
                    ShuffleMode::Idx => "idx",
                };
                let i32_type = self.context.i32_type();
                self.call_intrinsic(
                    &format!("llvm.nvvm.shfl.sync.{mode}.{suffix}"),
                    &[],
                    &[
                        i32_type.const_int(FULL_WARP, false).into(),
                        self.value(*value)?,
                        self.value(*lane)?,
                        i32_type.const_int(CLAMP, false).into(),
                    ],
                )?
            }
            Op::Pack { lo, hi } => {
                let vector = ty.into_vector_type();
                let i32_type = self.context.i32_type();
                let mut packed = vector.get_poison();
                for (i, half) in [lo, hi].into_iter().enumerate() {
                    let index = i32_type.const_int(i as u64, false);
                    packed = b.build_insert_element(packed, self.value(*half)?, index, "")?;
                }
                packed.into()
            }
            Op::PackRounded { lo, hi } => {
                // `cvt.rn.{bf16,f16}x2.f32 d, a, b` puts `a` in the high half.
                let name = match self.program.ty(result) {
                    crate::thread::Type::F16x2 => "llvm.nvvm.ff2f16x2.rn",
                    _ => "llvm.nvvm.ff2bf16x2.rn",
                };
                return self.call_declared(name, ty, &[self.value(*hi)?, self.value(*lo)?]);
            }
            Op::For { .. }
            | Op::If { .. }
            | Op::Store { .. }
            | Op::AtomicAdd { .. }
            | Op::StoreVector { .. }
            | Op::LoadVector { .. }
            | Op::CpAsync { .. }
            | Op::CpAsyncCommit
            | Op::CpAsyncWait { .. }
            | Op::Barrier
            | Op::NamedBarrier { .. }
            | Op::Yield(_)
            | Op::Ldmatrix { .. }
            | Op::Mma { .. }
            | Op::FenceProxyAsync
            | Op::WgmmaFence
            | Op::Wgmma { .. }
            | Op::WgmmaCommit
            | Op::KeepLive(_)
            | Op::WgmmaWait { .. }
            | Op::MbarrierInit { .. }
            | Op::FenceMbarrierInit
            | Op::GridControl(_)
            | Op::FenceGpu
            | Op::SetMaxNreg { .. }
            | Op::MbarrierArriveExpectTx { .. }
            | Op::MbarrierArrive { .. }
            | Op::MbarrierWait { .. }
            | Op::MbarrierInval { .. }
            | Op::TmaLoad { .. }
            | Op::TmaStore { .. }
            | Op::BulkWaitRead => {
                return Err(CodegenError::internal(Stage::Llir, "not a value op"));
            }
        })
    }

    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.b16`, its 32-bit words as the results'
    /// 16-bit pairs, from LLVM's intrinsic (`i32` words), or where every pair is an f16
    /// `mma.sync` operand from inline PTX with f32 words, each bitcast to `<2 x half>` (a
    /// `mov.b32`). LLVM 19 selects a bitcast from `i32` to `<2 x half>` as a proxy register,
    /// and its proxy-register erasure walks the whole function once per proxy: a fifth of the
    /// f16 `mma.sync` kernels' compile time. ptxas assembles both to the same machine code
    /// (docs/PERF.md). Words for `wgmma` keep the intrinsic: inline asm would change how LLVM
    /// merges the branches they sit in.
    fn ldmatrix(
        &self,
        ptr: crate::thread::Reg,
        count: u8,
        trans: bool,
        inst: &Inst,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let trans = if trans { ".trans" } else { "" };
        let ptr_value = self.value(ptr)?;
        let f16 = inst
            .results
            .iter()
            .all(|r| self.f16_mma_operands[r.index()]);
        let word_type: BasicTypeEnum<'ctx> = if f16 {
            self.context.f32_type().into()
        } else {
            self.context.i32_type().into()
        };
        let words_type: BasicTypeEnum<'ctx> = match count {
            1 => word_type,
            n => self
                .context
                .struct_type(&vec![word_type; n as usize], false)
                .into(),
        };
        let loaded = if f16 {
            let words: Vec<String> = (0..count).map(|i| format!("${i}")).collect();
            // A constant offset goes into the statement, as LLVM folds it into the intrinsic's.
            let (base, offset) = match self.constant_offset(ptr_value) {
                Some((base, offset)) => (base, format!("+{offset}")),
                None => (ptr_value, String::new()),
            };
            let asm = format!(
                "ldmatrix.sync.aligned.m8n8.x{count}{trans}.shared.b16 {{{}}}, [${count}{offset}];",
                words.join(", ")
            );
            let mut constraints = vec!["=f"; count as usize];
            constraints.push("l");
            self.read_only_asm(&asm, &constraints.join(","), words_type, base)?
        } else {
            // Overloaded on the pointer: `.p3`, a shared-memory pointer.
            let name = format!("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x{count}{trans}.b16.p3");
            self.call_declared(&name, words_type, &[ptr_value])?
        };
        let words: Vec<BasicValueEnum<'ctx>> = match loaded {
            BasicValueEnum::StructValue(s) => (0..count as u32)
                .map(|i| self.builder.build_extract_value(s, i, ""))
                .collect::<std::result::Result<_, _>>()?,
            word => vec![word],
        };
        words
            .into_iter()
            .zip(&inst.results)
            .map(|(word, &r)| Ok(self.builder.build_bit_cast(word, self.ty(r), "")?))
            .collect()
    }

    /// `ptr` as `getelementptr T, base, C` with a constant index: the base and the offset in
    /// bytes (an `i32`, as PTX's address offsets are), for f16 and bf16 elements.
    fn constant_offset(&self, ptr: BasicValueEnum<'ctx>) -> Option<(BasicValueEnum<'ctx>, i32)> {
        let inst = ptr.as_instruction_value()?;
        if inst.get_opcode() != InstructionOpcode::GetElementPtr || inst.get_num_operands() != 2 {
            return None;
        }
        let element = inst.get_gep_source_element_type().ok()?;
        let half: [BasicTypeEnum<'ctx>; 2] = [
            self.context.f16_type().into(),
            self.context.bf16_type().into(),
        ];
        if !half.contains(&element) {
            return None;
        }
        let BasicValueEnum::IntValue(index) = inst.get_operand(1)?.value()? else {
            return None;
        };
        let index = index.get_sign_extended_constant()?;
        let bytes = i32::try_from(index.checked_mul(2)?).ok()?;
        Some((inst.get_operand(0)?.value()?, bytes))
    }

    /// Inline PTX `asm` that only reads the memory `ptr` points to, as a load intrinsic does
    /// (`memory(argmem: read)`, `nounwind`): LLVM may remove, merge or move it as such a load,
    /// but not into a branch (`convergent`: `.sync.aligned` statements need every lane).
    fn read_only_asm(
        &self,
        asm: &str,
        constraints: &str,
        returns: BasicTypeEnum<'ctx>,
        ptr: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let fn_type = returns.fn_type(&[ptr.get_type().into()], false);
        let asm_value = self.context.create_inline_asm(
            fn_type,
            asm.to_string(),
            constraints.to_string(),
            false,
            false,
            None,
            false,
        );
        let call = self
            .builder
            .build_indirect_call(fn_type, asm_value, &[ptr.into()], "")?;
        // `memory(argmem: read)`: LLVM's encoding gives each location two bits, argument
        // memory the lowest, and `Ref` (read) is 1.
        let attributes = [("memory", 1), ("nounwind", 0), ("convergent", 0)];
        for (name, value) in attributes {
            let kind = Attribute::get_named_enum_kind_id(name);
            call.add_attribute(
                AttributeLoc::Function,
                self.context.create_enum_attribute(kind, value),
            );
        }
        call.try_as_basic_value().basic().ok_or_else(|| {
            CodegenError::internal(Stage::Llir, "expected the inline asm to return its words")
        })
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`: LLVM's f16 intrinsic
    /// takes `<2 x half>` operands, its bf16 one `i32`s.
    fn mma(
        &self,
        a: &[crate::thread::Reg],
        b: &[crate::thread::Reg],
        c: &[crate::thread::Reg],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let bf16 = self.program.ty(a[0]) == crate::thread::Type::BF16x2;
        let i32_type = self.context.i32_type();
        let mut args = Vec::new();
        for &r in a.iter().chain(b) {
            let value = self.value(r)?;
            args.push(if bf16 {
                self.builder.build_bit_cast(value, i32_type, "")?
            } else {
                value
            });
        }
        for &r in c {
            args.push(self.value(r)?);
        }
        let name = if bf16 {
            "llvm.nvvm.mma.m16n8k16.row.col.bf16"
        } else {
            "llvm.nvvm.mma.m16n8k16.row.col.f32.f32"
        };
        let f32_type = self.context.f32_type();
        let d_type = self.context.struct_type(&[f32_type.into(); 4], false);
        let d = self
            .call_declared(name, d_type.into(), &args)?
            .into_struct_value();
        (0..c.len() as u32)
            .map(|i| Ok(self.builder.build_extract_value(d, i, "")?))
            .collect()
    }

    /// Inline PTX for what LLVM 19 has no intrinsic for (`wgmma`, the async-proxy fence):
    /// volatile and clobbering memory, so that it keeps its place among shared-memory accesses
    /// and other such statements. `constraints` lists the outputs' then the inputs'.
    pub(super) fn asm(
        &self,
        asm: &str,
        constraints: &[String],
        outputs: &[BasicTypeEnum<'ctx>],
        inputs: &[BasicValueEnum<'ctx>],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let params: Vec<_> = inputs.iter().map(|v| v.get_type().into()).collect();
        let fn_type = match outputs {
            [] => self.context.void_type().fn_type(&params, false),
            [one] => one.fn_type(&params, false),
            many => self
                .context
                .struct_type(many, false)
                .fn_type(&params, false),
        };
        let mut constraints = constraints.to_vec();
        constraints.push("~{memory}".to_string());
        let asm_value = self.context.create_inline_asm(
            fn_type,
            asm.to_string(),
            constraints.join(","),
            true,
            false,
            None,
            false,
        );
        let args: Vec<_> = inputs.iter().map(|&v| v.into()).collect();
        let call = self
            .builder
            .build_indirect_call(fn_type, asm_value, &args, "")?;
        // Warp-collective statements (`.sync.aligned`, `vote`, `elect`) must stay where every
        // lane of the warp reaches them: LLVM may not sink or duplicate the call into a branch.
        let convergent = Attribute::get_named_enum_kind_id("convergent");
        call.add_attribute(
            AttributeLoc::Function,
            self.context.create_enum_attribute(convergent, 0),
        );
        let Some(result) = call.try_as_basic_value().basic() else {
            return Ok(Vec::new());
        };
        Ok(match result {
            BasicValueEnum::StructValue(s) => (0..outputs.len() as u32)
                .map(|i| self.builder.build_extract_value(s, i, ""))
                .collect::<std::result::Result<_, _>>()?,
            one => vec![one],
        })
    }

    /// `statements` on `inputs` in one lane (`elect.sync`) of each warp where `warps` holds
    /// (an i1, appended to the inputs): whole warps branch around them and one lane is elected
    /// in each, so that ptxas issues them once, not in a loop over the lanes that might.
    fn in_one_lane_per_warp(
        &self,
        statements: &[String],
        mut inputs: Vec<BasicValueEnum<'ctx>>,
        warps: crate::thread::Reg,
    ) -> Result<()> {
        let at = inputs.len();
        let body: Vec<String> = statements.iter().map(|s| format!("@one {s}")).collect();
        let body = body.join("\n\t");
        let asm = format!(
            "{{\n\t.reg .pred issue;\n\t.reg .pred one;\n\t.reg .b32 lane;\n\t\
             setp.ne.b32 issue, ${at}, 0;\n\t\
             vote.sync.any.pred issue, issue, -1;\n\t\
             @!issue bra kiln_tma_${{:uid}};\n\t\
             elect.sync lane|one, -1;\n\t\
             {body}\n\
             kiln_tma_${{:uid}}:\n\t}}"
        );
        inputs.push(self.asm_flag(warps)?);
        self.asm(&asm, &asm_constraints(&inputs), &[], &inputs)?;
        Ok(())
    }

    /// A TMA copy's operands, numbered from `first`: the shared tile `shared` (`$first`), the
    /// program's tensor map `map` (a kernel parameter, the next) and `coords`; and the tensor
    /// operand, `[$map, {$coord, ...}]`.
    fn tma_operands(
        &self,
        first: usize,
        shared: crate::thread::Reg,
        map: usize,
        coords: &[crate::thread::Reg],
    ) -> Result<(Vec<BasicValueEnum<'ctx>>, String)> {
        let shared = self.shared_word(shared)?;
        let map =
            self.tensor_maps.get(map).copied().ok_or_else(|| {
                CodegenError::internal(Stage::Llir, format!("no tensor map {map}"))
            })?;
        let map = self
            .builder
            .build_ptr_to_int(map, self.context.i64_type(), "")?;
        let mut inputs = vec![shared, map.into()];
        for &c in coords {
            inputs.push(self.value(c)?);
        }
        let places: Vec<String> = (first + 2..first + 2 + coords.len())
            .map(|i| format!("${i}"))
            .collect();
        Ok((
            inputs,
            format!("[${}, {{{}}}]", first + 1, places.join(", ")),
        ))
    }

    /// A shared pointer as the 32-bit address PTX's shared-memory operands take.
    fn shared_word(&self, ptr: crate::thread::Reg) -> Result<BasicValueEnum<'ctx>> {
        let ptr = self.value(ptr)?.into_pointer_value();
        Ok(self
            .builder
            .build_ptr_to_int(ptr, self.context.i32_type(), "")?
            .into())
    }

    /// One PTX statement on `inputs` ([`asm_constraints`]), run by the threads where `pred`
    /// holds: a predicate inside the statement, not a branch around it.
    pub(super) fn predicated_asm(
        &self,
        statement: &str,
        inputs: &[BasicValueEnum<'ctx>],
        pred: crate::thread::Reg,
    ) -> Result<()> {
        let at = inputs.len();
        let asm = format!(
            "{{\n\t.reg .pred issue;\n\tsetp.ne.b32 issue, ${at}, 0;\n\t@issue {statement}\n\t}}"
        );
        let mut all = inputs.to_vec();
        all.push(self.asm_flag(pred)?);
        self.asm(&asm, &asm_constraints(&all), &[], &all)?;
        Ok(())
    }

    /// An i1 register as the i32 an asm statement tests (`setp.ne.b32 p, $n, 0`).
    fn asm_flag(&self, flag: crate::thread::Reg) -> Result<BasicValueEnum<'ctx>> {
        let flag = self.value(flag)?.into_int_value();
        Ok(self
            .builder
            .build_int_z_extend(flag, self.context.i32_type(), "")?
            .into())
    }

    /// The PTX constraint letter of a register of type `ty`.
    fn constraint(&self, ty: crate::thread::Type) -> &'static str {
        match ty {
            crate::thread::Type::F32 => "f",
            crate::thread::Type::I64 => "l",
            _ => "r",
        }
    }

    /// `values` through an asm statement that names none of them but "writes" each: code that
    /// uses the results stays after it (`wgmma`'s accumulators are not ready before
    /// `wgmma.wait_group`).
    fn pass_through(
        &self,
        asm: &str,
        values: &[crate::thread::Reg],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let (inputs, types) = self.asm_operands(values)?;
        let outputs: Vec<String> = values
            .iter()
            .map(|&r| format!("={}", self.constraint(self.program.ty(r))))
            .collect();
        let tied = (0..values.len()).map(|i| i.to_string());
        let constraints: Vec<String> = outputs.into_iter().chain(tied).collect();
        let words = self.asm(asm, &constraints, &types, &inputs)?;
        words
            .into_iter()
            .zip(values)
            .map(|(word, &r)| Ok(self.builder.build_bit_cast(word, self.ty(r), "")?))
            .collect()
    }

    /// Registers as asm operands: 16-bit pairs as i32 (the `r` constraint), others as they are.
    fn asm_operands(
        &self,
        values: &[crate::thread::Reg],
    ) -> Result<(Vec<BasicValueEnum<'ctx>>, Vec<BasicTypeEnum<'ctx>>)> {
        let i32_type = self.context.i32_type();
        let mut inputs = Vec::new();
        for &r in values {
            let value = self.value(r)?;
            inputs.push(match self.program.ty(r) {
                crate::thread::Type::F16x2 | crate::thread::Type::BF16x2 => {
                    self.builder.build_bit_cast(value, i32_type, "")?
                }
                _ => value,
            });
        }
        let types = inputs.iter().map(|v| v.get_type()).collect();
        Ok((inputs, types))
    }

    /// `wgmma.mma_async.sync.aligned.m64n{N}k16.f32.{f16,bf16}.{f16,bf16}` once per step, in one
    /// statement, the accumulators in and out once, `scale-d` true (accumulate) but for the
    /// first step without `accumulate`, A and B unscaled. The descriptors' bases are its
    /// operands, one per tile; it adds their offsets (`WgmmaDesc`) to the bases' low words.
    fn wgmma(
        &self,
        steps: &[crate::thread::WgmmaStep],
        trans_b: bool,
        acc: &[crate::thread::Reg],
        accumulate: bool,
        elem: crate::thread::Type,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let count = acc.len();
        let elem = elem.name();
        let d: Vec<String> = (0..count).map(|i| format!("${i}")).collect();
        let mut operands = AsmOperands {
            inputs: Vec::new(),
            constraints: vec!["=f".to_string(); count],
        };
        // Each base an operand once, split into its words `lo{i}` and `hi{i}`; each step's
        // descriptor with an offset `desc{j}`, its low word plus the offset (which stays in the
        // start address field: the high word never changes) beside the base's high word.
        let mut bases: Vec<(crate::thread::Reg, String)> = Vec::new();
        let mut unpack = Vec::new();
        let mut add = Vec::new();
        let mut descriptor =
            |operands: &mut AsmOperands<'ctx>, desc: &crate::thread::WgmmaDesc| -> Result<String> {
                let i = match bases.iter().position(|(b, _)| *b == desc.base) {
                    Some(i) => i,
                    None => {
                        let name = operands.push(self.value(desc.base)?, "l");
                        bases.push((desc.base, name));
                        bases.len() - 1
                    }
                };
                if desc.offset == 0 {
                    return Ok(bases[i].1.clone());
                }
                if !unpack.iter().any(|(u, _)| *u == i) {
                    unpack.push((i, format!("mov.b64 {{lo{i}, hi{i}}}, {};", bases[i].1)));
                }
                let j = add.len();
                add.push(format!(
                    "add.u32 sum{j}, lo{i}, {};\nmov.b64 desc{j}, {{sum{j}, hi{i}}};",
                    desc.offset
                ));
                Ok(format!("desc{j}"))
            };
        let mut issued = Vec::new();
        for step in steps {
            let (a_text, trans) = match &step.a {
                crate::thread::WgmmaA::Descriptor { desc, trans } => (
                    descriptor(&mut operands, desc)?,
                    format!("{}, {}", *trans as u8, trans_b as u8),
                ),
                crate::thread::WgmmaA::Registers(regs) => {
                    let (words, _) = self.asm_operands(regs)?;
                    let names: Vec<String> =
                        words.into_iter().map(|w| operands.push(w, "r")).collect();
                    (
                        format!("{{{}}}", names.join(", ")),
                        format!("{}", trans_b as u8),
                    )
                }
            };
            let b_text = descriptor(&mut operands, &step.b)?;
            // `z` (false) makes the first step ignore the accumulators.
            let scale = if accumulate || !issued.is_empty() {
                "p"
            } else {
                "z"
            };
            issued.push(format!(
                "wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{elem}.{elem} {{{d}}}, {a_text}, \
                 {b_text}, {scale}, 1, 1, {trans};",
                n = 2 * count,
                d = d.join(", "),
            ));
        }
        let scale_d = operands.push(self.context.i32_type().const_int(1, false).into(), "r");
        let AsmOperands {
            mut inputs,
            mut constraints,
        } = operands;
        // Accumulators not read go in undefined, so that nothing sets them.
        let unread = self.context.f32_type().get_undef().into();
        for (i, &r) in acc.iter().enumerate() {
            inputs.push(if accumulate { self.value(r)? } else { unread });
            constraints.push(i.to_string());
        }
        let mut lines = vec![".reg .pred p;".to_string()];
        if !accumulate {
            lines.push(".reg .pred z;".to_string());
        }
        if !add.is_empty() {
            let words = bases.len();
            lines.push(format!(
                ".reg .b32 lo<{words}>, hi<{words}>, sum<{}>;",
                add.len()
            ));
            lines.push(format!(".reg .b64 desc<{}>;", add.len()));
        }
        lines.push(format!("setp.ne.b32 p, {scale_d}, 0;"));
        if !accumulate {
            lines.push(format!("setp.eq.b32 z, {scale_d}, 0;"));
        }
        lines.extend(unpack.into_iter().map(|(_, line)| line));
        lines.extend(add);
        lines.extend(issued);
        let asm = format!("{{\n{}\n}}", lines.join("\n"));
        let f32_type = self.context.f32_type().into();
        self.asm(&asm, &constraints, &vec![f32_type; count], &inputs)
    }

    /// `%tid.x` (with its range, so that LLVM can fold what follows), `%ctaid.*`, `%nctaid.*`;
    /// `%tid.x` again as an `asm` with side effects, which LLVM neither merges nor moves, with
    /// the same range.
    fn special(&self, special: Special) -> Result<BasicValueEnum<'ctx>> {
        let axis = |a: u8| ["x", "y", "z"][a as usize % 3];
        let name = match special {
            Special::TidAgain => {
                let i32_type = self.context.i32_type().into();
                let read =
                    self.asm("mov.u32 $0, %tid.x;", &["=r".to_string()], &[i32_type], &[])?;
                return self.with_thread_range(read[0]);
            }
            Special::Tid => "tid.x".to_string(),
            Special::Ctaid(a) => format!("ctaid.{}", axis(a)),
            Special::Nctaid(a) => format!("nctaid.{}", axis(a)),
        };
        let value = self.call_intrinsic(&format!("llvm.nvvm.read.ptx.sreg.{name}"), &[], &[])?;
        match special {
            Special::Tid => self.with_thread_range(value),
            _ => Ok(value),
        }
    }

    /// `value`, a call that reads `%tid.x`, marked as in `[0, threads per block)`.
    fn with_thread_range(&self, value: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let Some(call) = value.into_int_value().as_instruction() else {
            return Ok(value);
        };
        let i32_type = self.context.i32_type();
        let range = self.context.metadata_node(&[
            i32_type.const_int(0, false).into(),
            i32_type
                .const_int(self.program.threads_per_block as u64, false)
                .into(),
        ]);
        call.set_metadata(range, self.context.get_kind_id("range"))
            .map_err(|e| CodegenError::llvm(Stage::Llir, e))?;
        Ok(value)
    }

    fn math(&self, math: Math, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let f32_type = self.context.f32_type();
        Ok(match math {
            Math::Neg => self
                .builder
                .build_float_neg(x.into_float_value(), "")?
                .into(),
            Math::Abs => self.call_intrinsic("llvm.fabs", &[f32_type.into()], &[x])?,
            Math::Sqrt => self.call_intrinsic("llvm.sqrt", &[f32_type.into()], &[x])?,
            Math::Ex2Approx => self.call_intrinsic("llvm.nvvm.ex2.approx.ftz.f", &[], &[x])?,
            Math::Lg2Approx => self.call_intrinsic("llvm.nvvm.lg2.approx.ftz.f", &[], &[x])?,
            // `tanh.approx.f32` (sm_75+), which LLVM 19 has no intrinsic for.
            Math::TanhApprox => {
                let asm_type = f32_type.fn_type(&[f32_type.into()], false);
                let asm = self.context.create_inline_asm(
                    asm_type,
                    "tanh.approx.f32 $0, $1;".to_string(),
                    "=f,f".to_string(),
                    false,
                    false,
                    None,
                    false,
                );
                self.builder
                    .build_indirect_call(asm_type, asm, &[x.into()], "tanh")?
                    .try_as_basic_value()
                    .basic()
                    .ok_or_else(|| {
                        CodegenError::internal(Stage::Llir, "tanh asm returns nothing")
                    })?
            }
        })
    }

    /// A bf16 widened to f32 as bits, for an element of a vector load on any target, any other
    /// on sm_80. An element of a vector load comes from its pair's 32-bit word, one instruction
    /// each (the low half shifted up, the high one masked), not unpacked first: the sm_80 D128
    /// dQ's PTX 10% shorter, its machine code 6%, and sm_90a's machine code shorter too. Any
    /// other is `(x as u32) << 16`: sm_80 has no `cvt.f32.bf16`, and LLVM 19's own widening
    /// there starts with a bitcast to `i16`, a proxy register whose erasure walks the whole
    /// function, each of them (256 in that dQ kernel).
    fn bf16_to_f32_by_bits(&self, x: BasicValueEnum<'ctx>) -> Result<BasicValueEnum<'ctx>> {
        let b = &self.builder;
        let i32_type = self.context.i32_type();
        let bits = match vector_element(x) {
            Some((vector, index)) => {
                let words_type = i32_type.vec_type(vector.get_type().get_size() / 2);
                let words = b
                    .build_bit_cast(vector, words_type, "")?
                    .into_vector_value();
                let word = b
                    .build_extract_element(words, i32_type.const_int(index / 2, false), "")?
                    .into_int_value();
                if index % 2 == 0 {
                    b.build_left_shift(word, i32_type.const_int(16, false), "")?
                } else {
                    b.build_and(word, i32_type.const_int(0xffff_0000, false), "")?
                }
            }
            None => {
                let half = b.build_bit_cast(x, self.context.i16_type(), "")?;
                let wide = b.build_int_z_extend(half.into_int_value(), i32_type, "")?;
                b.build_left_shift(wide, i32_type.const_int(16, false), "")?
            }
        };
        Ok(b.build_bit_cast(bits, self.context.f32_type(), "")?)
    }

    fn cast(
        &self,
        cast: Cast,
        x: BasicValueEnum<'ctx>,
        to: inkwell::types::BasicTypeEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let b = &self.builder;
        Ok(match cast {
            Cast::FpExt
                if x.get_type() == self.context.bf16_type().into()
                    && to == self.context.f32_type().into()
                    && (self.target == Target::Sm80 || vector_element(x).is_some()) =>
            {
                self.bf16_to_f32_by_bits(x)?
            }
            Cast::FpExt => b
                .build_float_ext(x.into_float_value(), to.into_float_type(), "")?
                .into(),
            Cast::FpTrunc => b
                .build_float_trunc(x.into_float_value(), to.into_float_type(), "")?
                .into(),
            // Saturating, NaN to zero: Rust's `as`, and PTX's `cvt.rzi.sat`.
            Cast::FpToSiSat => self.call_intrinsic("llvm.fptosi.sat", &[to, x.get_type()], &[x])?,
            Cast::SiToFp => b
                .build_signed_int_to_float(x.into_int_value(), to.into_float_type(), "")?
                .into(),
            Cast::UiToFp => b
                .build_unsigned_int_to_float(x.into_int_value(), to.into_float_type(), "")?
                .into(),
            Cast::ZExt => b
                .build_int_z_extend(x.into_int_value(), to.into_int_type(), "")?
                .into(),
            Cast::SExt => b
                .build_int_s_extend(x.into_int_value(), to.into_int_type(), "")?
                .into(),
            Cast::Trunc => b
                .build_int_truncate(x.into_int_value(), to.into_int_type(), "")?
                .into(),
            Cast::PtrToInt => b
                .build_ptr_to_int(x.into_pointer_value(), to.into_int_type(), "")?
                .into(),
        })
    }
}

/// `x` as `extractelement <2n x T> vector, index` with a constant index: the vector and index.
fn vector_element(x: BasicValueEnum<'_>) -> Option<(VectorValue<'_>, u64)> {
    let inst = x.as_instruction_value()?;
    if inst.get_opcode() != InstructionOpcode::ExtractElement {
        return None;
    }
    let (BasicValueEnum::VectorValue(vector), BasicValueEnum::IntValue(index)) =
        (inst.get_operand(0)?.value()?, inst.get_operand(1)?.value()?)
    else {
        return None;
    };
    let index = index.get_zero_extended_constant()?;
    (vector.get_type().get_size() % 2 == 0).then_some((vector, index))
}

/// The asm constraints of `inputs`: `f` for f32, `l` for pointers and 64-bit integers, `r` for
/// the rest.
pub(super) fn asm_constraints(inputs: &[BasicValueEnum<'_>]) -> Vec<String> {
    inputs
        .iter()
        .map(|v| match v {
            BasicValueEnum::FloatValue(_) => "f",
            BasicValueEnum::PointerValue(_) => "l",
            BasicValueEnum::IntValue(i) if i.get_type().get_bit_width() == 64 => "l",
            _ => "r",
        })
        .map(str::to_string)
        .collect()
}

/// An inline-asm statement's inputs as they are added, each named `$i` after the outputs.
struct AsmOperands<'ctx> {
    inputs: Vec<BasicValueEnum<'ctx>>,
    constraints: Vec<String>,
}

impl<'ctx> AsmOperands<'ctx> {
    /// Adds `value` under constraint `letter`; returns its name in the statement.
    fn push(&mut self, value: BasicValueEnum<'ctx>, letter: &str) -> String {
        self.inputs.push(value);
        self.constraints.push(letter.to_string());
        format!("${}", self.constraints.len() - 1)
    }
}
