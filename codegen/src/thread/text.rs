//! The thread program's text form, the `thread` stage's dump: one instruction a line, results
//! first, the op named after its PTX instruction, operands, then ` : ` and the result types.

use std::fmt::{self, Write};

use super::ir::{
    Block, Cast, Constant, FloatCmp, FloatOp, Inst, IntCmp, IntOp, Math, Op, Program, Reg,
    ShuffleMode, Special, WgmmaA, WgmmaDesc, grid_control_ptx,
};

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut params: Vec<String> = self
            .params
            .iter()
            .map(|p| format!("{}: {} {}", reg(p.reg), self.ty(p.reg).name(), p.name))
            .collect();
        params.extend((0..self.tensor_maps.len()).map(|i| format!("map{i}: tensormap")));
        writeln!(
            f,
            "thread @{}({}) threads {} shared {} {{",
            self.name,
            params.join(", "),
            self.threads_per_block,
            self.shared_bytes
        )?;
        let mut out = String::new();
        self.block(&self.body, 1, &mut out);
        f.write_str(&out)?;
        writeln!(f, "}}")
    }
}

fn reg(r: Reg) -> String {
    format!("%{}", r.0)
}

fn regs(rs: &[Reg]) -> String {
    rs.iter().map(|&r| reg(r)).collect::<Vec<_>>().join(", ")
}

/// `%base+offset`, the offset in the descriptor's 16-byte units.
fn descriptor(desc: &WgmmaDesc) -> String {
    match desc.offset {
        0 => reg(desc.base),
        offset => format!("{}+{offset}", reg(desc.base)),
    }
}

impl Program {
    fn block(&self, block: &Block, indent: usize, out: &mut String) {
        for inst in &block.insts {
            self.inst(inst, indent, out);
        }
    }

    fn inst(&self, inst: &Inst, indent: usize, out: &mut String) {
        let pad = "  ".repeat(indent);
        let mut text = String::new();
        if !inst.results.is_empty() {
            let _ = write!(text, "{} = ", regs(&inst.results));
        }
        text.push_str(&op_text(&inst.op));
        if !inst.results.is_empty() {
            let types: Vec<&str> = inst.results.iter().map(|&r| self.ty(r).name()).collect();
            let _ = write!(text, " : {}", types.join(", "));
        }
        match &inst.op {
            Op::For { body, .. } => {
                let _ = writeln!(out, "{pad}{text} {{");
                self.block(body, indent + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
            Op::If {
                then_block,
                else_block,
                ..
            } => {
                let _ = writeln!(out, "{pad}{text} {{");
                self.block(then_block, indent + 1, out);
                let _ = writeln!(out, "{pad}}} else {{");
                self.block(else_block, indent + 1, out);
                let _ = writeln!(out, "{pad}}}");
            }
            _ => {
                let _ = writeln!(out, "{pad}{text}");
            }
        }
    }
}

fn op_text(op: &Op) -> String {
    match op {
        Op::Const(Constant::Int(v)) => format!("const {v}"),
        Op::Const(Constant::Float(v)) => format!("const {v:?}"),
        Op::Special(s) => match s {
            Special::Tid => "sreg tid.x".to_string(),
            Special::TidAgain => "sreg tid.x again".to_string(),
            Special::Ctaid(axis) => format!("sreg ctaid.{}", axis_name(*axis)),
            Special::Nctaid(axis) => format!("sreg nctaid.{}", axis_name(*axis)),
        },
        Op::Int(op, a, b) => format!("{} {}, {}", int_op_name(*op), reg(*a), reg(*b)),
        Op::IntAbs(a) => format!("abs.int {}", reg(*a)),
        Op::Float(op, a, b) => format!("{} {}, {}", float_op_name(*op), reg(*a), reg(*b)),
        Op::Math(m, a) => format!("{} {}", math_name(*m), reg(*a)),
        Op::IntCmp(c, a, b) => format!("setp.{} {}, {}", int_cmp_name(*c), reg(*a), reg(*b)),
        Op::FloatCmp(c, a, b) => {
            format!("setp.{} {}, {}", float_cmp_name(*c), reg(*a), reg(*b))
        }
        Op::Select {
            cond,
            if_true,
            if_false,
        } => format!("selp {}", regs(&[*if_true, *if_false, *cond])),
        Op::Fma { a, b, c } => format!("fma.rn {}", regs(&[*a, *b, *c])),
        Op::Cast(c, a) => format!("{} {}", cast_name(*c), reg(*a)),
        Op::PtrAdd { ptr, offset, elem } => {
            format!("ptradd {}, {} x {}", reg(*ptr), reg(*offset), elem.bytes())
        }
        Op::SharedAddress { offset } => format!("shared_address {offset}"),
        Op::Load { ptr, pred, other } => {
            let mut s = format!("ld {}", reg(*ptr));
            if let Some(p) = pred {
                let _ = write!(s, " if {}", reg(*p));
                if let Some(o) = other {
                    let _ = write!(s, " else {}", reg(*o));
                }
            }
            s
        }
        Op::Store { ptr, value, pred } => {
            let mut s = format!("st {}, {}", reg(*ptr), reg(*value));
            if let Some(p) = pred {
                let _ = write!(s, " if {}", reg(*p));
            }
            s
        }
        Op::AtomicAdd { ptr, values, pred } => {
            let mut s = match values[..] {
                [value] => format!("red.add.f32 {}, {}", reg(*ptr), reg(value)),
                _ => format!(
                    "red.add.v{}.f32 {}, {{{}}}",
                    values.len(),
                    reg(*ptr),
                    regs(values)
                ),
            };
            if let Some(p) = pred {
                let _ = write!(s, " if {}", reg(*p));
            }
            s
        }
        Op::StoreVector { ptr, values, pred } => {
            let mut s = format!("st.v{} {}, {{{}}}", values.len(), reg(*ptr), regs(values));
            if let Some(p) = pred {
                let _ = write!(s, " if {}", reg(*p));
            }
            s
        }
        Op::LoadVector { ptr, pred } => {
            let mut s = format!("ld.v {}", reg(*ptr));
            if let Some(p) = pred {
                let _ = write!(s, " if {}", reg(*p));
            }
            s
        }
        Op::CpAsync {
            dst,
            src,
            src_bytes,
        } => format!(
            "cp.async.cg.shared.global {}, {}, 16, {}",
            reg(*dst),
            reg(*src),
            reg(*src_bytes)
        ),
        Op::CpAsyncCommit => "cp.async.commit_group".to_string(),
        Op::CpAsyncWait { pending } => format!("cp.async.wait_group {pending}"),
        Op::Barrier => "bar.sync 0".to_string(),
        Op::NamedBarrier {
            id,
            threads,
            wait,
            pred,
        } => {
            let kind = if *wait { "sync" } else { "arrive" };
            let bar = format!("bar.{kind} {}, {threads}", reg(*id));
            match pred {
                Some(pred) => format!("{bar} if {}", reg(*pred)),
                None => bar,
            }
        }
        Op::Shuffle { mode, value, lane } => format!(
            "shfl.sync.{} {}, {}",
            match mode {
                ShuffleMode::Bfly => "bfly",
                ShuffleMode::Idx => "idx",
            },
            reg(*value),
            reg(*lane)
        ),
        Op::For {
            lower,
            upper,
            step,
            init,
            iv,
            params,
            ..
        } => {
            let carried: Vec<String> = params
                .iter()
                .zip(init)
                .map(|(&p, &i)| format!("{} = {}", reg(p), reg(i)))
                .collect();
            format!(
                "for {} = {} to {} step {} carry ({})",
                reg(*iv),
                reg(*lower),
                reg(*upper),
                reg(*step),
                carried.join(", ")
            )
        }
        Op::If { cond, .. } => format!("if {}", reg(*cond)),
        Op::Yield(values) => format!("yield {}", regs(values)),
        Op::Pack { lo, hi } => format!("mov.b32 {{{}, {}}}", reg(*lo), reg(*hi)),
        Op::PackRounded { lo, hi } => format!("cvt.rn.x2.f32 {{{}, {}}}", reg(*lo), reg(*hi)),
        Op::Ldmatrix { ptr, count, trans } => format!(
            "ldmatrix.x{count}{} {}",
            if *trans { ".trans" } else { "" },
            reg(*ptr)
        ),
        Op::Mma { a, b, c } => format!(
            "mma.m16n8k16 {{{}}}, {{{}}}, {{{}}}",
            regs(a),
            regs(b),
            regs(c)
        ),
        Op::FenceProxyAsync => "fence.proxy.async.shared::cta".to_string(),
        Op::WgmmaFence => "wgmma.fence".to_string(),
        Op::Wgmma {
            steps,
            trans_b,
            acc,
            accumulate,
            elem,
        } => {
            let steps: Vec<String> = steps
                .iter()
                .map(|step| {
                    let a = match &step.a {
                        WgmmaA::Descriptor { desc, trans } => {
                            format!("{}{}", descriptor(desc), if *trans { ".trans" } else { "" })
                        }
                        WgmmaA::Registers(a) => format!("{{{}}}", regs(a)),
                    };
                    let b = format!(
                        "{}{}",
                        descriptor(&step.b),
                        if *trans_b { ".trans" } else { "" }
                    );
                    format!("{a} x {b}")
                })
                .collect();
            format!(
                "wgmma.m64n{}k16.{} {{{}}} {} {}",
                2 * acc.len(),
                elem.name(),
                regs(acc),
                if *accumulate { "+=" } else { "=" },
                steps.join(" + ")
            )
        }
        Op::WgmmaCommit => "wgmma.commit_group".to_string(),
        Op::KeepLive(values) => format!("keep_live {}", regs(values)),
        Op::WgmmaWait { pending, values } => {
            format!("wgmma.wait_group {pending} {}", regs(values))
        }
        Op::MbarrierInit { bar, count, pred } => {
            format!("mbarrier.init {}, {count} if {}", reg(*bar), reg(*pred))
        }
        Op::FenceMbarrierInit => "fence.mbarrier_init".to_string(),
        Op::AtomicArrive { ptr, pred } => {
            format!("atom.acq_rel.gpu.add [{}], 1 if {}", reg(*ptr), reg(*pred))
        }
        Op::FenceGpu => "fence.acq_rel.gpu".to_string(),
        Op::GridControl(control) => grid_control_ptx(*control).to_string(),
        Op::SetMaxNreg { increase, regs } => {
            format!(
                "setmaxnreg.{} {regs}",
                if *increase { "inc" } else { "dec" }
            )
        }
        Op::MbarrierArriveExpectTx { bar, bytes, pred } => format!(
            "mbarrier.arrive.expect_tx {}, {bytes} if {}",
            reg(*bar),
            reg(*pred)
        ),
        Op::MbarrierArrive { bar } => format!("mbarrier.arrive {}", reg(*bar)),
        Op::MbarrierWait { bar, parity, warps } => {
            let wait = format!("mbarrier.wait.parity {}, {}", reg(*bar), reg(*parity));
            match warps {
                Some(warps) => format!("{wait} in warps where {}", reg(*warps)),
                None => wait,
            }
        }
        Op::MbarrierInval { bar, pred } => {
            format!("mbarrier.inval {} if {}", reg(*bar), reg(*pred))
        }
        Op::TmaLoad { copies, bar, warps } => format!(
            "cp.async.bulk.tensor {}, {} by one lane of warps where {}",
            copies
                .iter()
                .map(|c| format!("{}, map{} {{{}}}", reg(c.dst), c.map, regs(&c.coords)))
                .collect::<Vec<_>>()
                .join("; "),
            reg(*bar),
            reg(*warps)
        ),
        Op::TmaStore {
            src,
            map,
            coords,
            warps,
            add,
        } => format!(
            "cp{}.async.bulk.tensor map{map} {{{}}}, {} by one lane of warps where {}",
            if *add { ".reduce.add" } else { "" },
            regs(coords),
            reg(*src),
            reg(*warps)
        ),
        Op::BulkWaitRead => "cp.async.bulk.wait_group.read 0".to_string(),
    }
}

fn axis_name(axis: u8) -> &'static str {
    ["x", "y", "z"][axis as usize % 3]
}

fn int_op_name(op: IntOp) -> &'static str {
    match op {
        IntOp::Add => "add",
        IntOp::Sub => "sub",
        IntOp::Mul => "mul.lo",
        IntOp::SDiv => "div.s",
        IntOp::SRem => "rem.s",
        IntOp::SMax => "max.s",
        IntOp::SMin => "min.s",
        IntOp::And => "and",
        IntOp::Or => "or",
        IntOp::Xor => "xor",
        IntOp::Shl => "shl",
        IntOp::AShr => "shr.s",
        IntOp::LShr => "shr.u",
    }
}

fn float_op_name(op: FloatOp) -> &'static str {
    match op {
        FloatOp::Add => "add.rn",
        FloatOp::Sub => "sub.rn",
        FloatOp::Mul => "mul.rn",
        FloatOp::Div => "div.rn",
        FloatOp::Max => "max",
        FloatOp::Min => "min",
    }
}

fn math_name(m: Math) -> &'static str {
    match m {
        Math::Neg => "neg",
        Math::Abs => "abs",
        Math::Sqrt => "sqrt.rn",
        Math::Ex2Approx => "ex2.approx.ftz",
        Math::Lg2Approx => "lg2.approx.ftz",
        Math::TanhApprox => "tanh.approx",
    }
}

fn int_cmp_name(c: IntCmp) -> &'static str {
    match c {
        IntCmp::Eq => "eq",
        IntCmp::Ne => "ne",
        IntCmp::Slt => "lt.s",
        IntCmp::Sle => "le.s",
        IntCmp::Sgt => "gt.s",
        IntCmp::Sge => "ge.s",
        IntCmp::Ult => "lt.u",
        IntCmp::Ule => "le.u",
        IntCmp::Ugt => "gt.u",
        IntCmp::Uge => "ge.u",
    }
}

fn float_cmp_name(c: FloatCmp) -> &'static str {
    match c {
        FloatCmp::Olt => "lt",
        FloatCmp::Ole => "le",
        FloatCmp::Ogt => "gt",
        FloatCmp::Oge => "ge",
        FloatCmp::Oeq => "eq",
        FloatCmp::Une => "neu",
    }
}

fn cast_name(c: Cast) -> &'static str {
    match c {
        Cast::FpExt => "cvt.fpext",
        Cast::FpTrunc => "cvt.rn",
        Cast::FpToSiSat => "cvt.rzi.sat",
        Cast::SiToFp => "cvt.rn.s",
        Cast::UiToFp => "cvt.rn.u",
        Cast::ZExt => "cvt.zext",
        Cast::SExt => "cvt.sext",
        Cast::Trunc => "cvt.trunc",
        Cast::PtrToInt => "mov.addr",
    }
}
