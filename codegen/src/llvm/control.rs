//! Structured control flow and predicated memory access: `for` as a loop whose carried values
//! are phis, `if` as a diamond, a predicated load, store or atomic add as a branch around the
//! access.

use inkwell::IntPredicate;
use inkwell::basic_block::BasicBlock;
use inkwell::types::{BasicTypeEnum, VectorType};
use inkwell::values::{BasicValue, BasicValueEnum, PhiValue};

use super::ops::asm_constraints;
use super::{Result, Translation};
use crate::thread::{Block, Reg};
use crate::{CodegenError, Stage};

impl<'ctx> Translation<'_, 'ctx> {
    /// Runs while `iv < upper`, like the interpreter, and stops where `iv + step` wraps around
    /// its type; a step that is not positive runs nothing (the interpreter reports a fault).
    pub(super) fn for_loop(
        &mut self,
        lower: Reg,
        upper: Reg,
        step: Reg,
        init: &[Reg],
        iv_reg: Reg,
        params: &[Reg],
        body: &Block,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let (lo, hi, st) = (
            self.value(lower)?.into_int_value(),
            self.value(upper)?.into_int_value(),
            self.value(step)?.into_int_value(),
        );
        let init: Vec<BasicValueEnum<'ctx>> =
            init.iter().map(|&r| self.value(r)).collect::<Result<_>>()?;
        let b = &self.builder;
        let zero = st.get_type().const_zero();
        let positive = b.build_int_compare(IntPredicate::SGT, st, zero, "")?;
        let nonempty = b.build_int_compare(IntPredicate::SLT, lo, hi, "")?;
        let enter = b.build_and(positive, nonempty, "")?;
        let preheader = self.current_block()?;
        let header = self.context.append_basic_block(self.function, "for.body");
        let exit = self.context.append_basic_block(self.function, "for.exit");
        b.build_conditional_branch(enter, header, exit)?;

        b.position_at_end(header);
        let iv = b.build_phi(lo.get_type(), "iv")?;
        let carried: Vec<PhiValue<'ctx>> = init
            .iter()
            .map(|v| b.build_phi(v.get_type(), ""))
            .collect::<std::result::Result<_, _>>()?;
        self.bind(iv_reg, iv.as_basic_value());
        for (&param, phi) in params.iter().zip(&carried) {
            self.bind(param, phi.as_basic_value());
        }
        let yielded = self.block(body)?;
        let latch = self.current_block()?;
        let b = &self.builder;
        let iv_value = iv.as_basic_value().into_int_value();
        let next = b.build_int_add(iv_value, st, "iv.next")?;
        let no_wrap = b.build_int_compare(IntPredicate::SGE, next, lo, "")?;
        let below = b.build_int_compare(IntPredicate::SLT, next, hi, "")?;
        let again = b.build_and(no_wrap, below, "")?;
        b.build_conditional_branch(again, header, exit)?;
        iv.add_incoming(&[(&lo, preheader), (&next, latch)]);
        for ((phi, start), end) in carried.iter().zip(&init).zip(&yielded) {
            phi.add_incoming(&[(start, preheader), (end, latch)]);
        }

        b.position_at_end(exit);
        self.merge(&[(init, preheader), (yielded, latch)])
    }

    pub(super) fn if_else(
        &mut self,
        cond: Reg,
        then_block: &Block,
        else_block: &Block,
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let cond = self.value(cond)?.into_int_value();
        let then_start = self.context.append_basic_block(self.function, "then");
        let else_start = self.context.append_basic_block(self.function, "else");
        let merge = self.context.append_basic_block(self.function, "endif");
        self.builder
            .build_conditional_branch(cond, then_start, else_start)?;
        self.builder.position_at_end(then_start);
        let then_values = self.block(then_block)?;
        let then_end = self.current_block()?;
        self.builder.build_unconditional_branch(merge)?;
        self.builder.position_at_end(else_start);
        let else_values = self.block(else_block)?;
        let else_end = self.current_block()?;
        self.builder.build_unconditional_branch(merge)?;
        self.builder.position_at_end(merge);
        self.merge(&[(then_values, then_end), (else_values, else_end)])
    }

    /// One phi per value, joining what arrives from each block.
    fn merge(
        &self,
        incoming: &[(Vec<BasicValueEnum<'ctx>>, BasicBlock<'ctx>)],
    ) -> Result<Vec<BasicValueEnum<'ctx>>> {
        let Some((first, _)) = incoming.first() else {
            return Ok(Vec::new());
        };
        let mut results = Vec::new();
        for (index, value) in first.iter().enumerate() {
            let phi = self.builder.build_phi(value.get_type(), "")?;
            for (values, block) in incoming {
                phi.add_incoming(&[(&values[index], *block)]);
            }
            results.push(phi.as_basic_value());
        }
        Ok(results)
    }

    /// A load of `ty` at `ptr`; with a predicate, a branch around it and `other` (or zero)
    /// where the predicate is false.
    pub(super) fn load(
        &mut self,
        ptr: Reg,
        pred: Option<Reg>,
        other: Option<Reg>,
        ty: BasicTypeEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let fallback = match other {
            Some(o) => self.value(o)?,
            None => ty.const_zero(),
        };
        self.guarded_load(ptr, ty, None, pred, fallback)
    }

    /// A load of `ty` at `ptr` (aligned to `align` bytes, if given); with a predicate, a branch
    /// around it and `fallback` where the predicate is false.
    fn guarded_load(
        &mut self,
        ptr: Reg,
        ty: BasicTypeEnum<'ctx>,
        align: Option<u32>,
        pred: Option<Reg>,
        fallback: BasicValueEnum<'ctx>,
    ) -> Result<BasicValueEnum<'ctx>> {
        let address = self.value(ptr)?.into_pointer_value();
        let load = |this: &Self| -> Result<BasicValueEnum<'ctx>> {
            let loaded = this.builder.build_load(ty, address, "")?;
            if let (Some(bytes), Some(load)) = (align, loaded.as_instruction_value()) {
                load.set_alignment(bytes)
                    .map_err(|e| CodegenError::llvm(Stage::Llir, e))?;
            }
            Ok(loaded)
        };
        let Some(pred) = pred else {
            return load(self);
        };
        let pred = self.value(pred)?.into_int_value();
        let before = self.current_block()?;
        let load_block = self.context.append_basic_block(self.function, "load");
        let done = self.context.append_basic_block(self.function, "loaded");
        self.builder
            .build_conditional_branch(pred, load_block, done)?;
        self.builder.position_at_end(load_block);
        let loaded = load(self)?;
        self.builder.build_unconditional_branch(done)?;
        self.builder.position_at_end(done);
        let phi = self.builder.build_phi(ty, "")?;
        phi.add_incoming(&[(&loaded, load_block), (&fallback, before)]);
        Ok(phi.as_basic_value())
    }

    /// `<count x elem>`.
    pub(super) fn vector_type(
        &self,
        elem: BasicTypeEnum<'ctx>,
        count: usize,
    ) -> Result<VectorType<'ctx>> {
        match elem {
            BasicTypeEnum::FloatType(t) => Ok(t.vec_type(count as u32)),
            BasicTypeEnum::IntType(t) => Ok(t.vec_type(count as u32)),
            _ => Err(CodegenError::internal(
                Stage::Llir,
                "a vector of neither ints nor floats",
            )),
        }
    }

    /// A vector load of `ty` (`bytes` long, aligned to them) at `ptr`; with a predicate, a
    /// branch around it and zeros where the predicate is false.
    pub(super) fn vector_load(
        &mut self,
        ptr: Reg,
        ty: BasicTypeEnum<'ctx>,
        bytes: u32,
        pred: Option<Reg>,
    ) -> Result<BasicValueEnum<'ctx>> {
        self.guarded_load(ptr, ty, Some(bytes), pred, ty.const_zero())
    }

    /// A vector store of `value` (`bytes` long, aligned to them) at `ptr`, where `pred` holds.
    pub(super) fn vector_store(
        &mut self,
        ptr: Reg,
        value: BasicValueEnum<'ctx>,
        bytes: u32,
        pred: Option<Reg>,
    ) -> Result<()> {
        let address = self.value(ptr)?.into_pointer_value();
        self.predicated(pred, |this| {
            let store = this.builder.build_store(address, value)?;
            store
                .set_alignment(bytes)
                .map_err(|e| CodegenError::llvm(Stage::Llir, e))
        })
    }

    pub(super) fn store(&mut self, ptr: Reg, value: Reg, pred: Option<Reg>) -> Result<()> {
        let address = self.value(ptr)?.into_pointer_value();
        let value = self.value(value)?;
        self.predicated(pred, |this| {
            this.builder.build_store(address, value)?;
            Ok(())
        })
    }

    /// `red.global.add{.v2,.v4}.f32` (relaxed, GPU scope) as inline asm: LLVM has no vector
    /// atomic for NVPTX, and the predicate goes inside the statement, where a branch around each
    /// of a tile's atomics put a convergence barrier (`BSSY`/`BSYNC`) around each (no faster
    /// either way on the fused backward: docs/PERF.md, 2026-11-26, ninth session).
    pub(super) fn atomic_add(&mut self, ptr: Reg, values: &[Reg], pred: Option<Reg>) -> Result<()> {
        let mut inputs = vec![self.value(ptr)?];
        for &value in values {
            inputs.push(self.value(value)?);
        }
        let operands: Vec<String> = (1..=values.len()).map(|i| format!("${i}")).collect();
        let asm = match values.len() {
            1 => "red.global.add.f32 [$0], $1;".to_string(),
            n => format!("red.global.add.v{n}.f32 [$0], {{{}}};", operands.join(", ")),
        };
        match pred {
            Some(pred) => self.predicated_asm(&asm, &inputs, pred),
            None => {
                self.asm(&asm, &asm_constraints(&inputs), &[], &inputs)?;
                Ok(())
            }
        }
    }

    /// Runs `access` in a block of its own that is branched around where `pred` is false.
    fn predicated(
        &mut self,
        pred: Option<Reg>,
        access: impl FnOnce(&mut Self) -> Result<()>,
    ) -> Result<()> {
        let Some(pred) = pred else {
            return access(self);
        };
        let pred = self.value(pred)?.into_int_value();
        let access_block = self.context.append_basic_block(self.function, "access");
        let done = self.context.append_basic_block(self.function, "accessed");
        self.builder
            .build_conditional_branch(pred, access_block, done)?;
        self.builder.position_at_end(access_block);
        access(self)?;
        self.builder.build_unconditional_branch(done)?;
        self.builder.position_at_end(done);
        Ok(())
    }
}
