"""The functional API: thin typed wrappers of the registered ops (torch.ops.lossfns.*)."""
from __future__ import annotations

from typing import Literal, Optional

import torch

Reduction = Literal["none", "sum", "mean", "batchmean"]

# The library's one default (lossfns/defaults.h), read from the registered op's schema.
DEFAULT_IGNORE_INDEX: int = next(a.default_value for a in torch.ops.lossfns.tvd_loss.default._schema.arguments
                                 if a.name == "ignore_index")


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
    return torch.ops.lossfns.tvd_loss(p, q, labels, ignore_index, reduction)
