//! Layout assignment: one blocked layout per 1-D tile shape, chosen so that each thread's global
//! accesses are 16 contiguous bytes where the tile is big enough (Triton's `Coalesce`).
//!
//! Every op between tiles here is elementwise, so all 1-D tiles of one shape share one layout and
//! no conversion is ever needed. Ops that change rank or need other layout kinds (reductions,
//! `dot`, `trans`, `expand_dims`, `broadcast`, block pointers) are refused by name.

use std::collections::BTreeMap;

use kiln_dsl::ir::{Inst, Kernel, Op, Region, Value};
use kiln_dsl::types::{Elem, Type};

use super::{BlockedLayout, Layout, THREADS_PER_WARP};
use crate::{CodegenError, CompileOptions, Stage};

/// The bytes one thread should access contiguously: a 16-byte vector load or store.
const ACCESS_BYTES: usize = 16;

/// The layout stage's output: a layout for every tile value of a kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutAssignment {
    /// Indexed by [`Value`]: the layout of a tile; `None` for a scalar, which every thread holds.
    layouts: Vec<Option<Layout>>,
    pub num_warps: u32,
}

impl LayoutAssignment {
    pub fn layout(&self, value: Value) -> Option<&Layout> {
        self.layouts[value.index()].as_ref()
    }

    /// The distinct layouts in order of first use by a value: the text form's aliases.
    pub fn distinct_layouts(&self) -> Vec<&Layout> {
        let mut distinct: Vec<&Layout> = Vec::new();
        for layout in self.layouts.iter().flatten() {
            if !distinct.contains(&layout) {
                distinct.push(layout);
            }
        }
        distinct
    }
}

/// Assigns a layout to every tile value of `kernel`, or names the first op it cannot handle.
pub fn assign(kernel: &Kernel, options: &CompileOptions) -> Result<LayoutAssignment, CodegenError> {
    options.validate()?;
    // For each 1-D tile length, the narrowest element any load or store of that length moves.
    let mut access_bytes: BTreeMap<usize, usize> = BTreeMap::new();
    check_region(kernel, &kernel.body, &mut access_bytes)?;
    let threads = (options.num_warps * THREADS_PER_WARP) as usize;
    let layouts = kernel
        .values
        .iter()
        .map(|info| match info.ty.shape() {
            [len] => {
                let bytes = access_bytes.get(len).copied().unwrap_or(4);
                // 16 bytes per thread, but no more elements than the tile gives each thread.
                let per_thread = (ACCESS_BYTES / bytes).min(len / threads).max(1);
                Some(Layout::Blocked(BlockedLayout::one_dim(
                    per_thread as u32,
                    options.num_warps,
                )))
            }
            _ => None,
        })
        .collect();
    Ok(LayoutAssignment {
        layouts,
        num_warps: options.num_warps,
    })
}

fn unsupported(inst: &Inst, message: impl Into<String>) -> CodegenError {
    CodegenError::unsupported(Stage::Layout, inst.op.name(), inst.loc, message)
}

fn check_region(
    kernel: &Kernel,
    region: &Region,
    access_bytes: &mut BTreeMap<usize, usize>,
) -> Result<(), CodegenError> {
    for inst in &region.insts {
        check_inst(kernel, inst, access_bytes)?;
    }
    Ok(())
}

fn check_inst(
    kernel: &Kernel,
    inst: &Inst,
    access_bytes: &mut BTreeMap<usize, usize>,
) -> Result<(), CodegenError> {
    let refusal = match &inst.op {
        Op::Reduce { .. } => Some("reductions need slice layouts, which are not assigned yet"),
        Op::Dot { .. } => Some("`dot` needs the mma and dot-operand layouts, not assigned yet"),
        Op::Trans { .. } | Op::ExpandDims { .. } | Op::Broadcast { .. } => {
            Some("only elementwise ops on 1-D tiles get layouts so far")
        }
        Op::MakeBlockPtr { .. }
        | Op::Advance { .. }
        | Op::LoadBlock { .. }
        | Op::StoreBlock { .. } => Some("block pointers are not lowered yet"),
        _ => None,
    };
    if let Some(message) = refusal {
        return Err(unsupported(inst, message));
    }
    for &result in &inst.results {
        let ty = kernel.ty(result);
        if ty.shape().len() > 1 {
            return Err(unsupported(
                inst,
                format!(
                    "expected a scalar or a 1-D tile, got {ty}: 2-D layouts are not assigned yet"
                ),
            ));
        }
    }
    let accessed = match &inst.op {
        Op::Load { ptr, .. } | Op::Store { ptr, .. } => Some(*ptr),
        _ => None,
    };
    if let Some(ptr) = accessed
        && let Type::Tensor {
            elem: Elem::Ptr(pointee),
            shape,
        } = kernel.ty(ptr)
        && let [len] = shape[..]
    {
        let bytes = access_bytes.entry(len).or_insert(usize::MAX);
        *bytes = (*bytes).min(pointee.size_bytes());
    }
    match &inst.op {
        Op::For { body, .. } => check_region(kernel, body, access_bytes),
        Op::If {
            then_region,
            else_region,
            ..
        } => {
            check_region(kernel, then_region, access_bytes)?;
            check_region(kernel, else_region, access_bytes)
        }
        _ => Ok(()),
    }
}
