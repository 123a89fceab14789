#!/usr/bin/env bash
# Stages one GPU session's checks in a folder under .device/ (git-ignored) that the GPU machine,
# which has no Rust, runs with one command; every binary gzipped, for the 64 MiB carry limit:
#
#     scripts/device-stage.sh .device/r390 [--bench ../shared/bench] [--lib NAME=path/to/libkiln_kernels.so]...
#     # there (carry .device/r390):  bash .device/r390/run.sh [FILTER]
#     # with SANITIZE=1 before it, also racecheck and synccheck over every attention case
#     # (about 6 minutes more on an H200: run 404, docs/PERF.md)
#
# It holds kiln-gpu-tests (scripts/device-gpu-tests.sh), the attention checks
# (scripts/device-attention.sh), this tree's libkiln_kernels.so as `lib_this` beside any other
# `--lib` builds to compare, the bench folder (compare.py, kiln_ctypes.py) and the scripts that
# drive the C interface. run.sh runs, logging each under $OUT: the GPU tests (FILTER: only cases
# whose name holds it) and memcheck on the split and decode forwards, the designed checks against
# fp32 and SDPA, the stream workspaces (also under memcheck), few_query_blocks.py over every
# staged library and, with SANITIZE=1, racecheck and synccheck; then prints a short table of
# what passed.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ]; then
    echo "usage: scripts/device-stage.sh .device/rNNN [--bench DIR] [--lib NAME=PATH]..." >&2
    exit 2
fi
stage=$1
shift
case "$stage" in
.device/*) ;;
*)
    echo "error: stage under .device/ (git-ignored, carried to the GPU machine), got $stage" >&2
    exit 2
    ;;
esac
bench=../shared/bench
libs=()
while [ $# -gt 0 ]; do
    case "$1" in
    --bench)
        bench=$2
        shift 2
        ;;
    --lib)
        case "$2" in
        *=*) libs+=("$2") ;;
        *)
            echo "error: --lib expects NAME=PATH, got $2" >&2
            exit 2
            ;;
        esac
        shift 2
        ;;
    *)
        echo "error: unknown argument $1" >&2
        exit 2
        ;;
    esac
done
if [ ! -f "$bench/kiln_ctypes.py" ]; then
    echo "error: $bench has no kiln_ctypes.py (--bench: the folder of compare.py)" >&2
    exit 2
fi

scripts/device-gpu-tests.sh >/dev/null
scripts/device-attention.sh >/dev/null
cargo build --release --quiet -p kiln-kernels --lib

rm -rf "$stage"
mkdir -p "$stage/lib_this"
cp .device/kiln-gpu-tests "$stage/"
cp -r .device/attention "$stage/attention"
cp target/release/libkiln_kernels.so "$stage/lib_this/"
for entry in "${libs[@]}"; do
    name=${entry%%=*}
    path=${entry#*=}
    if [ "$(head -c 4 "$path" 2>/dev/null | tail -c 3)" != ELF ]; then
        echo "error: --lib $name=$path is not a shared library (gunzip it first?)" >&2
        exit 2
    fi
    mkdir -p "$stage/lib_$name"
    cp "$path" "$stage/lib_$name/libkiln_kernels.so"
done
cp -r "$bench" "$stage/bench"
cp scripts/stream_workspaces.py scripts/few_query_blocks.py "$stage/"
gzip -f "$stage/kiln-gpu-tests" "$stage/attention/kiln-attention-gpu" \
    "$stage/attention/attention_gpu" "$stage"/lib_*/libkiln_kernels.so

cat >"$stage/run.sh" <<'EOF'
#!/usr/bin/env bash
# Written by scripts/device-stage.sh: this session's GPU checks, logs under $OUT.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
out=${OUT:-$here/results}
mkdir -p "$out"
gunzip -f ./*.gz attention/*.gz lib_*/*.gz 2>/dev/null
chmod +x kiln-gpu-tests attention/*
filter=${1:-}
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
summary=()
step() {
    local name=$1 log=$2
    shift 2
    local start=$SECONDS
    "$@" >"$out/$log" 2>&1
    local rc=$?
    summary+=("$(printf '%-22s rc %-3s %4ss  %s' "$name" "$rc" $((SECONDS - start)) "$(tail -n 1 "$out/$log")")")
}
step gpu-tests gpu-tests.txt ./kiln-gpu-tests "$filter"
step memcheck-split memcheck.txt compute-sanitizer --tool memcheck ./kiln-gpu-tests _split
step attention attention.txt attention/run.sh "$out/attention"
step streams streams.txt python3 stream_workspaces.py --bench bench lib_this/libkiln_kernels.so
step streams-memcheck streams-memcheck.txt compute-sanitizer --tool memcheck \
    python3 stream_workspaces.py --bench bench lib_this/libkiln_kernels.so
mapfile -t staged < <(ls -d lib_*/libkiln_kernels.so)
step few-query-blocks few-query-blocks.txt python3 few_query_blocks.py --bench bench "${staged[@]}"
if [ "${SANITIZE:-0}" = 1 ]; then
    # The fused backward's preprocessing uses no shared memory: racecheck skips it.
    for kernels in attention_fwd attention_bwd_dkdv attention_bwd_dq; do
        step "racecheck $kernels" "racecheck-$kernels.txt" \
            compute-sanitizer --tool racecheck ./kiln-gpu-tests "$kernels"
    done
    step synccheck synccheck.txt compute-sanitizer --tool synccheck ./kiln-gpu-tests attention_
fi
cat "$out/few-query-blocks.txt"
echo "libraries, in column order: ${staged[*]}"
printf '%s\n' "${summary[@]}"
EOF
chmod +x "$stage/run.sh"
echo "staged $stage ($(du -sh "$stage" | cut -f1)); on the GPU machine (carry $stage): bash $stage/run.sh"
