//! Pointer arithmetic, loads and stores, one register at a time. A masked access branches around
//! the memory instruction, so a masked-off lane never reads or writes (no out-of-bounds access,
//! even speculatively); 16-byte vector accesses come with the vectorisation work.

use inkwell::IntPredicate;
use inkwell::values::{BasicValueEnum, IntValue};
use kiln_dsl::ir::{Inst, Value};
use kiln_dsl::types::DType;

use super::{Lowering, Regs, memory_type, register_type};
use crate::CodegenError;

type Result<T> = std::result::Result<T, CodegenError>;

impl<'ctx> Lowering<'_, 'ctx> {
    /// `ptr + offset` elements of the pointee: a `getelementptr` (not `inbounds`: masked-off
    /// lanes may point anywhere), the offset sign-extended as the interpreter's i64 arithmetic.
    pub(super) fn add_ptr(&self, ptr: Value, offset: Value) -> Result<Regs<'ctx>> {
        let pointee = memory_type(self.context, self.dtype(ptr));
        let (ptrs, offsets) = (self.regs(ptr)?, self.regs(offset)?);
        ptrs.iter()
            .zip(offsets)
            .map(|(&p, &o)| {
                // Safety: a GEP without `inbounds` is plain address arithmetic; it never reads memory.
                let address = unsafe {
                    self.builder.build_gep(
                        pointee,
                        p.into_pointer_value(),
                        &[o.into_int_value()],
                        "",
                    )?
                };
                Ok(address.into())
            })
            .collect()
    }

    pub(super) fn load(
        &self,
        inst: &Inst,
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
    ) -> Result<Regs<'ctx>> {
        let dtype = self.result_dtype(inst)?;
        let ptrs = self.regs(ptr)?.clone();
        let masks = mask.map(|m| self.regs(m).cloned()).transpose()?;
        let others = other.map(|o| self.regs(o).cloned()).transpose()?;
        let zero = register_type(self.context, dtype).const_zero();
        let mut out = Vec::with_capacity(ptrs.len());
        for (i, &address) in ptrs.iter().enumerate() {
            let Some(masks) = &masks else {
                out.push(self.load_register(address, dtype)?);
                continue;
            };
            let fallback = others.as_ref().map_or(zero, |o| o[i]);
            let before = self.current_block()?;
            let load_block = self.context.append_basic_block(self.function, "load");
            let done = self.context.append_basic_block(self.function, "loaded");
            self.builder
                .build_conditional_branch(masks[i].into_int_value(), load_block, done)?;
            self.builder.position_at_end(load_block);
            let loaded = self.load_register(address, dtype)?;
            self.builder.build_unconditional_branch(done)?;
            self.builder.position_at_end(done);
            let phi = self.builder.build_phi(loaded.get_type(), "")?;
            phi.add_incoming(&[(&loaded, load_block), (&fallback, before)]);
            out.push(phi.as_basic_value());
        }
        Ok(out)
    }

    fn load_register(
        &self,
        address: BasicValueEnum<'ctx>,
        dtype: DType,
    ) -> Result<BasicValueEnum<'ctx>> {
        let ty = memory_type(self.context, dtype);
        let value = self
            .builder
            .build_load(ty, address.into_pointer_value(), "")?;
        Ok(match dtype {
            DType::I1 => {
                let byte = value.into_int_value();
                let zero = byte.get_type().const_zero();
                self.builder
                    .build_int_compare(IntPredicate::NE, byte, zero, "")?
                    .into()
            }
            _ => value,
        })
    }

    /// Stores the registers this thread owns: where the mask is set, and only from the first of
    /// the threads that hold copies of an element (one thread for a scalar store).
    pub(super) fn store(
        &self,
        inst: &Inst,
        ptr: Value,
        value: Value,
        mask: Option<Value>,
    ) -> Result<()> {
        let dtype = self.dtype(value);
        let positions = self.positions(ptr, inst)?;
        let scalar = self.kernel.ty(ptr).shape().is_empty();
        let (ptrs, values) = (self.regs(ptr)?.clone(), self.regs(value)?.clone());
        let masks = mask.map(|m| self.regs(m).cloned()).transpose()?;
        for (i, (&address, &stored)) in ptrs.iter().zip(&values).enumerate() {
            let mut predicate: Option<IntValue<'ctx>> =
                masks.as_ref().map(|m| m[i].into_int_value());
            let owner = if scalar {
                let first = self.builder.build_int_compare(
                    IntPredicate::EQ,
                    self.thread_id,
                    self.i32(0),
                    "first_thread",
                )?;
                Some(first)
            } else {
                positions[i].owner
            };
            if let Some(owner) = owner {
                predicate = Some(match predicate {
                    Some(p) => self.builder.build_and(p, owner, "")?,
                    None => owner,
                });
            }
            let Some(predicate) = predicate else {
                self.store_register(address, stored, dtype)?;
                continue;
            };
            let store_block = self.context.append_basic_block(self.function, "store");
            let done = self.context.append_basic_block(self.function, "stored");
            self.builder
                .build_conditional_branch(predicate, store_block, done)?;
            self.builder.position_at_end(store_block);
            self.store_register(address, stored, dtype)?;
            self.builder.build_unconditional_branch(done)?;
            self.builder.position_at_end(done);
        }
        Ok(())
    }

    fn store_register(
        &self,
        address: BasicValueEnum<'ctx>,
        value: BasicValueEnum<'ctx>,
        dtype: DType,
    ) -> Result<()> {
        let value = match dtype {
            DType::I1 => self
                .builder
                .build_int_z_extend(value.into_int_value(), self.context.i8_type(), "")?
                .into(),
            _ => value,
        };
        self.builder
            .build_store(address.into_pointer_value(), value)?;
        Ok(())
    }

    pub(super) fn current_block(&self) -> Result<inkwell::basic_block::BasicBlock<'ctx>> {
        self.builder.get_insert_block().ok_or_else(|| {
            CodegenError::internal(crate::Stage::Llir, "the ir builder has no insertion block")
        })
    }
}
