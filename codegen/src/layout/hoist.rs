//! Loop-invariant conversions: a value defined outside a loop and converted to another layout
//! inside it (a row vector computed before the loop, used by every iteration's scores) is
//! converted once, before the outermost loop that does not define it, instead of once an
//! iteration (a round trip through shared memory and a block barrier each time). Triton's
//! layout passes hoist such conversions too. So is a `wgmma`'s A operand taken into registers
//! ([`crate::CompileOptions::resident_a`]): its `ldmatrix`s run once before the loop, and one
//! that its innermost loop defines stays a descriptor.

use std::collections::BTreeSet;

use kiln_dsl::ir::{Kernel, Op, Region, Value};

use super::divisibility::defined_in;
use super::{Conversion, ConversionKind, Layout, LayoutAssignment, MmaVersion, nested_regions};

/// Moves every register-to-register conversion of a value a loop does not define to before
/// that loop: [`ConversionKind::BeforeLoop`] at the `for`, [`ConversionKind::Hoisted`] where
/// it was; and a `wgmma` operand's `ldmatrix`s likewise
/// ([`ConversionKind::LdmatrixBeforeLoop`]), or back to its descriptor where every enclosing
/// loop defines it.
pub(super) fn apply(kernel: &Kernel, assignment: &mut LayoutAssignment) {
    let mut loops = Vec::new();
    let mut moves = Vec::new();
    collect_moves(&kernel.body, &mut 0, &mut loops, assignment, &mut moves);
    for Move {
        at,
        value,
        to,
        destination,
    } in moves
    {
        for conversion in assignment.conversions.entry(at).or_default() {
            if conversion.value == value && conversion.to == to {
                conversion.kind = match (&destination, &conversion.kind) {
                    (Destination::BackToDescriptor, ConversionKind::Ldmatrix { from }) => {
                        ConversionKind::Descriptor { from: from.clone() }
                    }
                    _ => ConversionKind::Hoisted,
                };
            }
        }
        let (before, kind) = match destination {
            Destination::BackToDescriptor => continue,
            Destination::BeforeFor { index, kind } => (index, kind),
        };
        let before = assignment.conversions.entry(before).or_default();
        if !before.iter().any(|c| c.value == value && c.to == to) {
            before.push(Conversion { value, to, kind });
        }
    }
}

/// A conversion to move: where it is (pre-order index), of what, to which layout, and where
/// it goes.
struct Move {
    at: usize,
    value: Value,
    to: Layout,
    destination: Destination,
}

/// Where a conversion goes: before the `for` at `index` (its kind there), or back to a
/// descriptor at its `dot`.
enum Destination {
    BeforeFor { index: usize, kind: ConversionKind },
    BackToDescriptor,
}

/// Whether `to` is the operand of a `wgmma`.
fn wgmma_operand(to: &Layout) -> bool {
    matches!(to, Layout::DotOperand(op)
        if matches!(&*op.parent, Layout::Mma(mma) if mma.version == MmaVersion::V3))
}

/// An enclosing loop: its `for`'s pre-order index and the values its body defines.
struct Loop {
    index: usize,
    defines: BTreeSet<Value>,
}

/// Walks `region` in pre-order, recording each conversion to move.
fn collect_moves(
    region: &Region,
    next: &mut usize,
    loops: &mut Vec<Loop>,
    assignment: &LayoutAssignment,
    moves: &mut Vec<Move>,
) {
    for inst in &region.insts {
        let index = *next;
        *next += 1;
        for conversion in assignment.conversions_at(index) {
            let kind_before = match &conversion.kind {
                ConversionKind::ThroughShared => ConversionKind::BeforeLoop,
                ConversionKind::Ldmatrix { from } if wgmma_operand(&conversion.to) => {
                    ConversionKind::LdmatrixBeforeLoop { from: from.clone() }
                }
                _ => continue,
            };
            // The outermost loop whose body does not define the value (the loops inside it
            // do not either).
            let destination = match loops
                .iter()
                .find(|l| !l.defines.contains(&conversion.value))
            {
                Some(target) => Destination::BeforeFor {
                    index: target.index,
                    kind: kind_before,
                },
                // Loaded every iteration, registers would only add `ldmatrix`s.
                None if !loops.is_empty()
                    && matches!(conversion.kind, ConversionKind::Ldmatrix { .. }) =>
                {
                    Destination::BackToDescriptor
                }
                None => continue,
            };
            moves.push(Move {
                at: index,
                value: conversion.value,
                to: conversion.to.clone(),
                destination,
            });
        }
        let is_loop = matches!(inst.op, Op::For { .. });
        for nested in nested_regions(&inst.op) {
            if is_loop {
                loops.push(Loop {
                    index,
                    defines: defined_in(nested),
                });
            }
            collect_moves(nested, next, loops, assignment, moves);
            if is_loop {
                loops.pop();
            }
        }
    }
}
