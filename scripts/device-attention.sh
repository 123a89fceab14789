#!/usr/bin/env bash
# Builds the attention checks here and stages them in .device/attention/ (git-ignored) with the
# judge, so that a GPU machine with PyTorch and no Rust reruns them with one command:
#
#     scripts/device-attention.sh          # here: build and stage
#     .device/attention/run.sh             # there: the interpreter tests' shapes against the
#                                          # interpreter, then the check against fp32 and SDPA
#     scripts/device-attention.sh --run    # on a machine with Rust, a GPU and PyTorch: both
#
# The binaries link no LLVM: they carry the PTX kiln-kernels ships (kernels/ptx). They need glibc
# 2.34 or later and the NVIDIA driver. Timing beside SDPA is ../shared/bench/compare.py's.
set -euo pipefail
cd "$(dirname "$0")/.."

# `--message-format=json` prints, among cargo's messages, each built executable's path.
executable() {
    python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    target = message.get("target") or {}
    if message.get("reason") == "compiler-artifact" and target.get("name") == sys.argv[1] \
            and message.get("executable"):
        print(message["executable"])
' "$1"
}
harness=$(cargo test --release -p kiln-runtime --features gpu --test attention_gpu --no-run \
    --message-format=json | executable attention_gpu)
example=$(cargo build --release -p kiln-kernels --example attention_gpu --message-format=json |
    executable attention_gpu)
if [ -z "$harness" ] || [ -z "$example" ]; then
    echo "error: cargo built no attention_gpu test or example" >&2
    exit 1
fi
stage=.device/attention
rm -rf "$stage"
mkdir -p "$stage"
cp "$harness" "$stage/kiln-attention-gpu"
cp "$example" "$stage/attention_gpu"
cp scripts/attention_vs_sdpa.py "$stage/attention_vs_sdpa.py"
cp scripts/attention-gpu-run.sh "$stage/run.sh"
chmod +x "$stage/run.sh" "$stage/attention_vs_sdpa.py"
echo "staged $stage ($(du -sh "$stage" | cut -f1))"
if [ "${1:-}" = "--run" ]; then
    exec "$stage/run.sh"
fi
echo "on the GPU machine (carry $stage): $stage/run.sh"
