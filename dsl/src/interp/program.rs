//! One program's execution: walks the IR once per instruction, each computing a whole tile.

use super::KernelArg;
use super::memory::HostBuffer;
use super::tile::{
    Addr, BlockPtr, Data, around_axis, broadcast_indices, dot, round_to, strides_of, wrap_all,
};
use crate::error::{Error, Result};
use crate::ir::{BinaryOp, CmpOp, Constant, Inst, Kernel, Op, ReduceOp, Region, UnaryOp, Value};
use crate::passes::{self, round_float, wrap_int};
use crate::types::DType;

use super::Grid;

/// What every program of a launch shares.
pub(crate) struct Launch<'a> {
    kernel: &'a Kernel,
    grid: Grid,
    args: Vec<KernelArg<'a>>,
    /// The buffers of pointer arguments, indexed by [`Addr::buffer`], with their argument names.
    buffers: Vec<(&'a HostBuffer, &'static str)>,
}

impl<'a> Launch<'a> {
    pub fn new(kernel: &'a Kernel, grid: Grid, args: Vec<KernelArg<'a>>) -> Launch<'a> {
        let buffers = args
            .iter()
            .zip(kernel.signature.args)
            .filter_map(|(arg, decl)| match arg {
                KernelArg::Buffer(b) => Some((*b, decl.name)),
                _ => None,
            })
            .collect();
        Launch {
            kernel,
            grid,
            args,
            buffers,
        }
    }

    pub fn run_program(&self, linear: usize) -> Result<()> {
        let [gx, gy, _] = self.grid.0.map(|n| n as usize);
        let pid = [
            (linear % gx) as u32,
            ((linear / gx) % gy) as u32,
            (linear / (gx * gy)) as u32,
        ];
        let mut program = Program {
            launch: self,
            pid,
            env: vec![None; self.kernel.values.len()],
        };
        let mut buffer = 0u32;
        for (arg, &value) in self.args.iter().zip(&self.kernel.args) {
            let data = match *arg {
                KernelArg::Buffer(_) => {
                    buffer += 1;
                    Data::Ptr(vec![Addr {
                        buffer: buffer - 1,
                        offset: 0,
                    }])
                }
                KernelArg::I32(v) => Data::Int(vec![v as i64]),
                KernelArg::I64(v) => Data::Int(vec![v]),
                KernelArg::F32(v) => Data::Float(vec![v]),
            };
            program.env[value.index()] = Some(data);
        }
        program.region(&self.kernel.body).map(|_| ())
    }
}

struct Program<'l, 'a> {
    launch: &'l Launch<'a>,
    pid: [u32; 3],
    env: Vec<Option<Data>>,
}

impl Program<'_, '_> {
    fn kernel(&self) -> &Kernel {
        self.launch.kernel
    }

    fn get(&self, v: Value) -> &Data {
        self.env[v.index()]
            .as_ref()
            .expect("SSA: a value is defined before it is used")
    }

    fn floats(&self, v: Value) -> &[f32] {
        match self.get(v) {
            Data::Float(x) => x,
            other => unreachable!("the builder typed this value as a float, found {other:?}"),
        }
    }

    fn ints(&self, v: Value) -> &[i64] {
        match self.get(v) {
            Data::Int(x) => x,
            other => unreachable!("the builder typed this value as an integer, found {other:?}"),
        }
    }

    fn bools(&self, v: Value) -> &[bool] {
        match self.get(v) {
            Data::Bool(x) => x,
            other => unreachable!("the builder typed this value as a bool, found {other:?}"),
        }
    }

    fn addrs(&self, v: Value) -> &[Addr] {
        match self.get(v) {
            Data::Ptr(x) => x,
            other => unreachable!("the builder typed this value as pointers, found {other:?}"),
        }
    }

    fn scalar_int(&self, v: Value) -> i64 {
        self.ints(v)[0]
    }

    fn shape(&self, v: Value) -> Vec<usize> {
        self.kernel().ty(v).shape().to_vec()
    }

    fn fault(&self, inst: &Inst, message: String) -> Error {
        Error::Runtime {
            loc: inst.loc,
            op: inst.op.name(),
            program: self.pid,
            message,
        }
    }

    /// Runs a region's instructions; returns the values its `yield` names.
    fn region(&mut self, region: &Region) -> Result<Vec<Data>> {
        for inst in &region.insts {
            if let Op::Yield { values } = &inst.op {
                return Ok(values.iter().map(|&v| self.get(v).clone()).collect());
            }
            let results = self.inst(inst)?;
            for (&r, data) in inst.results.iter().zip(results) {
                self.env[r.index()] = Some(data);
            }
        }
        Ok(Vec::new())
    }

    fn inst(&mut self, inst: &Inst) -> Result<Vec<Data>> {
        let one = |d: Data| Ok(vec![d]);
        let result_dtype = || {
            inst.results
                .first()
                .and_then(|&r| self.kernel().ty(r).dtype())
        };
        match &inst.op {
            Op::Constant(c) => {
                let dtype = result_dtype().expect("constants are numbers");
                one(match *c {
                    Constant::Int(v) if dtype.is_float() => {
                        Data::Float(vec![round_float(v as f64, dtype) as f32])
                    }
                    Constant::Int(v) => Data::Int(vec![wrap_int(v, dtype)]),
                    Constant::Float(v) => Data::Float(vec![round_float(v, dtype) as f32]),
                    Constant::Bool(v) => Data::Bool(vec![v]),
                })
            }
            Op::ProgramId { axis } => one(Data::Int(vec![self.pid[*axis as usize] as i64])),
            Op::NumPrograms { axis } => {
                one(Data::Int(vec![self.launch.grid.0[*axis as usize] as i64]))
            }
            Op::Arange { start, end } => one(Data::Int((*start..*end).collect())),
            Op::Splat { value } => {
                let n: usize = self.shape(inst.results[0]).iter().product();
                one(self.get(*value).gather(std::iter::repeat_n(0, n)))
            }
            Op::Broadcast { value } => {
                let indices = broadcast_indices(&self.shape(*value), &self.shape(inst.results[0]));
                one(self.get(*value).gather(indices.into_iter()))
            }
            Op::ExpandDims { value, .. } => one(self.get(*value).clone()),
            Op::Trans { value } => {
                let shape = self.shape(*value);
                let (rows, cols) = (shape[0], shape[1]);
                let indices = (0..cols).flat_map(|c| (0..rows).map(move |r| r * cols + c));
                one(self.get(*value).gather(indices))
            }
            Op::Cast { value } => {
                let to = result_dtype().expect("casts give numbers");
                one(self.cast(*value, to))
            }
            Op::Unary { op, value } => {
                let dtype = result_dtype().expect("unary ops give numbers");
                one(self.unary(*op, *value, dtype))
            }
            Op::Binary { op, lhs, rhs } => {
                let dtype = result_dtype().expect("binary ops give numbers");
                self.binary(inst, *op, *lhs, *rhs, dtype).map(|d| vec![d])
            }
            Op::Compare { op, lhs, rhs } => one(self.compare(*op, *lhs, *rhs)),
            Op::Select {
                cond,
                if_true,
                if_false,
            } => {
                fn pick<T: Copy>(c: &[bool], t: &[T], f: &[T]) -> Vec<T> {
                    c.iter()
                        .zip(t.iter().zip(f))
                        .map(|(&c, (&t, &f))| if c { t } else { f })
                        .collect()
                }
                let c = self.bools(*cond);
                one(match (self.get(*if_true), self.get(*if_false)) {
                    (Data::Float(t), Data::Float(f)) => Data::Float(pick(c, t, f)),
                    (Data::Int(t), Data::Int(f)) => Data::Int(pick(c, t, f)),
                    (Data::Bool(t), Data::Bool(f)) => Data::Bool(pick(c, t, f)),
                    (Data::Ptr(t), Data::Ptr(f)) => Data::Ptr(pick(c, t, f)),
                    _ => unreachable!("the builder unified select's operands"),
                })
            }
            Op::Fma { a, b, c } => one(Data::Float(
                (self.floats(*a).iter().zip(self.floats(*b)))
                    .zip(self.floats(*c))
                    .map(|((&a, &b), &c)| a.mul_add(b, c))
                    .collect(),
            )),
            Op::Reduce { op, value, axis } => {
                let dtype = result_dtype().expect("reductions give numbers");
                one(self.reduce(*op, *value, *axis, dtype))
            }
            Op::Dot { lhs, rhs, acc } => {
                let (sa, sb) = (self.shape(*lhs), self.shape(*rhs));
                let mut out = self.floats(*acc).to_vec();
                dot(
                    self.floats(*lhs),
                    self.floats(*rhs),
                    &mut out,
                    sa[0],
                    sa[1],
                    sb[1],
                );
                one(Data::Float(out))
            }
            Op::AddPtr { ptr, offset } => one(Data::Ptr(
                self.addrs(*ptr)
                    .iter()
                    .zip(self.ints(*offset))
                    .map(|(a, &o)| Addr {
                        buffer: a.buffer,
                        offset: a.offset.wrapping_add(o),
                    })
                    .collect(),
            )),
            Op::Load { ptr, mask, other } => self.load(inst, *ptr, *mask, *other).map(|d| vec![d]),
            Op::Store { ptr, value, mask } => {
                self.store(inst, *ptr, *value, *mask, false)?;
                Ok(Vec::new())
            }
            Op::AtomicAdd { ptr, value, mask } => {
                self.store(inst, *ptr, *value, *mask, true)?;
                Ok(Vec::new())
            }
            Op::AtomicArrive { ptr } => {
                let (buffer, index) = self.locate(inst, self.addrs(*ptr)[0])?;
                one(Data::Int(vec![buffer.arrive_i32(index) as i64]))
            }
            Op::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                order,
            } => {
                let ints =
                    |vs: &[Value]| -> Vec<i64> { vs.iter().map(|&v| self.scalar_int(v)).collect() };
                let (shape, strides, offsets) = (ints(shape), ints(strides), ints(offsets));
                // The leading dimensions the block does not cover are indexed: folded into the base.
                let lead = shape.len() - order.len();
                let mut base = self.addrs(*base)[0];
                for d in 0..lead {
                    if !(0..shape[d]).contains(&offsets[d]) {
                        return Err(self.fault(
                            inst,
                            format!(
                                "offset {} indexes dimension {d} of an array of shape {shape:?} \
                                 outside it",
                                offsets[d]
                            ),
                        ));
                    }
                    // i64 arithmetic wraps, as the GPU's does.
                    base.offset = base
                        .offset
                        .wrapping_add(offsets[d].wrapping_mul(strides[d]));
                }
                one(Data::Block(Box::new(BlockPtr {
                    base,
                    shape: shape[lead..].to_vec(),
                    strides: strides[lead..].to_vec(),
                    offsets: offsets[lead..].to_vec(),
                })))
            }
            Op::Advance { ptr, offsets } => {
                let Data::Block(block) = self.get(*ptr) else {
                    unreachable!("advance takes a block pointer")
                };
                let mut block = block.clone();
                for (o, &d) in block.offsets.iter_mut().zip(offsets) {
                    *o = o.wrapping_add(self.scalar_int(d));
                }
                one(Data::Block(block))
            }
            Op::LoadBlock {
                ptr,
                boundary_check,
            } => {
                let dtype = result_dtype().expect("loads give numbers");
                let shape = self.shape(inst.results[0]);
                self.load_block(inst, *ptr, &shape, boundary_check, dtype)
                    .map(|d| vec![d])
            }
            Op::StoreBlock {
                ptr,
                value,
                boundary_check,
            } => {
                let shape = self.shape(*value);
                self.store_block(inst, *ptr, *value, &shape, boundary_check, false)?;
                Ok(Vec::new())
            }
            Op::AtomicAddBlock {
                ptr,
                value,
                boundary_check,
            } => {
                let shape = self.shape(*value);
                self.store_block(inst, *ptr, *value, &shape, boundary_check, true)?;
                Ok(Vec::new())
            }
            Op::For {
                lower,
                upper,
                step,
                init,
                body,
            } => {
                let (lo, hi, st) = (
                    self.scalar_int(*lower),
                    self.scalar_int(*upper),
                    self.scalar_int(*step),
                );
                if st <= 0 {
                    return Err(
                        self.fault(inst, format!("the loop step must be positive, got {st}"))
                    );
                }
                let dtype = self.kernel().dtype(*lower);
                let mut carried: Vec<Data> = init.iter().map(|&v| self.get(v).clone()).collect();
                let mut iv = lo;
                while iv < hi {
                    self.env[body.params[0].index()] = Some(Data::Int(vec![iv]));
                    for (&param, data) in body.params[1..].iter().zip(carried) {
                        self.env[param.index()] = Some(data);
                    }
                    carried = self.region(body)?;
                    iv = wrap_int(iv.wrapping_add(st), dtype);
                    if iv < lo {
                        break; // the induction variable wrapped around its type
                    }
                }
                Ok(carried)
            }
            Op::If {
                cond,
                then_region,
                else_region,
            } => {
                if self.bools(*cond)[0] {
                    self.region(then_region)
                } else {
                    self.region(else_region)
                }
            }
            Op::Yield { .. } => unreachable!("handled by the region walk"),
            // The interpreter runs one launch at a time: the kernel before has ended.
            Op::GridControl(_) => Ok(Vec::new()),
        }
    }

    fn cast(&self, value: Value, to: DType) -> Data {
        match self.get(value) {
            Data::Float(x) if to.is_float() => {
                let mut out = x.clone();
                round_to(&mut out, to);
                Data::Float(out)
            }
            Data::Float(x) if to == DType::I1 => Data::Bool(x.iter().map(|&v| v != 0.0).collect()),
            Data::Float(x) => Data::Int(
                x.iter()
                    .map(|&v| {
                        if to == DType::I32 {
                            v as i32 as i64
                        } else {
                            v as i64
                        }
                    })
                    .collect(),
            ),
            Data::Int(x) if to.is_float() => {
                let mut out: Vec<f32> = x.iter().map(|&v| v as f32).collect();
                round_to(&mut out, to);
                Data::Float(out)
            }
            Data::Int(x) if to == DType::I1 => Data::Bool(x.iter().map(|&v| v != 0).collect()),
            Data::Int(x) => {
                let mut out = x.clone();
                wrap_all(&mut out, to);
                Data::Int(out)
            }
            Data::Bool(x) if to.is_float() => {
                Data::Float(x.iter().map(|&v| v as u8 as f32).collect())
            }
            Data::Bool(x) => Data::Int(x.iter().map(|&v| v as i64).collect()),
            other => unreachable!("casts take numbers, found {other:?}"),
        }
    }

    fn unary(&self, op: UnaryOp, value: Value, dtype: DType) -> Data {
        match self.get(value) {
            Data::Float(x) => {
                let f: fn(f32) -> f32 = match op {
                    UnaryOp::Neg => |v| -v,
                    UnaryOp::Exp => f32::exp,
                    UnaryOp::Exp2 => f32::exp2,
                    UnaryOp::Log => f32::ln,
                    UnaryOp::Log2 => f32::log2,
                    UnaryOp::Tanh => f32::tanh,
                    UnaryOp::Sqrt => f32::sqrt,
                    UnaryOp::Rsqrt => |v| 1.0 / v.sqrt(),
                    UnaryOp::Abs => f32::abs,
                    UnaryOp::Not => unreachable!("the builder refuses `!` on floats"),
                };
                let mut out: Vec<f32> = x.iter().map(|&v| f(v)).collect();
                round_to(&mut out, dtype);
                Data::Float(out)
            }
            Data::Int(x) => {
                let mut out: Vec<i64> = x
                    .iter()
                    .map(|&v| match op {
                        UnaryOp::Neg => v.wrapping_neg(),
                        UnaryOp::Not => !v,
                        UnaryOp::Abs => v.wrapping_abs(),
                        _ => unreachable!("the builder refuses math functions on integers"),
                    })
                    .collect();
                wrap_all(&mut out, dtype);
                Data::Int(out)
            }
            Data::Bool(x) => Data::Bool(x.iter().map(|&v| !v).collect()),
            other => unreachable!("unary ops take numbers, found {other:?}"),
        }
    }

    fn binary(
        &self,
        inst: &Inst,
        op: BinaryOp,
        lhs: Value,
        rhs: Value,
        dtype: DType,
    ) -> Result<Data> {
        Ok(match (self.get(lhs), self.get(rhs)) {
            (Data::Float(a), Data::Float(b)) => {
                let f: fn(f32, f32) -> f32 = match op {
                    BinaryOp::Add => |x, y| x + y,
                    BinaryOp::Sub => |x, y| x - y,
                    BinaryOp::Mul => |x, y| x * y,
                    BinaryOp::Div => |x, y| x / y,
                    BinaryOp::Rem => |x, y| x % y,
                    BinaryOp::Max => f32::max,
                    BinaryOp::Min => f32::min,
                    _ => unreachable!("the builder refuses bitwise ops on floats"),
                };
                let mut out: Vec<f32> = a.iter().zip(b).map(|(&x, &y)| f(x, y)).collect();
                round_to(&mut out, dtype);
                Data::Float(out)
            }
            (Data::Int(a), Data::Int(b)) => {
                if matches!(op, BinaryOp::Div | BinaryOp::Rem) && b.contains(&0) {
                    return Err(self.fault(inst, "integer division by zero".to_string()));
                }
                let mut out: Vec<i64> = a
                    .iter()
                    .zip(b)
                    .map(|(&x, &y)| match op {
                        BinaryOp::Add => x.wrapping_add(y),
                        BinaryOp::Sub => x.wrapping_sub(y),
                        BinaryOp::Mul => x.wrapping_mul(y),
                        BinaryOp::Div => x.wrapping_div(y),
                        BinaryOp::Rem => x.wrapping_rem(y),
                        BinaryOp::Max => x.max(y),
                        BinaryOp::Min => x.min(y),
                        BinaryOp::And => x & y,
                        BinaryOp::Or => x | y,
                        BinaryOp::Xor => x ^ y,
                        BinaryOp::Shl => passes::shift(true, x, y, dtype),
                        BinaryOp::Shr => passes::shift(false, x, y, dtype),
                    })
                    .collect();
                wrap_all(&mut out, dtype);
                Data::Int(out)
            }
            (Data::Bool(a), Data::Bool(b)) => Data::Bool(
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| match op {
                        BinaryOp::And | BinaryOp::Min => x & y,
                        BinaryOp::Or | BinaryOp::Max => x | y,
                        BinaryOp::Xor => x ^ y,
                        _ => unreachable!("the builder refuses arithmetic on bools"),
                    })
                    .collect(),
            ),
            _ => unreachable!("the builder unified binary operands"),
        })
    }

    fn compare(&self, op: CmpOp, lhs: Value, rhs: Value) -> Data {
        fn cmp<T: PartialOrd>(op: CmpOp, a: &[T], b: &[T]) -> Vec<bool> {
            a.iter()
                .zip(b)
                .map(|(x, y)| match op {
                    CmpOp::Lt => x < y,
                    CmpOp::Le => x <= y,
                    CmpOp::Gt => x > y,
                    CmpOp::Ge => x >= y,
                    CmpOp::Eq => x == y,
                    CmpOp::Ne => x != y,
                })
                .collect()
        }
        Data::Bool(match (self.get(lhs), self.get(rhs)) {
            (Data::Float(a), Data::Float(b)) => cmp(op, a, b),
            (Data::Int(a), Data::Int(b)) => cmp(op, a, b),
            (Data::Bool(a), Data::Bool(b)) => cmp(op, a, b),
            _ => unreachable!("the builder unified compare operands"),
        })
    }

    fn reduce(&self, op: ReduceOp, value: Value, axis: usize, dtype: DType) -> Data {
        let (outer, len, inner) = around_axis(&self.shape(value), axis);
        let at = move |o: usize, r: usize, i: usize| (o * len + r) * inner + i;
        let positions = move || (0..outer).flat_map(move |o| (0..inner).map(move |i| (o, i)));
        match self.get(value) {
            Data::Float(x) => {
                let (init, f): (f32, fn(f32, f32) -> f32) = match op {
                    ReduceOp::Sum => (0.0, |a, b| a + b),
                    ReduceOp::Max => (f32::NEG_INFINITY, f32::max),
                    ReduceOp::Min => (f32::INFINITY, f32::min),
                };
                let mut out: Vec<f32> = positions()
                    .map(|(o, i)| (0..len).fold(init, |acc, r| f(acc, x[at(o, r, i)])))
                    .collect();
                round_to(&mut out, dtype);
                Data::Float(out)
            }
            Data::Int(x) => {
                let mut out: Vec<i64> = positions()
                    .map(|(o, i)| {
                        let items = (0..len).map(|r| x[at(o, r, i)]);
                        match op {
                            ReduceOp::Sum => items.fold(0i64, i64::wrapping_add),
                            ReduceOp::Max => items.max().unwrap_or(i64::MIN),
                            ReduceOp::Min => items.min().unwrap_or(i64::MAX),
                        }
                    })
                    .collect();
                wrap_all(&mut out, dtype);
                Data::Int(out)
            }
            Data::Bool(x) => Data::Bool(
                positions()
                    .map(|(o, i)| {
                        let mut items = (0..len).map(|r| x[at(o, r, i)]);
                        match op {
                            ReduceOp::Max => items.any(|b| b),
                            _ => items.all(|b| b),
                        }
                    })
                    .collect(),
            ),
            other => unreachable!("reductions take numbers, found {other:?}"),
        }
    }

    /// The buffer and element index of an address, or a fault naming the buffer and the offset.
    fn locate(&self, inst: &Inst, addr: Addr) -> Result<(&HostBuffer, usize)> {
        let (buffer, name) = self.launch.buffers[addr.buffer as usize];
        if addr.offset < 0 || addr.offset as usize >= buffer.len() {
            return Err(self.fault(
                inst,
                format!(
                    "unmasked access to element {} of `{name}`, which has {} elements",
                    addr.offset,
                    buffer.len()
                ),
            ));
        }
        Ok((buffer, addr.offset as usize))
    }

    fn read(&self, inst: &Inst, addr: Addr, dtype: DType, out: &mut Data) -> Result<()> {
        let (buffer, index) = self.locate(inst, addr)?;
        match out {
            Data::Float(v) => v.push(buffer.read_float(index)),
            Data::Int(v) => v.push(buffer.read_int(index)),
            Data::Bool(v) => v.push(buffer.read_int(index) != 0),
            _ => unreachable!("loads give numbers of {dtype}"),
        }
        Ok(())
    }

    fn zero_of(dtype: DType, capacity: usize) -> Data {
        if dtype.is_float() {
            Data::Float(Vec::with_capacity(capacity))
        } else if dtype == DType::I1 {
            Data::Bool(Vec::with_capacity(capacity))
        } else {
            Data::Int(Vec::with_capacity(capacity))
        }
    }

    fn push_zero(out: &mut Data) {
        match out {
            Data::Float(v) => v.push(0.0),
            Data::Int(v) => v.push(0),
            Data::Bool(v) => v.push(false),
            _ => unreachable!("loads give numbers"),
        }
    }

    fn push_from(out: &mut Data, from: &Data, i: usize) {
        match (out, from) {
            (Data::Float(v), Data::Float(f)) => v.push(f[i]),
            (Data::Int(v), Data::Int(f)) => v.push(f[i]),
            (Data::Bool(v), Data::Bool(f)) => v.push(f[i]),
            _ => unreachable!("the builder cast `other` to the pointee"),
        }
    }

    fn load(
        &self,
        inst: &Inst,
        ptr: Value,
        mask: Option<Value>,
        other: Option<Value>,
    ) -> Result<Data> {
        let dtype = self
            .kernel()
            .ty(inst.results[0])
            .dtype()
            .expect("loads give numbers");
        let addrs = self.addrs(ptr);
        let mut out = Self::zero_of(dtype, addrs.len());
        for (i, &addr) in addrs.iter().enumerate() {
            if mask.is_some_and(|m| !self.bools(m)[i]) {
                match other {
                    Some(o) => Self::push_from(&mut out, self.get(o), i),
                    None => Self::push_zero(&mut out),
                }
            } else {
                self.read(inst, addr, dtype, &mut out)?;
            }
        }
        Ok(out)
    }

    /// Writes element `i` of `value` at `addr`, or with `accumulate` (`atomic_add`, f32 only)
    /// adds it there, atomically, since programs run in parallel.
    fn write(
        &self,
        inst: &Inst,
        addr: Addr,
        value: &Data,
        i: usize,
        accumulate: bool,
    ) -> Result<()> {
        let (buffer, index) = self.locate(inst, addr)?;
        match value {
            Data::Float(v) if accumulate => buffer.atomic_add_f32(index, v[i]),
            _ if accumulate => unreachable!("the builder lets `atomic_add` add f32 only"),
            Data::Float(v) => buffer.write_float(index, v[i]),
            Data::Int(v) => buffer.write_int(index, v[i]),
            Data::Bool(v) => buffer.write_int(index, v[i] as i64),
            _ => unreachable!("stores take numbers"),
        }
        Ok(())
    }

    /// A store, or with `accumulate` an `atomic_add`.
    fn store(
        &self,
        inst: &Inst,
        ptr: Value,
        value: Value,
        mask: Option<Value>,
        accumulate: bool,
    ) -> Result<()> {
        let data = self.get(value);
        for (i, &addr) in self.addrs(ptr).iter().enumerate() {
            if mask.is_none_or(|m| self.bools(m)[i]) {
                self.write(inst, addr, data, i, accumulate)?;
            }
        }
        Ok(())
    }

    /// Visits every element of a block: its row-major index in the tile, and its address when it
    /// lies inside the array along every checked axis (`None` where it is padding).
    fn for_each_block_element(
        &self,
        ptr: Value,
        shape: &[usize],
        boundary_check: &[usize],
        mut f: impl FnMut(usize, Option<Addr>) -> Result<()>,
    ) -> Result<()> {
        let Data::Block(block) = self.get(ptr) else {
            unreachable!("block loads take block pointers")
        };
        let total: usize = shape.iter().product();
        let strides = strides_of(shape);
        for linear in 0..total {
            let mut offset = block.base.offset;
            let mut inside = true;
            for (axis, &stride) in strides.iter().enumerate() {
                let coord =
                    block.offsets[axis].wrapping_add(((linear / stride) % shape[axis]) as i64);
                if boundary_check.contains(&axis) && !(0..block.shape[axis]).contains(&coord) {
                    inside = false;
                }
                offset = offset.wrapping_add(coord.wrapping_mul(block.strides[axis]));
            }
            let addr = inside.then_some(Addr {
                buffer: block.base.buffer,
                offset,
            });
            f(linear, addr)?;
        }
        Ok(())
    }

    fn load_block(
        &self,
        inst: &Inst,
        ptr: Value,
        shape: &[usize],
        boundary_check: &[usize],
        dtype: DType,
    ) -> Result<Data> {
        let mut out = Self::zero_of(dtype, shape.iter().product());
        self.for_each_block_element(ptr, shape, boundary_check, |_, addr| match addr {
            Some(addr) => self.read(inst, addr, dtype, &mut out),
            None => {
                Self::push_zero(&mut out);
                Ok(())
            }
        })?;
        Ok(out)
    }

    fn store_block(
        &self,
        inst: &Inst,
        ptr: Value,
        value: Value,
        shape: &[usize],
        boundary_check: &[usize],
        accumulate: bool,
    ) -> Result<()> {
        let data = self.get(value);
        self.for_each_block_element(ptr, shape, boundary_check, |i, addr| match addr {
            Some(addr) => self.write(inst, addr, data, i, accumulate),
            None => Ok(()),
        })
    }
}
