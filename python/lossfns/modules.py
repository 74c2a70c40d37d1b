"""torch.nn.Module wrappers of the losses, for code that builds its loss as a module."""
from __future__ import annotations

from typing import Optional

import torch

from ._ops import DEFAULT_IGNORE_INDEX, Reduction, tvd_loss


class TVDLoss(torch.nn.Module):
    """The total variation distance loss as a module: ``TVDLoss(...)(p, q, labels)`` is
    ``lossfns.tvd_loss(p, q, labels, ignore_index, reduction)``; see that function for shapes,
    dtypes and the tie rule (gradient exactly 0 where p == q).

    The arguments are keyword-only: Liger's ``LigerTVDLoss(reduction, ignore_index)`` takes them
    in the other order, so a positional call fails loudly instead of swapping them.
    """

    def __init__(self, *, ignore_index: int = DEFAULT_IGNORE_INDEX, reduction: Reduction = "batchmean") -> None:
        super().__init__()
        if reduction not in ("none", "sum", "mean", "batchmean"):
            raise ValueError(f"lossfns.TVDLoss: reduction must be one of 'none', 'sum', 'mean', "
                             f"'batchmean'; got {reduction!r}")
        self.ignore_index = ignore_index
        self.reduction: Reduction = reduction

    def forward(self, p: torch.Tensor, q: torch.Tensor, labels: Optional[torch.Tensor] = None) -> torch.Tensor:
        return tvd_loss(p, q, labels, self.ignore_index, self.reduction)

    def extra_repr(self) -> str:
        return f"ignore_index={self.ignore_index}, reduction={self.reduction!r}"
