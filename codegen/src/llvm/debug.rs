//! Line info: a `DILocation` (the DSL source's line and column) on every LLVM instruction
//! translated from a tile op, so that the PTX's `.loc` lines lead from an instruction to the
//! Rust line it came from.
//!
//! The compile unit asks for `DebugDirectivesOnly`: the NVPTX back end then emits `.file` and
//! `.loc` and nothing else, no `.debug_*` sections of bytes and no `.target ..., debug` (which
//! `LineTablesOnly` brings, with a DWARF compile unit carrying the producer and file names). The
//! paths are `file!()`'s, relative to the workspace, with no directory: the PTX is the same in
//! any clone. LLVM's code does not change with them, nor ptxas's: it puts line tables beside
//! the same machine code.
//!
//! inkwell's debug-info builder cannot make such a compile unit (its emission kinds stop at
//! `LineTablesOnly`), so this module calls LLVM's C API for the DIBuilder directly.

use std::ffi::{c_char, c_uint};
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use inkwell::builder::Builder;
use inkwell::context::Context;
use inkwell::llvm_sys::LLVMOpaqueDIBuilder;
use inkwell::llvm_sys::core::LLVMSetCurrentDebugLocation2;
use inkwell::llvm_sys::debuginfo::{
    LLVMCreateDIBuilderDisallowUnresolved, LLVMDIBuilderCreateDebugLocation,
    LLVMDIBuilderCreateFile, LLVMDIBuilderCreateFunction, LLVMDIBuilderCreateLexicalBlockFile,
    LLVMDIBuilderFinalize, LLVMDIFlagZero, LLVMDWARFSourceLanguage, LLVMDisposeDIBuilder,
    LLVMSetSubprogram,
};
use inkwell::llvm_sys::prelude::{LLVMBool, LLVMDIBuilderRef, LLVMMetadataRef};
use inkwell::module::{FlagBehavior, Module};
use inkwell::values::{AsValueRef, FunctionValue};
use kiln_dsl::Loc;

/// LLVM's `DICompileUnit::DebugDirectivesOnly`, which the C API's enum does not name.
const DEBUG_DIRECTIVES_ONLY: c_uint = 3;

/// The DWARF version the NVPTX back end emits (it takes no other): the module flag says so.
const DWARF_VERSION: u64 = 2;

unsafe extern "C" {
    /// llvm-sys's `LLVMDIBuilderCreateCompileUnit`, with the emission kind as the integer the C
    /// API casts to LLVM's enum: a Rust enum cannot hold `DEBUG_DIRECTIVES_ONLY`.
    #[link_name = "LLVMDIBuilderCreateCompileUnit"]
    fn create_compile_unit(
        builder: LLVMDIBuilderRef,
        language: LLVMDWARFSourceLanguage,
        file: LLVMMetadataRef,
        producer: *const c_char,
        producer_len: usize,
        is_optimized: LLVMBool,
        flags: *const c_char,
        flags_len: usize,
        runtime_version: c_uint,
        split_name: *const c_char,
        split_name_len: usize,
        kind: c_uint,
        dwo_id: c_uint,
        split_debug_inlining: LLVMBool,
        debug_info_for_profiling: LLVMBool,
        sysroot: *const c_char,
        sysroot_len: usize,
        sdk: *const c_char,
        sdk_len: usize,
    ) -> LLVMMetadataRef;
}

/// The kernel function's debug info while it is translated: the DIBuilder, its subprogram, and
/// a scope per source file. Dropping it finalizes the debug info, which the verifier needs.
pub(super) struct LineInfo<'a, 'ctx> {
    context: &'ctx Context,
    builder: NonNull<LLVMOpaqueDIBuilder>,
    subprogram: LLVMMetadataRef,
    /// The scope of each file's locations: the subprogram in the kernel's file, a lexical block
    /// file in the subprogram for another (a `#[kernel_fn]`'s, inlined).
    scopes: Vec<(&'static str, LLVMMetadataRef)>,
    /// The location the IR builder gives new instructions.
    current: Option<Loc>,
    /// The DIBuilder writes into the module until it is dropped.
    _module: PhantomData<&'a Module<'ctx>>,
}

impl<'a, 'ctx> LineInfo<'a, 'ctx> {
    /// A compile unit and a subprogram for `function`, from `file` (the kernel's, as `file!()`
    /// gives it), and the module flags that make the back end emit `.file` and `.loc`.
    pub(super) fn new(
        context: &'ctx Context,
        module: &'a Module<'ctx>,
        function: FunctionValue<'ctx>,
        file: &'static str,
    ) -> LineInfo<'a, 'ctx> {
        let i32_type = context.i32_type();
        module.add_basic_value_flag(
            "Debug Info Version",
            FlagBehavior::Warning,
            i32_type.const_int(inkwell::debug_info::debug_metadata_version().into(), false),
        );
        module.add_basic_value_flag(
            "Dwarf Version",
            FlagBehavior::Warning,
            i32_type.const_int(DWARF_VERSION, false),
        );
        let producer = "kiln";
        let name = function.get_name().to_bytes();
        // Safety: the module outlives the DIBuilder (dropped at the end of the translation);
        // every string is passed with its length; the file and the compile unit are this
        // builder's.
        unsafe {
            let builder = NonNull::new(LLVMCreateDIBuilderDisallowUnresolved(module.as_mut_ptr()))
                .expect("LLVM returns a DIBuilder");
            let di_file = create_file(builder.as_ptr(), file);
            create_compile_unit(
                builder.as_ptr(),
                LLVMDWARFSourceLanguage::LLVMDWARFSourceLanguageRust,
                di_file,
                producer.as_ptr().cast(),
                producer.len(),
                1,
                ptr::null(),
                0,
                0,
                ptr::null(),
                0,
                DEBUG_DIRECTIVES_ONLY,
                0,
                0,
                0,
                ptr::null(),
                0,
                ptr::null(),
                0,
            );
            // Line 0: the kernel's own line is not recorded; what runs before its first op
            // (thread ids) is the compiler's.
            let subprogram = LLVMDIBuilderCreateFunction(
                builder.as_ptr(),
                di_file,
                name.as_ptr().cast(),
                name.len(),
                ptr::null(),
                0,
                di_file,
                0,
                ptr::null_mut(),
                0,
                1,
                0,
                LLVMDIFlagZero,
                1,
            );
            LLVMSetSubprogram(function.as_value_ref(), subprogram);
            LineInfo {
                context,
                builder,
                subprogram,
                scopes: vec![(file, subprogram)],
                current: None,
                _module: PhantomData,
            }
        }
    }

    /// Gives the instructions `builder` makes from now on `loc`'s line and column, or no
    /// location.
    pub(super) fn locate(&mut self, builder: &Builder<'ctx>, loc: Option<Loc>) {
        if loc == self.current {
            return;
        }
        self.current = loc;
        let location = match loc {
            Some(loc) => {
                let scope = self.scope(loc.file);
                // Safety: the scope is this builder's, in this context.
                unsafe {
                    LLVMDIBuilderCreateDebugLocation(
                        self.context.raw(),
                        loc.line,
                        loc.col,
                        scope,
                        ptr::null_mut(),
                    )
                }
            }
            None => ptr::null_mut(),
        };
        // Safety: a null location clears the builder's.
        unsafe { LLVMSetCurrentDebugLocation2(builder.as_mut_ptr(), location) };
    }

    /// The location the builder gives new instructions.
    pub(super) fn current(&self) -> Option<Loc> {
        self.current
    }

    fn scope(&mut self, file: &'static str) -> LLVMMetadataRef {
        if let Some(&(_, scope)) = self.scopes.iter().find(|(f, _)| *f == file) {
            return scope;
        }
        // Safety: the subprogram is this builder's.
        let scope = unsafe {
            let di_file = create_file(self.builder.as_ptr(), file);
            LLVMDIBuilderCreateLexicalBlockFile(self.builder.as_ptr(), self.subprogram, di_file, 0)
        };
        self.scopes.push((file, scope));
        scope
    }
}

impl Drop for LineInfo<'_, '_> {
    fn drop(&mut self) {
        // Safety: the builder is disposed once, here, after it resolves what it made.
        unsafe {
            LLVMDIBuilderFinalize(self.builder.as_ptr());
            LLVMDisposeDIBuilder(self.builder.as_ptr());
        }
    }
}

/// A `DIFile` of `path` with no directory: nothing of the machine's goes into the module.
///
/// # Safety
/// `builder` must be a live DIBuilder.
unsafe fn create_file(builder: LLVMDIBuilderRef, path: &str) -> LLVMMetadataRef {
    // Safety: the caller's builder; the strings are passed with their lengths.
    unsafe { LLVMDIBuilderCreateFile(builder, path.as_ptr().cast(), path.len(), ptr::null(), 0) }
}
