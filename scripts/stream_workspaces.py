"""The split forward's kept workspaces (kiln-runtime `StreamWorkspaces`) on the GPU machine:
calls of growing and shrinking needs back to back on one stream, then alternating over two
streams at once, then one captured into a CUDA graph (which allocates its own) and replayed
after calls that grow its stream's kept memory, then over 20 streams (past the 16 that keep
memory); each O and LSE poisoned (NaN) first and O checked against an fp32 SDPA (compare.py's
`err`); exits 1 on any error above 1e-2 or unwritten element:

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
worst, bad, calls = 0.0, 0, 0


def poison():
    for c in cases:
        c[3].fill_(float("nan"))
        c[4].fill_(float("nan"))
    torch.cuda.synchronize()


def check(which):
    global worst, bad, calls
    torch.cuda.synchronize()
    for (_, _, _, o, lse, ref) in (cases[i] for i in which):
        written = bool(torch.isfinite(o).all() and torch.isfinite(lse).all())
        e = err(o, ref) if written else float("inf")
        worst = max(worst, e)
        bad += e > 1e-2
        calls += 1


def run_over(streams):
    """Every case, and more calls than cases where there are more streams, over `streams`."""
    poison()
    for i in range(max(len(cases), len(streams))):
        q, k, v, o, lse, _ = cases[i % len(cases)]
        with torch.cuda.stream(streams[i % len(streams)]):
            kc.forward(lib, q, k, v, o, lse)
    check(range(len(cases)))


# The current stream alone, then alternating over 2, unsynchronised.
run_over([torch.cuda.current_stream()])
run_over([torch.cuda.Stream() for _ in range(2)])
# Captured: a graph of the smallest call, replayed after calls that grow the capturing stream's
# kept memory (the 4th stream, within the 16 that keep memory).
side = torch.cuda.Stream()
small = cases[0]
with torch.cuda.stream(side):
    kc.forward(lib, *small[:5])  # warm: modules loaded before the capture
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph, stream=side):
    kc.forward(lib, *small[:5])
for _ in range(2):
    poison()
    with torch.cuda.stream(side):
        for q, k, v, o, lse, _ in cases[1:]:
            kc.forward(lib, q, k, v, o, lse)
    graph.replay()
    check(range(len(cases)))
# Over 20 streams: the first 12 of them keep memory, the rest allocate their own.
run_over([torch.cuda.Stream() for _ in range(20)])
print(f"stream workspaces: {calls} calls checked, worst error {worst:.1e}, {bad} bad")
sys.exit(1 if bad else 0)
