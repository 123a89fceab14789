"""Per-kernel GPU times of several builds of kiln's prebuilt kernels, in one process on the GPU
machine: for each configuration, `--rounds` rounds in which every library runs `--rep` calls under
torch.profiler; each kernel's time is the median over rounds of its mean per call. Alternating
libraries round by round (every other round in reverse order) puts the GPU's drift and each
library's place in a round on all alike, and timing kernels apart tells a change to one kernel
(a few percent) from the spread of the whole call (docs/PERF.md).

    python3 scripts/kernel_times.py --libs old/libkiln_kernels.so,new/libkiln_kernels.so \
        --bench ../shared/bench [--pass fwd|bwd] [--flags 1] [--seqs 1024,4096,16384] [--control]

Two loads of one library read up to 2.5% apart at a shape (docs/PERF.md, twenty-third session):
`--control` times a copy of the baseline too, so that a run prints its own noise beside its
ratios.

Shapes are compare.py's (batch = 16384 / seqlen, heads = 2048 / head_dim); the first library is
the baseline of the printed ratios. Correctness is compare.py's and the GPU tests' business.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile


def kernel_means(call, rep):
    """Mean device microseconds per call of each kernel `call` launches."""
    call()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(rep):
            call()
        torch.cuda.synchronize()
    total = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and not e.name.startswith("Memset"):
            total[e.name] = total.get(e.name, 0.0) + e.device_time
    return {name: us / rep for name, us in total.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", required=True, help="comma-separated paths; the first is the baseline")
    ap.add_argument("--bench", required=True, help="the directory of compare.py and kiln_ctypes.py")
    ap.add_argument("--pass", dest="which", default="bwd", choices=["fwd", "bwd"])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--seqs", default="1024,4096,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep", type=int, default=10, help="calls profiled per library and round")
    ap.add_argument("--flags", type=int, default=0, help="kiln_attn_config flags (1: fused backward)")
    ap.add_argument("--control", action="store_true",
                    help="also time a copy of the baseline, last: its ratio is the run's own noise")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.bench))
    import kiln_ctypes as kc  # noqa: E402

    paths = a.libs.split(",")
    if a.control:
        # A copy under another path: the loader maps it apart, with its own modules and buffers.
        copy = os.path.join(tempfile.mkdtemp(prefix="kiln-control-"), os.path.basename(paths[0]))
        shutil.copyfile(paths[0], copy)
        paths.append(copy)
    libs = [kc.load(p) for p in paths]
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    print("libraries: " + ", ".join(f"[{i}] {p}" for i, p in enumerate(paths)))
    print(f"D causal N kernel | us per call [0] [1] ... | speedups over [0] (medians of {a.rounds} rounds)")
    for D in map(int, a.head_dims.split(",")):
        for causal in (c == "1" for c in a.causal.split(",")):
            for N in map(int, a.seqs.split(",")):
                B, H = max(1, 16384 // N), 2048 // D
                q, k, v = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(3))
                o = torch.empty_like(q)
                lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
                # One forward and one dO: every library's backward reads the same inputs.
                if a.which == "bwd":
                    kc.forward(libs[0], q, k, v, o, lse, causal=causal)
                    do = torch.randn_like(q)
                    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
                calls = []
                for lib in libs:
                    if a.which == "fwd":
                        calls.append(kc.forward_call(lib, q, k, v, o, lse, causal=causal))
                    else:
                        calls.append(kc.backward_call(
                            lib, q, k, v, o, lse, do, dq, dk, dv, causal=causal, flags=a.flags))
                samples = [{} for _ in libs]
                for r in range(a.rounds):
                    # Every other round in reverse: a library's place in the round (what ran
                    # just before it) costs it alike in both directions.
                    order = list(enumerate(calls))
                    for i, call in order if r % 2 == 0 else reversed(order):
                        for name, us in kernel_means(call, a.rep).items():
                            samples[i].setdefault(name, []).append(us)
                names = sorted(set().union(*samples), key=lambda n: -statistics.median(samples[0].get(n, [0])))
                for name in names + ["total"]:
                    if name == "total":
                        us = [sum(statistics.median(s[n]) for n in s) for s in samples]
                    else:
                        us = [statistics.median(s[name]) if name in s else float("nan") for s in samples]
                    # A kernel one library does not launch reads "-".
                    times = " ".join("-" if t != t else f"{t:.1f}" for t in us)
                    ratios = " ".join("-" if t != t or us[0] != us[0] else f"{us[0] / t:.3f}"
                                      for t in us[1:])
                    print(f"{D} {int(causal)} {N} {name[:40]} | {times} | {ratios}", flush=True)


if __name__ == "__main__":
    main()
