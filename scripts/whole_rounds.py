"""What the last, partly empty round of a launch costs, for kiln and cuDNN, on the GPU machine:

    python3 scripts/whole_rounds.py --lib path/to/libkiln_kernels.so --bench ../shared/bench \
        [--pass fwd|bwd] [--flags 1]

compare.py's D128 shapes (batch = 16384 / seqlen, 16 heads) give 2048 query blocks of 128 rows
(or, key-major, 2048 dK/dV programs of 128 keys): 15.52 rounds of an H200's 132 SMs, causal
7.76 rounds of pairs of blocks. Beside each, a head count whose blocks fill whole rounds (66 at
4k, 33 at 8k and 16k, as batch 1). The time a head at compare.py's shape over the time a head in
whole rounds is what balancing the last round could gain at most (`tail x`, above 1 where the
partly empty round costs); `balanced` is kiln's ratio to cuDNN with that gain. Times are
compare.py's `bench_ms`, 5 readings a shape alternating kiln and cuDNN, the median of each.
Correctness is compare.py's and the GPU tests' business.
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

# seqlen, heads at compare.py's shape (as batch 1), heads in whole rounds of 132 SMs
SHAPES = [(4096, 64, 66), (8192, 32, 33), (16384, 16, 33)]
HEAD_DIM = 128


def calls(kc, lib, which, flags, heads, seqlen, causal):
    """kiln's and cuDNN's call of one pass at batch 1, `heads` heads of `seqlen` rows."""
    q, k, v, do = (torch.randn(1, seqlen, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                   for _ in range(4))
    o = torch.empty_like(q)
    lse = torch.empty(1, heads, seqlen, device="cuda", dtype=torch.float32)
    qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_(which == "bwd") for t in (q, k, v))
    if which == "fwd":
        kiln = kc.forward_call(lib, q, k, v, o, lse, causal=causal, flags=flags)

        def cudnn():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
        return kiln, cudnn
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    kc.forward(lib, q, k, v, o, lse, causal=causal)
    kiln = kc.backward_call(lib, q, k, v, o, lse, do, dq, dk, dv, causal=causal, flags=flags)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    dot = do.transpose(1, 2).contiguous()
    return kiln, lambda: torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True, help="path to libkiln_kernels.so")
    ap.add_argument("--bench", required=True, help="the directory of compare.py and kiln_ctypes.py")
    ap.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument("--flags", type=int, default=0, help="kiln_attn_config flags (1: fused backward)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.bench))
    import kiln_ctypes as kc  # noqa: E402
    from compare import bench_ms  # noqa: E402

    lib = kc.load(a.lib)
    rows = []
    for seqlen, compare_heads, whole_heads in SHAPES:
        for causal in (False, True):
            ms = {}
            for heads in (compare_heads, whole_heads):
                kiln, cudnn = calls(kc, lib, a.which, a.flags, heads, seqlen, causal)
                readings = [(bench_ms(kiln), bench_ms(cudnn)) for _ in range(5)]
                ms[heads] = tuple(statistics.median(r[i] for r in readings) for i in range(2))
                torch.cuda.empty_cache()
            (kiln_c, cudnn_c), (kiln_w, cudnn_w) = ms[compare_heads], ms[whole_heads]
            tail_kiln = (kiln_c / compare_heads) / (kiln_w / whole_heads)
            tail_cudnn = (cudnn_c / compare_heads) / (cudnn_w / whole_heads)
            balanced = cudnn_c / (kiln_w * compare_heads / whole_heads)
            rows.append(
                f"{a.which} N {seqlen:5d} causal {int(causal)} | kiln {kiln_c:.3f} ms at "
                f"{compare_heads} heads, {kiln_w:.3f} at {whole_heads}, tail x{tail_kiln:.3f} | "
                f"cuDNN {cudnn_c:.3f}, {cudnn_w:.3f}, tail x{tail_cudnn:.3f} | kiln / cuDNN "
                f"{cudnn_c / kiln_c:.3f}, balanced {balanced:.3f}")
            print(rows[-1], flush=True)
    print("\n".join(rows))


if __name__ == "__main__":
    main()
