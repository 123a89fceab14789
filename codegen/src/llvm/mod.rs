//! The llir stage: a kernel with layouts -> one LLVM NVVM IR kernel function, verified.
//!
//! The function is what one thread runs. A tile value becomes the registers this thread owns
//! under its layout (`BlockedLayout::register_offsets` says which elements); a scalar becomes one
//! register every thread holds. Elementwise ops apply per register; `arange` computes positions
//! from the thread id; masked loads and stores branch around the access, so a masked-off lane
//! never touches memory. f16 and bf16 arithmetic runs in f32 and rounds back to nearest even
//! after every op, exactly as the interpreter computes (f32 holds every f16/bf16 sum, product and
//! quotient well enough that the double rounding is exact).
//!
//! Ops this stage cannot lower are [`CodegenError::Unsupported`] with the op and its source line.

mod arith;
mod control;
mod memory;

use inkwell::AddressSpace;
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::Module;
use inkwell::targets::TargetMachine;
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{BasicValueEnum, FunctionValue, IntValue};
use kiln_dsl::ir::{Inst, Kernel, Op, Region, Value};
use kiln_dsl::types::{DType, Elem, Type};

use crate::layout::{BlockedLayout, Layout, LayoutAssignment, THREADS_PER_WARP};
use crate::{CodegenError, CompileOptions, Stage};

/// The registers one thread holds of a value, in the layout's register order.
pub(crate) type Regs<'ctx> = Vec<BasicValueEnum<'ctx>>;

/// Global memory: what kernel pointer arguments point into.
const GLOBAL: u16 = 1;

/// Lowers `kernel` with its `layouts` into a new module of `context`, for `machine`'s target, and
/// runs the LLVM verifier on it.
pub fn lower<'ctx>(
    context: &'ctx Context,
    kernel: &Kernel,
    layouts: &LayoutAssignment,
    options: &CompileOptions,
    machine: &TargetMachine,
) -> Result<Module<'ctx>, CodegenError> {
    let module = context.create_module(kernel.name());
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    let mut lowering = Lowering::new(context, &module, kernel, layouts, options)?;
    lowering.region(&kernel.body)?;
    lowering.builder.build_return(None)?;
    module.verify().map_err(|message| {
        CodegenError::llvm(
            Stage::Llir,
            format!("the verifier rejected the module kiln made: {message}"),
        )
    })?;
    Ok(module)
}

/// A thread's view of where a register sits in its tile.
pub(crate) struct Position<'ctx> {
    /// The element's index along each dimension (i32).
    pub coords: Vec<IntValue<'ctx>>,
    /// Whether this thread is the element's owner (false on the extra copies of a tile smaller
    /// than its layout's CTA tile); `None` where every thread owns what it holds.
    pub owner: Option<IntValue<'ctx>>,
}

pub(crate) struct Lowering<'a, 'ctx> {
    pub context: &'ctx Context,
    pub module: &'a Module<'ctx>,
    pub builder: Builder<'ctx>,
    pub function: FunctionValue<'ctx>,
    pub kernel: &'a Kernel,
    layouts: &'a LayoutAssignment,
    /// The registers of every value lowered so far, indexed by [`Value`].
    values: Vec<Option<Regs<'ctx>>>,
    /// `threadIdx.x` (i32).
    pub thread_id: IntValue<'ctx>,
    /// For each blocked layout of the kernel, the first element of this thread's chunk along
    /// each dimension; computed in the entry block so that it dominates every use.
    thread_bases: Vec<(BlockedLayout, Vec<IntValue<'ctx>>)>,
}

impl<'a, 'ctx> Lowering<'a, 'ctx> {
    fn new(
        context: &'ctx Context,
        module: &'a Module<'ctx>,
        kernel: &'a Kernel,
        layouts: &'a LayoutAssignment,
        options: &CompileOptions,
    ) -> Result<Lowering<'a, 'ctx>, CodegenError> {
        let param_types = kernel
            .args
            .iter()
            .map(|&arg| Ok(arg_type(context, kernel.ty(arg)).into()))
            .collect::<Result<Vec<_>, CodegenError>>()?;
        let function = module.add_function(
            kernel.name(),
            context.void_type().fn_type(&param_types, false),
            None,
        );
        for (param, decl) in function.get_param_iter().zip(kernel.signature.args) {
            param.set_name(decl.name);
        }
        annotate_kernel(context, module, function, options.threads_per_block())?;
        let builder = context.create_builder();
        builder.position_at_end(context.append_basic_block(function, "entry"));
        let thread_id = read_thread_id(context, module, &builder, options.threads_per_block())?;
        let mut lowering = Lowering {
            context,
            module,
            builder,
            function,
            kernel,
            layouts,
            values: vec![None; kernel.values.len()],
            thread_id,
            thread_bases: Vec::new(),
        };
        for (param, &arg) in function.get_param_iter().zip(&kernel.args) {
            lowering.values[arg.index()] = Some(vec![param]);
        }
        for layout in layouts.distinct_layouts() {
            if let Layout::Blocked(blocked) = layout {
                let bases = lowering.thread_base(blocked)?;
                lowering.thread_bases.push((blocked.clone(), bases));
            }
        }
        Ok(lowering)
    }

    /// Computes `BlockedLayout::thread_base` from the thread id, per dimension.
    fn thread_base(&self, layout: &BlockedLayout) -> Result<Vec<IntValue<'ctx>>, CodegenError> {
        let b = &self.builder;
        let lane = b.build_and(self.thread_id, self.i32(THREADS_PER_WARP - 1), "lane")?;
        let warp = b.build_right_shift(
            self.thread_id,
            self.i32(THREADS_PER_WARP.trailing_zeros()),
            false,
            "warp",
        )?;
        let lanes = layout.lane_decomposition();
        let warps = layout.warp_decomposition();
        let mut bases = Vec::new();
        for d in 0..layout.rank() {
            let index = |id: IntValue<'ctx>, (divisor, modulus): (u32, u32)| {
                let id = b.build_int_unsigned_div(id, self.i32(divisor), "")?;
                b.build_int_unsigned_rem(id, self.i32(modulus), "")
            };
            let lane_d = index(lane, lanes[d])?;
            let warp_d = index(warp, warps[d])?;
            let thread_d = b.build_int_add(
                b.build_int_mul(warp_d, self.i32(layout.threads_per_warp[d]), "")?,
                lane_d,
                "",
            )?;
            bases.push(b.build_int_mul(
                thread_d,
                self.i32(layout.size_per_thread[d]),
                &format!("base{d}"),
            )?);
        }
        Ok(bases)
    }

    pub fn i32(&self, value: u32) -> IntValue<'ctx> {
        self.context.i32_type().const_int(value as u64, false)
    }

    /// The registers of a value already lowered.
    pub fn regs(&self, value: Value) -> Result<&Regs<'ctx>, CodegenError> {
        self.values[value.index()].as_ref().ok_or_else(|| {
            CodegenError::internal(
                Stage::Llir,
                format!("value %{} is used before it is lowered", value.0),
            )
        })
    }

    pub fn bind(&mut self, value: Value, regs: Regs<'ctx>) {
        self.values[value.index()] = Some(regs);
    }

    /// How many registers a thread holds of `value`: its layout's elements per thread, 1 for a scalar.
    pub fn register_count(&self, value: Value) -> usize {
        match self.layouts.layout(value) {
            Some(Layout::Blocked(layout)) => {
                layout.elements_per_thread(self.kernel.ty(value).shape())
            }
            _ => 1,
        }
    }

    /// Where each of this thread's registers of `value` sits in its tile.
    pub fn positions(
        &self,
        value: Value,
        inst: &Inst,
    ) -> Result<Vec<Position<'ctx>>, CodegenError> {
        let shape = self.kernel.ty(value).shape();
        let Some(layout) = self.layouts.layout(value) else {
            return Ok(vec![Position {
                coords: Vec::new(),
                owner: None,
            }]);
        };
        let Layout::Blocked(layout) = layout else {
            return Err(unsupported(
                inst,
                format!("the {} layout is not lowered yet", layout.kind_name()),
            ));
        };
        let bases = self
            .thread_bases
            .iter()
            .find(|(l, _)| l == layout)
            .map(|(_, bases)| bases)
            .ok_or_else(|| {
                CodegenError::internal(Stage::Llir, format!("no thread base for {layout}"))
            })?;
        let tile = layout.cta_tile();
        let b = &self.builder;
        let mut positions = Vec::new();
        for offsets in layout.register_offsets(shape) {
            let mut coords = Vec::new();
            let mut owner: Option<IntValue<'ctx>> = None;
            for d in 0..shape.len() {
                let unwrapped = b.build_int_add(bases[d], self.i32(offsets[d] as u32), "")?;
                if shape[d] >= tile[d] {
                    coords.push(unwrapped);
                    continue;
                }
                // A tile smaller than the CTA tile wraps: later threads hold copies.
                coords.push(b.build_and(unwrapped, self.i32(shape[d] as u32 - 1), "")?);
                let first = b.build_int_compare(
                    inkwell::IntPredicate::ULT,
                    unwrapped,
                    self.i32(shape[d] as u32),
                    "owner",
                )?;
                owner = Some(match owner {
                    Some(o) => b.build_and(o, first, "owner")?,
                    None => first,
                });
            }
            positions.push(Position { coords, owner });
        }
        Ok(positions)
    }

    /// Lowers a region's instructions; returns the registers of the values its `yield` names.
    pub fn region(&mut self, region: &Region) -> Result<Vec<Regs<'ctx>>, CodegenError> {
        for inst in &region.insts {
            if let Op::Yield { values } = &inst.op {
                return values.iter().map(|&v| self.regs(v).cloned()).collect();
            }
            let results = self.inst(inst)?;
            for (&result, regs) in inst.results.iter().zip(results) {
                self.bind(result, regs);
            }
        }
        Ok(Vec::new())
    }

    fn inst(&mut self, inst: &Inst) -> Result<Vec<Regs<'ctx>>, CodegenError> {
        let one = |regs: Regs<'ctx>| Ok(vec![regs]);
        match &inst.op {
            Op::Constant(c) => {
                let value = self.constant(*c, self.result_dtype(inst)?);
                one(vec![value; self.register_count(inst.results[0])])
            }
            Op::ProgramId { axis } => one(vec![self.special_register("ctaid", *axis)?]),
            Op::NumPrograms { axis } => one(vec![self.special_register("nctaid", *axis)?]),
            Op::Arange { start, .. } => {
                let positions = self.positions(inst.results[0], inst)?;
                let start = self.i32(*start as u32);
                positions
                    .iter()
                    .map(|p| Ok(self.builder.build_int_add(start, p.coords[0], "")?.into()))
                    .collect::<Result<Regs<'ctx>, CodegenError>>()
                    .map(|regs| vec![regs])
            }
            Op::Splat { value } => {
                let scalar = self.regs(*value)?[0];
                one(vec![scalar; self.register_count(inst.results[0])])
            }
            Op::Cast { value } => one(self.cast(inst, *value)?),
            Op::Unary { op, value } => one(self.unary(inst, *op, *value)?),
            Op::Binary { op, lhs, rhs } => one(self.binary(inst, *op, *lhs, *rhs)?),
            Op::Compare { op, lhs, rhs } => one(self.compare(*op, *lhs, *rhs)?),
            Op::Select {
                cond,
                if_true,
                if_false,
            } => one(self.select(*cond, *if_true, *if_false)?),
            Op::AddPtr { ptr, offset } => one(self.add_ptr(*ptr, *offset)?),
            Op::Load { ptr, mask, other } => one(self.load(inst, *ptr, *mask, *other)?),
            Op::Store { ptr, value, mask } => {
                self.store(inst, *ptr, *value, *mask)?;
                Ok(Vec::new())
            }
            Op::For {
                lower,
                upper,
                step,
                init,
                body,
            } => self.for_loop(*lower, *upper, *step, init, body),
            Op::If {
                cond,
                then_region,
                else_region,
            } => self.if_else(*cond, then_region, else_region),
            Op::Yield { .. } => Err(CodegenError::internal(
                Stage::Llir,
                "a yield that does not end its region",
            )),
            Op::Broadcast { .. }
            | Op::ExpandDims { .. }
            | Op::Trans { .. }
            | Op::Reduce { .. }
            | Op::Dot { .. }
            | Op::MakeBlockPtr { .. }
            | Op::Advance { .. }
            | Op::LoadBlock { .. }
            | Op::StoreBlock { .. } => Err(unsupported(inst, "this op is not lowered yet")),
        }
    }

    /// The number type of an instruction's (first) result.
    pub fn result_dtype(&self, inst: &Inst) -> Result<DType, CodegenError> {
        inst.results
            .first()
            .and_then(|&r| self.kernel.ty(r).dtype())
            .ok_or_else(|| {
                CodegenError::internal(
                    Stage::Llir,
                    format!("expected `{}` to give numbers", inst.op.name()),
                )
            })
    }

    /// The number type of a value, or of what a pointer value points at.
    pub fn dtype(&self, value: Value) -> DType {
        match self.kernel.ty(value).elem() {
            Some(Elem::Value(dtype) | Elem::Ptr(dtype)) => dtype,
            None => DType::I64,
        }
    }

    /// `%ctaid.x` and its kin: a read of a PTX special register along grid axis `axis`.
    fn special_register(&self, name: &str, axis: u8) -> Result<BasicValueEnum<'ctx>, CodegenError> {
        let axis = ["x", "y", "z"][axis as usize];
        let intrinsic = format!("llvm.nvvm.read.ptx.sreg.{name}.{axis}");
        self.call_intrinsic(&intrinsic, &[], &[])
    }

    /// Calls the LLVM intrinsic `name`, overloaded on `types` where it is.
    pub fn call_intrinsic(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>, CodegenError> {
        call_intrinsic(self.module, &self.builder, name, types, args)
    }
}

fn call_intrinsic<'ctx>(
    module: &Module<'ctx>,
    builder: &Builder<'ctx>,
    name: &str,
    types: &[BasicTypeEnum<'ctx>],
    args: &[BasicValueEnum<'ctx>],
) -> Result<BasicValueEnum<'ctx>, CodegenError> {
    let declaration = inkwell::intrinsics::Intrinsic::find(name)
        .and_then(|intrinsic| intrinsic.get_declaration(module, types))
        .ok_or_else(|| {
            CodegenError::llvm(
                Stage::Llir,
                format!("expected llvm to know the intrinsic `{name}`"),
            )
        })?;
    let args: Vec<_> = args.iter().map(|&a| a.into()).collect();
    builder
        .build_call(declaration, &args, "")?
        .try_as_basic_value()
        .basic()
        .ok_or_else(|| CodegenError::internal(Stage::Llir, format!("`{name}` returns nothing")))
}

pub(crate) fn unsupported(inst: &Inst, message: impl Into<String>) -> CodegenError {
    CodegenError::unsupported(Stage::Llir, inst.op.name(), inst.loc, message)
}

/// The register type of a number dtype.
pub(crate) fn register_type(context: &Context, dtype: DType) -> BasicTypeEnum<'_> {
    match dtype {
        DType::F16 => context.f16_type().into(),
        DType::BF16 => context.bf16_type().into(),
        DType::F32 => context.f32_type().into(),
        DType::I32 => context.i32_type().into(),
        DType::I64 => context.i64_type().into(),
        DType::I1 => context.bool_type().into(),
    }
}

/// The type of a kernel parameter: a global pointer or a scalar passed by value.
fn arg_type<'ctx>(context: &'ctx Context, ty: &Type) -> BasicTypeEnum<'ctx> {
    match ty.elem() {
        Some(Elem::Ptr(_)) => context.ptr_type(AddressSpace::from(GLOBAL)).into(),
        Some(Elem::Value(dtype)) => register_type(context, dtype),
        None => context.ptr_type(AddressSpace::from(GLOBAL)).into(),
    }
}

/// Marks `function` as a kernel entry (`.entry`) with at most `threads` threads per block
/// (`.maxntid`, which lets ptxas budget registers for exactly that block size).
fn annotate_kernel<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    function: FunctionValue<'ctx>,
    threads: u32,
) -> Result<(), CodegenError> {
    let i32_type = context.i32_type();
    let function_ref = function.as_global_value().as_pointer_value();
    for (key, value) in [("kernel", 1), ("maxntidx", threads)] {
        let node = context.metadata_node(&[
            function_ref.into(),
            context.metadata_string(key).into(),
            i32_type.const_int(value as u64, false).into(),
        ]);
        module
            .add_global_metadata("nvvm.annotations", &node)
            .map_err(|e| CodegenError::llvm(Stage::Llir, e))?;
    }
    Ok(())
}

/// `threadIdx.x`, with its range (`[0, threads)`) attached so that LLVM can fold what follows.
fn read_thread_id<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    builder: &Builder<'ctx>,
    threads: u32,
) -> Result<IntValue<'ctx>, CodegenError> {
    let tid = call_intrinsic(module, builder, "llvm.nvvm.read.ptx.sreg.tid.x", &[], &[])?
        .into_int_value();
    if let Some(call) = tid.as_instruction() {
        let i32_type = context.i32_type();
        let range = context.metadata_node(&[
            i32_type.const_int(0, false).into(),
            i32_type.const_int(threads as u64, false).into(),
        ]);
        call.set_metadata(range, context.get_kind_id("range"))
            .map_err(|e| CodegenError::llvm(Stage::Llir, e))?;
    }
    Ok(tid)
}

/// The memory type of a dtype: booleans are bytes in memory (as the interpreter's buffers hold them).
pub(crate) fn memory_type(context: &Context, dtype: DType) -> BasicTypeEnum<'_> {
    match dtype {
        DType::I1 => context.i8_type().as_basic_type_enum(),
        other => register_type(context, other),
    }
}
