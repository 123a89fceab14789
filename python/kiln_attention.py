"""PyTorch binding of kiln's prebuilt FlashAttention kernels through their C interface (ctypes, no build step).

    from kiln_attention import attention
    o = attention(q, k, v, causal=True)  # [batch, seqlen, heads, head_dim]; k and v may have fewer heads (GQA)

The library, libkiln_kernels.so (`cargo build --release -p kiln-kernels`), is the one given to `load(path)`, else
$KILN_LIB, else target/release/libkiln_kernels.so in this repository. The ctypes structures follow the C
interface's contract (c-abi.md) field for field and import without PyTorch; the rest needs it.
`python3 python/kiln_attention.py` on a GPU machine checks kiln against an fp32 reference and PyTorch's SDPA.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
from pathlib import Path

try:
    import torch
    from torch.autograd.function import Function, once_differentiable
except ImportError:  # the structures and load() work without PyTorch; attention() says what is missing
    torch = None
    Function, once_differentiable = object, lambda f: f

__all__ = ["KilnAttnConfig", "KilnTensor", "KilnAttnFwdArgs", "KilnAttnBwdArgs", "KilnError", "STATUS_NAMES",
           "load", "version", "attention"]

KILN_F16, KILN_BF16 = 0, 1
KILN_FLAG_FUSED_BACKWARD = 1
STATUS_NAMES = {0: "KILN_OK", 1: "KILN_INVALID_ARGUMENT", 2: "KILN_UNSUPPORTED", 3: "KILN_CUDA_ERROR",
                4: "KILN_INTERNAL"}
DEFAULT_LIBRARY = Path(__file__).resolve().parent.parent / "target" / "release" / "libkiln_kernels.so"
_i32, _f32 = ctypes.c_int32, ctypes.c_float
_FLOAT_P = ctypes.POINTER(_f32)


class KilnAttnConfig(ctypes.Structure):
    """`kiln_attn_config`: what to compute (72 bytes, no padding)."""
    _fields_ = [("dtype", _i32), ("batch", _i32), ("seqlen_q", _i32), ("seqlen_k", _i32), ("heads_q", _i32),
                ("heads_kv", _i32), ("head_dim", _i32), ("causal", _i32), ("window_left", _i32),
                ("window_right", _i32), ("softmax_scale", _f32), ("softcap", _f32), ("dropout_p", _f32),
                ("flags", ctypes.c_uint32), ("rng_seed", ctypes.c_uint64), ("rng_offset", ctypes.c_uint64)]


class KilnTensor(ctypes.Structure):
    """`kiln_tensor`: a [batch, seqlen, heads, head_dim] tensor in device memory; strides count elements."""
    _fields_ = [("data", ctypes.c_void_p), ("batch_stride", ctypes.c_int64), ("seq_stride", ctypes.c_int64),
                ("head_stride", ctypes.c_int64)]


class KilnAttnFwdArgs(ctypes.Structure):
    """`kiln_attn_fwd_args`."""
    _fields_ = [("cfg", KilnAttnConfig), ("q", KilnTensor), ("k", KilnTensor), ("v", KilnTensor),
                ("o", KilnTensor), ("lse", _FLOAT_P)]


class KilnAttnBwdArgs(ctypes.Structure):
    """`kiln_attn_bwd_args`."""
    _fields_ = [("cfg", KilnAttnConfig), ("q", KilnTensor), ("k", KilnTensor), ("v", KilnTensor),
                ("o", KilnTensor), ("d_o", KilnTensor), ("lse", _FLOAT_P), ("dq", KilnTensor),
                ("dk", KilnTensor), ("dv", KilnTensor), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_size_t)]


_SIZES = tuple(map(ctypes.sizeof, (KilnAttnConfig, KilnTensor, KilnAttnFwdArgs, KilnAttnBwdArgs)))
assert _SIZES == (72, 32, 208, 352), f"ctypes structure sizes {_SIZES} differ from the C interface's"

_SIGNATURES = {
    "kiln_attn_fwd": ([ctypes.POINTER(KilnAttnFwdArgs), ctypes.c_void_p], _i32),
    "kiln_attn_bwd": ([ctypes.POINTER(KilnAttnBwdArgs), ctypes.c_void_p], _i32),
    "kiln_attn_bwd_workspace_bytes": ([ctypes.POINTER(KilnAttnConfig)], ctypes.c_size_t),
    "kiln_last_error": ([], ctypes.c_char_p),
    "kiln_version": ([], ctypes.c_char_p),
}
_lib: ctypes.CDLL | None = None


class KilnError(RuntimeError):
    """A kiln call returned a non-zero status: `status` (int), `name` (KILN_...), `message` (kiln_last_error())."""

    def __init__(self, status: int, message: str):
        super().__init__(status, message)
        self.status, self.message = status, message
        self.name = STATUS_NAMES.get(status, f"unknown status {status}")

    def __str__(self) -> str:
        return f"{self.name}: {self.message or '(no message)'}"


def load(path: str | os.PathLike | None = None) -> ctypes.CDLL:
    """Load libkiln_kernels.so for every later call and return it: `path`, else $KILN_LIB, else the repository's
    target/release/libkiln_kernels.so. A bare file name (no directory) is the dynamic loader's to find, on
    LD_LIBRARY_PATH and the system's paths."""
    global _lib
    if path is not None:
        source = "load(path)"
    elif os.environ.get("KILN_LIB"):
        path, source = os.environ["KILN_LIB"], "$KILN_LIB"
    else:
        path, source = DEFAULT_LIBRARY, "the default location"
    def not_kiln(error: Exception) -> OSError:
        return OSError(f"{path} (from {source}) is not a kiln library with the C interface: {error}")

    bare = os.sep not in str(path)
    if not bare and not Path(path).is_file():
        raise FileNotFoundError(f"kiln library not found: {path} (from {source}). Build it with `cargo build "
                                "--release -p kiln-kernels`, set KILN_LIB, or call kiln_attention.load(path).")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as error:
        if bare:
            raise FileNotFoundError(f"kiln library {path} (from {source}) not found by the dynamic loader: "
                                    f"{error}") from error
        raise not_kiln(error) from error
    try:
        for name, (argtypes, restype) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes, function.restype = argtypes, restype
    except (OSError, AttributeError) as error:
        raise not_kiln(error) from error
    _lib = lib
    return lib


def _library() -> ctypes.CDLL:
    return _lib if _lib is not None else load()


def version() -> str:
    """kiln_version(): the library's version and the kernels, dtypes, head dims and archs it was built with."""
    return _library().kiln_version().decode()


def _check(lib: ctypes.CDLL, status: int) -> None:
    if status != 0:
        raise KilnError(status, (lib.kiln_last_error() or b"").decode(errors="replace"))


def _validate(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float | None) -> float:
    """Raise ValueError naming the argument for what Python can check; return the softmax scale."""
    if torch is None:
        raise ImportError("kiln_attention.attention needs PyTorch, which could not be imported")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-d [batch, seqlen, heads, head_dim] tensor, got {got}")
        if t.dtype not in (torch.float16, torch.bfloat16) or not t.is_cuda:
            raise ValueError(f"{name} must be a float16 or bfloat16 CUDA tensor, got {t.dtype} on {t.device}")
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, but q is {q.dtype} on {q.device}")
        if t.numel() == 0 or max(t.shape) >= 2**31:
            raise ValueError(f"{name} must have sizes in 1..2**31-1, got {tuple(t.shape)}")
    batch, _, heads_q, head_dim = q.shape
    if k.shape[0] != batch or k.shape[3] != head_dim:
        raise ValueError(f"k must have q's batch {batch} and head_dim {head_dim}, got {tuple(k.shape)}")
    if v.shape != k.shape:
        raise ValueError(f"v must have k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if heads_q % k.shape[2]:
        raise ValueError(f"k: q's {heads_q} heads are not a multiple of k's {k.shape[2]}")
    if head_dim % 8:
        raise ValueError(f"q: head_dim must be a multiple of 8, got {head_dim}")
    scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return scale


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """Batch, seq and head strides; a size-1 dimension's stride (arbitrary in PyTorch) becomes 0 if it is off."""
    return tuple(0 if t.shape[d] == 1 and t.stride(d) % 8 else t.stride(d) for d in range(3))


def _kiln_layout(t: torch.Tensor) -> torch.Tensor:
    """`t` if the C interface takes it (head_dim stride 1, strides multiples of 8, 16-byte aligned), else a copy."""
    if t.stride(3) == 1 and t.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in _strides(t)):
        return t
    return t.clone(memory_format=torch.contiguous_format)  # clone: .contiguous() keeps a misaligned view


def _tensor(t: torch.Tensor) -> KilnTensor:
    return KilnTensor(t.data_ptr(), *_strides(t))


def _stream(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream(t.device).cuda_stream)


def _config(q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, flags: int) -> KilnAttnConfig:
    batch, seqlen_q, heads_q, head_dim = q.shape
    return KilnAttnConfig(dtype=KILN_BF16 if q.dtype == torch.bfloat16 else KILN_F16, batch=batch,
                          seqlen_q=seqlen_q, seqlen_k=k.shape[1], heads_q=heads_q, heads_kv=k.shape[2],
                          head_dim=head_dim, causal=int(causal), window_left=-1, window_right=-1,
                          softmax_scale=scale, flags=flags)


def _forward(lib: ctypes.CDLL, cfg: KilnAttnConfig, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """kiln_attn_fwd on inputs in kiln's layout: o (a new tensor shaped like q) and lse (float32)."""
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((cfg.batch, cfg.heads_q, cfg.seqlen_q), dtype=torch.float32, device=q.device)
    lse_p = ctypes.cast(lse.data_ptr(), _FLOAT_P)
    args = KilnAttnFwdArgs(cfg, _tensor(q), _tensor(k), _tensor(v), _tensor(o), lse_p)
    _check(lib, lib.kiln_attn_fwd(ctypes.byref(args), _stream(q)))
    return o, lse


class _KilnAttention(Function):
    """Forward through kiln_attn_fwd, saving o and lse; backward through kiln_attn_bwd."""

    @staticmethod
    def forward(ctx, q, k, v, causal: bool, scale: float, flags: int):
        with torch.cuda.device(q.device):
            q, k, v = (_kiln_layout(t) for t in (q, k, v))
            ctx.lib, ctx.cfg = _library(), _config(q, k, causal, scale, flags)
            o, lse = _forward(ctx.lib, ctx.cfg, q, k, v)
        ctx.save_for_backward(q, k, v, o, lse)
        return o

    @staticmethod
    @once_differentiable
    def backward(ctx, d_o):
        q, k, v, o, lse = ctx.saved_tensors
        lib, cfg = ctx.lib, ctx.cfg
        with torch.cuda.device(q.device):
            d_o = _kiln_layout(d_o.to(o.dtype))
            dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
            nbytes = lib.kiln_attn_bwd_workspace_bytes(ctypes.byref(cfg))
            if nbytes == 0:  # the config is invalid: raise KILN_INVALID_ARGUMENT with kiln's message
                _check(lib, 1)
            workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device)
            lse_p = ctypes.cast(lse.data_ptr(), _FLOAT_P)
            args = KilnAttnBwdArgs(cfg, _tensor(q), _tensor(k), _tensor(v), _tensor(o), _tensor(d_o), lse_p,
                                   _tensor(dq), _tensor(dk), _tensor(dv), workspace.data_ptr(), nbytes)
            _check(lib, lib.kiln_attn_bwd(ctypes.byref(args), _stream(q)))
        return dq, dk, dv, None, None, None


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              softmax_scale: float | None = None, deterministic: bool = True) -> torch.Tensor:
    """Differentiable attention through kiln's kernels; returns o shaped like q.

    q is [batch, seqlen_q, heads_q, head_dim], k and v [batch, seqlen_k, heads_kv, head_dim] (heads_q a multiple
    of heads_kv: GQA/MQA), all float16 or all bfloat16 on one CUDA device. `causal` aligns the mask bottom-right:
    row i sees key j iff j <= i + seqlen_k - seqlen_q; a row that sees no key gives 0. `softmax_scale` defaults
    to 1/sqrt(head_dim). `deterministic=False` runs the fused backward (KILN_FLAG_FUSED_BACKWARD: dQ summed by
    atomic adds, so its last bits may vary from run to run); the default split backward gives the same bits on
    every run. Inputs the C interface cannot take as they are (strides not multiples of 8, head_dim
    not contiguous, pointers not 16-byte aligned) are copied. Raises ValueError for bad arguments and KilnError
    for a non-zero kiln status.
    """
    scale = _validate(q, k, v, softmax_scale)
    flags = 0 if deterministic else KILN_FLAG_FUSED_BACKWARD
    return _KilnAttention.apply(q, k, v, bool(causal), scale, flags)


def _reference(q, k, v, mask, scale, sdpa=False):
    """Attention with a boolean [seqlen_q, seqlen_k] mask, k and v repeated to q's heads: (o, lse), or o from
    SDPA; rows that see no key give o = 0 and no gradient (SDPA lets them see every key, then zeroes them)."""
    rep = q.shape[2] // k.shape[2]
    q, k, v = (t.transpose(1, 2) for t in (q, k.repeat_interleave(rep, 2), v.repeat_interleave(rep, 2)))
    empty = ~mask.any(-1, keepdim=True)
    if sdpa:
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask | empty, scale=scale)
        return (o * ~empty).transpose(1, 2)
    s = (scale * q @ k.transpose(-1, -2)).masked_fill(~mask, -math.inf).masked_fill(empty, 0.0)
    p = torch.softmax(s, -1).masked_fill(empty, 0.0)
    return (p @ v).transpose(1, 2), torch.logsumexp(s, -1).masked_fill(empty.squeeze(-1), -math.inf)


def _run(fn, inputs, d_o) -> list[torch.Tensor]:
    """[o, dq, dk, dv] of fn on fresh leaf copies of inputs."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    o = fn(*leaves)
    o.backward(d_o)
    return [o.detach()] + [t.grad for t in leaves]


def _worst_row_error(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Max over rows (last dim) of |x - ref| / |ref|, with row norms floored at 1e-3 of their mean."""
    norms = ref.float().norm(dim=-1)
    return ((x.float() - ref.float()).norm(dim=-1) / norms.clamp_min(1e-3 * norms.mean())).max().item()


def _self_check() -> int:
    """kiln vs an fp32 reference and bf16 SDPA at a ragged GQA shape; 0 if kiln's errors are within bounds."""
    if torch is None or not torch.cuda.is_available():
        sys.exit("the self-check needs PyTorch and a CUDA GPU")
    print(version())
    torch.manual_seed(0)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, dev = 2, 300, 257, 8, 2, "cuda"
    failed = False
    for head_dim in (64, 128):
        for causal in (False, True):
            q = torch.randn(batch, seqlen_q, heads_q, head_dim, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(batch, seqlen_k, heads_kv, head_dim, device=dev, dtype=torch.bfloat16) for _ in "kv")
            # A misaligned view with odd strides: backward must copy it into kiln's layout.
            d_o = torch.randn(batch, seqlen_q, heads_q, head_dim + 1, device=dev, dtype=torch.bfloat16)[..., 1:]
            rows, cols = torch.arange(seqlen_q, device=dev)[:, None], torch.arange(seqlen_k, device=dev)
            mask = (cols <= rows + seqlen_k - seqlen_q) | (not causal)
            scale = head_dim ** -0.5
            ref = _run(lambda *a: _reference(*a, mask, scale)[0], [t.float() for t in (q, k, v)], d_o.float())
            sdpa = _run(lambda *a: _reference(*a, mask, scale, sdpa=True), (q, k, v), d_o)
            for deterministic in (True, False):
                kiln = _run(lambda *a: attention(*a, causal=causal, softmax_scale=scale, deterministic=deterministic),
                            (q, k, v), d_o)
                backward = "split" if deterministic else "fused"
                print(f"head_dim {head_dim}, causal {causal}, {backward} backward: worst-row relative error vs fp32")
                for name, x, r, s in zip(("o", "dq", "dk", "dv"), kiln, ref, sdpa):
                    kiln_error, sdpa_error = _worst_row_error(x, r), _worst_row_error(s, r)
                    ok = kiln_error <= 2 * sdpa_error + 1e-3  # False for NaN
                    failed |= not ok
                    print(f"  {name:3} kiln {kiln_error:.3e}  sdpa {sdpa_error:.3e}  {'ok' if ok else 'FAIL'}")
            lse = _forward(_library(), _config(q, k, causal, scale, 0), q, k, v)[1]  # q, k, v: kiln's layout
            ref_lse = _reference(q.float(), k.float(), v.float(), mask, scale)[1]
            lse_error = torch.where(torch.isneginf(ref_lse), torch.where(torch.isneginf(lse), 0.0, math.inf),
                                    (lse - ref_lse).abs()).max().item()
            failed |= not lse_error <= 1e-2
            print(f"  lse kiln {lse_error:.3e} (absolute)  {'ok' if lse_error <= 1e-2 else 'FAIL'}")
    print("FAILED" if failed else "all ok")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(_self_check())
