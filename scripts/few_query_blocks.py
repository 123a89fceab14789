"""The forward at shapes whose query blocks do not fill the GPU (decode steps, short chunks of
queries against long keys, GQA and MQA), for several builds of kiln's prebuilt kernels beside
PyTorch SDPA's FlashAttention-2 and cuDNN backends, on the GPU machine:

    python3 scripts/few_query_blocks.py --bench ../shared/bench a/libkiln_kernels.so [b/...]

Each library's O is poisoned (NaN) first and checked against an fp32 SDPA (the worst row's
relative error, compare.py's `err`, printed beside FA2's); times are compare.py's `bench_ms`
(median of 30 samples of 10 calls), which at the smallest shapes is the host's time a call,
and then each one's GPU time a call with the host out of the way (`queued_us`: 40 calls queued
behind a sleeping kernel, between two events; the gaps between kernels count). kiln splits
such a forward over the keys and runs a decode step's query heads of one kv head as one block's
rows (`plan::forward_splits`, docs/PERF.md, thirty-first and thirty-second sessions); the last
shapes fill the GPU and must not change.
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

# B, Nq, Nk, heads q, heads kv, D, causal
SHAPES = [
    (1, 1, 8192, 32, 8, 128, False),
    (1, 1, 32768, 32, 8, 128, False),
    (1, 1, 131072, 32, 8, 128, False),
    (4, 1, 16384, 32, 32, 128, False),
    (16, 1, 8192, 32, 32, 128, False),
    (32, 1, 4096, 32, 32, 64, False),
    (16, 1, 8192, 64, 64, 32, False),
    (8, 1, 8192, 32, 8, 128, False),
    (1, 1, 8192, 16, 16, 64, False),
    (1, 1, 32768, 16, 16, 64, False),
    (1, 1, 32768, 32, 4, 64, False),
    (1, 1, 32768, 16, 16, 128, False),
    (1, 4, 32768, 16, 16, 128, True),
    (2, 1, 65536, 64, 8, 128, True),
    (1, 128, 65536, 16, 16, 128, False),
    (1, 128, 65536, 16, 16, 128, True),
    (1, 512, 131072, 16, 16, 128, True),
    (2, 1024, 32768, 16, 16, 128, True),
    (1, 2048, 16384, 16, 16, 64, False),
    (4, 4096, 4096, 16, 16, 128, False),
]


def queued_us(fn, calls=40, samples=7):
    """GPU time a call of `fn` in us, the calls queued behind a 20 ms sleep so that the host's
    time to issue them is hidden: median of `samples`."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(40_000_000)
        a.record()
        for _ in range(calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / calls * 1000)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="the folder of compare.py and kiln_ctypes.py")
    ap.add_argument("--heads-major", action="store_true",
                    help="give kiln Q, K, V and O laid out [B, H, N, D] in memory, as SDPA reads "
                         "them, rather than [B, N, H, D]")
    ap.add_argument("libs", nargs="+")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.bench))
    import kiln_ctypes as kc
    from compare import bench_ms, err

    libs = [kc.load(p) for p in a.libs]
    names = " ".join(f"kiln{i}_ms" for i in range(len(libs)))
    gpu_names = " ".join(f"kiln{i}" for i in range(len(libs)))
    print(f"{'B':>2} {'Nq':>5} {'Nk':>6} {'Hq':>3} {'Hkv':>3} {'D':>3} c | {names} fa2_ms cudnn_ms"
          f" | queued_us {gpu_names} fa2 cudnn | err kilns / fa2", flush=True)
    for (B, Nq, Nk, Hq, Hkv, D, causal) in SHAPES:
        torch.manual_seed(0)
        q = torch.randn(B, Nq, Hq, D, device="cuda", dtype=torch.bfloat16)
        k, v = [torch.randn(B, Nk, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
        # SDPA reads grouped kv heads as they are (`enable_gqa`), as kiln does: K and V of
        # `Hkv` heads, not repeated for each query head.
        gqa = Hq != Hkv
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        mask = causal_lower_right(Nq, Nk) if causal else None
        ref = F.scaled_dot_product_attention(qt.float(), kt.float(), vt.float(), attn_mask=mask,
                                             enable_gqa=gqa)
        ref = ref.transpose(1, 2)
        times, gpu, errors = [], [], []
        for lib in libs:
            o = torch.full_like(q, float("nan"))
            lse = torch.full((B, Hq, Nq), float("nan"), device="cuda")
            if a.heads_major:
                o = torch.full_like(qt, float("nan")).transpose(1, 2)
                ins = (x.transpose(1, 2) for x in (qt, kt, vt))
            else:
                ins = (q, k, v)
            call = kc.forward_call(lib, *ins, o, lse, causal=causal)
            call()
            torch.cuda.synchronize()
            written = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
            errors.append(err(o, ref) if written else float("inf"))
            times.append(bench_ms(call))
            gpu.append(queued_us(call))
        sdpa = {}
        for name, backend in (("fa2", SDPBackend.FLASH_ATTENTION),
                              ("cudnn", SDPBackend.CUDNN_ATTENTION)):
            try:
                with sdpa_kernel(backend):
                    f = lambda: F.scaled_dot_product_attention(  # noqa: E731
                        qt, kt, vt, attn_mask=mask, enable_gqa=gqa)
                    sdpa[name + "_err"] = err(f().transpose(1, 2), ref)
                    sdpa[name] = bench_ms(f)
                    sdpa[name + "_gpu"] = queued_us(f)
            except Exception:  # noqa: BLE001
                sdpa[name] = sdpa[name + "_gpu"] = float("nan")
        print(f"{B:2d} {Nq:5d} {Nk:6d} {Hq:3d} {Hkv:3d} {D:3d} {int(causal)} | "
              + " ".join(f"{t:8.3f}" for t in times)
              + f" {sdpa['fa2']:7.3f} {sdpa['cudnn']:8.3f} | "
              + " ".join(f"{t:6.1f}" for t in gpu)
              + f" {sdpa['fa2_gpu']:6.1f} {sdpa['cudnn_gpu']:6.1f} | "
              + " ".join(f"{e:.1e}" for e in errors)
              + f" / {sdpa.get('fa2_err', float('nan')):.1e}", flush=True)
        del q, k, v, qt, kt, vt, ref
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
