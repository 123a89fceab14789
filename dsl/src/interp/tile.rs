//! Tile values at run time and the native loops that compute on whole tiles.
//!
//! Float tiles of every float dtype are held as f32 (exact for f16 and bf16); after each op that
//! produces f16 or bf16 the result is rounded to that dtype, as the GPU's registers would hold it.

use half::{bf16, f16};

use crate::passes::wrap_int;
use crate::types::DType;

/// An element address: which buffer (argument order among pointer arguments) and where in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Addr {
    pub buffer: u32,
    pub offset: i64,
}

#[derive(Clone, Debug)]
pub(crate) struct BlockPtr {
    pub base: Addr,
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub offsets: Vec<i64>,
}

/// The elements of one value, row-major; the shape is the IR type's.
#[derive(Clone, Debug)]
pub(crate) enum Data {
    Float(Vec<f32>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
    Ptr(Vec<Addr>),
    Block(Box<BlockPtr>),
}

impl Data {
    /// Rebuilds a tile of the same kind from chosen element indices (broadcast, transpose).
    pub fn gather(&self, indices: impl Iterator<Item = usize>) -> Data {
        match self {
            Data::Float(v) => Data::Float(indices.map(|i| v[i]).collect()),
            Data::Int(v) => Data::Int(indices.map(|i| v[i]).collect()),
            Data::Bool(v) => Data::Bool(indices.map(|i| v[i]).collect()),
            Data::Ptr(v) => Data::Ptr(indices.map(|i| v[i]).collect()),
            Data::Block(_) => unreachable!("the builder never reshapes block pointers"),
        }
    }
}

/// Rounds f32 values to `dtype` in place (a no-op for f32).
pub(crate) fn round_to(values: &mut [f32], dtype: DType) {
    match dtype {
        DType::F16 => values
            .iter_mut()
            .for_each(|v| *v = f16::from_f32(*v).to_f32()),
        DType::BF16 => values
            .iter_mut()
            .for_each(|v| *v = bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

pub(crate) fn wrap_all(values: &mut [i64], dtype: DType) {
    if dtype == DType::I32 {
        values.iter_mut().for_each(|v| *v = wrap_int(*v, dtype));
    }
}

/// Row-major strides of `shape`.
pub(crate) fn strides_of(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// For each element of `to` (row-major), the index of the element of `from` it repeats; `from`
/// has the same rank with size-1 dimensions where it broadcasts.
pub(crate) fn broadcast_indices(from: &[usize], to: &[usize]) -> Vec<usize> {
    let from_strides = strides_of(from);
    let stride: Vec<usize> = from
        .iter()
        .zip(&from_strides)
        .map(|(&d, &s)| if d == 1 { 0 } else { s })
        .collect();
    let total: usize = to.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut index = vec![0usize; to.len()];
    for _ in 0..total {
        out.push(index.iter().zip(&stride).map(|(i, s)| i * s).sum());
        for d in (0..to.len()).rev() {
            index[d] += 1;
            if index[d] < to[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// `acc [m, n] += a [m, k] @ b [k, n]`, in f32, summing over k in order for every element.
///
/// The loop order (i, k, j) keeps the inner loop contiguous in both `b` and `acc`, so it
/// vectorises without reassociating any sum.
pub(crate) fn dot(a: &[f32], b: &[f32], acc: &mut [f32], m: usize, k: usize, n: usize) {
    const ROWS: usize = 4;
    let mut i = 0;
    while i + ROWS <= m {
        let (c0, rest) = acc[i * n..(i + ROWS) * n].split_at_mut(n);
        let (c1, rest) = rest.split_at_mut(n);
        let (c2, c3) = rest.split_at_mut(n);
        for kk in 0..k {
            let brow = &b[kk * n..(kk + 1) * n];
            let (x0, x1, x2, x3) = (
                a[i * k + kk],
                a[(i + 1) * k + kk],
                a[(i + 2) * k + kk],
                a[(i + 3) * k + kk],
            );
            for j in 0..n {
                let bj = brow[j];
                c0[j] += x0 * bj;
                c1[j] += x1 * bj;
                c2[j] += x2 * bj;
                c3[j] += x3 * bj;
            }
        }
        i += ROWS;
    }
    for i in i..m {
        let c = &mut acc[i * n..(i + 1) * n];
        for kk in 0..k {
            let x = a[i * k + kk];
            let brow = &b[kk * n..(kk + 1) * n];
            for (cj, bj) in c.iter_mut().zip(brow) {
                *cj += x * bj;
            }
        }
    }
}

/// Splits `shape` around `axis` into (outer, len, inner) for reductions.
pub(crate) fn around_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape[..axis].iter().product();
    let inner = shape[axis + 1..].iter().product();
    (outer, shape[axis], inner)
}
