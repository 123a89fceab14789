//! The tensor-core register maps and shared-memory swizzles, checked element by element.

mod mma;
mod swizzle;
mod wgmma;
