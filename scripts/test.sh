#!/usr/bin/env bash
# kiln's test suite on a fresh machine without a GPU (the README's test command; CI runs it):
# installs what it needs, then formatting, lints and every test.
# Rust comes from rust-toolchain.toml. kiln-codegen links LLVM 19 statically (Debian's packages)
# and its tests assemble the PTX they generate with ptxas 13.0.88 (PyPI, the GPU machine's
# version): both are installed here when missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# LLVM 19, through apt-get as root, only where it is not installed yet.
if ! command -v llvm-config-19 >/dev/null 2>&1 && [ ! -x /usr/lib/llvm-19/bin/llvm-config ]; then
    as_root=()
    if [ "$(id -u)" != 0 ]; then
        as_root=(sudo)
    fi
    "${as_root[@]}" apt-get update
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y llvm-19-dev libpolly-19-dev libzstd-dev
fi
# llvm-sys looks here first, whatever other llvm-config is on PATH.
export LLVM_SYS_191_PREFIX=/usr/lib/llvm-19

# ptxas, in a virtual environment kept between runs; codegen's tests read KILN_PTXAS and, with
# it set, fail unless ptxas runs and assembles every kernel for sm_80 and sm_90a.
if [ -z "${KILN_PTXAS:-}" ]; then
    venv="${KILN_PTXAS_VENV:-$HOME/.cache/kiln/ptxas-venv}"
    if [ ! -x "$venv/bin/python" ]; then
        python3 -m venv "$venv"
    fi
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check 'nvidia-cuda-nvcc==13.0.88'
    # The wheel puts ptxas under the `nvidia` namespace package: <site-packages>/nvidia/cu13/bin.
    KILN_PTXAS=$("$venv/bin/python" -c '
import importlib.util, os, sys
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations if spec else []):
    path = os.path.join(root, "cu13", "bin", "ptxas")
    if os.access(path, os.X_OK):
        print(path)
        sys.exit(0)
sys.exit("ptxas not found in the nvidia-cuda-nvcc wheel")
')
    export KILN_PTXAS
fi
"$KILN_PTXAS" --version | tail -n 1

cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
# The GPU test is built and linted here, and run on a GPU machine (scripts/device-gpu-tests.sh).
cargo clippy -p kiln-runtime --all-targets --release --features gpu -- -D warnings
# The `kiln` CLI's compiler stages, linted here and run below; the JIT and its example, linted.
cargo clippy -p kiln-kernels --all-targets --release --features codegen -- -D warnings
cargo clippy -p kiln --all-targets --release --features jit -- -D warnings
cargo test --release --workspace
# The documentation, private items too (the compiler's stages are read from it): every intra-doc
# link resolves.
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --workspace --document-private-items --quiet

# The C interface from C, without a GPU: the header compiles as C99, the static library links with
# libc alone, bad input is refused with the field named.
cargo build --release --quiet -p kiln-kernels --lib
cc -std=c99 -Wall -Wextra -Werror -I kernels/include kernels/tests/c/smoke.c \
    target/release/libkiln_kernels.a -lpthread -ldl -lm -o target/kiln-c-smoke
target/kiln-c-smoke

# The Python side without a GPU: the wrapper's ctypes structures have the C layout (it asserts
# their sizes on import), and the SDPA judge reads cases and draws its table.
python3 -c 'import sys; sys.path.insert(0, "python"); import kiln_attention'
# It loads the library by path or, a bare name, through the dynamic loader (no GPU needed to
# read its version), and says which when neither finds it.
LD_LIBRARY_PATH=target/release python3 -c '
import sys; sys.path.insert(0, "python"); import kiln_attention as k
k.load("libkiln_kernels.so"); assert k.version().startswith("kiln "), k.version()
try:
    k.load("libkiln_nowhere.so")
except FileNotFoundError as e:
    assert "dynamic loader" in str(e), e
else:
    sys.exit("loaded a library that is not there")'
python3 scripts/attention_vs_sdpa.py selftest >/dev/null
# The GPU-only scripts (PyTorch there) at least parse.
for script in scripts/*.py; do
    python3 -c 'import ast, sys; ast.parse(open(sys.argv[1]).read())' "$script"
done

# The `kiln` CLI built with kiln-codegen (LLVM): it compiles a shipped specialisation (warning if
# that differs from the shipped PTX) and reads ptxas's resource report of one.
kiln=(cargo run --release --quiet -p kiln-kernels --features codegen --bin kiln --)
"${kiln[@]}" ptx attention_fwd --spec T=bf16,HEAD_DIM=128,CAUSAL=true --arch sm_80 | grep -q mma.sync
"${kiln[@]}" resources attention_bwd_dkdv --spec T=bf16,HEAD_DIM=256 --arch sm_80 |
    grep -q "0 bytes spill stores, 0 bytes spill loads"
