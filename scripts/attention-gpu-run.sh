#!/usr/bin/env bash
# The attention checks on a GPU machine (PyTorch with CUDA there; no Rust needed), as staged by
# scripts/device-attention.sh into .device/attention/ beside the binaries and the judge:
#
#     .device/attention/run.sh [RESULTS_DIR]      # default: $OUT, else .device/attention/results
#
# 1. attention_gpu (kernels/examples/attention_gpu.rs): the interpreter tests' designed shapes
#    through the Rust API, every output against the CPU interpreter's, backward bits repeated.
# 2. kiln-attention-gpu --check: ragged shapes up to seqlen 16k through the Rust API, inputs and
#    outputs written to a scratch folder; attention_vs_sdpa.py check judges them against the
#    fp32 reference and PyTorch SDPA in the same dtype (check.txt, check.json).
# KILN_TARGET=sm_80 runs the portable PTX on a Hopper GPU. Exits 1 if anything fails.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${1:-${OUT:-$here/results}}
mkdir -p "$results"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kiln-attention.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
export PYTHONUNBUFFERED=1
status=0
"$here/attention_gpu" | tee "$results/interp-shapes.txt" || status=1
"$here/kiln-attention-gpu" --check "$scratch/check" || status=1
python3 "$here/attention_vs_sdpa.py" check "$scratch/check" --json "$results/check.json" |
    tee "$results/check.txt" || status=1
echo "results in $results; exit $status"
exit $status
