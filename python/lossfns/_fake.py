"""Fake (meta) implementations of the lossfns ops, for FakeTensor tracing (torch.compile,
torch.export, opcheck): output shapes, dtypes and devices without computing anything.

Registered from Python, not for C++'s Meta key, because a fake kernel sees the fake tensors'
real device and the backends differ: the CUDA forward returns packed signs of (rows, pitch)
bytes when asked to save them, the CPU forward returns (0, pitch) and its backward recomputes the
signs from p and q. The contract of each output is lib/src/tvd_cpu.cpp's and tvd_cuda.cu's.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._ops import DEFAULT_IGNORE_INDEX, REDUCTIONS

_NONE = REDUCTIONS.index("none")  # the internal ops' code of reduction 'none'


def sign_row_pitch(V):
    """Bytes per row of the CUDA forward's packed signs: lib/src/tvd_common.h's sign_row_pitch
    (256-element tiles; pos bits, tie bits and one flag byte per tile, each region rounded up to
    128 bytes). tests/python/test_package.py checks it against the library for a sweep of V."""
    tiles = (V + 255) // 256
    tie_offset = (tiles * 32 + 127) // 128 * 128
    return 2 * tie_offset + (tiles + 127) // 128 * 128


def _acc_dtype(p: torch.Tensor) -> torch.dtype:
    # The loss and scale accumulate in fp32, fp64 for fp64 inputs (the CPU's only: CUDA rejects it).
    return torch.float64 if p.dtype == torch.float64 else torch.float32


def _rows(s: torch.Tensor):
    n = 1
    for d in s.shape[:-1]:
        n = n * d
    return n


def _check_labels(op: str, labels: Optional[torch.Tensor], x: torch.Tensor, what: str) -> None:
    # lib/src/common.cpp's check_labels: int64, on x's device, x's leading shape or (rows,). Here
    # too, not only in the kernels: labels on another device (meta) make the dispatcher pick these
    # fakes even in eager mode, whose empty outputs would be taken for the loss.
    if labels is None:
        return
    lead = tuple(x.shape[:-1])
    rows = _rows(x)
    torch._check(labels.dtype == torch.int64,
                 lambda: f"{op}: labels must be int64 (Long); got {labels.dtype} (convert with .long() in Python, "
                         ".to(torch::kLong) in C++)")
    torch._check(labels.device == x.device,
                 lambda: f"{op}: labels must be on the device of {what}, {x.device}; got {labels.device}")
    torch._check(tuple(labels.shape) == lead or (labels.dim() == 1 and labels.shape[0] == rows),
                 lambda: f"{op}: labels must have shape {list(lead)} (the shape of {what} without its last "
                         f"dimension); got {list(labels.shape)}")


def _check_devices(op: str, x: torch.Tensor, what: str, **others: Optional[torch.Tensor]) -> None:
    # An internal op's tensor arguments on x's device. One of them on meta and the rest on a real
    # device make the dispatcher run these fake kernels in eager mode, whose outputs would then be
    # uninitialised memory on the real device: an error naming the argument instead.
    for name, y in others.items():
        if y is not None:
            torch._check(y.device == x.device,
                         lambda: f"{op}: {name} must be on the device of {what}, {x.device}; got {y.device}")


def _check_inputs(p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor] = None) -> None:
    torch._check(p.dim() in (2, 3), lambda: f"lossfns.tvd_loss: p must be (BT, V) or (B, T, V); got {tuple(p.shape)}")
    torch._check(q.shape == p.shape, lambda: f"lossfns.tvd_loss: q must have p's shape {tuple(p.shape)}; got {tuple(q.shape)}")
    torch._check(q.dtype == p.dtype, lambda: f"lossfns.tvd_loss: q must have p's dtype {p.dtype}; got {q.dtype}")
    torch._check(q.device == p.device, lambda: f"lossfns.tvd_loss: q must be on p's device {p.device}; got {q.device}")
    torch._check(p.shape[-1] > 0, lambda: "lossfns.tvd_loss: the vocabulary dimension V must be > 0")
    _check_labels("lossfns.tvd_loss", labels, p, "p")


@torch.library.register_fake("lossfns::tvd_loss")
def _tvd_loss_fake(p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor] = None,
                   ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: str = "batchmean") -> torch.Tensor:
    _check_inputs(p, q, labels)
    # 'none': the per-element loss, p's shape, contiguous; else a 0-dim loss.
    return p.new_empty(p.shape if reduction == "none" else (), dtype=_acc_dtype(p))


@torch.library.register_fake("lossfns::_tvd_forward")
def _tvd_forward_fake(p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor], ignore_index: int,
                      reduction: int, save_signs: bool):
    _check_inputs(p, q, labels)
    V = p.shape[-1]
    rows = p.numel() // V
    acc = _acc_dtype(p)
    none = reduction == _NONE
    loss = p.new_empty((rows, V) if none else (), dtype=acc)
    signs_rows = rows if (p.device.type == "cuda" and save_signs) else 0
    signs = p.new_empty((signs_rows, sign_row_pitch(V)), dtype=torch.uint8)
    scale = p.new_empty((0 if none else 1,), dtype=acc)
    return loss, signs, scale


@torch.library.register_fake("lossfns::_tvd_backward")
def _tvd_backward_fake(grad_output: torch.Tensor, signs: torch.Tensor, scale: torch.Tensor,
                       p: Optional[torch.Tensor], q: Optional[torch.Tensor], labels: Optional[torch.Tensor],
                       ignore_index: int, V: int, dtype: torch.dtype, reduction: int) -> torch.Tensor:
    # The gradient w.r.t. p as (rows, V) in p's dtype, contiguous: CUDA counts rows from the signs,
    # the CPU from p (which it requires).
    _check_devices("lossfns._tvd_backward", signs, "signs", grad_output=grad_output, scale=scale, p=p, q=q,
                   labels=labels)
    if signs.device.type == "cuda":
        return signs.new_empty((signs.shape[0], V), dtype=dtype)
    torch._check(p is not None and q is not None,
                 lambda: "lossfns._tvd_backward: on CPU, p and q (the forward's inputs) are required")
    return p.new_empty((p.numel() // V, V), dtype=dtype)


# --- lossfns.distill_loss (lib/src/distill_op.cpp, distill_cpu.cpp, distill_cuda.cu) ------------
_STATS_PER_ROW = 6  # lib/src/distill_common.h, kStatsPerRow


def _check_logits(s: torch.Tensor, t: torch.Tensor, labels: Optional[torch.Tensor] = None) -> None:
    op = "lossfns.distill_loss"
    torch._check(s.dim() in (2, 3), lambda: f"{op}: student_logits must be (BT, V) or (B, T, V); got {tuple(s.shape)}")
    torch._check(t.dim() == s.dim() and t.shape[:-1] == s.shape[:-1],
                 lambda: f"{op}: teacher_logits must have the leading shape {list(s.shape[:-1])} of student_logits "
                         f"{list(s.shape)} (every dimension but the last; the vocabulary sizes may differ); "
                         f"got {list(t.shape)}")
    torch._check(t.dtype == s.dtype, lambda: f"{op}: teacher_logits must have the student's dtype {s.dtype}; got {t.dtype}")
    torch._check(t.device == s.device,
                 lambda: f"{op}: teacher_logits must be on the student's device {s.device}; got {t.device}")
    _check_labels(op, labels, s, "student_logits")


def _check_grad_scale(s, grad_scale) -> None:
    if grad_scale is not None:  # as check_grad_scale (lib/src/distill_checks.cpp), on every device
        torch._check(
            grad_scale.numel() == 1 and grad_scale.device == s.device and grad_scale.dtype.is_floating_point,
            lambda: "lossfns.distill_loss: grad_scale must be a 1-element floating-point tensor on the logits' "
            f"device {s.device}; got {grad_scale.dtype} {list(grad_scale.shape)} on {grad_scale.device}")


@torch.library.register_fake("lossfns::distill_loss")
def _distill_loss_fake(s, t, labels=None, divergence="tvd", beta=0.5, temperature=1.0,
                       ignore_index=DEFAULT_IGNORE_INDEX, reduction="batchmean", vocab_size=None, grad_scale=None):
    # Reached directly under inference mode (no autograd kernel first): the checks the op makes.
    _check_logits(s, t, labels)
    _check_grad_scale(s, grad_scale)
    return s.new_empty(s.shape[:-1] if reduction == "none" else (), dtype=_acc_dtype(s))


@torch.library.register_fake("lossfns::_distill_forward")
def _distill_forward_fake(s, t, labels, divergence, beta, temperature, ignore_index, reduction, V, grad_scale, save):
    # loss (rows,) or (); stats (rows, 6); scale (1,); the gradient computed in forward: (rows, ws)
    # on CUDA with a grad_scale for a reduced loss when saving, else (0, ws).
    _check_logits(s, t, labels)
    _check_grad_scale(s, grad_scale)
    rows, acc = _rows(s), _acc_dtype(s)
    loss = s.new_empty((rows,) if reduction == _NONE else (), dtype=acc)
    stats = s.new_empty((rows, _STATS_PER_ROW), dtype=acc)
    scale = s.new_empty((1,), dtype=acc)
    grad_now = s.device.type == "cuda" and save and grad_scale is not None and reduction != _NONE
    grad = s.new_empty((rows if grad_now else 0, s.shape[-1]))
    return loss, stats, scale, grad


@torch.library.register_fake("lossfns::_distill_backward")
def _distill_backward_fake(grad_output, s, t, labels, stats, scale, divergence, beta, temperature, ignore_index,
                           reduction, V):
    _check_logits(s, t, labels)
    _check_devices("lossfns._distill_backward", s, "student_logits", grad_output=grad_output, stats=stats,
                   scale=scale)
    return s.new_empty((_rows(s), s.shape[-1]))


@torch.library.register_fake("lossfns::_distill_rescale_grad_")
def _distill_rescale_grad_fake(grad, grad_output, grad_scale):
    _check_devices("lossfns._distill_rescale_grad_", grad, "grad", grad_output=grad_output, grad_scale=grad_scale)
    return None


@torch.library.register_fake("lossfns::_distill_ce_grad_")
def _distill_ce_grad_fake(grad, s, t, labels, stats, kd_weight, ce_weight, ce_stats, divergence, beta, temperature,
                          ignore_index, V):
    _check_devices("lossfns._distill_ce_grad_", s, "student_logits", grad=grad, t=t, labels=labels, stats=stats,
                   kd_weight=kd_weight, ce_weight=ce_weight, ce_stats=ce_stats)
    return None


# --- lossfns.fused_linear_distill_loss (lib/src/fused_linear_op.cpp, fused_linear_driver.cpp) -------
def _check_hidden(sh, sw, th, tw, labels=None) -> None:
    op = "lossfns.fused_linear_distill_loss"
    torch._check(sh.dim() in (2, 3), lambda: f"{op}: student_hidden must be (BT, H_s) or (B, T, H_s); got {tuple(sh.shape)}")
    torch._check(th.dim() == sh.dim() and th.shape[:-1] == sh.shape[:-1],
                 lambda: f"{op}: teacher_hidden must have the leading shape {list(sh.shape[:-1])} of student_hidden "
                         f"{list(sh.shape)} (every dimension but the last; the hidden sizes may differ); "
                         f"got {list(th.shape)}")
    torch._check(sw.dim() == 2 and sw.shape[1] == sh.shape[-1],
                 lambda: f"{op}: student_lm_head must be (V_s, H_s) with H_s = {sh.shape[-1]}; got {tuple(sw.shape)}")
    torch._check(tw.dim() == 2 and tw.shape[1] == th.shape[-1],
                 lambda: f"{op}: teacher_lm_head must be (V_t, H_t) with H_t = {th.shape[-1]}; got {tuple(tw.shape)}")
    # As check_same_dtype_and_device (lib/src/fused_linear_driver.cpp): an input on another device
    # (meta: weights never loaded) would otherwise get the empty outputs taken for a loss.
    for x, name in ((sw, "student_lm_head"), (th, "teacher_hidden"), (tw, "teacher_lm_head")):
        torch._check(x.device == sh.device,
                     lambda: f"{op}: {name} must be on student_hidden's device {sh.device}; got {x.device}")
        torch._check(x.dtype == sh.dtype, lambda: f"{op}: {name} must have student_hidden's dtype {sh.dtype}; "
                                                  f"got {x.dtype} (convert with .to(dtype): one dtype for the four inputs)")
    _check_labels(op, labels, sh, "student_hidden")


@torch.library.register_fake("lossfns::fused_linear_distill_loss")
def _fused_linear_fake(sh, sw, th, tw, labels=None, divergence="tvd", beta=0.5, temperature=1.0,
                       ignore_index=DEFAULT_IGNORE_INDEX, reduction="batchmean", vocab_size=None, kd_weight=1.0, ce_weight=0.0, chunk_size=None):
    # loss, divergence, ce: 0-dim, or the hidden states' leading shape for 'none'.
    _check_hidden(sh, sw, th, tw, labels)
    shape = sh.shape[:-1] if reduction == "none" else ()
    return tuple(sh.new_empty(shape, dtype=_acc_dtype(sh)) for _ in range(3))


def _fused_grads(sh, sw, grad_hidden, grad_lm_head):
    # (BT, H_s) and (V_s, H_s) when computed, else (0, H_s).
    return (sh.new_empty((sh.shape[0] if grad_hidden else 0, sh.shape[1])),
            sw.new_empty((sw.shape[0] if grad_lm_head else 0, sw.shape[1])))


@torch.library.register_fake("lossfns::_fused_linear_distill_forward")
def _fused_linear_forward_fake(sh, sw, th, tw, labels, divergence, beta, temperature, ignore_index, reduction, V,
                               kd_weight, ce_weight, chunk_size, grad_hidden, grad_lm_head):
    # The gradients only for a reduced loss (kNone recomputes them in _fused_linear_distill_backward).
    _check_hidden(sh, sw, th, tw, labels)
    none = reduction == _NONE
    shape = (sh.shape[0],) if none else ()
    losses = tuple(sh.new_empty(shape, dtype=_acc_dtype(sh)) for _ in range(3))
    gh, gw = _fused_grads(sh, sw, grad_hidden and not none, grad_lm_head and not none)
    return losses + (gh, gw.to(_acc_dtype(sw)))  # the lm_head's in the accumulation dtype


@torch.library.register_fake("lossfns::_fused_linear_distill_backward")
def _fused_linear_backward_fake(grad_output, sh, sw, th, tw, labels, divergence, beta, temperature, ignore_index, V,
                                kd_weight, ce_weight, chunk_size, grad_hidden, grad_lm_head):
    _check_devices("lossfns._fused_linear_distill_backward", sh, "student_hidden", grad_output=grad_output)
    return _fused_grads(sh, sw, grad_hidden, grad_lm_head)


@torch.library.register_fake("lossfns::_scale_cast")
def _scale_cast_fake(src, scale, dtype):
    # src * scale rounded once to dtype (the backward of a reduced fused linear loss).
    torch._check(scale.numel() == 1, lambda: f"lossfns._scale_cast: scale must have 1 element; got {tuple(scale.shape)}")
    _check_devices("lossfns._scale_cast", src, "src", scale=scale)
    return src.new_empty(src.shape, dtype=dtype)
# --- lossfns.cross_entropy_loss (lib/src/cross_entropy_op.cpp, _cpu.cpp, _cuda.cu) --------------
_CE_STATS_PER_ROW = 2  # lib/src/cross_entropy_common.h, kCeStatsPerRow


def _check_ce(logits: torch.Tensor, labels: torch.Tensor) -> None:
    op = "lossfns.cross_entropy_loss"
    torch._check(logits.dim() in (2, 3), lambda: f"{op}: logits must be (BT, V) or (B, T, V); got {tuple(logits.shape)}")
    _check_labels(op, labels, logits, "logits")


@torch.library.register_fake("lossfns::cross_entropy_loss")
def _cross_entropy_loss_fake(logits, labels, ignore_index=DEFAULT_IGNORE_INDEX, reduction="mean", vocab_size=None):
    _check_ce(logits, labels)
    return logits.new_empty(logits.shape[:-1] if reduction == "none" else (), dtype=_acc_dtype(logits))


@torch.library.register_fake("lossfns::_cross_entropy_forward")
def _cross_entropy_forward_fake(logits, labels, ignore_index, reduction, V):
    # loss (rows,) for 'none' else (); stats (rows, 2); scale (1,)
    _check_ce(logits, labels)
    rows, acc = _rows(logits), _acc_dtype(logits)
    loss = logits.new_empty((rows,) if reduction == _NONE else (), dtype=acc)
    return loss, logits.new_empty((rows, _CE_STATS_PER_ROW), dtype=acc), logits.new_empty((1,), dtype=acc)


@torch.library.register_fake("lossfns::_cross_entropy_backward")
def _cross_entropy_backward_fake(grad_output, logits, labels, stats, scale, ignore_index, reduction, V):
    _check_devices("lossfns._cross_entropy_backward", logits, "logits", grad_output=grad_output, labels=labels,
                   stats=stats, scale=scale)
    return logits.new_empty((_rows(logits), logits.shape[-1]))
