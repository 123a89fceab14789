#!/usr/bin/env bash
# Builds the attention harness (runtime/tests/attention_gpu.rs) here and stages it in
# .device/attention/ (git-ignored) with what it runs beside it, so that a GPU machine with
# PyTorch and no Rust reruns the whole check and timing with one command:
#
#     scripts/device-attention.sh          # here: build and stage
#     .device/attention/run.sh             # there: the interpreter tests' shapes vs the
#                                          # interpreter, check vs fp32 and SDPA, then timings
#     scripts/device-attention.sh --run    # on a machine with Rust, a GPU and PyTorch: both
#
# The binary links no LLVM: it loads the PTX kiln-codegen made, staged in .device/attention/ptx
# from kernels/ptx (the shipped set) or from KILN_ATTENTION_PTX, a folder of
# the same form (mod.rs and the .ptx files). It needs glibc 2.34 or later and the NVIDIA driver.
set -euo pipefail
cd "$(dirname "$0")/.."

# `--no-run --message-format=json` prints, among cargo's messages, the test binary's path.
binary=$(
    cargo test --release -p kiln-runtime --features gpu --test attention_gpu --no-run \
        --message-format=json |
        python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    target = message.get("target") or {}
    if message.get("reason") == "compiler-artifact" and target.get("name") == "attention_gpu" \
            and "test" in target.get("kind", []) and message.get("executable"):
        print(message["executable"])
'
)
if [ -z "$binary" ]; then
    echo "error: cargo built no attention_gpu binary" >&2
    exit 1
fi
ptx=${KILN_ATTENTION_PTX:-kernels/ptx}
stage=.device/attention
rm -rf "$stage"
mkdir -p "$stage"
cp "$binary" "$stage/kiln-attention-gpu"
cp -r "$ptx" "$stage/ptx"
cp scripts/attention_vs_sdpa.py "$stage/attention_vs_sdpa.py"
cp scripts/attention-gpu-run.sh "$stage/run.sh"
chmod +x "$stage/run.sh" "$stage/attention_vs_sdpa.py"
echo "staged $stage ($(du -sh "$stage" | cut -f1)): kiln-attention-gpu from $binary, PTX from $ptx"
if [ "${1:-}" = "--run" ]; then
    exec "$stage/run.sh"
fi
echo "on the GPU machine (carry $stage): $stage/run.sh"
