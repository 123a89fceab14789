"""kiln's fused backward (KILN_FLAG_FUSED_BACKWARD) on the GPU machine, beside its split backward and
PyTorch SDPA's FlashAttention-2 and cuDNN backwards, in one process, through the C interface.

    python3 scripts/fused_backward.py --lib libkiln_kernels.so --bench ../shared/bench [--seqs 4096]

compare.py times the split backward only (it passes no flags); this runs its own correctness check
(`check_kiln`, imported) with the flag set, then times the four backwards at the FlashAttention
benchmark setup (batch = 16384 / seqlen, heads = 2048 / head_dim), with compare.py's `bench_ms` and
FLOP convention. It also runs the fused backward twice on the same inputs and reports whether dQ
came out bitwise the same (it may not: its atomic adds land in any order) and whether dK and dV
did (they must: each is written by one program). Rows go to fused_backward.json under --out.
"""
import argparse
import functools
import json
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--bench", required=True, help="the directory of compare.py and kiln_ctypes.py")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--seqs", default="1024,2048,4096,8192,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--rep", type=int, default=30, help="timed samples per measurement")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.bench))
    import compare  # noqa: E402
    import kiln_ctypes as kc  # noqa: E402

    compare.REP = a.rep

    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    lib = kc.load(a.lib)
    fused = dict(flags=kc.KILN_FLAG_FUSED_BACKWARD)
    os.makedirs(a.out, exist_ok=True)
    print(lib.kiln_version().decode(), "|", torch.cuda.get_device_name(), "| torch", torch.__version__, flush=True)
    rows, checks = [], []

    def save():
        with open(os.path.join(a.out, "fused_backward.json"), "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), dtype=a.dtype, checks=checks, rows=rows), f, indent=1)

    for D in [int(d) for d in a.head_dims.split(",")]:
        for causal in (False, True):
            torch.manual_seed(100 * D + causal + 7)
            # compare.py's check, its backward calls carrying the flag.
            split_backward = kc.backward
            kc.backward = functools.partial(split_backward, **fused)
            try:
                ok, errs, sdpa_errs = compare.check_kiln(lib, causal, D, dtype)
            finally:
                kc.backward = split_backward
            checks.append(dict(D=D, causal=causal, ok=ok, kiln=errs, sdpa=sdpa_errs))
            save()
            print(f"check fused D={D} causal={int(causal)}: kiln "
                  + " ".join(f"{n} {x:.1e}" for n, x in errs.items())
                  + " | sdpa " + " ".join(f"{n} {x:.1e}" for n, x in sdpa_errs.items())
                  + ("" if ok else "  WRONG: not timed"), flush=True)
            if not ok:
                continue
            for N in [int(n) for n in a.seqs.split(",")]:
                B, H = 16384 // N, 2048 // D
                torch.manual_seed(N)
                q, k, v, do = [torch.randn(B, N, H, D, device="cuda", dtype=dtype) for _ in range(4)]
                flops = 2.5 * 4.0 * B * H * N * N * D / (2 if causal else 1)
                res = dict(D=D, causal=causal, N=N)
                qt, kt, vt, dot = [t.transpose(1, 2).contiguous() for t in (q, k, v, do)]
                for name, be in (("fa2", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
                    try:
                        with sdpa_kernel(be):
                            qq, kk, vv = [t.detach().requires_grad_() for t in (qt, kt, vt)]
                            out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
                            res[name] = flops / compare.bench_ms(
                                lambda: torch.autograd.grad(out, (qq, kk, vv), dot, retain_graph=True)) / 1e9
                    except Exception as e:  # noqa: BLE001
                        print(f"{name} D={D} N={N}: {type(e).__name__}", flush=True)
                o = torch.empty_like(q)
                lse = torch.empty((B, H, N), device="cuda")
                kc.forward(lib, q, k, v, o, lse, causal=causal)
                grads = [[torch.full_like(t, float("nan")) for t in (q, k, v)] for _ in range(2)]
                for name, kw in (("split", {}), ("fused", fused)):
                    call = kc.backward_call(lib, q, k, v, o, lse, do, *grads[0], causal=causal, **kw)
                    res[name] = flops / compare.bench_ms(call) / 1e9
                kc.backward(lib, q, k, v, o, lse, do, *grads[1], causal=causal, **fused)
                torch.cuda.synchronize()
                # grads[0] holds the last timed fused run: the same inputs, a different schedule.
                res["dq_bitwise"], res["dk_bitwise"], res["dv_bitwise"] = [
                    bool(torch.equal(x, y)) for x, y in zip(*grads)]
                rows.append(res)
                save()
                cudnn = res.get("cudnn", float("nan"))
                print(f"D={D:3d} causal={int(causal)} N={N:5d} | bwd fused {res['fused']:6.1f} split {res['split']:6.1f}"
                      f" fa2 {res.get('fa2', 0):6.1f} cudnn {cudnn:6.1f} | fused/cudnn {res['fused'] / cudnn:5.2f}"
                      f" fused/fa2 {res['fused'] / res.get('fa2', float('nan')):5.2f} | bitwise dq {int(res['dq_bitwise'])}"
                      f" dk {int(res['dk_bitwise'])} dv {int(res['dv_bitwise'])}  (TFLOP/s)", flush=True)
                del q, k, v, do, qt, kt, vt, dot, grads
                torch.cuda.empty_cache()
    save()


if __name__ == "__main__":
    main()
