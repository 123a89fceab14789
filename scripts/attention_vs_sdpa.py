#!/usr/bin/env python3
"""Judges kiln's attention on the GPU against an fp32 reference and PyTorch SDPA. Runs on the GPU
machine (PyTorch with CUDA), after `kiln-attention-gpu` (built from
`runtime/tests/attention_gpu.rs`; `scripts/device-attention.sh` stages and runs both). Timing
beside SDPA is `../shared/bench/compare.py`'s, through kiln's C interface.

    python3 attention_vs_sdpa.py check DIR [--json FILE]
        DIR holds one folder per case from `kiln-attention-gpu --check DIR`: case.json and raw
        little-endian q, k, v, do (inputs) and o, lse, dq, dk, dv (kiln's outputs). Per case: the
        fp32 reference (computed in chunks of query rows, so that seqlen 16k fits), PyTorch SDPA
        in the inputs' dtype on the same inputs (bottom-right causal mask), and the worst-row
        relative error of each output against the reference. kiln passes a case where each of O,
        dQ, dK, dV is at most twice as far from the reference as SDPA (+1e-3), LSE is within 1e-2
        with -inf exactly where the reference has it, and no element is left unwritten (NaN
        poison). Prints a table; exits 1 if any case fails.
    python3 attention_vs_sdpa.py selftest
        Checks the case reader and the table on a fake case folder (no GPU, no PyTorch needed).

`err`, the autograd `reference` and `sdpa_same_dtype` are copied from
`../shared/bench/compare.py` (the project's benchmark), so that both judge kiln alike; here the
last two take the case's softmax scale (compare.py runs the default one only).
"""
import argparse
import json
import math
import os
import sys
import tempfile

ELEMENT_BYTES = {"f16": 2, "bf16": 2, "f32": 4}
# compare.py's fixed tolerances: used only where SDPA gives no usable (finite) baseline.
TOL = {"bf16": 2e-2, "f16": 5e-3}
OUTPUTS = ("o", "dq", "dk", "dv")
# Below this many score elements per case, the chunked reference is also checked against
# compare.py's autograd reference (which holds the whole score matrix).
AUTOGRAD_CHECK_ELEMENTS = 64 << 20


# ---- case folders (plain Python: `selftest` runs it without PyTorch) ----

def tensor_shapes(meta):
    """Shape and dtype of every file of a case: tensors [batch, seqlen, heads, head_dim],
    LSE [batch, heads_q, seqlen_q] f32."""
    b, nq, nk = meta["batch"], meta["seqlen_q"], meta["seqlen_k"]
    hq, hkv, d, dt = meta["heads_q"], meta["heads_kv"], meta["head_dim"], meta["dtype"]
    q, kv = (b, nq, hq, d), (b, nk, hkv, d)
    return {"q": (q, dt), "k": (kv, dt), "v": (kv, dt), "do": (q, dt), "o": (q, dt),
            "lse": ((b, hq, nq), "f32"), "dq": (q, dt), "dk": (kv, dt), "dv": (kv, dt)}


def read_cases(root):
    """The cases under `root`, sorted by name: (folder, case.json, problem or None). A case the
    binary could not run carries its `error`; a file of the wrong size is a problem."""
    cases = []
    for name in sorted(os.listdir(root)):
        folder = os.path.join(root, name)
        path = os.path.join(folder, "case.json")
        if not os.path.isfile(path):
            continue
        with open(path) as f:
            meta = json.load(f)
        problem = meta.get("error")
        if problem is None:
            for key, (shape, dt) in tensor_shapes(meta).items():
                file = os.path.join(folder, meta["files"][key])
                want = math.prod(shape) * ELEMENT_BYTES[dt]
                got = os.path.getsize(file) if os.path.isfile(file) else None
                if got != want:
                    problem = f"{key}: expected {want} bytes, found {got}"
                    break
        cases.append((folder, meta, problem))
    if not cases:
        raise SystemExit(f"no case.json under {root}")
    return cases


def passes(kiln, sdpa, lse_err, unwritten):
    """kiln's bar: each output at most twice SDPA's error (+1e-3), LSE within 1e-2 (inf where
    its -inf rows differ from the reference's), every element written."""
    return (unwritten == 0 and lse_err < 1e-2
            and all(kiln[n] <= 2 * sdpa[n] + 1e-3 for n in OUTPUTS))


def check_table(rows):
    """The check's table as text: kiln's and SDPA's worst-row errors per output."""
    head = (f"{'case':44} " + " ".join(f"{n + ' kiln/sdpa':>19}" for n in OUTPUTS)
            + f" {'lse':>8} {'unwritten':>9}  result")
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['name']:44} FAILED: {r['error']}")
            continue
        cells = " ".join(f"{r['kiln'][n]:9.2e}/{r['sdpa'][n]:9.2e}" for n in OUTPUTS)
        note = " (sdpa: " + ", ".join(r["notes"]) + ")" if r["notes"] else ""
        lines.append(f"{r['name']:44} {cells} {r['lse']:8.1e} {r['unwritten']:9d}  "
                     f"{'ok' if r['ok'] else 'FAILED'}{note}")
    return "\n".join(lines)


# ---- copied from ../shared/bench/compare.py ----

def err(x, ref):
    """Worst row's relative error (a single wrong row must not hide in a global norm); inf on NaN."""
    x, ref = x.float(), ref.float()
    if not torch.isfinite(x).all():
        return float("inf")
    d = (x - ref).flatten(0, -2).norm(dim=-1)
    r = ref.flatten(0, -2).norm(dim=-1)
    scale = r.mean().clamp_min(1e-30)  # rows near zero are judged against a typical row
    return (d / torch.maximum(r, scale)).max().item()


def reference(q, k, v, do, causal, scale):
    """fp32 autograd reference. q: [B, Nq, Hq, D]; k, v: [B, Nk, Hkv, D]. Returns o, lse, dq, dk, dv."""
    qf, kf, vf = [t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    rep = qf.shape[1] // kf.shape[1]
    kk, vv = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    s = qf @ kk.transpose(-1, -2) * scale
    if causal:
        nq, nk = s.shape[-2], s.shape[-1]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)
    o = p @ vv
    o.backward(do.float().transpose(1, 2))
    return o.transpose(1, 2), lse, qf.grad.transpose(1, 2), kf.grad.transpose(1, 2), vf.grad.transpose(1, 2)


def sdpa_same_dtype(q, k, v, do, causal, scale):
    """PyTorch SDPA in the inputs' own dtype (the error level kiln is held to): o, dq, dk, dv."""
    from torch.nn.attention.bias import causal_lower_right
    rep = q.shape[2] // k.shape[2]
    qq = q.detach().transpose(1, 2).requires_grad_()
    kk = k.detach().transpose(1, 2).requires_grad_()
    vv = v.detach().transpose(1, 2).requires_grad_()
    mask = causal_lower_right(q.shape[1], k.shape[1]) if causal else None
    o = F.scaled_dot_product_attention(qq, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1), attn_mask=mask,
                                       scale=scale)
    dq, dk, dv = torch.autograd.grad(o, (qq, kk, vv), do.transpose(1, 2))
    return [t.transpose(1, 2) for t in (o, dq, dk, dv)]


def chunked_reference(q, k, v, do, causal, scale, rows=4096):
    """The fp32 reference of `reference`, one query head and `rows` query rows at a time (so that
    seqlen 16k needs no [heads, 16k, 16k] score tensor), with the gradients written out:
    dS = P (dP - rowsum(dO O)), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO.
    Returns o, lse, dq, dk, dv in the layouts of the inputs, fp32."""
    B, Nq, Hq, D = q.shape
    Nk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    f32 = dict(dtype=torch.float32, device=q.device)
    o, dq = torch.empty(B, Nq, Hq, D, **f32), torch.empty(B, Nq, Hq, D, **f32)
    dk, dv = torch.zeros(B, Nk, Hkv, D, **f32), torch.zeros(B, Nk, Hkv, D, **f32)
    lse = torch.empty(B, Hq, Nq, **f32)
    keys = torch.arange(Nk, device=q.device)[None, :]
    for b in range(B):
        for h in range(Hq):
            g = h // group
            kh, vh = k[b, :, g].float(), v[b, :, g].float()
            for r0 in range(0, Nq, rows):
                r1 = min(Nq, r0 + rows)
                qc, doc = q[b, r0:r1, h].float(), do[b, r0:r1, h].float()
                s = (qc @ kh.T) * scale
                if causal:
                    i = torch.arange(r0, r1, device=q.device)[:, None]
                    s.masked_fill_(keys > i + (Nk - Nq), float("-inf"))
                m = torch.logsumexp(s, -1)
                p = torch.exp(s - m[:, None]).nan_to_num(0.0)  # a row that sees no key: P = 0
                oc = p @ vh
                ds = p * (doc @ vh.T - (doc * oc).sum(-1, keepdim=True))
                o[b, r0:r1, h], lse[b, h, r0:r1] = oc, m
                dq[b, r0:r1, h] = (ds @ kh) * scale
                dk[b, :, g] += (ds.T @ qc) * scale
                dv[b, :, g] += p.T @ doc
                del s, p, ds
    return o, lse, dq, dk, dv


def load(folder, meta, key, shape, dt):
    dtype = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[dt]
    with open(os.path.join(folder, meta["files"][key]), "rb") as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=dtype).reshape(shape).cuda()


def check_case(folder, meta):
    t = {key: load(folder, meta, key, shape, dt) for key, (shape, dt) in tensor_shapes(meta).items()}
    q, k, v, do, causal = t["q"], t["k"], t["v"], t["do"], meta["causal"]
    scale = meta["softmax_scale"]
    ro, rlse, rdq, rdk, rdv = chunked_reference(q, k, v, do, causal, scale)
    ref = {"o": ro, "dq": rdq, "dk": rdk, "dv": rdv}
    row = dict(name=meta["name"], notes=[])
    b, hq, nq, nk = meta["batch"], meta["heads_q"], meta["seqlen_q"], meta["seqlen_k"]
    if b * hq * nq * nk <= AUTOGRAD_CHECK_ELEMENTS:
        # The chunked reference against compare.py's own, where that one fits.
        ao, alse, adq, adk, adv = reference(q, k, v, do, causal, scale)
        worst = max(err(x, a) for x, a in zip((ro, rdq, rdk, rdv), (ao, adq, adk, adv)))
        fin = torch.isfinite(alse)
        if not torch.equal(fin, torch.isfinite(rlse)):
            worst = float("inf")
        elif fin.any():
            worst = max(worst, (alse[fin] - rlse[fin]).abs().max().item())
        row["reference_vs_autograd"] = worst
        del ao, alse, adq, adk, adv
    lse = t["lse"]
    row["unwritten"] = int(sum(torch.isnan(t[n]).sum().item() for n in OUTPUTS) + torch.isnan(lse).sum().item())
    fin = torch.isfinite(rlse)
    lse_ok = torch.equal(fin, torch.isfinite(lse)) and torch.equal(lse[~fin], rlse[~fin])
    row["lse"] = (lse[fin] - rlse[fin]).abs().max().item() if lse_ok and fin.any() else (0.0 if lse_ok else float("inf"))
    row["kiln"] = {n: err(t[n], ref[n]) for n in OUTPUTS}
    try:
        sdpa = dict(zip(OUTPUTS, sdpa_same_dtype(q, k, v, do, causal, scale)))
    except Exception as e:  # noqa: BLE001
        row["notes"].append(f"unavailable: {type(e).__name__}")
        sdpa = {}
    row["sdpa"] = {}
    for n in OUTPUTS:
        e = err(sdpa[n], ref[n]) if n in sdpa else float("inf")
        if not math.isfinite(e):
            row["notes"].append(f"{n} not finite, fixed {TOL[meta['dtype']] / 2:.0e}")
            e = TOL[meta["dtype"]] / 2  # no usable baseline: compare.py's fixed tolerance
        row["sdpa"][n] = e
    row["ok"] = passes(row["kiln"], row["sdpa"], row["lse"], row["unwritten"])
    return row


def check(args):
    rows = []
    for folder, meta, problem in read_cases(args.dir):
        if problem is not None:
            rows.append(dict(name=meta["name"], error=problem, ok=False))
            continue
        try:
            rows.append(check_case(folder, meta))
        except Exception as e:  # noqa: BLE001
            rows.append(dict(name=meta["name"], error=f"{type(e).__name__}: {e}", ok=False))
        torch.cuda.empty_cache()
        r = rows[-1]
        extra = (f" (chunked vs autograd reference {r['reference_vs_autograd']:.1e})"
                 if "reference_vs_autograd" in r else "")
        print(f"judged {r['name']}{extra}", file=sys.stderr, flush=True)
    print(check_table(rows))
    bad = [r for r in rows if not r["ok"]]
    agree = [r["reference_vs_autograd"] for r in rows if "reference_vs_autograd" in r]
    if agree and max(agree) > 1e-4:
        print(f"the chunked reference differs from compare.py's autograd one by {max(agree):.1e}")
        bad.append("reference")
    failed = len([r for r in rows if not r["ok"]])
    print(f"{len(rows) - failed} passed, {failed} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows), f, indent=1)
    return 1 if bad else 0


# ---- timing ----

def selftest(_args):
    """The case reader, the bar and the table on fake data: no GPU, no PyTorch."""
    with tempfile.TemporaryDirectory() as root:
        meta = dict(name="bf16_d64_causal_b2_q3_k5_h4x2", dtype="bf16", batch=2, seqlen_q=3, seqlen_k=5,
                    heads_q=4, heads_kv=2, head_dim=64, causal=True, softmax_scale=0.125,
                    files={k: f"{k}.bin" for k in ("q", "k", "v", "do", "o", "lse", "dq", "dk", "dv")})
        os.makedirs(os.path.join(root, meta["name"]))
        for key, (shape, dt) in tensor_shapes(meta).items():
            with open(os.path.join(root, meta["name"], f"{key}.bin"), "wb") as f:
                f.write(bytes(math.prod(shape) * ELEMENT_BYTES[dt]))
        with open(os.path.join(root, meta["name"], "case.json"), "w") as f:
            json.dump(meta, f)
        os.makedirs(os.path.join(root, "failed"))
        with open(os.path.join(root, "failed", "case.json"), "w") as f:
            json.dump(dict(meta, name="failed", error="no PTX for attention_fwd_f16_d256_sm_90a"), f)
        short = dict(meta, name="short")
        os.makedirs(os.path.join(root, "short"))
        with open(os.path.join(root, "short", "case.json"), "w") as f:
            json.dump(short, f)
        cases = read_cases(root)
        assert [m["name"] for _, m, _ in cases] == [meta["name"], "failed", "short"], cases
        assert cases[0][2] is None, cases[0]
        assert cases[1][2].startswith("no PTX"), cases[1]
        assert cases[2][2] == "q: expected 3072 bytes, found None", cases[2]
        assert tensor_shapes(meta)["lse"] == ((2, 4, 3), "f32")
        assert tensor_shapes(meta)["dk"] == ((2, 5, 2, 64), "bf16")
    sdpa = dict(o=1e-3, dq=2e-3, dk=2e-3, dv=1e-3)
    assert passes(dict(o=3e-3, dq=5e-3, dk=5e-3, dv=3e-3), sdpa, 5e-3, 0)
    assert not passes(dict(o=3.1e-3, dq=5e-3, dk=5e-3, dv=3e-3), sdpa, 5e-3, 0)
    assert not passes(dict(sdpa), sdpa, 1e-2, 0)
    assert not passes(dict(sdpa), sdpa, 0.0, 1)
    assert not passes(dict(sdpa, dv=float("inf")), sdpa, 0.0, 0)
    rows = [dict(name="a", kiln=sdpa, sdpa=sdpa, lse=1e-6, unwritten=0, ok=True, notes=[]),
            dict(name="b", kiln=dict(sdpa, o=float("inf")), sdpa=sdpa, lse=float("inf"), unwritten=7, ok=False,
                 notes=["o not finite, fixed 1e-02"]),
            dict(name="c", error="no PTX", ok=False)]
    table = check_table(rows)
    assert "FAILED: no PTX" in table and "inf" in table and "fixed 1e-02" in table, table
    print(table)
    print("selftest: 1 passed, 0 failed")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("--json")
    sub.add_parser("selftest")
    args = ap.parse_args()
    if args.command == "selftest":
        return selftest(args)
    global torch, F
    import torch
    import torch.nn.functional as F
    # The reference is fp32: no TF32 in its matrix products.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return check(args)


if __name__ == "__main__":
    sys.exit(main())
