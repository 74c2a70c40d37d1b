"""lossfns: distillation losses for PyTorch, from liblossfns (C++ and CUDA).

    import torch, lossfns
    loss = lossfns.distill_loss(student_logits, teacher_logits.detach(), labels, divergence="jsd")
    loss = lossfns.fused_linear_distill_loss(hidden, lm_head.weight, t_hidden.detach(),
                                             t_lm_head.weight.detach(), labels, divergence="jsd")
    loss = lossfns.tvd_loss(student_probs, teacher_probs, labels)   # or lossfns.TVDLoss()(...)
    loss = lossfns.cross_entropy_loss(student_logits, labels)       # hard labels, fused

Importing the package loads the liblossfns.so shipped beside this file (or the one named by
$LOSSFNS_LIBRARY), which registers torch.ops.lossfns.*, and registers the ops' fake
implementations so that torch.compile(fullgraph=True) traces them. Import torch first, or let
this package do it: the library finds libtorch in the process.
"""
from __future__ import annotations

import torch

from . import _library

__library__: str = _library.load()
__version__: str = _library.library_version(__library__)

from . import _fake  # noqa: E402  (needs the ops registered by the library)
from ._ops import (Divergence, FusedLinearDistillResult, Reduction, cross_entropy_loss,  # noqa: E402
                   distill_loss, fused_linear_distill_loss, tvd_loss)
from .modules import CrossEntropyLoss, DistillLoss, TVDLoss  # noqa: E402

__all__ = ["CrossEntropyLoss", "DistillLoss", "Divergence", "FusedLinearDistillResult", "Reduction", "TVDLoss",
           "cross_entropy_loss", "distill_loss", "fused_linear_distill_loss", "tvd_loss", "__version__"]
