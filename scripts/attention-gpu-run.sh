#!/usr/bin/env bash
# The attention harness on a GPU machine (PyTorch with CUDA there; no Rust needed), as staged by
# scripts/device-attention.sh into .device/attention/ beside the binary, the script and the PTX:
#
#     .device/attention/run.sh [RESULTS_DIR]      # default: $OUT, else .device/attention/results
#
# 0. kiln-attention-gpu --interp-shapes: the interpreter tests' shapes, forward + backward on the
#    GPU and on the interpreter (rayon: all cores), every output against the interpreter's.
# 1. kiln-attention-gpu --check: ragged shapes up to seqlen 16k, forward + backward on the GPU,
#    inputs and outputs written to a scratch folder; attention_vs_sdpa.py check judges them
#    against the fp32 reference and PyTorch SDPA in the same dtype (check.txt, check.json).
# 2. kiln-attention-gpu --time, then attention_vs_sdpa.py time: kiln, SDPA FlashAttention-2 and
#    SDPA cuDNN at the FlashAttention benchmark setup, TFLOP/s side by side (time.txt,
#    time.json, kiln-time.json).
# Extra arguments for the binary (--seqs 1024,4096, --rep 5, --filter bf16) go in
# KILN_ATTENTION_ARGS. Exits 1 if a check fails or anything fails to run.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${1:-${OUT:-$here/results}}
mkdir -p "$results"
scratch=$(mktemp -d "${TMPDIR:-/tmp}/kiln-attention.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
read -r -a extra <<<"${KILN_ATTENTION_ARGS:-}"
export PYTHONUNBUFFERED=1
status=0
"$here/kiln-attention-gpu" --ptx "$here/ptx" --interp-shapes | tee "$results/interp-shapes.txt" || status=1
"$here/kiln-attention-gpu" --ptx "$here/ptx" --check "$scratch/check" "${extra[@]}" || status=1
python3 "$here/attention_vs_sdpa.py" check "$scratch/check" --json "$results/check.json" |
    tee "$results/check.txt" || status=1
rm -rf "$scratch/check"
"$here/kiln-attention-gpu" --ptx "$here/ptx" --time "${extra[@]}" >"$results/kiln-time.json" || status=1
python3 "$here/attention_vs_sdpa.py" time "$results/kiln-time.json" --json "$results/time.json" |
    tee "$results/time.txt" || status=1
echo "results in $results; exit $status"
exit $status
