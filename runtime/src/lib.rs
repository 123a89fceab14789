//! kiln-runtime: loads PTX through the CUDA driver (cudarc), caches modules in memory and on disk,
//! and launches kernels with arguments checked against their signatures.
//!
//! Where it sits: after kiln-codegen (which makes PTX) and under kiln-kernels' GPU API. It holds
//! no driver code yet: the "Codegen" issue adds the minimal loader its GPU tests need, and the
//! "Runtime" issue grows it.
