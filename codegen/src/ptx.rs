//! The ptx stage: kiln's pass pipeline ([`PIPELINE`]) on the verified module, the verifier
//! again, then the NVPTX back end's assembly for a [`Target`]. The same module gives byte-identical PTX: nothing here
//! depends on time, paths or hash order.

use std::sync::Once;

use inkwell::OptimizationLevel;
use inkwell::module::Module;
use inkwell::passes::PassBuilderOptions;
use inkwell::targets::{
    CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetMachine,
    TargetTriple,
};

use crate::{CodegenError, Stage, Target};

/// CUDA's 64-bit PTX target.
pub const TRIPLE: &str = "nvptx64-nvidia-cuda";

/// The NVPTX target machine for `target`, with LLVM's default floating-point options: no
/// fast-math, no fma contraction, denormals kept. Its code generation runs at `-O2`: at `-O3`
/// the NVPTX back end runs GVN where `-O2` runs early CSE, which [`PIPELINE`] has done already;
/// the PTX ptxas gets is the same, 40% sooner.
pub fn target_machine(target: Target) -> Result<TargetMachine, CodegenError> {
    static INIT: Once = Once::new();
    INIT.call_once(|| LlvmTarget::initialize_nvptx(&InitializationConfig::default()));
    let triple = TargetTriple::create(TRIPLE);
    let llvm_target =
        LlvmTarget::from_triple(&triple).map_err(|e| CodegenError::llvm(Stage::Ptx, e))?;
    llvm_target
        .create_target_machine(
            &triple,
            target.name(),
            &target_features(target),
            OptimizationLevel::Default,
            RelocMode::Default,
            CodeModel::Default,
        )
        .ok_or_else(|| {
            CodegenError::llvm(
                Stage::Ptx,
                format!("expected llvm to make a target machine for {target}"),
            )
        })
}

/// The LLVM passes kiln runs: what its straight-line, fully unrolled kernels need (scalar
/// replacement, CSE and GVN of the address arithmetic, instruction combining, hoisting of
/// loop-invariant values, dead code and CFG cleanup), without `default<O3>`'s inliner,
/// interprocedural, loop-transforming and vectorising passes, which find nothing to do in one
/// kernel function yet took three quarters of its time: the same PTX to within a few
/// instructions and ptxas's same registers, in a quarter of the time (docs/PERF.md).
pub const PIPELINE: &str = "function(sroa,early-cse,instcombine<no-verify-fixpoint>,simplifycfg,\
                            loop-mssa(licm),gvn,instcombine<no-verify-fixpoint>,adce,simplifycfg)";

/// Runs [`PIPELINE`], then the verifier.
pub fn optimize(module: &Module<'_>, machine: &TargetMachine) -> Result<(), CodegenError> {
    module
        .run_passes(PIPELINE, machine, PassBuilderOptions::create())
        .map_err(|e| CodegenError::llvm(Stage::LlirOpt, e))?;
    module.verify().map_err(|message| {
        CodegenError::llvm(
            Stage::LlirOpt,
            format!("the verifier rejected the optimised module: {message}"),
        )
    })
}

/// The module as PTX text: the module [`optimize`] verified (it is not verified again).
pub fn emit(module: &Module<'_>, machine: &TargetMachine) -> Result<String, CodegenError> {
    let buffer = machine
        .write_to_memory_buffer(module, FileType::Assembly)
        .map_err(|e| CodegenError::llvm(Stage::Ptx, e))?;
    String::from_utf8(buffer.as_slice().to_vec())
        .map_err(|e| CodegenError::llvm(Stage::Ptx, format!("expected utf-8 ptx text: {e}")))
}

/// The LLVM target features of `target`: the PTX ISA version it declares ([`Target::ptx_isa`]).
fn target_features(target: Target) -> String {
    let (major, minor) = target.ptx_isa();
    format!("+ptx{major}{minor}")
}
