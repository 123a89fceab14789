//! The layout stage's text form: the layouts as aliases (`#blocked = #blocked<{..}>`, then
//! `#blocked1`, ..), then kiln-dsl's IR text with the alias after each tile result's type
//! (`%offs.5 = add %3, %4 : i32[1024] #blocked`), so that a golden test shows every decision.

use kiln_dsl::ir::{Inst, Kernel, Op, Region};

use super::{Layout, LayoutAssignment};
use crate::{CodegenError, Stage};

impl LayoutAssignment {
    /// The IR text of `kernel` annotated with this assignment's layouts.
    pub fn to_text(&self, kernel: &Kernel) -> Result<String, CodegenError> {
        let distinct = self.distinct_layouts();
        let alias = |layout: &Layout| {
            let same_kind = distinct
                .iter()
                .filter(|l| l.kind_name() == layout.kind_name());
            let nth = same_kind.take_while(|l| **l != layout).count();
            match nth {
                0 => format!("#{}", layout.kind_name()),
                n => format!("#{}{n}", layout.kind_name()),
            }
        };
        let mut out = String::new();
        for layout in &distinct {
            out.push_str(&format!("{} = {layout}\n", alias(layout)));
        }
        // The printer writes one line per instruction, plus closing lines for regions; walking the
        // IR in the same order pairs each line with its instruction.
        let ir = kernel.to_string();
        let lines: Vec<&str> = ir.lines().collect();
        let mut insts: Vec<Option<&Inst>> = vec![None];
        line_insts(&kernel.body, &mut insts);
        insts.push(None);
        if insts.len() != lines.len() {
            return Err(CodegenError::internal(
                Stage::Layout,
                format!(
                    "expected {} lines of tile IR text, one per instruction, got {}",
                    insts.len(),
                    lines.len()
                ),
            ));
        }
        for (line, inst) in lines.iter().zip(insts) {
            out.push_str(&match inst {
                Some(inst) if !inst.results.is_empty() => {
                    annotate(kernel, self, inst, line, &alias)
                }
                _ => line.to_string(),
            });
            out.push('\n');
        }
        Ok(out)
    }
}

/// Lists the instruction of each printed line in printing order; `None` for region closers.
fn line_insts<'k>(region: &'k Region, out: &mut Vec<Option<&'k Inst>>) {
    for inst in &region.insts {
        out.push(Some(inst));
        match &inst.op {
            Op::For { body, .. } => {
                line_insts(body, out);
                out.push(None);
            }
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                line_insts(then_region, out);
                out.push(None);
                line_insts(else_region, out);
                out.push(None);
            }
            _ => {}
        }
    }
}

/// Rewrites the ` : types` part of an instruction's line with each tile type's layout alias.
fn annotate(
    kernel: &Kernel,
    assignment: &LayoutAssignment,
    inst: &Inst,
    line: &str,
    alias: &dyn Fn(&Layout) -> String,
) -> String {
    let types = |annotated: bool| {
        let types: Vec<String> = inst
            .results
            .iter()
            .map(|&r| match assignment.layout(r) {
                Some(layout) if annotated => format!("{} {}", kernel.ty(r), alias(layout)),
                _ => kernel.ty(r).to_string(),
            })
            .collect();
        format!(" : {}", types.join(", "))
    };
    let plain = types(false);
    match line.rfind(&plain) {
        Some(at) => format!(
            "{}{}{}",
            &line[..at],
            types(true),
            &line[at + plain.len()..]
        ),
        None => line.to_string(),
    }
}
