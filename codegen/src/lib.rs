//! kiln-codegen: lowers checked tile IR (kiln-dsl) through named stages to PTX — layout
//! assignment, LLVM NVVM IR through inkwell, the NVPTX back end — and will be the only crate that
//! links LLVM.
//!
//! Where it sits: after kiln-dsl's builder and semantic checks, beside the CPU interpreter (which
//! defines what a kernel means); kiln-runtime loads what it emits. It holds no stages yet: the
//! "Codegen" issue builds them, and until then kiln runs its kernels on the interpreter only.
