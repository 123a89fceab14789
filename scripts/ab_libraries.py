"""Two builds of kiln's prebuilt kernels timed against each other in one process on the GPU
machine: for each configuration the new library, the old, the new and the old again, the best of
each kept, so that the GPU's drift over a run (which has moved unchanged kernels by up to 17%
between two sequential compare.py passes, docs/PERF.md) falls on both alike.

    python3 scripts/ab_libraries.py --new new/libkiln_kernels.so --old old/libkiln_kernels.so \
        --bench ../shared/bench [--pass fwd|bwd] [--seqs 1024,4096,16384]

The FlashAttention benchmark setup (batch = 16384 / seqlen, heads = 2048 / head_dim) and FLOP
convention (backward 2.5x forward), with compare.py's `bench_ms`; correctness is compare.py's and
the GPU tests' business, not this script's.
"""
import argparse
import os
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--new", required=True)
    ap.add_argument("--old", required=True)
    ap.add_argument("--bench", required=True, help="the directory of compare.py and kiln_ctypes.py")
    ap.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--rep", type=int, default=15, help="timed samples per measurement")
    ap.add_argument("--flags", type=int, default=0, help="kiln_attn_config flags (1: fused backward)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.bench))
    import compare  # noqa: E402
    import kiln_ctypes as kc  # noqa: E402

    libs = {"new": kc.load(a.new), "old": kc.load(a.old)}
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    print(f"D causal N | {a.which} TFLOP/s new old new/old (best of two, alternating)")
    for D in map(int, a.head_dims.split(",")):
        for causal in (False, True):
            for N in map(int, a.seqs.split(",")):
                B, H = 16384 // N, 2048 // D
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(3))
                o = torch.empty_like(q)
                lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                flops = 4 * B * H * N * N * D / (2 if causal else 1)
                calls = {}
                for name, lib in libs.items():
                    if a.which == "fwd":
                        calls[name] = kc.forward_call(lib, q, k, v, o, lse, causal=causal)
                    else:
                        kc.forward(lib, q, k, v, o, lse, causal=causal)
                        do = torch.randn_like(q)
                        dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
                        calls[name] = kc.backward_call(
                            lib, q, k, v, o, lse, do, dq, dk, dv, causal=causal, flags=a.flags
                        )
                work = flops * (2.5 if a.which == "bwd" else 1.0)
                best = {name: 0.0 for name in libs}
                for _ in range(2):
                    for name in libs:
                        ms = compare.bench_ms(calls[name], rep=a.rep)
                        best[name] = max(best[name], work / ms / 1e9)
                ratio = best["new"] / best["old"]
                print(f"{D} {int(causal)} {N} | {best['new']:.1f} {best['old']:.1f} {ratio:.3f}",
                      flush=True)


if __name__ == "__main__":
    main()
