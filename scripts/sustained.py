"""Sustained forward or backward times under the GPU's power cap, with the SM clock and the power
drawn, for several builds of kiln's prebuilt kernels and cuDNN's, on the GPU machine:

    python3 scripts/sustained.py --libs a/libkiln_kernels.so,b/libkiln_kernels.so \
        --bench ../shared/bench --shapes 64:4096:0,128:1024:1 [--seconds 3] [--rounds 2] \
        [--dtype bf16|fp16] [--pass fwd|bwd] [--flags 1]

Each (library, shape) runs back to back for `--seconds`, nvidia-smi sampled every 50 ms; the
first second's samples are dropped, so the clock is the one the power cap settles at. An H200
runs every attention pass at its cap (~690 W): a kernel that spends more energy a FLOP runs
at a lower clock, which a short burst of calls (`kernel_times.py`) does not show (docs/PERF.md,
fourteenth session). Shapes are D:seqlen:causal at compare.py's batch and heads; correctness is
compare.py's and the GPU tests' business.
"""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class Sampler:
    """nvidia-smi's SM clock (MHz) and power (W), every 50 ms in a thread, with timestamps."""

    def __init__(self):
        self.samples, self.stop = [], threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self):
        query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
        while not self.stop.is_set():
            clock, power = subprocess.run(query, capture_output=True, text=True).stdout.split(",")
            self.samples.append((time.time(), float(clock), float(power)))
            time.sleep(0.05)

    def between(self, start, end):
        return [s for s in self.samples if start <= s[0] <= end]

    def close(self):
        self.stop.set()
        self.thread.join()


def sustained(name, call, seconds, sampler):
    """Runs `call` for `seconds`; prints its mean time a call and the settled clock and power."""
    call()
    torch.cuda.synchronize()
    start_time, calls = time.time(), 0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    while time.time() - start_time < seconds:
        for _ in range(10):
            call()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    settled = sampler.between(start_time + 1.0, time.time())
    clock = statistics.mean(s[1] for s in settled)
    power = statistics.mean(s[2] for s in settled)
    print(f"{name:40s} {start.elapsed_time(end) / calls * 1000:8.1f} us/call  "
          f"sm {clock:5.0f} MHz  {power:4.0f} W  ({len(settled)} samples)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--libs", required=True, help="comma-separated paths")
    ap.add_argument("--bench", required=True, help="the directory of kiln_ctypes.py")
    ap.add_argument("--shapes", default="64:4096:0,128:4096:0,128:1024:0", help="D:seqlen:causal,...")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"],
                    help="bwd: the backward alone, from one forward's O and lse")
    ap.add_argument("--flags", type=int, default=0, help="kiln_attn_config flags (1: fused backward)")
    a = ap.parse_args()
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    sys.path.insert(0, os.path.abspath(a.bench))
    import kiln_ctypes as kc  # noqa: E402

    libs = [(path, kc.load(path)) for path in a.libs.split(",")]
    sampler = Sampler()
    try:
        for shape in a.shapes.split(","):
            D, N, causal = (int(x) for x in shape.split(":"))
            causal = bool(causal)
            B, H = 16384 // N, 2048 // D
            q, k, v, do = (torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4))
            o = torch.empty_like(q)
            lse = torch.empty(B, H, N, device="cuda", dtype=torch.float32)
            dq, dk, dv = (torch.empty_like(q) for _ in range(3))
            qt, kt, vt = (t.transpose(1, 2).contiguous().requires_grad_(a.which == "bwd") for t in (q, k, v))
            dot = do.transpose(1, 2).contiguous()
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                ot = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    if a.which == "fwd":
                        F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
                    else:
                        torch.autograd.grad(ot, (qt, kt, vt), dot, retain_graph=True)

            for _ in range(a.rounds):
                for path, lib in libs:
                    if a.which == "fwd":
                        call = kc.forward_call(lib, q, k, v, o, lse, causal=causal, flags=a.flags)
                    else:
                        kc.forward(lib, q, k, v, o, lse, causal=causal)
                        call = kc.backward_call(lib, q, k, v, o, lse, do, dq, dk, dv, causal=causal,
                                                flags=a.flags)
                    name = f"{path} {a.which} {a.dtype} D{D} N{N} causal {int(causal)}"
                    sustained(name, call, a.seconds, sampler)
                sustained(f"cudnn {a.which} {a.dtype} D{D} N{N} causal {int(causal)}", cudnn, a.seconds,
                          sampler)
    finally:
        sampler.close()


if __name__ == "__main__":
    main()
