//! The GPU architectures kiln compiles for. It lives here, below codegen and the runtime, because
//! a kernel's specialisation (its block sizes, warps and pipeline depth) is chosen per target by
//! crates that link no LLVM.

use std::fmt;
use std::str::FromStr;

/// The GPU architecture PTX is emitted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Ampere and later (runs on Hopper too).
    Sm80,
    /// Hopper with its architecture-specific features (wgmma, TMA); runs on sm_90 only.
    Sm90a,
}

impl Target {
    pub const ALL: [Target; 2] = [Target::Sm80, Target::Sm90a];

    /// The PTX `.target`, which is also LLVM's CPU name and ptxas's `-arch`.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90a => "sm_90a",
        }
    }

    /// The most shared memory a block may have (static and dynamic): 163 KiB on sm_80 (A100),
    /// 227 KiB on sm_90.
    pub fn max_shared_bytes(self) -> u32 {
        match self {
            Target::Sm80 => 163 * 1024,
            Target::Sm90a => 227 * 1024,
        }
    }

    /// The PTX ISA version kiln's PTX for this target declares (`.version`): sm_80's 7.0, the
    /// first to know sm_80; sm_90a's 8.1, the first with the vector `red.global.add.v{2,4}.f32`.
    pub fn ptx_isa(self) -> (u32, u32) {
        match self {
            Target::Sm80 => (7, 0),
            Target::Sm90a => (8, 1),
        }
    }

    /// The oldest CUDA driver whose JIT reads this target's PTX, as `cuDriverGetVersion` gives
    /// it (12010 for 12.1): the CUDA release of its PTX ISA (7.0 came with 11.0, 8.1 with 12.1).
    pub fn min_driver(self) -> i32 {
        match self {
            Target::Sm80 => 11000,
            Target::Sm90a => 12010,
        }
    }

    /// The best target for a GPU of compute capability `(major, minor)` under a CUDA driver of
    /// version `driver`: sm_90a on Hopper (its `a` features run on 9.0 only) where the driver
    /// reads its PTX, else sm_80 on any GPU from Ampere on; `None` where neither runs.
    pub fn for_device(major: i32, minor: i32, driver: i32) -> Option<Target> {
        let newest = match (major, minor) {
            (9, 0) => [Target::Sm90a, Target::Sm80].as_slice(),
            (8.., _) => [Target::Sm80].as_slice(),
            _ => [].as_slice(),
        };
        newest.iter().copied().find(|t| driver >= t.min_driver())
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a target name was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownTarget(pub String);

impl fmt::Display for UnknownTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected a target of sm_80 or sm_90a, got `{}`", self.0)
    }
}

impl std::error::Error for UnknownTarget {}

impl FromStr for Target {
    type Err = UnknownTarget;

    fn from_str(name: &str) -> Result<Target, UnknownTarget> {
        Target::ALL
            .into_iter()
            .find(|t| t.name() == name)
            .ok_or_else(|| UnknownTarget(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for target in Target::ALL {
            assert_eq!(target.name().parse::<Target>(), Ok(target));
        }
        assert_eq!(
            "sm_70".parse::<Target>().unwrap_err().to_string(),
            "expected a target of sm_80 or sm_90a, got `sm_70`"
        );
    }

    #[test]
    fn devices_pick_the_newest_target_that_runs() {
        let cuda_12_8 = 12080;
        assert_eq!(Target::for_device(9, 0, cuda_12_8), Some(Target::Sm90a));
        assert_eq!(Target::for_device(8, 6, cuda_12_8), Some(Target::Sm80));
        assert_eq!(Target::for_device(10, 0, cuda_12_8), Some(Target::Sm80));
        assert_eq!(Target::for_device(7, 5, cuda_12_8), None);
        // A CUDA 12.0 driver reads PTX ISA 8.0 at most: Hopper runs the portable PTX there.
        assert_eq!(Target::for_device(9, 0, 12010), Some(Target::Sm90a));
        assert_eq!(Target::for_device(9, 0, 12000), Some(Target::Sm80));
        assert_eq!(Target::for_device(9, 0, 10020), None);
    }
}
