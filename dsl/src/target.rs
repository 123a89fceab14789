//! The GPU architectures kiln compiles for. It lives here, below codegen and the runtime, because
//! a kernel's specialisation (its block sizes, warps and pipeline depth) is chosen per target by
//! crates that link no LLVM.

use std::fmt;
use std::str::FromStr;

/// The GPU architecture PTX is emitted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    /// Ampere and later (runs on Hopper too): PTX ISA 7.0.
    Sm80,
    /// Hopper with its architecture-specific features (wgmma, TMA): PTX ISA 8.0; runs on sm_90 only.
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

    /// The best target for a GPU of compute capability `(major, minor)`: sm_90a on Hopper (its
    /// `a` features run on 9.0 only), sm_80 on any other GPU from Ampere on, `None` before it.
    pub fn for_capability(major: i32, minor: i32) -> Option<Target> {
        match (major, minor) {
            (9, 0) => Some(Target::Sm90a),
            (8.., _) => Some(Target::Sm80),
            _ => None,
        }
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
    fn capabilities_pick_the_newest_target_that_runs() {
        assert_eq!(Target::for_capability(9, 0), Some(Target::Sm90a));
        assert_eq!(Target::for_capability(8, 6), Some(Target::Sm80));
        assert_eq!(Target::for_capability(10, 0), Some(Target::Sm80));
        assert_eq!(Target::for_capability(7, 5), None);
    }
}
