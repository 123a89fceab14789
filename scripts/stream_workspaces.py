"""The split forward's kept workspaces (kiln-runtime `StreamWorkspaces`) on the GPU machine:
calls of growing and shrinking needs back to back on one stream, then alternating over two
streams at once, each O and LSE poisoned (NaN) first and O checked against an fp32 SDPA
(compare.py's `err`); exits 1 on any error above 1e-2 or unwritten element:

    python3 scripts/stream_workspaces.py --bench ../shared/bench libkiln_kernels.so
    compute-sanitizer --tool memcheck python3 scripts/stream_workspaces.py --bench ... lib.so
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--bench", required=True, help="the folder of compare.py and kiln_ctypes.py")
ap.add_argument("lib")
a = ap.parse_args()
sys.path.insert(0, os.path.abspath(a.bench))
import kiln_ctypes as kc  # noqa: E402
from compare import err  # noqa: E402

lib = kc.load(a.lib)
# B, Nq, Nk, heads q, heads kv, D: each one splits; their workspaces differ in size.
SHAPES = [(1, 1, 4096, 16, 16, 64), (2, 8, 32768, 16, 16, 128), (1, 1, 9000, 32, 8, 128),
          (1, 64, 65536, 16, 16, 128)]


def case(shape, seed):
    """Inputs, poisoned outputs and the fp32 reference of one call."""
    torch.manual_seed(seed)
    B, Nq, Nk, Hq, Hkv, D = shape
    q = torch.randn(B, Nq, Hq, D, device="cuda", dtype=torch.bfloat16)
    k, v = [torch.randn(B, Nk, Hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    o = torch.full_like(q, float("nan"))
    lse = torch.full((B, Hq, Nq), float("nan"), device="cuda")
    qt, kt, vt = (x.transpose(1, 2).float() for x in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=Hq != Hkv).transpose(1, 2)
    return q, k, v, o, lse, ref


cases = [case(SHAPES[i % len(SHAPES)], i) for i in range(16)]
streams = [torch.cuda.Stream(), torch.cuda.Stream()]
worst, bad = 0.0, 0
# Round 0 on the current stream alone, rounds 1-2 alternating over two streams, unsynchronised.
for rnd in range(3):
    for c in cases:
        c[3].fill_(float("nan"))
        c[4].fill_(float("nan"))
    torch.cuda.synchronize()
    for i, (q, k, v, o, lse, _) in enumerate(cases):
        with torch.cuda.stream(streams[i % 2] if rnd > 0 else torch.cuda.current_stream()):
            kc.forward(lib, q, k, v, o, lse)
    torch.cuda.synchronize()
    for (_, _, _, o, lse, ref) in cases:
        written = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
        e = err(o, ref) if written else float("inf")
        worst = max(worst, e)
        bad += e > 1e-2
print(f"stream workspaces: {3 * len(cases)} calls, worst error {worst:.1e}, {bad} bad")
sys.exit(1 if bad else 0)
