//! Loop-invariant conversions: a value defined outside a loop and converted to another layout
//! inside it (a row vector computed before the loop, used by every iteration's scores) is
//! converted once, before the outermost loop that does not define it, instead of once an
//! iteration (a round trip through shared memory and a block barrier each time). Triton's
//! layout passes hoist such conversions too.

use std::collections::BTreeSet;

use kiln_dsl::ir::{Kernel, Op, Region, Value};

use super::divisibility::defined_in;
use super::{Conversion, ConversionKind, Layout, LayoutAssignment, nested_regions};

/// Moves every register-to-register conversion of a value a loop does not define to before
/// that loop: [`ConversionKind::BeforeLoop`] at the `for`, [`ConversionKind::Hoisted`] where
/// it was.
pub(super) fn apply(kernel: &Kernel, assignment: &mut LayoutAssignment) {
    let mut loops = Vec::new();
    let mut moves = Vec::new();
    collect_moves(&kernel.body, &mut 0, &mut loops, assignment, &mut moves);
    for Move {
        at,
        value,
        to,
        before,
    } in moves
    {
        for conversion in assignment.conversions.entry(at).or_default() {
            if conversion.value == value && conversion.to == to {
                conversion.kind = ConversionKind::Hoisted;
            }
        }
        let before = assignment.conversions.entry(before).or_default();
        if !before.iter().any(|c| c.value == value && c.to == to) {
            before.push(Conversion {
                value,
                to,
                kind: ConversionKind::BeforeLoop,
            });
        }
    }
}

/// A conversion to move: where it is (pre-order index), of what, to which layout, and the
/// `for` it goes before.
struct Move {
    at: usize,
    value: Value,
    to: Layout,
    before: usize,
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
            if conversion.kind != ConversionKind::ThroughShared {
                continue;
            }
            // The outermost loop whose body does not define the value (the loops inside it
            // do not either).
            if let Some(target) = loops
                .iter()
                .find(|l| !l.defines.contains(&conversion.value))
            {
                moves.push(Move {
                    at: index,
                    value: conversion.value,
                    to: conversion.to.clone(),
                    before: target.index,
                });
            }
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
