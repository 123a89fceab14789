//! The text form of the IR: what golden tests compare and what `kiln ir` prints.
//!
//! One instruction a line, results first, then the op and its operands, then ` : ` and the result
//! types. A value prints as `%N`, or `%name.N` when the DSL bound it to a variable.

use std::fmt::{self, Write};

use crate::ir::{Constant, Inst, Kernel, Op, Region, Value};

struct Printer<'a> {
    kernel: &'a Kernel,
    out: String,
}

impl Printer<'_> {
    fn value(&self, v: Value) -> String {
        match &self.kernel.values[v.index()].name {
            Some(name) => format!("%{name}.{}", v.0),
            None => format!("%{}", v.0),
        }
    }

    fn list(&self, values: &[Value]) -> String {
        values
            .iter()
            .map(|&v| self.value(v))
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn line(&mut self, indent: usize, text: &str) {
        for _ in 0..indent {
            self.out.push_str("  ");
        }
        self.out.push_str(text);
        self.out.push('\n');
    }

    fn region(&mut self, region: &Region, indent: usize) {
        for inst in &region.insts {
            self.inst(inst, indent);
        }
    }

    fn inst(&mut self, inst: &Inst, indent: usize) {
        let mut text = String::new();
        if !inst.results.is_empty() {
            let _ = write!(text, "{} = ", self.list(&inst.results));
        }
        text.push_str(inst.op.name());
        let v = |p: &Self, x: &Value| p.value(*x);
        let operands = match &inst.op {
            Op::Constant(c) => match c {
                Constant::Int(i) => format!(" {i}"),
                Constant::Float(f) => format!(" {f:?}"),
                Constant::Bool(b) => format!(" {b}"),
            },
            Op::ProgramId { axis } | Op::NumPrograms { axis } => format!(" {axis}"),
            Op::Arange { start, end } => format!(" {start}, {end}"),
            Op::Splat { value }
            | Op::Broadcast { value }
            | Op::Trans { value }
            | Op::Cast { value }
            | Op::Unary { value, .. } => format!(" {}", v(self, value)),
            Op::ExpandDims { value, axis } | Op::Reduce { value, axis, .. } => {
                format!(" {}, axis {axis}", v(self, value))
            }
            Op::Binary { lhs, rhs, .. } | Op::Compare { lhs, rhs, .. } => {
                format!(" {}, {}", v(self, lhs), v(self, rhs))
            }
            Op::Select {
                cond,
                if_true,
                if_false,
            } => format!(" {}", self.list(&[*cond, *if_true, *if_false])),
            Op::Dot { lhs, rhs, acc } => format!(" {}", self.list(&[*lhs, *rhs, *acc])),
            Op::Fma { a, b, c } => format!(" {}", self.list(&[*a, *b, *c])),
            Op::AddPtr { ptr, offset } => format!(" {}", self.list(&[*ptr, *offset])),
            Op::Load { ptr, mask, other } => {
                let mut s = format!(" {}", v(self, ptr));
                if let Some(m) = mask {
                    let _ = write!(s, ", mask {}", v(self, m));
                }
                if let Some(o) = other {
                    let _ = write!(s, ", other {}", v(self, o));
                }
                s
            }
            Op::Store { ptr, value, mask } | Op::AtomicAdd { ptr, value, mask } => {
                let mut s = format!(" {}", self.list(&[*ptr, *value]));
                if let Some(m) = mask {
                    let _ = write!(s, ", mask {}", v(self, m));
                }
                s
            }
            Op::MakeBlockPtr {
                base,
                shape,
                strides,
                offsets,
                order,
            } => format!(
                " {}, shape [{}], strides [{}], offsets [{}], order {order:?}",
                v(self, base),
                self.list(shape),
                self.list(strides),
                self.list(offsets)
            ),
            Op::Advance { ptr, offsets } => {
                format!(" {}, [{}]", v(self, ptr), self.list(offsets))
            }
            Op::LoadBlock {
                ptr,
                boundary_check,
            } => format!(" {}, check {boundary_check:?}", v(self, ptr)),
            Op::StoreBlock {
                ptr,
                value,
                boundary_check,
            }
            | Op::AtomicAddBlock {
                ptr,
                value,
                boundary_check,
            } => format!(" {}, check {boundary_check:?}", self.list(&[*ptr, *value])),
            Op::Yield { values } if values.is_empty() => String::new(),
            Op::GridControl(_) => String::new(),
            Op::AtomicArrive { ptr } => format!(" {}", v(self, ptr)),
            Op::Yield { values } => format!(" {}", self.list(values)),
            Op::For {
                lower,
                upper,
                step,
                init,
                body,
            } => {
                let carried: Vec<String> = body.params[1..]
                    .iter()
                    .zip(init)
                    .map(|(p, i)| format!("{} = {}", self.value(*p), self.value(*i)))
                    .collect();
                format!(
                    " {} = {} to {} step {} carry ({})",
                    self.value(body.params[0]),
                    v(self, lower),
                    v(self, upper),
                    v(self, step),
                    carried.join(", ")
                )
            }
            Op::If { cond, .. } => format!(" {}", v(self, cond)),
        };
        text.push_str(&operands);
        if !inst.results.is_empty() {
            let types: Vec<String> = inst
                .results
                .iter()
                .map(|&r| self.kernel.ty(r).to_string())
                .collect();
            let _ = write!(text, " : {}", types.join(", "));
        }
        match &inst.op {
            Op::For { body, .. } => {
                text.push_str(" {");
                self.line(indent, &text);
                self.region(body, indent + 1);
                self.line(indent, "}");
            }
            Op::If {
                then_region,
                else_region,
                ..
            } => {
                text.push_str(" {");
                self.line(indent, &text);
                self.region(then_region, indent + 1);
                self.line(indent, "} else {");
                self.region(else_region, indent + 1);
                self.line(indent, "}");
            }
            _ => self.line(indent, &text),
        }
    }
}

impl fmt::Display for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut printer = Printer {
            kernel: self,
            out: String::new(),
        };
        let args: Vec<String> = self
            .args
            .iter()
            .map(|&a| format!("{}: {}", printer.value(a), self.ty(a)))
            .collect();
        let header = format!(
            "kernel @{}<{}>({}) {{",
            self.name(),
            self.spec,
            args.join(", ")
        );
        printer.line(0, &header);
        printer.region(&self.body, 1);
        printer.line(0, "}");
        f.write_str(&printer.out)
    }
}
