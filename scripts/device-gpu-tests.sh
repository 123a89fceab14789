#!/usr/bin/env bash
# Builds kiln-runtime's GPU test here and puts it in .device/ (git-ignored), so that the GPU
# machine, which has no Rust, runs it with one command:
#
#     .device/kiln-gpu-tests                                   # the table; exit 1 on a mismatch
#     compute-sanitizer --tool memcheck .device/kiln-gpu-tests # no out-of-bounds access either
#
# The binary links no LLVM: it carries the PTX kiln-codegen made (runtime/tests/gpu/ptx/, and
# kiln-kernels' shipped attention PTX) and
# loads libcuda.so at run time. It needs only glibc (2.34 or later) and the NVIDIA driver.
set -euo pipefail
cd "$(dirname "$0")/.."

# `--no-run --message-format=json` prints, among cargo's messages, the test binary's path.
binary=$(
    cargo test --release -p kiln-runtime --features gpu --test gpu --no-run --message-format=json |
        python3 -c '
import json, sys
for line in sys.stdin:
    message = json.loads(line)
    target = message.get("target") or {}
    if message.get("reason") == "compiler-artifact" and target.get("name") == "gpu" \
            and "test" in target.get("kind", []) and message.get("executable"):
        print(message["executable"])
'
)
if [ -z "$binary" ]; then
    echo "error: cargo built no gpu test binary" >&2
    exit 1
fi
mkdir -p .device
cp "$binary" .device/kiln-gpu-tests
# The PTX beside it, for reading or for ptxas/cuobjdump there; the binary does not need it.
rm -rf .device/ptx
cp -r runtime/tests/gpu/ptx .device/ptx
echo "built .device/kiln-gpu-tests from $binary"
echo "on the GPU machine (carry .device): .device/kiln-gpu-tests"
