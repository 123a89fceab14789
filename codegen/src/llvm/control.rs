//! Structured control flow: `for` as a loop whose carried values are phis, `if` as a diamond.
//! Their conditions and bounds are scalars, the same in every thread, so no thread diverges.

use inkwell::IntPredicate;
use inkwell::values::{BasicValueEnum, PhiValue};
use kiln_dsl::ir::{Region, Value};

use super::{Lowering, Regs};
use crate::CodegenError;

type Result<T> = std::result::Result<T, CodegenError>;

impl<'ctx> Lowering<'_, 'ctx> {
    /// `for iv in (lower..upper).step_by(step)`: runs while `iv < upper`, like the interpreter,
    /// and stops where `iv + step` wraps around its type; a step that is not positive runs nothing
    /// (the interpreter reports it as a fault).
    pub(super) fn for_loop(
        &mut self,
        lower: Value,
        upper: Value,
        step: Value,
        init: &[Value],
        body: &Region,
    ) -> Result<Vec<Regs<'ctx>>> {
        let (lo, hi, st) = (
            self.regs(lower)?[0].into_int_value(),
            self.regs(upper)?[0].into_int_value(),
            self.regs(step)?[0].into_int_value(),
        );
        let init: Vec<Regs<'ctx>> = init
            .iter()
            .map(|&v| self.regs(v).cloned())
            .collect::<Result<_>>()?;
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
        let carried: Vec<Vec<PhiValue<'ctx>>> = init
            .iter()
            .map(|regs| regs.iter().map(|r| b.build_phi(r.get_type(), "")).collect())
            .collect::<std::result::Result<_, _>>()?;
        self.bind(body.params[0], vec![iv.as_basic_value()]);
        for (&param, phis) in body.params[1..].iter().zip(&carried) {
            self.bind(param, phis.iter().map(|p| p.as_basic_value()).collect());
        }
        let yielded = self.region(body)?;
        let latch = self.current_block()?;
        let b = &self.builder;
        let iv_value = iv.as_basic_value().into_int_value();
        let next = b.build_int_add(iv_value, st, "iv.next")?;
        let no_wrap = b.build_int_compare(IntPredicate::SGE, next, lo, "")?;
        let below = b.build_int_compare(IntPredicate::SLT, next, hi, "")?;
        let again = b.build_and(no_wrap, below, "")?;
        b.build_conditional_branch(again, header, exit)?;
        iv.add_incoming(&[(&lo, preheader), (&next, latch)]);
        for ((phis, start), end) in carried.iter().zip(&init).zip(&yielded) {
            for ((phi, s), e) in phis.iter().zip(start).zip(end) {
                phi.add_incoming(&[(s, preheader), (e, latch)]);
            }
        }

        b.position_at_end(exit);
        self.merge(&[(init, preheader), (yielded, latch)])
    }

    pub(super) fn if_else(
        &mut self,
        cond: Value,
        then_region: &Region,
        else_region: &Region,
    ) -> Result<Vec<Regs<'ctx>>> {
        let cond = self.regs(cond)?[0].into_int_value();
        let then_block = self.context.append_basic_block(self.function, "then");
        let else_block = self.context.append_basic_block(self.function, "else");
        let merge = self.context.append_basic_block(self.function, "endif");
        self.builder
            .build_conditional_branch(cond, then_block, else_block)?;
        self.builder.position_at_end(then_block);
        let then_values = self.region(then_region)?;
        let then_end = self.current_block()?;
        self.builder.build_unconditional_branch(merge)?;
        self.builder.position_at_end(else_block);
        let else_values = self.region(else_region)?;
        let else_end = self.current_block()?;
        self.builder.build_unconditional_branch(merge)?;
        self.builder.position_at_end(merge);
        self.merge(&[(then_values, then_end), (else_values, else_end)])
    }

    /// One phi per register of each result, joining the values that arrive from each block.
    fn merge(
        &self,
        incoming: &[(Vec<Regs<'ctx>>, inkwell::basic_block::BasicBlock<'ctx>)],
    ) -> Result<Vec<Regs<'ctx>>> {
        let Some((first, _)) = incoming.first() else {
            return Ok(Vec::new());
        };
        let mut results = Vec::new();
        for (value_index, regs) in first.iter().enumerate() {
            let mut merged = Vec::new();
            for (reg_index, reg) in regs.iter().enumerate() {
                let phi = self.builder.build_phi(reg.get_type(), "")?;
                for (values, block) in incoming {
                    let value: &BasicValueEnum<'ctx> = &values[value_index][reg_index];
                    phi.add_incoming(&[(value, *block)]);
                }
                merged.push(phi.as_basic_value());
            }
            results.push(merged);
        }
        Ok(results)
    }
}
