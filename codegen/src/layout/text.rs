//! The layout stage's text form: the layouts as aliases (`#blocked = #blocked<{..}>`, then
//! `#blocked1`, ..), then kiln-dsl's IR text with the alias after each tile result's type
//! (`%offs.5 = add %3, %4 : i32[1024] #blocked`), and a `convert_layout` line before each op
//! that takes an operand in another layout (a staging into shared memory sits before the
//! instruction after the value's definition), so that a golden test shows every decision. A
//! `dot` that takes an accumulator as its A operand in registers says so after its line, and
//! so do a pipelined `for` (its stages) and each load it streams through `cp.async` or TMA (into
//! how many buffers of which shared layout; the tensor maps are listed first).

use kiln_dsl::ir::{Inst, Kernel, Region, Value};

use super::{ConversionKind, Layout, LayoutAssignment};
use crate::{CodegenError, Stage};

impl LayoutAssignment {
    /// The IR text of `kernel` annotated with this assignment's layouts.
    pub fn to_text(&self, kernel: &Kernel) -> Result<String, CodegenError> {
        let distinct = self.distinct_layouts();
        let alias = |layout: &Layout| -> String {
            let same_kind = distinct
                .iter()
                .filter(|l| l.kind_name() == layout.kind_name());
            let nth = same_kind.take_while(|l| *l != layout).count();
            match nth {
                0 => format!("#{}", layout.kind_name()),
                n => format!("#{}{n}", layout.kind_name()),
            }
        };
        let mut out = String::new();
        for (i, map) in self.tensor_maps.iter().enumerate() {
            out.push_str(&format!("// map {i}: {map}\n"));
        }
        for layout in &distinct {
            out.push_str(&format!("{} = {layout}\n", alias(layout)));
        }
        // The printer writes one line per instruction, plus closing lines for regions; walking the
        // IR in the same order pairs each line with its instruction.
        let ir = kernel.to_string();
        let lines: Vec<&str> = ir.lines().collect();
        let mut insts: Vec<Option<(usize, &Inst)>> = vec![None];
        line_insts(&kernel.body, &mut 0, &mut insts);
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
            let mut in_registers = Vec::new();
            if let Some((index, _)) = inst {
                let indent = &line[..line.len() - line.trim_start().len()];
                for conversion in self.conversions_at(index) {
                    let value = conversion.value;
                    let from = match &conversion.kind {
                        ConversionKind::AccumulatorAsA => {
                            in_registers.push(format!(
                                "{} {} is {} in registers",
                                value_name(kernel, value),
                                self.layout(value).map_or("?".to_string(), &alias),
                                alias(&conversion.to)
                            ));
                            continue;
                        }
                        ConversionKind::Hoisted => {
                            in_registers.push(format!(
                                "{} is {} in registers converted before the loop",
                                value_name(kernel, value),
                                alias(&conversion.to)
                            ));
                            continue;
                        }
                        ConversionKind::Ldmatrix { from }
                        | ConversionKind::Descriptor { from }
                        | ConversionKind::LdmatrixBeforeLoop { from } => alias(from),
                        _ => self.layout(value).map_or("?".to_string(), &alias),
                    };
                    let through = match &conversion.kind {
                        ConversionKind::ThroughBuffers { shared, .. } => format!(
                            "  // through {} where the loops' buffers were",
                            alias(&Layout::Shared(shared.clone()))
                        ),
                        _ => String::new(),
                    };
                    out.push_str(&format!(
                        "{indent}convert_layout {} : {} {from} -> {}{through}\n",
                        value_name(kernel, value),
                        kernel.ty(value),
                        alias(&conversion.to)
                    ));
                }
            }
            out.push_str(&match inst {
                Some((_, inst)) if !inst.results.is_empty() => {
                    annotate(kernel, self, inst, line, &alias)
                }
                _ => line.to_string(),
            });
            // The FlashAttention-2 identity: no conversion at all, said where it happens.
            if !in_registers.is_empty() {
                out.push_str(&format!(
                    "  // {}: no data movement",
                    in_registers.join(", ")
                ));
            }
            // Software pipelining, on the loop and on each load it streams.
            if let Some((index, _)) = inst {
                if let Some(pipelined) = self.pipeline_at(index) {
                    out.push_str(&format!(
                        "  // pipelined: {} stages, {} tile(s) in flight per load",
                        pipelined.stages,
                        pipelined.stages - 1
                    ));
                }
                if let Some((_, load)) = self.tma_once_at(index) {
                    out.push_str(&format!(
                        "  // tma map {} once -> {}",
                        load.tma.map,
                        alias(&Layout::Shared(load.shared.clone()))
                    ));
                }
                if let Some(load) = self.pipelined_load(index) {
                    let stages = self.pipelines().find(|(_, p)| p.loads.contains(load));
                    let copy = match &load.tma {
                        Some(tma) => format!("tma map {}", tma.map),
                        None => "cp.async 16 B".to_string(),
                    };
                    let buffer = match &load.shared {
                        Some(shared) => alias(&Layout::Shared(shared.clone())),
                        None => "row-major, read in registers".to_string(),
                    };
                    out.push_str(&format!(
                        "  // {copy} -> {} x {buffer}",
                        stages.map_or(0, |(_, p)| p.stages),
                    ));
                }
            }
            out.push('\n');
        }
        Ok(out)
    }
}

/// A value as kiln-dsl's printer spells it: `%name.N`, or `%N`.
fn value_name(kernel: &Kernel, value: Value) -> String {
    match &kernel.values[value.index()].name {
        Some(name) => format!("%{name}.{}", value.0),
        None => format!("%{}", value.0),
    }
}

/// Lists the instruction (with its pre-order index) of each printed line in printing order;
/// `None` for region closers.
fn line_insts<'k>(region: &'k Region, next: &mut usize, out: &mut Vec<Option<(usize, &'k Inst)>>) {
    for inst in &region.insts {
        out.push(Some((*next, inst)));
        *next += 1;
        for nested in super::assign::nested_regions(&inst.op) {
            line_insts(nested, next, out);
            out.push(None);
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
