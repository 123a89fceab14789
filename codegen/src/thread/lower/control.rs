//! Structured control flow: a tile `for` or `if` becomes the thread program's, with one carried
//! register (or result) per register of each carried tile. Bounds and conditions are scalars,
//! the same in every thread. Accesses to staged tiles pending at a barrier are joined
//! conservatively: anything may be pending at a loop's head and after it.

use kiln_dsl::ir::{Region, Value};

use super::dot::Pending;
use super::{Lowering, Result};
use crate::thread::ir::{Block, Inst, Op, Reg};

impl Lowering<'_> {
    /// Lowers `region` into a block of its own, ending in a yield of what the region yields.
    fn nested_block(&mut self, region: &Region) -> Result<(Block, Vec<Vec<Reg>>)> {
        self.blocks.push(Vec::new());
        let yielded = self.region(region);
        let mut insts = self.blocks.pop().unwrap_or_default();
        let yielded = yielded?;
        insts.push(Inst {
            results: Vec::new(),
            op: Op::Yield(yielded.iter().flatten().copied().collect()),
            loc: self.loc,
        });
        Ok((Block { insts }, yielded))
    }

    /// Fresh registers of the same types and grouping as `like`.
    fn fresh(&mut self, like: &[Vec<Reg>]) -> Vec<Vec<Reg>> {
        like.iter()
            .map(|regs| {
                regs.iter()
                    .map(|&r| {
                        let ty = self.ty(r);
                        self.new_reg(ty)
                    })
                    .collect()
            })
            .collect()
    }

    pub(super) fn for_loop(
        &mut self,
        lower: Value,
        upper: Value,
        step: Value,
        init: &[Value],
        body: &Region,
    ) -> Result<Vec<Vec<Reg>>> {
        let loc = self.loc;
        let (lower, upper, step) = (self.reg(lower)?, self.reg(upper)?, self.reg(step)?);
        let init: Vec<Vec<Reg>> = init.iter().map(|&v| self.regs(v)).collect::<Result<_>>()?;
        let iv = self.new_reg(self.ty(lower));
        let params = self.fresh(&init);
        self.bind(body.params[0], vec![iv]);
        for (&param, regs) in body.params[1..].iter().zip(&params) {
            self.bind(param, regs.clone());
        }
        // Staged tiles: the body may follow its own last iteration, and the loop may not run.
        self.pending = Pending::unknown();
        let (body, _) = self.nested_block(body)?;
        self.pending = Pending::unknown();
        let results = self.fresh(&init);
        self.push(Inst {
            results: results.iter().flatten().copied().collect(),
            op: Op::For {
                lower,
                upper,
                step,
                init: init.into_iter().flatten().collect(),
                iv,
                params: params.into_iter().flatten().collect(),
                body,
            },
            loc,
        });
        Ok(results)
    }

    pub(super) fn if_else(
        &mut self,
        cond: Value,
        then_region: &Region,
        else_region: &Region,
    ) -> Result<Vec<Vec<Reg>>> {
        let loc = self.loc;
        let cond = self.reg(cond)?;
        let before = self.pending;
        let (then_block, yielded) = self.nested_block(then_region)?;
        let after_then = std::mem::replace(&mut self.pending, before);
        let (else_block, _) = self.nested_block(else_region)?;
        self.pending.reads |= after_then.reads;
        self.pending.writes |= after_then.writes;
        let results = self.fresh(&yielded);
        self.push(Inst {
            results: results.iter().flatten().copied().collect(),
            op: Op::If {
                cond,
                then_block,
                else_block,
            },
            loc,
        });
        Ok(results)
    }
}
