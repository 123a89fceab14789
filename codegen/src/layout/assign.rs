//! Layout assignment: which layout every tile value gets, and where an op needs an operand in
//! another layout than the one it has (an explicit conversion, through shared memory).
//!
//! Values that elementwise ops, loads, stores, `broadcast`, loop-carried values and `if` results
//! tie together form a class that shares one layout. A class of 2-D tiles gets the coalescing
//! blocked layout of its widest shape ([`BlockedLayout::coalesced`], Triton's `Coalesce`); a class
//! of 1-D tiles gets the slice of a 2-D layout when a reduction produces it or `expand_dims`
//! consumes it (so that neither moves data), and a coalescing 1-D layout otherwise. Then each op
//! that relates two layouts checks its operand: `expand_dims` wants the slice of its result's
//! layout, a reduction the parent of its result's slice, `trans` the transpose of its result's
//! layout; an operand in another layout gets a [`Conversion`] right before the op.
//!
//! Instructions are numbered in pre-order (an op, then the ops of its regions, `yield`s
//! included), the order in which the printer and the lowering visit them.

use std::collections::BTreeMap;

use kiln_dsl::ir::{Inst, Kernel, Op, Region, Value};
use kiln_dsl::types::{Elem, Type};

use super::{BlockedLayout, Layout};
use crate::{CodegenError, CompileOptions, Stage};

/// An operand converted to another layout right before the op that uses it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversion {
    pub value: Value,
    pub to: Layout,
}

/// The layout stage's output: a layout for every tile value of a kernel, and the conversions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayoutAssignment {
    /// Indexed by [`Value`]: the layout of a tile; `None` for a scalar, which every thread holds,
    /// and for a block pointer (a handful of scalars).
    layouts: Vec<Option<Layout>>,
    /// By the pre-order index of the instruction that needs them.
    conversions: BTreeMap<usize, Vec<Conversion>>,
    pub num_warps: u32,
}

impl LayoutAssignment {
    pub fn layout(&self, value: Value) -> Option<&Layout> {
        self.layouts[value.index()].as_ref()
    }

    /// The conversions that run right before instruction `inst_index` (pre-order).
    pub fn conversions_at(&self, inst_index: usize) -> &[Conversion] {
        self.conversions
            .get(&inst_index)
            .map_or(&[], |c| c.as_slice())
    }

    /// The distinct layouts in order of first use by a value, then conversion targets: the text
    /// form's aliases.
    pub fn distinct_layouts(&self) -> Vec<&Layout> {
        let mut distinct: Vec<&Layout> = Vec::new();
        let targets = self.conversions.values().flatten().map(|c| &c.to);
        for layout in self.layouts.iter().flatten().chain(targets) {
            if !distinct.contains(&layout) {
                distinct.push(layout);
            }
        }
        distinct
    }
}

/// Calls `f` with every instruction of `region` and its pre-order index, starting at `*next`.
pub fn walk_insts<'k>(region: &'k Region, next: &mut usize, f: &mut dyn FnMut(usize, &'k Inst)) {
    for inst in &region.insts {
        f(*next, inst);
        *next += 1;
        for nested in nested_regions(&inst.op) {
            walk_insts(nested, next, f);
        }
    }
}

/// The regions an op owns, in printing order.
pub(crate) fn nested_regions(op: &Op) -> Vec<&Region> {
    match op {
        Op::For { body, .. } => vec![body],
        Op::If {
            then_region,
            else_region,
            ..
        } => vec![then_region, else_region],
        _ => Vec::new(),
    }
}

/// The values a region's closing `yield` names.
fn yielded(region: &Region) -> &[Value] {
    match region.insts.last().map(|i| &i.op) {
        Some(Op::Yield { values }) => values,
        _ => &[],
    }
}

/// An op whose operand and result layouts are related rather than equal.
#[derive(Clone, Copy)]
enum Relation {
    ExpandDims { axis: usize },
    Reduce { axis: usize },
    Trans,
}

struct Edge<'k> {
    inst_index: usize,
    inst: &'k Inst,
    relation: Relation,
    input: Value,
    result: Value,
}

/// Union-find over values, with what each class needs.
struct Classes {
    parent: Vec<usize>,
}

impl Classes {
    fn find(&mut self, v: usize) -> usize {
        let mut root = v;
        while self.parent[root] != root {
            root = self.parent[root];
        }
        let mut at = v;
        while self.parent[at] != root {
            let next = self.parent[at];
            self.parent[at] = root;
            at = next;
        }
        root
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        // The smaller index is the root: deterministic, and the first value names the class.
        if a < b {
            self.parent[b] = a;
        } else if b < a {
            self.parent[a] = b;
        }
    }
}

fn is_tile(kernel: &Kernel, v: Value) -> bool {
    matches!(kernel.ty(v), Type::Tensor { shape, .. } if !shape.is_empty())
}

fn unsupported(inst: &Inst, message: impl Into<String>) -> CodegenError {
    CodegenError::unsupported(Stage::Layout, inst.op.name(), inst.loc, message)
}

/// Assigns a layout to every tile value of `kernel`, or names the first op it cannot handle.
pub fn assign(kernel: &Kernel, options: &CompileOptions) -> Result<LayoutAssignment, CodegenError> {
    options.validate()?;
    let count = kernel.values.len();
    let mut classes = Classes {
        parent: (0..count).collect(),
    };
    // The narrowest element a load or store of the class moves, by value.
    let mut access_bytes: Vec<Option<usize>> = vec![None; count];
    let mut edges: Vec<Edge<'_>> = Vec::new();
    let mut refusal: Option<CodegenError> = None;
    let mut next = 0;
    walk_insts(&kernel.body, &mut next, &mut |inst_index, inst| {
        if refusal.is_none() {
            refusal = check_inst(kernel, inst).err();
        }
        let mut tie = |values: &[Value]| {
            let tiles: Vec<Value> = values
                .iter()
                .copied()
                .filter(|&v| is_tile(kernel, v))
                .collect();
            for pair in tiles.windows(2) {
                classes.union(pair[0].index(), pair[1].index());
            }
        };
        let results = &inst.results;
        let mut access = |value: Value, pointee: usize| {
            let bytes = &mut access_bytes[value.index()];
            *bytes = Some(bytes.map_or(pointee, |b| b.min(pointee)));
        };
        match &inst.op {
            Op::Unary { value, .. } | Op::Cast { value } | Op::Broadcast { value } => {
                tie(&[results[0], *value])
            }
            Op::Binary { lhs, rhs, .. } | Op::Compare { lhs, rhs, .. } => {
                tie(&[results[0], *lhs, *rhs])
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => tie(&[results[0], *cond, *if_true, *if_false]),
            Op::AddPtr { ptr, offset } => tie(&[results[0], *ptr, *offset]),
            Op::Load { ptr, mask, other } => {
                let mut tied = vec![results[0], *ptr];
                tied.extend(mask.iter().chain(other.iter()));
                tie(&tied);
                access(results[0], pointee_bytes(kernel, *ptr));
            }
            Op::Store { ptr, value, mask } => {
                let mut tied = vec![*ptr, *value];
                tied.extend(mask.iter());
                tie(&tied);
                access(*value, pointee_bytes(kernel, *ptr));
            }
            Op::LoadBlock { ptr, .. } => access(results[0], pointee_bytes(kernel, *ptr)),
            Op::StoreBlock { ptr, value, .. } => access(*value, pointee_bytes(kernel, *ptr)),
            Op::For { init, body, .. } => {
                for (i, &init) in init.iter().enumerate() {
                    let mut tied = vec![init, body.params[i + 1], results[i]];
                    tied.extend(yielded(body).get(i));
                    tie(&tied);
                }
            }
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                for (i, &result) in results.iter().enumerate() {
                    let mut tied = vec![result];
                    tied.extend(yielded(then_region).get(i));
                    tied.extend(yielded(else_region).get(i));
                    tie(&tied);
                }
            }
            Op::ExpandDims { value, axis } => edges.push(Edge {
                inst_index,
                inst,
                relation: Relation::ExpandDims { axis: *axis },
                input: *value,
                result: results[0],
            }),
            Op::Reduce { value, axis, .. } => edges.push(Edge {
                inst_index,
                inst,
                relation: Relation::Reduce { axis: *axis },
                input: *value,
                result: results[0],
            }),
            Op::Trans { value } => edges.push(Edge {
                inst_index,
                inst,
                relation: Relation::Trans,
                input: *value,
                result: results[0],
            }),
            _ => {}
        }
    });
    if let Some(error) = refusal {
        return Err(error);
    }

    // What each class covers: its widest shape and the narrowest element it moves.
    let mut widest: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    let mut narrowest: BTreeMap<usize, usize> = BTreeMap::new();
    for (index, info) in kernel.values.iter().enumerate() {
        if !is_tile(kernel, Value(index as u32)) {
            continue;
        }
        let root = classes.find(index);
        let shape = info.ty.shape();
        let entry = widest.entry(root).or_insert_with(|| shape.to_vec());
        for (w, &s) in entry.iter_mut().zip(shape) {
            *w = (*w).max(s);
        }
        if let Some(bytes) = access_bytes[index] {
            let n = narrowest.entry(root).or_insert(bytes);
            *n = (*n).min(bytes);
        }
    }
    let coalesced = |root: usize, shape: &[usize]| {
        let bytes = narrowest.get(&root).copied().unwrap_or(4);
        Layout::Blocked(BlockedLayout::coalesced(shape, bytes, options.num_warps))
    };
    let mut class_layout: BTreeMap<usize, Layout> = BTreeMap::new();
    for (&root, shape) in &widest {
        if shape.len() >= 2 {
            class_layout.insert(root, coalesced(root, shape));
        }
    }
    // 1-D classes: the slice of the 2-D layout a reduction comes from, or that `expand_dims`
    // goes to, so that neither moves data.
    for prefer_reductions in [true, false] {
        for edge in &edges {
            let (known, derived, axis) = match (edge.relation, prefer_reductions) {
                (Relation::Reduce { axis }, true) => (edge.input, edge.result, axis),
                (Relation::ExpandDims { axis }, false) => (edge.result, edge.input, axis),
                _ => continue,
            };
            if !is_tile(kernel, derived) || !is_tile(kernel, known) {
                continue;
            }
            let derived_root = classes.find(derived.index());
            if class_layout.contains_key(&derived_root) {
                continue;
            }
            if let Some(parent) = class_layout.get(&classes.find(known.index())) {
                let slice = parent.slice(axis);
                class_layout.insert(derived_root, slice);
            }
        }
    }
    for (&root, shape) in &widest {
        class_layout
            .entry(root)
            .or_insert_with(|| coalesced(root, shape));
    }
    let layouts: Vec<Option<Layout>> = (0..count)
        .map(|index| {
            is_tile(kernel, Value(index as u32))
                .then(|| class_layout.get(&classes.find(index)).cloned())
                .flatten()
        })
        .collect();

    let mut conversions: BTreeMap<usize, Vec<Conversion>> = BTreeMap::new();
    for edge in &edges {
        let (Some(input), result) = (
            layouts[edge.input.index()].as_ref(),
            layouts[edge.result.index()].as_ref(),
        ) else {
            continue; // a scalar operand: every thread holds it
        };
        let wanted = match (edge.relation, result) {
            (Relation::ExpandDims { axis }, Some(result)) => result.slice(axis),
            (Relation::Reduce { axis }, Some(result)) => match result {
                Layout::Slice(slice) if slice.dim == axis => (*slice.parent).clone(),
                _ if *result == input.slice(axis) => continue,
                other => {
                    return Err(unsupported(
                        edge.inst,
                        format!("expected the result in a slice along {axis}, got {other}"),
                    ));
                }
            },
            (Relation::Reduce { .. }, None) => continue, // to a scalar: any layout reduces
            (Relation::Trans, Some(Layout::Blocked(result))) => {
                Layout::Blocked(result.transposed())
            }
            (_, other) => {
                return Err(unsupported(
                    edge.inst,
                    format!(
                        "expected a blocked result layout, got {}",
                        other.map_or("none".to_string(), Layout::to_string)
                    ),
                ));
            }
        };
        if *input != wanted {
            conversions
                .entry(edge.inst_index)
                .or_default()
                .push(Conversion {
                    value: edge.input,
                    to: wanted,
                });
        }
    }
    Ok(LayoutAssignment {
        layouts,
        conversions,
        num_warps: options.num_warps,
    })
}

fn pointee_bytes(kernel: &Kernel, ptr: Value) -> usize {
    match kernel.ty(ptr) {
        Type::Tensor {
            elem: Elem::Ptr(pointee),
            ..
        } => pointee.size_bytes(),
        Type::BlockPtr { pointee, .. } => pointee.size_bytes(),
        Type::Tensor { .. } => 4,
    }
}

/// Refuses what no layout covers yet: `dot`, and tiles of more than two dimensions.
fn check_inst(kernel: &Kernel, inst: &Inst) -> Result<(), CodegenError> {
    if let Op::Dot { .. } = inst.op {
        return Err(unsupported(
            inst,
            "`dot` needs the mma and dot-operand layouts, not assigned yet",
        ));
    }
    for &result in &inst.results {
        let ty = kernel.ty(result);
        if ty.shape().len() > 2 {
            return Err(unsupported(
                inst,
                format!("expected a scalar, 1-D or 2-D tile, got {ty}"),
            ));
        }
    }
    Ok(())
}
