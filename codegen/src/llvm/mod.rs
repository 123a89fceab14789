//! The llir stage: the thread program -> one LLVM NVVM IR kernel function, verified.
//!
//! A translation, op for op: every layout decision was made by the layout stage and every
//! per-thread computation spelled out by the thread stage ([`crate::thread`]), so that the
//! emulator runs the same program this module emits. What is left here is LLVM's spelling:
//! registers become SSA values, `for` a loop with phis, `if` a diamond, a predicated load or
//! store a branch around the access (a masked-off lane never touches memory, even
//! speculatively), shared memory an `addrspace(3)` array (static, or dynamic above 48 KiB),
//! the approximate math, `ldmatrix` and `mma.sync` the NVVM intrinsics (or inline PTX where LLVM
//! has none, or where LLVM 19's own spelling would cost compile time: `ops::ldmatrix`). Every
//! instruction carries the source location of the tile op it came from (the `debug` module),
//! for the PTX's `.loc` lines.

mod control;
mod debug;
mod ops;

use inkwell::AddressSpace;
use inkwell::attributes::{Attribute, AttributeLoc};
use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::module::{Linkage, Module};
use inkwell::targets::TargetMachine;
use inkwell::types::{AnyType, BasicMetadataTypeEnum, BasicType, BasicTypeEnum, FunctionType};
use inkwell::values::{BasicValueEnum, CallSiteValue, FunctionValue, GlobalValue, PointerValue};
use kiln_dsl::Loc;

use crate::thread::{Block, Op, Program, Reg, Space, Type};
use crate::{CodegenError, Stage, Target};

type Result<T> = std::result::Result<T, CodegenError>;

/// NVPTX address spaces.
const GLOBAL: u16 = 1;
const SHARED: u16 = 3;

/// Translates `program` into a new module of `context`, for `target` (`machine`'s), and runs
/// the LLVM verifier on it. With `line_info`, every instruction from a tile op carries that op's
/// DSL source line and column (the `debug` module).
pub fn lower<'ctx>(
    context: &'ctx Context,
    program: &Program,
    target: Target,
    machine: &TargetMachine,
    line_info: bool,
) -> Result<Module<'ctx>> {
    let module = context.create_module(program.name);
    module.set_triple(&machine.get_triple());
    module.set_data_layout(&machine.get_target_data().get_data_layout());
    let mut param_types: Vec<_> = program
        .params
        .iter()
        .map(|p| llvm_type(context, program.ty(p.reg)).into())
        .collect();
    // Tensor maps come by value after the kernel's own parameters (CUDA's `const __grid_constant__
    // CUtensorMap`): 128 bytes aligned to 64 in the parameter space, used where they are.
    let generic = context.ptr_type(AddressSpace::default());
    param_types
        .extend((0..program.tensor_maps.len()).map(|_| BasicMetadataTypeEnum::from(generic)));
    let function = module.add_function(
        program.name,
        context.void_type().fn_type(&param_types, false),
        None,
    );
    let map_type = context.i8_type().array_type(TENSOR_MAP_BYTES);
    let map_params: Vec<u32> = (0..program.tensor_maps.len())
        .map(|m| (program.params.len() + m) as u32)
        .collect();
    for &index in &map_params {
        let kind = |name| Attribute::get_named_enum_kind_id(name);
        let byval = context.create_type_attribute(kind("byval"), map_type.as_any_type_enum());
        let align = context.create_enum_attribute(kind("align"), TENSOR_MAP_ALIGN);
        function.add_attribute(AttributeLoc::Param(index), byval);
        function.add_attribute(AttributeLoc::Param(index), align);
    }
    annotate_kernel(
        context,
        &module,
        function,
        program.threads_per_block,
        &map_params,
    )?;
    // Above 48 KiB a block's shared memory must be dynamic: an external array of no size,
    // which the launch sizes.
    let shared = (program.shared_bytes > 0).then(|| {
        let dynamic = program.dynamic_shared_bytes() > 0;
        let array = context
            .i8_type()
            .array_type(if dynamic { 0 } else { program.shared_bytes });
        let global = module.add_global(array, Some(AddressSpace::from(SHARED)), "kiln_shared");
        if dynamic {
            global.set_linkage(Linkage::External);
        } else {
            global.set_linkage(Linkage::Internal);
            global.set_initializer(&array.get_undef());
        }
        global.set_alignment(program.shared_align);
        global
    });
    let builder = context.create_builder();
    builder.position_at_end(context.append_basic_block(function, "entry"));
    let mut translation = Translation {
        context,
        module: &module,
        builder,
        function,
        program,
        target,
        values: vec![None; program.types.len()],
        f16_mma_operands: f16_mma_operands(program),
        shared,
        tensor_maps: Vec::new(),
        line_info: line_info
            .then(|| debug::LineInfo::new(context, &module, function, program.file)),
    };
    for (param, decl) in function.get_param_iter().zip(&program.params) {
        param.set_name(decl.name);
        translation.values[decl.reg.index()] = Some(param);
    }
    for (m, &index) in map_params.iter().enumerate() {
        let param = function.get_nth_param(index).ok_or_else(|| {
            CodegenError::internal(Stage::Llir, "a tensor map parameter is missing")
        })?;
        param.set_name(&format!("tensor_map{m}"));
        translation.tensor_maps.push(param.into_pointer_value());
    }
    translation.block(&program.body)?;
    translation.builder.build_return(None)?;
    // Dropping the DIBuilder completes the debug info, which the verifier checks.
    drop(translation);
    module.verify().map_err(|message| {
        CodegenError::llvm(
            Stage::Llir,
            format!("the verifier rejected the module kiln made: {message}"),
        )
    })?;
    Ok(module)
}

pub(crate) struct Translation<'a, 'ctx> {
    context: &'ctx Context,
    module: &'a Module<'ctx>,
    builder: Builder<'ctx>,
    function: FunctionValue<'ctx>,
    program: &'a Program,
    target: Target,
    /// The LLVM value of every register translated so far.
    values: Vec<Option<BasicValueEnum<'ctx>>>,
    /// By register: whether an f16 `mma.sync` reads it (`ops::ldmatrix` loads those as f32).
    f16_mma_operands: Vec<bool>,
    /// The block's shared memory, where the program uses any.
    shared: Option<GlobalValue<'ctx>>,
    /// The tensor map parameters, by the program's map index.
    tensor_maps: Vec<PointerValue<'ctx>>,
    line_info: Option<debug::LineInfo<'a, 'ctx>>,
}

/// By register of `program`: whether an f16 `mma.sync` reads it as an operand.
fn f16_mma_operands(program: &Program) -> Vec<bool> {
    fn visit(block: &Block, program: &Program, read: &mut [bool]) {
        for inst in &block.insts {
            if let Op::Mma { a, b, .. } = &inst.op
                && program.ty(a[0]) == Type::F16x2
            {
                for r in a.iter().chain(b) {
                    read[r.index()] = true;
                }
            }
            for nested in inst.op.nested_blocks() {
                visit(nested, program, read);
            }
        }
    }
    let mut read = vec![false; program.types.len()];
    visit(&program.body, program, &mut read);
    read
}

impl<'ctx> Translation<'_, 'ctx> {
    fn value(&self, reg: Reg) -> Result<BasicValueEnum<'ctx>> {
        self.values[reg.index()].ok_or_else(|| {
            CodegenError::internal(
                Stage::Llir,
                format!("register %{} is used before it is defined", reg.0),
            )
        })
    }

    fn ty(&self, reg: Reg) -> BasicTypeEnum<'ctx> {
        llvm_type(self.context, self.program.ty(reg))
    }

    fn bind(&mut self, reg: Reg, value: BasicValueEnum<'ctx>) {
        self.values[reg.index()] = Some(value);
    }

    /// Calls the LLVM intrinsic `name`, overloaded on `types` where it is.
    fn call_intrinsic(
        &self,
        name: &str,
        types: &[BasicTypeEnum<'ctx>],
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        self.call_value(self.intrinsic(name, types)?, name, args)
    }

    /// Calls the intrinsic `name` through a declaration of its type: for the NVVM intrinsics
    /// inkwell's lookup table lacks (`ldmatrix`, `mma`), which LLVM recognises by name and the
    /// verifier checks against their signatures.
    fn call_declared(
        &self,
        name: &str,
        returns: BasicTypeEnum<'ctx>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        let declaration = self.declared(name, args, |params| returns.fn_type(params, false));
        self.call_value(declaration, name, args)
    }

    /// Calls the intrinsic `name`, which returns nothing, through a declaration of its type
    /// (`cp.async`'s, which inkwell's lookup table lacks; LLVM recognises them by name).
    fn call_declared_void(&self, name: &str, args: &[BasicValueEnum<'ctx>]) -> Result<()> {
        let void = self.context.void_type();
        let declaration = self.declared(name, args, |params| void.fn_type(params, false));
        self.call_args(declaration, args)?;
        Ok(())
    }

    /// Calls an intrinsic that returns nothing (`llvm.nvvm.barrier0`).
    fn call_intrinsic_void(&self, name: &str) -> Result<()> {
        self.call_args(self.intrinsic(name, &[])?, &[])?;
        Ok(())
    }

    /// The declaration of the LLVM intrinsic `name`, overloaded on `types`.
    fn intrinsic(&self, name: &str, types: &[BasicTypeEnum<'ctx>]) -> Result<FunctionValue<'ctx>> {
        inkwell::intrinsics::Intrinsic::find(name)
            .and_then(|intrinsic| intrinsic.get_declaration(self.module, types))
            .ok_or_else(|| {
                CodegenError::llvm(
                    Stage::Llir,
                    format!("expected llvm to know the intrinsic `{name}`"),
                )
            })
    }

    /// The function `name`, declared with the type `fn_type` gives for `args`' types if the
    /// module lacks it.
    fn declared(
        &self,
        name: &str,
        args: &[BasicValueEnum<'ctx>],
        fn_type: impl FnOnce(&[BasicMetadataTypeEnum<'ctx>]) -> FunctionType<'ctx>,
    ) -> FunctionValue<'ctx> {
        self.module.get_function(name).unwrap_or_else(|| {
            let params: Vec<_> = args.iter().map(|a| a.get_type().into()).collect();
            self.module.add_function(name, fn_type(&params), None)
        })
    }

    fn call_args(
        &self,
        function: FunctionValue<'ctx>,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<CallSiteValue<'ctx>> {
        let args: Vec<_> = args.iter().map(|&a| a.into()).collect();
        Ok(self.builder.build_call(function, &args, "")?)
    }

    /// A call of `function` (called `name` in errors) and its result.
    fn call_value(
        &self,
        function: FunctionValue<'ctx>,
        name: &str,
        args: &[BasicValueEnum<'ctx>],
    ) -> Result<BasicValueEnum<'ctx>> {
        self.call_args(function, args)?
            .try_as_basic_value()
            .basic()
            .ok_or_else(|| CodegenError::internal(Stage::Llir, format!("`{name}` returns nothing")))
    }

    fn current_block(&self) -> Result<inkwell::basic_block::BasicBlock<'ctx>> {
        self.builder.get_insert_block().ok_or_else(|| {
            CodegenError::internal(Stage::Llir, "the ir builder has no insertion block")
        })
    }

    /// Translates a block's instructions, each at its op's source location; returns the values
    /// its `yield` names.
    fn block(&mut self, block: &Block) -> Result<Vec<BasicValueEnum<'ctx>>> {
        // What follows a nested block (a loop's latch, an `if`'s phis) is its op's.
        let outer = self.line_info.as_ref().and_then(debug::LineInfo::current);
        let mut yielded = Vec::new();
        for inst in &block.insts {
            if let crate::thread::Op::Yield(values) = &inst.op {
                yielded = values
                    .iter()
                    .map(|&r| self.value(r))
                    .collect::<Result<_>>()?;
                break;
            }
            self.locate(inst.loc);
            self.inst(inst)?;
        }
        self.locate(outer);
        Ok(yielded)
    }

    /// Gives the instructions built from now on `loc` (none: no location), with line info on.
    fn locate(&mut self, loc: Option<Loc>) {
        if let Some(line_info) = &mut self.line_info {
            line_info.locate(&self.builder, loc);
        }
    }
}

/// The LLVM type of a register type.
fn llvm_type(context: &Context, ty: Type) -> BasicTypeEnum<'_> {
    match ty {
        Type::I1 => context.bool_type().into(),
        Type::I8 => context.i8_type().into(),
        Type::I16 => context.i16_type().into(),
        Type::I32 => context.i32_type().into(),
        Type::I64 => context.i64_type().into(),
        Type::F16 => context.f16_type().into(),
        Type::BF16 => context.bf16_type().into(),
        Type::F32 => context.f32_type().as_basic_type_enum(),
        Type::F16x2 => context.f16_type().vec_type(2).into(),
        Type::BF16x2 => context.bf16_type().vec_type(2).into(),
        Type::Ptr(Space::Global) => context.ptr_type(AddressSpace::from(GLOBAL)).into(),
        Type::Ptr(Space::Shared) => context.ptr_type(AddressSpace::from(SHARED)).into(),
    }
}

/// Marks `function` as a kernel entry (`.entry`) with at most `threads` threads per block
/// (`.maxntid`, which lets ptxas budget registers for exactly that block size), of which one
/// block per SM must fit (`.minnctapersm 1`: without it ptxas aims at an occupancy of its own
/// choosing and spills to reach it, e.g. at 64 registers for 256 threads).
/// Parameters in `grid_constant` (0-based) are read in place, through their address, never
/// copied: what a tensor map must be for `cp.async.bulk.tensor` to take its address.
fn annotate_kernel<'ctx>(
    context: &'ctx Context,
    module: &Module<'ctx>,
    function: FunctionValue<'ctx>,
    threads: u32,
    grid_constant: &[u32],
) -> Result<()> {
    let i32_type = context.i32_type();
    let function_ref = function.as_global_value().as_pointer_value();
    for (key, value) in [("kernel", 1), ("maxntidx", threads), ("minctasm", 1)] {
        let node = context.metadata_node(&[
            function_ref.into(),
            context.metadata_string(key).into(),
            i32_type.const_int(value as u64, false).into(),
        ]);
        module
            .add_global_metadata("nvvm.annotations", &node)
            .map_err(|e| CodegenError::llvm(Stage::Llir, e))?;
    }
    if !grid_constant.is_empty() {
        // 1-based, as NVVM counts them.
        let indices: Vec<_> = grid_constant
            .iter()
            .map(|&i| i32_type.const_int(i as u64 + 1, false).into())
            .collect();
        let node = context.metadata_node(&[
            function_ref.into(),
            context.metadata_string("grid_constant").into(),
            context.metadata_node(&indices).into(),
        ]);
        module
            .add_global_metadata("nvvm.annotations", &node)
            .map_err(|e| CodegenError::llvm(Stage::Llir, e))?;
    }
    Ok(())
}

/// A `CUtensorMap`: its bytes and alignment.
const TENSOR_MAP_BYTES: u32 = 128;
const TENSOR_MAP_ALIGN: u64 = 64;
