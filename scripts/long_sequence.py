#!/usr/bin/env python3
"""Causal attention at long sequences on the GPU, kiln beside PyTorch SDPA (FlashAttention-2 backend):
batch 1, 16 heads of 128, bf16, forward and backward. For each, the time of each pass, TFLOP/s by the
FlashAttention convention, and the memory each pass allocates beyond its inputs and outputs (which must
grow linearly in seqlen: no seqlen^2 buffer anywhere). Checks: kiln's O on sampled rows against an fp32
reference of those rows, and kiln's O, dQ, dK, dV against SDPA's (relative error of the whole tensor).

    KILN_LIB=libkiln_kernels.so python3 scripts/long_sequence.py [--seqs 32768,131072]
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
import kiln_attention  # noqa: E402

HEADS, HEAD_DIM = 16, 128


def kiln_call(q, k, v):
    return kiln_attention.attention(q, k, v, causal=True)


def sdpa_call(q, k, v):
    # SDPA takes [batch, heads, seqlen, head_dim].
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                           is_causal=True)
    return o.transpose(1, 2)


def measure(call, q, k, v, d_o):
    """Milliseconds of the forward and the backward, the bytes each allocates beyond what exists before it,
    and the outputs (o, dq, dk, dv)."""
    for t in (q, k, v):
        t.grad = None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start.record()
    o = call(q, k, v)
    end.record()
    torch.cuda.synchronize()
    fwd_ms = start.elapsed_time(end)
    fwd_extra = torch.cuda.max_memory_allocated() - base - o.numel() * o.element_size()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    start.record()
    o.backward(d_o)
    end.record()
    torch.cuda.synchronize()
    bwd_ms = start.elapsed_time(end)
    grads = 3 * q.numel() * q.element_size()
    bwd_extra = torch.cuda.max_memory_allocated() - base - grads
    return fwd_ms, bwd_ms, fwd_extra, bwd_extra, (o.detach(), q.grad, k.grad, v.grad)


def sampled_rows_error(q, k, v, o, rows):
    """Largest |o - reference| over `rows` of every head, the reference in fp32."""
    worst = 0.0
    scale = 1.0 / math.sqrt(HEAD_DIM)
    for r in rows:
        s = torch.einsum("hd,nhd->hn", q[0, r].float(), k[0, : r + 1].float()) * scale
        ref = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), v[0, : r + 1].float())
        worst = max(worst, (o[0, r].float() - ref).abs().max().item())
    return worst


def relative(x, ref):
    return ((x.float() - ref.float()).norm() / ref.float().norm()).item()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="32768,65536,131072")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"kiln {kiln_attention.version()} | {torch.cuda.get_device_name()} | torch {torch.__version__}")
    print("| seqlen | impl | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s | fwd extra MiB | bwd extra MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    failed = False
    for n in map(int, args.seqs.split(",")):
        shape = (1, n, HEADS, HEAD_DIM)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        d_o = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        flops = 4 * HEADS * n * n * HEAD_DIM / 2
        results = {}
        for name, call in (("kiln", kiln_call), ("sdpa-fa2", sdpa_call)):
            measure(call, q, k, v, d_o)  # warm-up: module loads, allocator
            fwd_ms, bwd_ms, fwd_extra, bwd_extra, outs = measure(call, q, k, v, d_o)
            results[name] = outs
            print(f"| {n} | {name} | {fwd_ms:.1f} | {flops / fwd_ms / 1e9:.1f} | {bwd_ms:.1f} | "
                  f"{2.5 * flops / bwd_ms / 1e9:.1f} | {fwd_extra / 2**20:.1f} | {bwd_extra / 2**20:.1f} |")
        kiln, sdpa = results["kiln"], results["sdpa-fa2"]
        rows = [0, 1, n // 3, n // 2, n - 2, n - 1]
        row_error = sampled_rows_error(q.detach(), k.detach(), v.detach(), kiln[0], rows)
        sdpa_row_error = sampled_rows_error(q.detach(), k.detach(), v.detach(), sdpa[0], rows)
        rel = [relative(a, b) for a, b in zip(kiln, sdpa)]
        ok = row_error <= 2 * sdpa_row_error + 1e-3 and all(r < 2e-2 for r in rel)
        failed |= not ok
        print(f"check {n}: sampled rows |o - fp32| kiln {row_error:.2e} sdpa {sdpa_row_error:.2e}; kiln vs sdpa "
              f"relative o {rel[0]:.2e} dq {rel[1]:.2e} dk {rel[2]:.2e} dv {rel[3]:.2e}: {'ok' if ok else 'FAIL'}")
        del q, k, v, d_o, results, kiln, sdpa
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
