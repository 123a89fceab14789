//! Autotuning the attention kernels on a GPU: for one dtype, head dim and mask, each candidate
//! configuration of a kernel (forward, dQ, dK/dV, that of the split or of the fused backward;
//! [`candidates`]) is compiled by the caller
//! (kiln-codegen, which this crate does not link), checked against the f64 reference on a ragged
//! GQA problem of the timed call's range of lengths (its specialisation), and timed at the benchmark setup with the rest of the call as shipped. The
//! fastest correct candidate per kernel is what `attention::config`'s table should say for that
//! target; `kiln tune` runs this and prints the trials and the winners.

use kiln_dsl::{DType, Target};
use kiln_runtime::Device;

use crate::attention::check::Tolerance;
use crate::attention::gpu::{self, Candidate, Overrides};
use crate::attention::{
    AttentionError, AttentionKernel, AttentionParams, DECODE_ROWS, KernelConfig, KeyLength,
    dkdv_dq_by_turns, dkdv_key_major,
};
use crate::bench::{self, HeadReference, Pass, Problem, Sampling};
use crate::reference::Rng;

/// The configurations tried for `kernel` (of the fused backward, or not): blocks of 32 to 128 rows
/// each way, 4 or 8 warps, 2 and 3 pipeline stages (the forward keeps at least 64 query rows),
/// each also with `%tid.x` read again in its loop bodies; on
/// sm_90a each again on `wgmma` where every warp can take 16 rows of its own (of keys for the split
/// dK/dV, which is key-major there), at 8 warps also with a producer warpgroup issuing the copies
/// (keeping 40 registers or 24; the forward's also persistent), each two-warpgroup one with a
/// uniform warpgroup index and the backward's with descriptors at issue, and for the forward 256
/// query rows of 16 warps (four warpgroups taking turns, with a producer, with Q in registers, or
/// neither; the backward's accumulators need more registers than 16 warps leave a thread). The
/// compiler refuses what does not fit (shared memory, warps the tile cannot feed); those trials
/// say so.
pub fn candidates(
    kernel: AttentionKernel,
    target: Target,
    fused_backward: bool,
) -> Vec<KernelConfig> {
    let block_ms: &[usize] = match kernel {
        AttentionKernel::Forward => &[64, 128],
        _ => &[32, 64, 128],
    };
    let stages: &[u32] = &[2, 3];
    let mut all = Vec::new();
    for &block_m in block_ms {
        for block_n in [32, 64, 128] {
            for num_warps in [4, 8] {
                for &num_stages in stages {
                    let config = KernelConfig::new(block_m, block_n, num_warps, num_stages);
                    // On `mma.sync`, each also with `%tid.x` read again in its loop bodies.
                    all.extend([config, config.with_loop_tid()]);
                    // On Hopper's warpgroup tensor cores: every warp along the rows of each
                    // product, 16 or more each (dK/dV's products are along keys, and along
                    // queries too where it is query-major).
                    let wgmma = config.on_wgmma();
                    let rows = match kernel {
                        AttentionKernel::DkDv if dkdv_key_major(fused_backward, wgmma) => block_n,
                        AttentionKernel::DkDv => block_m.min(block_n),
                        _ => block_m,
                    };
                    if target == Target::Sm90a && rows.is_multiple_of(16 * num_warps as usize) {
                        let mut variants = vec![wgmma];
                        // Two consumer warpgroups fed by a producer's (keeping 40 registers
                        // or 24), and each two-warpgroup variant with its `wgmma` descriptors'
                        // warpgroup index from lane 0.
                        if num_warps == 8 {
                            let mut producers = vec![wgmma.with_producer()];
                            if kernel == AttentionKernel::Forward {
                                producers.push(wgmma.with_producer().persistent());
                            }
                            for producer in producers {
                                variants.extend([producer, producer.with_lean_producer()]);
                            }
                            // A persistent forward also with its row sum kept as lanes'
                            // partial sums (1.01-1.02x without a mask: run 315).
                            let partial: Vec<KernelConfig> = variants
                                .iter()
                                .filter(|c| c.persistent)
                                .map(|c| c.with_partial_sums())
                                .collect();
                            variants.extend(partial);
                            let uniform: Vec<KernelConfig> = variants
                                .iter()
                                .map(|c| c.with_uniform_warpgroup())
                                .collect();
                            variants.extend(uniform);
                        }
                        // The fused dK/dV's two warpgroups of 64 query rows, each also with
                        // dQ by turns.
                        if kernel == AttentionKernel::DkDv
                            && dkdv_dq_by_turns(fused_backward, wgmma.with_dq_by_turns())
                        {
                            let turns: Vec<KernelConfig> =
                                variants.iter().map(|c| c.with_dq_by_turns()).collect();
                            variants.extend(turns);
                        }
                        // The backward's, short of registers, each with its descriptors
                        // computed at issue too.
                        if kernel != AttentionKernel::Forward {
                            let at_issue: Vec<KernelConfig> = variants
                                .iter()
                                .map(|c| c.with_descriptors_at_issue())
                                .collect();
                            variants.extend(at_issue);
                        }
                        all.extend(variants);
                    }
                }
            }
        }
    }
    if target == Target::Sm90a && kernel == AttentionKernel::Forward {
        for block_n in [64, 128] {
            for &num_stages in stages {
                // Four warpgroups reading one Q tile: each also with Q in registers.
                let config = KernelConfig::new(256, block_n, 16, num_stages).on_wgmma();
                all.extend([config, config.with_resident_a(), config.with_producer()]);
            }
        }
    }
    all
}

/// The decode blocks tried ([`Setup::decode`]): [`DECODE_ROWS`] query rows against 32 to 256
/// keys, 2, 4 or 8 warps side by side along the keys, 2 to 4 stages, on `mma.sync` with the row
/// sums kept as lanes' partial sums, as the table's are.
pub fn decode_candidates() -> Vec<KernelConfig> {
    let mut all = Vec::new();
    for block_n in [32, 64, 128, 256] {
        for num_warps in [2, 4, 8] {
            for num_stages in [2, 3, 4] {
                let config = KernelConfig::new(DECODE_ROWS, block_n, num_warps, num_stages);
                all.push(config.with_partial_sums());
            }
        }
    }
    all
}

/// What became of one candidate.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Correct; the median milliseconds of the pass it is part of.
    Timed { ms: f64, tflops: f64 },
    /// It ran, and disagreed with the f64 reference.
    Wrong(Vec<String>),
    /// It did not compile, load or launch.
    Failed(String),
}

/// One candidate of one kernel, and what became of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Trial {
    pub kernel: AttentionKernel,
    pub config: KernelConfig,
    /// Whether it is the table's configuration.
    pub shipped: bool,
    pub outcome: Outcome,
    /// What the driver's ptxas says of its PTX that costs speed (a `wgmma` serialized for want
    /// of registers, C7512; which took a producer's verdict astray once: docs/PERF.md,
    /// twenty-first session), a line each.
    pub warnings: Vec<String>,
}

/// What to tune, and how long to time each candidate.
#[derive(Clone, Debug)]
pub struct Setup {
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
    /// The benchmark setup's sequence length to time at.
    pub seqlen: usize,
    pub kernels: Vec<AttentionKernel>,
    /// Whether the backward's kernels are tuned as the fused backward runs them (dK/dV adding
    /// dQ with atomics) or as the split one does.
    pub fused_backward: bool,
    pub sampling: Sampling,
    /// The configurations to try beside the table's, instead of [`candidates`].
    pub configs: Option<Vec<KernelConfig>>,
    /// Whether the forward's decode blocks are tuned ([`crate::attention::AttentionConfig::decode`],
    /// [`decode_candidates`]), checked on 13 rows and timed on a batch of decode steps
    /// ([`bench::decode_steps`]), rather than its blocks at the benchmark setup.
    pub decode: bool,
}

/// Compiles one candidate: `kernel` of the call `p` at `config` for `target`.
pub type Compile<'a> = dyn FnMut(AttentionKernel, &AttentionParams, KernelConfig, Target) -> Result<Candidate, String>
    + 'a;

/// Runs every candidate of every kernel of `setup` on `device`, the table's configuration
/// included; `progress` hears of each trial as it ends.
pub fn tune(
    device: &Device,
    setup: &Setup,
    compile: &mut Compile<'_>,
    rng: &mut Rng,
    progress: &mut dyn FnMut(&Trial),
) -> Result<Vec<Trial>, AttentionError> {
    let target = gpu::target(device)?;
    let (timed, (seqlen_q, seqlen_k)) = if setup.decode {
        let steps = bench::decode_steps(setup.dtype, setup.head_dim, setup.causal, setup.seqlen);
        // Rows under one block, the causal mask inside it.
        (steps, (13, 999))
    } else {
        let timed = AttentionParams {
            fused_backward: setup.fused_backward,
            ..bench::standard(setup.dtype, setup.head_dim, setup.causal, setup.seqlen)
        };
        (timed, checked_seqlens(timed.key_length()))
    };
    let table = timed.config(target)?;
    // Ragged along every block size, unequal lengths, two query heads per kv head, and in the
    // timed call's range of lengths: the candidate is compiled as that range's specialisation.
    let checked = AttentionParams {
        batch: 1,
        seqlen_q,
        seqlen_k,
        heads_q: 2,
        heads_kv: 1,
        ..timed
    };
    let mut check = Problem::random(device, checked, rng)?;
    let reference = check.reference_head(device, 0, 0)?;
    let mut time = Problem::random(device, timed, rng)?;
    let mut trials = Vec::new();
    for &kernel in &setup.kernels {
        let (shipped, tried) = match setup.decode {
            true => (table.decode, decode_candidates()),
            false => (
                table.kernel(kernel),
                candidates(kernel, target, setup.fused_backward),
            ),
        };
        let mut configs = setup.configs.clone().unwrap_or(tried);
        configs.retain(|&c| c != shipped);
        configs.insert(0, shipped);
        for config in configs {
            let (outcome, warnings) = match compile(kernel, &timed, config, target) {
                Err(message) => (Outcome::Failed(message), Vec::new()),
                Ok(candidate) => {
                    // PTX the driver refuses fails its trial, with the driver's log.
                    let overrides = Overrides::default().with(candidate.clone());
                    let problems = Problems {
                        check: &mut check,
                        reference: &reference,
                        time: &mut time,
                    };
                    let outcome = trial(device, setup, kernel, &overrides, problems)
                        .unwrap_or_else(|e| Outcome::Failed(e.to_string()));
                    (outcome, gpu::candidate_warnings(device, &candidate))
                }
            };
            let trial = Trial {
                kernel,
                config,
                shipped: config == shipped,
                outcome,
                warnings,
            };
            progress(&trial);
            trials.push(trial);
        }
    }
    Ok(trials)
}

/// The query and key lengths of the call a candidate is checked on, ragged along every block
/// size, in range `keys` causal or not ([`KeyLength::of`]).
fn checked_seqlens(keys: KeyLength) -> (usize, usize) {
    match keys {
        KeyLength::Short => (333, 500),
        KeyLength::Medium => (777, 1000),
        KeyLength::Long => (777, 8999),
    }
}

/// The problems every candidate runs: one checked against its f64 reference, one timed.
struct Problems<'a> {
    check: &'a mut Problem,
    reference: &'a HeadReference,
    time: &'a mut Problem,
}

/// Checks, then times, one candidate.
fn trial(
    device: &Device,
    setup: &Setup,
    kernel: AttentionKernel,
    overrides: &Overrides,
    Problems {
        check,
        reference,
        time,
    }: Problems<'_>,
) -> Result<Outcome, AttentionError> {
    check.overrides = overrides.clone();
    check.poison(device)?;
    check.forward(device)?;
    check.backward(device)?;
    let failures = check
        .compare_head(device, reference)?
        .failures(Tolerance::for_dtype(setup.dtype));
    if !failures.is_empty() {
        return Ok(Outcome::Wrong(failures));
    }
    time.overrides = overrides.clone();
    let (pass, flops) = match kernel {
        AttentionKernel::Forward => (Pass::Forward, 1.0),
        _ => {
            // The backward reads the forward's outputs.
            time.forward(device)?;
            (Pass::Backward, 2.5)
        }
    };
    let ms = time.median_ms(device, setup.sampling, pass)?;
    let tflops = flops * bench::forward_flops(&time.params) / ms / 1e9;
    Ok(Outcome::Timed { ms, tflops })
}

/// The fastest correct trial of `kernel`, if any.
pub fn winner(trials: &[Trial], kernel: AttentionKernel) -> Option<&Trial> {
    trials
        .iter()
        .filter(|t| t.kernel == kernel)
        .filter_map(|t| match t.outcome {
            Outcome::Timed { ms, .. } => Some((t, ms)),
            _ => None,
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(t, _)| t)
}

/// The trials as a Markdown table, each timed one beside the table's configuration.
pub fn table(trials: &[Trial]) -> String {
    let mut out = String::from(
        "| kernel | configuration | shipped | pass ms | TFLOP/s | vs shipped | outcome |\n\
         | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for t in trials {
        let shipped_ms = trials.iter().find_map(|s| match s.outcome {
            Outcome::Timed { ms, .. } if s.shipped && s.kernel == t.kernel => Some(ms),
            _ => None,
        });
        let (ms, tflops, ratio, outcome) = match &t.outcome {
            Outcome::Timed { ms, tflops } => (
                format!("{ms:.3}"),
                format!("{tflops:.1}"),
                shipped_ms.map_or("-".into(), |s| format!("{:.3}", s / ms)),
                "ok".to_string(),
            ),
            Outcome::Wrong(failures) => (
                "-".into(),
                "-".into(),
                "-".into(),
                format!("WRONG: {}", failures.join("; ")),
            ),
            Outcome::Failed(message) => (
                "-".into(),
                "-".into(),
                "-".into(),
                // The first line says why; the rest is the compiler's or driver's detail.
                format!("failed: {}", message.lines().next().unwrap_or_default()),
            ),
        };
        // ptxas's own words after its prefix (`ptxas info    : `).
        let outcome = t.warnings.iter().fold(outcome, |outcome, w| {
            let words = w.split_once(": ").map_or(w.as_str(), |(_, rest)| rest);
            format!("{outcome}; ptxas: {words}")
        });
        out.push_str(&format!(
            "| {} | {} | {} | {ms} | {tflops} | {ratio} | {outcome} |\n",
            t.kernel.name(),
            t.config,
            if t.shipped { "yes" } else { "" },
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::config;

    #[test]
    fn the_search_covers_the_sm_90a_table() {
        for head_dim in [64, 128] {
            for (causal, fused) in [(false, false), (true, false), (false, true), (true, true)] {
                for keys in KeyLength::ALL {
                    let table = config(head_dim, causal, fused, Target::Sm90a, keys).unwrap();
                    for kernel in AttentionKernel::ALL.into_iter().filter(|k| k.reads_keys()) {
                        let shipped = table.kernel(kernel);
                        assert!(
                            candidates(kernel, Target::Sm90a, fused).contains(&shipped),
                            "{kernel:?} d{head_dim} {keys:?} (fused backward: {fused}): {shipped}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_decode_search_covers_the_tables_decode_blocks() {
        let tried = decode_candidates();
        assert!(
            tried
                .iter()
                .all(|c| c.block_m == DECODE_ROWS && c.partial_sums)
        );
        for target in Target::ALL {
            for head_dim in crate::attention::HEAD_DIMS {
                for causal in [false, true] {
                    let table = config(head_dim, causal, false, target, KeyLength::Medium);
                    let decode = table.unwrap().decode;
                    assert!(tried.contains(&decode), "{target} d{head_dim}: {decode}");
                }
            }
        }
    }

    #[test]
    fn candidates_are_checked_in_the_range_of_lengths_they_are_compiled_for() {
        for keys in KeyLength::ALL {
            let (seqlen_q, seqlen_k) = checked_seqlens(keys);
            for causal in [false, true] {
                assert_eq!(
                    KeyLength::of(seqlen_q, seqlen_k, causal),
                    keys,
                    "causal {causal}"
                );
            }
        }
    }

    #[test]
    fn the_winner_is_the_fastest_correct_trial() {
        let trial = |block_m, shipped, outcome| Trial {
            kernel: AttentionKernel::Dq,
            config: KernelConfig::new(block_m, 64, 4, 2),
            shipped,
            outcome,
            warnings: Vec::new(),
        };
        let trials = [
            trial(
                64,
                true,
                Outcome::Timed {
                    ms: 2.0,
                    tflops: 100.0,
                },
            ),
            trial(32, false, Outcome::Wrong(vec!["dq off".into()])),
            trial(
                128,
                false,
                Outcome::Timed {
                    ms: 1.6,
                    tflops: 125.0,
                },
            ),
            trial(16, false, Outcome::Failed("shared memory\ndetail".into())),
        ];
        assert_eq!(winner(&trials, AttentionKernel::Dq), Some(&trials[2]));
        assert_eq!(winner(&trials, AttentionKernel::Forward), None);
        let mut trials = trials.to_vec();
        trials[0].warnings = vec![
            "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions \
             are serialized"
                .into(),
        ];
        let table = table(&trials);
        assert!(
            table.contains(
                "| ok; ptxas: (C7512) Potential Performance Loss: wgmma.mma_async instructions \
                 are serialized |"
            ),
            "{table}"
        );
        assert!(table.contains("| 128 x 64, 4 warps, 2 stages |  | 1.600 | 125.0 | 1.250 | ok |"));
        assert!(table.contains("WRONG: dq off"), "{table}");
        assert!(table.contains("failed: shared memory |"), "{table}");
    }
}
