"""The functional API: thin typed wrappers of the registered ops (torch.ops.lossfns.*)."""
from __future__ import annotations

from typing import Literal, NamedTuple, Optional, Union, overload

import torch

Reduction = Literal["none", "sum", "mean", "batchmean"]
Divergence = Literal["tvd", "forward_kl", "reverse_kl", "jsd"]

# The names, in the order of the internal ops' integer codes (lib/src/kernels_common.h's
# kReductionNames, lib/include/lossfns/divergence.h's kDivergenceNames): a name's index is its
# code. tests/python/test_package.py checks both orders against the library.
REDUCTIONS = ("none", "sum", "mean", "batchmean")
DIVERGENCES = ("tvd", "forward_kl", "reverse_kl", "jsd")

# The library's one default (lossfns/defaults.h), read from the registered op's schema.
DEFAULT_IGNORE_INDEX: int = next(a.default_value for a in torch.ops.lossfns.tvd_loss.default._schema.arguments
                                 if a.name == "ignore_index")


def check_name(op: str, what: str, value: str, names: tuple) -> None:
    """Raises ValueError unless ``value`` is one of ``names`` (a module's argument, checked when it
    is built rather than at its first call)."""
    if value not in names:
        raise ValueError(f"{op}: {what} must be one of {', '.join(repr(n) for n in names)}; got {value!r}")


def _kind(v) -> str:
    """'b' (bool), 'i'/'u' (integer), 'f' (floating) or 'c' (complex) for a tensor or a NumPy
    scalar or array (the schema takes 0-dim ones as numbers), without importing NumPy; '' else."""
    if isinstance(v, torch.Tensor):
        return "b" if v.dtype == torch.bool else "c" if v.is_complex() else "f" if v.is_floating_point() else "i"
    dtype = getattr(v, "dtype", None) if type(v).__module__ == "numpy" else None
    return getattr(dtype, "kind", "")


def _is_bool(v) -> bool:
    """Python's bool, or a bool tensor or NumPy bool (the schema takes them as 0 or 1)."""
    return isinstance(v, bool) or _kind(v) == "b"


# The ints that may be None (their default): the others must be given as ints.
_OPTIONAL_INTS = ("vocab_size", "chunk_size")


def _check_scalars(op: str, ints: dict, floats: dict, strs: Optional[dict] = None) -> None:
    """What the op's schema cannot say well: a Python int past int64 (torch's message is "Expected a
    value of type 'int' ... found type 'int'"), a bool where a number is meant (the schema takes
    True as 1: vocab_size=True made every loss 0), a number given as a tensor that requires
    grad (converted to a float, it would get no gradient, silently), and a value of another type
    where an int or a name is meant (None, 1.5: pybind's "Unable to cast Python instance of type
    ... to C++ type '?'" named no argument). RuntimeError, as the op's errors."""
    for name, v in (strs or {}).items():
        if not isinstance(v, str):
            raise RuntimeError(f"{op}: {name} must be a str; got {v!r} ({type(v).__name__})")
    for name, v in list(ints.items()) + list(floats.items()):
        if _is_bool(v):
            kind = "an int" if name in ints else "a number"
            raise RuntimeError(f"{op}: {name} must be {kind}, not a bool; got {v}")
        if v is None and name not in _OPTIONAL_INTS:
            kind = "an int" if name in ints else "a number"
            raise RuntimeError(f"{op}: {name} must be {kind}; got None")
    for name, v in ints.items():
        if isinstance(v, int) and not -2**63 <= v < 2**63:
            raise RuntimeError(f"{op}: {name} must fit in a 64-bit integer; got {v}")
        if isinstance(v, (float, complex)):
            raise RuntimeError(f"{op}: {name} must be an int; got {v!r} ({type(v).__name__})")
        if _kind(v) in ("f", "c"):
            # The schema would truncate it (vocab_size=torch.tensor(5.7) counted 5 columns).
            raise RuntimeError(f"{op}: {name} must be an int; got {v!r} ({v.dtype})")
    for name, v in floats.items():
        if isinstance(v, torch.Tensor) and v.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(f"{op}: {name} is a tensor that requires grad, but the op takes a number and gives "
                               f"it no gradient; pass float({name}.detach()) (a learned {name} is not supported)")


def tvd_loss(p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor] = None,
             ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: Reduction = "batchmean") -> torch.Tensor:
    """Total variation distance between a student's and a teacher's distributions.

    ``loss = 0.5 * sum_j |p_j - q_j|`` per row of V probabilities, reduced over rows.

    Args:
        p: student probabilities, ``(BT, V)`` or ``(B, T, V)``; float32, bfloat16, float16, or
            float64 (CPU only). Any strides with a unit stride in V are read in place.
        q: teacher probabilities: p's shape, dtype and device.
        labels: optional int64 ``(BT,)`` or ``(B, T)`` on p's device. Rows whose label equals
            ``ignore_index`` contribute no loss and get no gradient.
        ignore_index: the label value of ignored rows.
        reduction: ``"batchmean"`` (sum / rows not ignored), ``"mean"`` (sum / (rows not ignored
            * V)), ``"sum"``, or ``"none"`` (the per-element loss ``0.5*|p - q|``, p's shape,
            ignored rows 0). An all-ignored batch gives loss 0 and gradient 0, not NaN.

    Returns:
        A 0-dim tensor (``"none"``: p's shape), float32 (float64 for float64 inputs).

    Gradient: ``d loss / d p_j = 0.5 * sign(p_j - q_j) * scale * grad_output`` in p's dtype, and
    its negation for q. Ties get exactly 0: where ``p_j == q_j`` (self-distillation's first step,
    vocabulary padding that is 0 in both) the gradient is 0.0, where Liger's ``LigerTVDLoss``
    gives ``-0.5 * scale``. Errors (shapes, dtypes, devices, labels) raise RuntimeError naming
    what was expected and what was passed.
    """
    _check_scalars("lossfns.tvd_loss", {"ignore_index": ignore_index}, {}, {"reduction": reduction})
    return torch.ops.lossfns.tvd_loss(p, q, labels, ignore_index, reduction)



def distill_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: Optional[torch.Tensor] = None,
                 divergence: Divergence = "tvd", beta: float = 0.5, temperature: float = 1.0,
                 ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: Reduction = "batchmean",
                 vocab_size: Optional[int] = None, grad_scale: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A divergence between the student's and the teacher's distributions, from their logits.

    With ``p = softmax(student_logits / T)`` and ``q = softmax(teacher_logits / T)``, per row:

    - ``"tvd"``: ``0.5 * sum_j |p_j - q_j|`` (gradient exactly 0 where ``p_j == q_j``);
    - ``"forward_kl"``: ``KL(q || p)``; ``"reverse_kl"``: ``KL(p || q)``;
    - ``"jsd"``: ``beta * KL(q || m) + (1 - beta) * KL(p || m)``, ``m = beta q + (1 - beta) p``;
      ``beta = 0`` is forward KL and ``beta = 1`` reverse KL (TRL's and Liger's convention).

    Fused: no softmax, no float32 copy of the logits and no ``(BT, V)`` intermediate besides the
    gradient; the math is in float32. The loss is not multiplied by ``T**2``.

    Args:
        student_logits: ``(BT, V_s)`` or ``(B, T, V_s)``, float32 / bfloat16 / float16 (float64 on
            the CPU); any strides with unit stride in V.
        teacher_logits: the student's leading shape, ``(.., V_t)``, same dtype and device. A
            constant: it gets no gradient, and one that requires grad is an error (``.detach()``
            it). ``V_s`` and ``V_t`` may differ: the narrower one's missing columns are -inf.
        labels: optional int64 ``(BT,)`` or ``(B, T)``: rows whose label is ``ignore_index``
            contribute nothing and get a zero gradient.
        reduction: ``"batchmean"`` (sum / rows not ignored), ``"mean"`` (sum / (rows not ignored
            * V), as torch's kl_div), ``"sum"``, or ``"none"`` (per row: the logits' shape
            without V). An all-ignored batch gives 0, not NaN.
        vocab_size: columns at or past it are padding: -inf in both whatever they hold, gradient 0.
        grad_scale: optional 1-element floating-point tensor (any float dtype) on the logits'
            device, checked on every device: the grad_output the backward will bring (e.g.
            ``kd_weight / tokens``). Given, the CUDA forward computes the gradient while it reads
            the logits; the result is the same either way.

    Returns:
        A 0-dim float32 tensor (float64 for float64 logits), or the per-row losses for ``"none"``.

    Edge cases (docs/distill.md): columns -inf in both contribute exactly 0; a teacher -inf where
    the student is finite makes reverse KL +inf (forward KL: a student -inf where the teacher is
    finite); identical rows give loss 0 and gradient 0 for every divergence.
    """
    _check_scalars("lossfns.distill_loss", {"ignore_index": ignore_index, "vocab_size": vocab_size},
                   {"beta": beta, "temperature": temperature},
                   {"divergence": divergence, "reduction": reduction})
    return torch.ops.lossfns.distill_loss(student_logits, teacher_logits, labels, divergence, beta, temperature,
                                          ignore_index, reduction, vocab_size, grad_scale)


class FusedLinearDistillResult(NamedTuple):
    """The loss and its two terms (detached), as ``fused_linear_distill_loss(..., return_parts=True)``
    returns them."""
    loss: torch.Tensor
    divergence: torch.Tensor
    ce: torch.Tensor


@overload
def fused_linear_distill_loss(student_hidden: torch.Tensor, student_lm_head: torch.Tensor,
                              teacher_hidden: torch.Tensor, teacher_lm_head: torch.Tensor,
                              labels: Optional[torch.Tensor] = ..., divergence: Divergence = ...,
                              beta: float = ..., temperature: float = ..., ignore_index: int = ...,
                              reduction: Reduction = ..., vocab_size: Optional[int] = ...,
                              kd_weight: float = ..., ce_weight: float = ..., chunk_size: Optional[int] = ...,
                              return_parts: Literal[False] = ...) -> torch.Tensor: ...


@overload
def fused_linear_distill_loss(student_hidden: torch.Tensor, student_lm_head: torch.Tensor,
                              teacher_hidden: torch.Tensor, teacher_lm_head: torch.Tensor,
                              labels: Optional[torch.Tensor] = ..., divergence: Divergence = ...,
                              beta: float = ..., temperature: float = ..., ignore_index: int = ...,
                              reduction: Reduction = ..., vocab_size: Optional[int] = ...,
                              kd_weight: float = ..., ce_weight: float = ..., chunk_size: Optional[int] = ...,
                              *, return_parts: Literal[True]) -> FusedLinearDistillResult: ...


@overload
def fused_linear_distill_loss(student_hidden: torch.Tensor, student_lm_head: torch.Tensor,
                              teacher_hidden: torch.Tensor, teacher_lm_head: torch.Tensor,
                              labels: Optional[torch.Tensor] = ..., divergence: Divergence = ...,
                              beta: float = ..., temperature: float = ..., ignore_index: int = ...,
                              reduction: Reduction = ..., vocab_size: Optional[int] = ...,
                              kd_weight: float = ..., ce_weight: float = ..., chunk_size: Optional[int] = ...,
                              return_parts: bool = ...) -> Union[torch.Tensor, FusedLinearDistillResult]: ...


def fused_linear_distill_loss(student_hidden: torch.Tensor, student_lm_head: torch.Tensor,
                              teacher_hidden: torch.Tensor, teacher_lm_head: torch.Tensor,
                              labels: Optional[torch.Tensor] = None, divergence: Divergence = "tvd",
                              beta: float = 0.5, temperature: float = 1.0, ignore_index: int = DEFAULT_IGNORE_INDEX,
                              reduction: Reduction = "batchmean", vocab_size: Optional[int] = None,
                              kd_weight: float = 1.0, ce_weight: float = 0.0, chunk_size: Optional[int] = None,
                              return_parts: bool = False) -> Union[torch.Tensor, FusedLinearDistillResult]:
    """``distill_loss`` (+ a hard-label cross-entropy) from hidden states and lm_heads, without the
    ``(BT, V)`` logits: the tokens are processed a chunk at a time (logits by a matmul in the input
    dtype, the divergence by distill_loss's kernels, the cross-entropy, and the gradients of
    ``student_hidden`` and ``student_lm_head``, all in forward; backward only scales them).

    ``loss = kd_weight * D(softmax(s / T), softmax(t / T)) + ce_weight * CE(s, labels)`` with
    ``s = student_hidden @ student_lm_head.T`` and ``t = teacher_hidden @ teacher_lm_head.T``.

    Args:
        student_hidden: ``(BT, H_s)`` or ``(B, T, H_s)``; float32 / bfloat16 / float16 (float64 on
            the CPU). student_lm_head: ``(V_s, H_s)``, same dtype and device (no bias).
        teacher_hidden: the student's leading shape, ``(.., H_t)``; teacher_lm_head ``(V_t, H_t)``.
            Constants: they get no gradient, and one that requires grad is an error (``.detach()``).
        labels: optional int64 ``(BT,)`` or ``(B, T)``: rows equal to ``ignore_index`` count
            nowhere; the others are the cross-entropy's targets (needed when ``ce_weight != 0``).
        divergence, beta, temperature, ignore_index, vocab_size: as ``distill_loss``. The
            temperature applies to the divergence only, never to the cross-entropy.
        reduction: as ``distill_loss`` for the divergence; the cross-entropy is reduced as torch's
            ``cross_entropy`` (``"batchmean"`` and ``"mean"``: sum / rows not ignored). ``"none"``:
            per token (its backward recomputes every chunk).
        kd_weight, ce_weight: the terms' weights (a weight of 0 drops its term; its value is still
            computed).
        chunk_size: tokens per chunk; None: automatic (CUDA: min(free memory / 8, 2 GiB) of chunk
            temporaries; CPU: 256 MiB).
        return_parts: return ``FusedLinearDistillResult(loss, divergence, ce)`` (the terms detached,
            for logging) instead of the loss alone.

    Returns:
        The loss, a 0-dim float32 tensor (float64 for float64 inputs) or per token for ``"none"``;
        or the three tensors with ``return_parts=True``.
    """
    _check_scalars("lossfns.fused_linear_distill_loss",
                   {"ignore_index": ignore_index, "vocab_size": vocab_size, "chunk_size": chunk_size},
                   {"beta": beta, "temperature": temperature, "kd_weight": kd_weight, "ce_weight": ce_weight},
                   {"divergence": divergence, "reduction": reduction})
    loss, div, ce = torch.ops.lossfns.fused_linear_distill_loss(
        student_hidden, student_lm_head, teacher_hidden, teacher_lm_head, labels, divergence, beta, temperature,
        ignore_index, reduction, vocab_size, kd_weight, ce_weight, chunk_size)
    return FusedLinearDistillResult(loss, div, ce) if return_parts else loss


def cross_entropy_loss(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int = DEFAULT_IGNORE_INDEX,
                       reduction: Reduction = "mean", vocab_size: Optional[int] = None) -> torch.Tensor:
    """Hard-label cross-entropy from logits, fused: ``F.cross_entropy(logits.float(), labels)``
    without the float32 copy and the log_softmax output.

    Per row ``loss = logsumexp(x) - x[label]``; the gradient ``softmax(x) - onehot(label)`` is
    written once, in the logits' dtype. The math is in float32.

    Args:
        logits: ``(BT, V)`` or ``(B, T, V)``, float32 / bfloat16 / float16 (float64 on the CPU);
            any strides with unit stride in V.
        labels: int64 ``(BT,)`` or ``(B, T)`` on the logits' device: ``ignore_index`` or in
            ``[0, V)``. Out of range: a RuntimeError on the CPU; on CUDA that row's loss and
            gradient are NaN (no host synchronisation; torch would device-assert instead).
        ignore_index: the label value of ignored rows (loss 0, gradient 0).
        reduction: ``"mean"`` (default) and ``"batchmean"``: sum / rows not ignored, as torch's
            ``cross_entropy`` ``"mean"``; ``"sum"``; ``"none"`` (per row: the logits' shape
            without V; ignored rows 0). An all-ignored batch gives 0, not NaN.
        vocab_size: columns at or past it are padding: left out of the softmax whatever they
            hold, gradient 0.

    Returns:
        A 0-dim float32 tensor (float64 for float64 logits), or the per-row losses for ``"none"``.
    """
    _check_scalars("lossfns.cross_entropy_loss", {"ignore_index": ignore_index, "vocab_size": vocab_size}, {},
                   {"reduction": reduction})
    return torch.ops.lossfns.cross_entropy_loss(logits, labels, ignore_index, reduction, vocab_size)
