//! The ptx stage: LLVM's `O3` pipeline on the verified module, the verifier again, then the NVPTX
//! back end's assembly for a [`Target`]. The same module gives byte-identical PTX: nothing here
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
/// fast-math, no fma contraction, denormals kept.
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
            target_features(target),
            OptimizationLevel::Aggressive,
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

/// Runs LLVM's `O3` pipeline, then the verifier.
pub fn optimize(module: &Module<'_>, machine: &TargetMachine) -> Result<(), CodegenError> {
    module
        .run_passes("default<O3>", machine, PassBuilderOptions::create())
        .map_err(|e| CodegenError::llvm(Stage::LlirOpt, e))?;
    module.verify().map_err(|message| {
        CodegenError::llvm(
            Stage::LlirOpt,
            format!("the verifier rejected the optimised module: {message}"),
        )
    })
}

/// The module as PTX text.
pub fn emit(module: &Module<'_>, machine: &TargetMachine) -> Result<String, CodegenError> {
    module.verify().map_err(|message| {
        CodegenError::llvm(
            Stage::Ptx,
            format!("the verifier rejected the module before emission: {message}"),
        )
    })?;
    let buffer = machine
        .write_to_memory_buffer(module, FileType::Assembly)
        .map_err(|e| CodegenError::llvm(Stage::Ptx, e))?;
    String::from_utf8(buffer.as_slice().to_vec())
        .map_err(|e| CodegenError::llvm(Stage::Ptx, format!("expected utf-8 ptx text: {e}")))
}

/// The LLVM target features of `target`: the PTX ISA version it needs.
fn target_features(target: Target) -> &'static str {
    match target {
        Target::Sm80 => "+ptx70",
        Target::Sm90a => "+ptx80",
    }
}
