"""torch.nn.Module wrappers of the losses, for code that builds its loss as a module."""
from __future__ import annotations

import math
import numbers
import struct
from typing import Optional

import torch

from ._ops import (DEFAULT_IGNORE_INDEX, DIVERGENCES, REDUCTIONS, Divergence, Reduction, check_name,
                   cross_entropy_loss, distill_loss, tvd_loss)


def _float32(x: float) -> float:
    """x rounded to float32 as C++'s static_cast<float> does (inf past float32's largest value)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _temperature_ok(t: float) -> bool:
    """The op's check (lib/src/distill_checks.cpp, check_temperature): t > 0 and finite, and so
    are its float32 rounding and that rounding's float32 inverse."""
    t32 = _float32(t)
    return math.isfinite(t) and t > 0 and math.isfinite(t32) and t32 > 0 and math.isfinite(_float32(1.0 / t32))


def _as_float(value) -> float:
    """float(value), or inf for an int too large for a float (10**400), which the checks refuse."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _check_args(op: str, ignore_index, vocab_size=None, temperature=None, beta=None,
                beta_range: bool = False) -> None:
    """The checks the ops make at their first call, made when the module is built (ValueError).
    beta must be a number whatever the divergence (the op's schema takes a float); its range
    is checked for 'jsd' only (beta_range), the one divergence that reads it."""
    if (isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral)
            or not -2**63 <= ignore_index < 2**63):
        raise ValueError(f"{op}: ignore_index must be an int that fits in 64 bits; got {ignore_index!r}")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, numbers.Integral)
                                   or not 1 <= vocab_size < 2**63):
        raise ValueError(f"{op}: vocab_size must be an int >= 1 that fits in 64 bits (or None); got {vocab_size!r}")
    for name, value in (("temperature", temperature), ("beta", beta)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
            hint = " (float(t) of a 0-dim tensor)" if isinstance(value, torch.Tensor) else ""
            raise ValueError(f"{op}: {name} must be a Python number{hint}; got {value!r}")
    if temperature is not None and not _temperature_ok(_as_float(temperature)):
        raise ValueError(f"{op}: temperature must be > 0 and representable with its inverse in float32 "
                         f"(about 3e-38 to 3e38); got {temperature!r}")
    if beta is not None and not math.isfinite(_as_float(beta)):
        raise ValueError(f"{op}: beta must be a finite number (the op's schema takes a float); got {beta!r}")
    if beta_range and not 0.0 <= _as_float(beta) <= 1.0:
        raise ValueError(f"{op}: beta must be in [0, 1] for 'jsd'; got {beta!r}")


class TVDLoss(torch.nn.Module):
    """The total variation distance loss as a module: ``TVDLoss(...)(p, q, labels)`` is
    ``lossfns.tvd_loss(p, q, labels, ignore_index, reduction)``; see that function for shapes,
    dtypes and the tie rule (gradient exactly 0 where p == q).

    The arguments are keyword-only: Liger's ``LigerTVDLoss(reduction, ignore_index)`` takes them
    in the other order, so a positional call fails loudly instead of swapping them.
    """

    def __init__(self, *, ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: Reduction = "batchmean") -> None:
        super().__init__()
        check_name("lossfns.TVDLoss", "reduction", reduction, REDUCTIONS)
        _check_args("lossfns.TVDLoss", ignore_index)
        self.ignore_index = ignore_index
        self.reduction: Reduction = reduction

    def forward(self, p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return tvd_loss(p, q, labels, self.ignore_index, self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"


class DistillLoss(torch.nn.Module):
    """``lossfns.distill_loss`` as a module: ``DistillLoss(divergence="jsd", beta=0.5)(student_logits,
    teacher_logits, labels)``. Keyword-only arguments; see ``lossfns.distill_loss`` for their meaning.
    """

    def __init__(self, *, divergence: Divergence = "tvd", beta: float = 0.5, temperature: float = 1.0,
                 ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: Reduction = "batchmean",
                 vocab_size: Optional[int] = None) -> None:
        super().__init__()
        check_name("lossfns.DistillLoss", "divergence", divergence, DIVERGENCES)
        check_name("lossfns.DistillLoss", "reduction", reduction, REDUCTIONS)
        if beta is None:
            raise ValueError("lossfns.DistillLoss: beta must be a Python number (the op's schema takes a "
                             "float; the divergences other than 'jsd' ignore its value); got None")
        _check_args("lossfns.DistillLoss", ignore_index, vocab_size, temperature, beta,
                    beta_range=divergence == "jsd")
        self.divergence: Divergence = divergence
        self.beta = beta
        self.temperature = temperature
        self.ignore_index = ignore_index
        self.reduction: Reduction = reduction
        self.vocab_size = vocab_size

    def forward(self, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
                labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return distill_loss(student_logits, teacher_logits, labels, self.divergence, self.beta, self.temperature,
                            self.ignore_index, self.reduction, self.vocab_size)

    def extra_repr(self) -> str:
        beta = f", beta={self.beta}" if self.divergence == "jsd" else ""
        vocab = f", vocab_size={self.vocab_size}" if self.vocab_size is not None else ""
        return (f"divergence={self.divergence!r}{beta}, temperature={self.temperature}, "
                f"ignore_index={self.ignore_index}, reduction={self.reduction!r}{vocab}")


class CrossEntropyLoss(torch.nn.Module):
    """``lossfns.cross_entropy_loss`` as a module: ``CrossEntropyLoss(vocab_size=V)(logits, labels)``.
    Keyword-only arguments; see ``lossfns.cross_entropy_loss`` for their meaning.
    """

    def __init__(self, *, ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: Reduction = "mean",
                 vocab_size: Optional[int] = None) -> None:
        super().__init__()
        check_name("lossfns.CrossEntropyLoss", "reduction", reduction, REDUCTIONS)
        _check_args("lossfns.CrossEntropyLoss", ignore_index, vocab_size)
        self.ignore_index = ignore_index
        self.reduction: Reduction = reduction
        self.vocab_size = vocab_size

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return cross_entropy_loss(logits, labels, self.ignore_index, self.reduction, self.vocab_size)

    def extra_repr(self) -> str:
        vocab = f", vocab_size={self.vocab_size}" if self.vocab_size is not None else ""
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}{vocab}"
