//! kiln-codegen (placeholder)
