"""lossfns.cross_entropy_loss from Python: against torch.nn.functional.cross_entropy for every
reduction, torch.autograd.gradcheck in float64, opcheck of the public and internal ops, aot
compile against eager, the module, and the errors. CUDA cases skip without a GPU.

Run by ctest with test_package.py (tests/CMakeLists.txt): PYTHONPATH=python and
LOSSFNS_LIBRARY=<build>/lib/liblossfns.so.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import lossfns
from lossfns._ops import REDUCTIONS
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU"))]


def logits_labels(shape, dtype, device, vocab_size=None, ignored="some"):
    """Logits ~ N(0, 4) with every 7th column -inf; labels never on a -inf column, a third of the
    rows ignored ("some"), or all ("all"). Padding columns (vocab_size < V) hold NaN."""
    g = torch.Generator().manual_seed(0)
    *lead, V = shape
    n = vocab_size or V
    x = torch.randn(*lead, V, generator=g, dtype=torch.float64) * 2
    x[..., 3:n:7] = float("-inf")
    x[..., n:] = float("nan")
    lab = torch.randint(0, n // 7, tuple(lead), generator=g) * 7
    lab.view(-1)[:: 3 if ignored == "some" else 1] = -100
    return x.to(device, dtype), lab.to(device)


def torch_reference(x, lab, reduction, vocab_size=None):
    n = vocab_size or x.shape[-1]
    red = "mean" if reduction == "batchmean" else reduction
    return F.cross_entropy(x[..., :n].double().flatten(0, -2), lab.flatten(), reduction=red).reshape(
        lab.shape if reduction == "none" else ())


CASES = [(shape, dtype, red) for shape in [(7, 300), (2, 3, 300)] for dtype in [torch.float32, torch.bfloat16]
         for red in REDUCTIONS]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,dtype,reduction", CASES,
                         ids=[f"{'x'.join(map(str, s))}-{str(d)[6:]}-{r}" for s, d, r in CASES])
def test_matches_torch_cross_entropy(device, shape, dtype, reduction):
    x, lab = logits_labels(shape, dtype, device, vocab_size=290)
    xg = x.clone().requires_grad_()
    ours = lossfns.cross_entropy_loss(xg, lab, reduction=reduction, vocab_size=290)
    assert ours.dtype == torch.float32 and ours.shape == (lab.shape if reduction == "none" else ())
    xr = x[..., :290].double().requires_grad_()
    ref = torch_reference(xr, lab, reduction)
    torch.testing.assert_close(ours.double(), ref, rtol=2e-5, atol=2e-5)
    go = torch.rand_like(ref) + 0.5
    ours.backward(go.to(ours.dtype))
    ref.backward(go)
    assert xg.grad.dtype == dtype
    tol = dict(rtol=5e-3, atol=1e-6) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(xg.grad[..., :290].double(), xr.grad, **tol)
    assert xg.grad[..., 290:].abs().max() == 0  # padding


@pytest.mark.parametrize("device", DEVICES)
def test_all_ignored_gives_zero(device):
    x, lab = logits_labels((5, 40), torch.float32, device, ignored="all")
    xg = x.clone().requires_grad_()
    loss = lossfns.cross_entropy_loss(xg, lab)  # torch's mean would be NaN
    loss.backward()
    assert loss.item() == 0.0 and xg.grad.abs().max().item() == 0.0


def test_gradcheck_float64():
    x, lab = logits_labels((4, 9), torch.float64, "cpu", vocab_size=8)
    x = x.nan_to_num(nan=5.0, neginf=-3.0).requires_grad_()  # finite differences need finite logits
    for red in REDUCTIONS:
        assert torch.autograd.gradcheck(lambda t: lossfns.cross_entropy_loss(t, lab, reduction=red, vocab_size=8), (x,))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_opcheck(device, reduction):
    x, lab = logits_labels((2, 3, 300), torch.bfloat16, device, vocab_size=290)
    op = torch.ops.lossfns.cross_entropy_loss.default
    torch.library.opcheck(op, (x.clone().requires_grad_(), lab, -100, reduction, 290))  # autograd
    torch.library.opcheck(op, (x, lab, -100, reduction, 290))  # no grad: every check
    torch.library.opcheck(torch.ops.lossfns._cross_entropy_forward.default, (x, lab, -100, REDUCTIONS.index(reduction), 290))
    loss, stats, scale = torch.ops.lossfns._cross_entropy_forward(x, lab, -100, REDUCTIONS.index(reduction), 290)
    go = torch.rand_like(loss) if reduction == "none" else torch.tensor(0.75, device=device)
    torch.library.opcheck(torch.ops.lossfns._cross_entropy_backward.default,
                          (go, x, lab, stats, scale, -100, REDUCTIONS.index(reduction), 290))


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_aot_matches_eager(dynamic):
    x, lab = logits_labels((2, 3, 300), torch.float32, "cpu", vocab_size=280)
    fn = lambda x, lab: lossfns.cross_entropy_loss(x, lab, vocab_size=280) * 2.0  # noqa: E731
    out = {}
    for name, f in [("eager", fn), ("aot", torch.compile(fn, backend="aot_eager", fullgraph=True, dynamic=dynamic))]:
        xg = x.clone().requires_grad_()
        loss = f(xg, lab)
        loss.backward()
        out[name] = (loss.detach(), xg.grad)
    for a, b in zip(out["eager"], out["aot"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_module_and_errors():
    x, lab = logits_labels((7, 300), torch.float32, "cpu", vocab_size=290)
    for red in REDUCTIONS:
        torch.testing.assert_close(lossfns.CrossEntropyLoss(reduction=red, vocab_size=290)(x, lab),
                                   lossfns.cross_entropy_loss(x, lab, reduction=red, vocab_size=290), rtol=0, atol=0)
    assert repr(lossfns.CrossEntropyLoss(vocab_size=8)) == "CrossEntropyLoss(ignore_index=-100, reduction='mean', vocab_size=8)"
    with pytest.raises(ValueError, match="reduction must be one of"):
        lossfns.CrossEntropyLoss(reduction="avg")
    with pytest.raises(RuntimeError, match=r"labels must be in \[0, 300\) .* got 300 at row 0"):
        lossfns.cross_entropy_loss(x, torch.full((7,), 300))  # V = 300 without vocab_size
    with pytest.raises(RuntimeError, match=r"labels must be int64 .*convert with \.long\(\) in Python"):
        lossfns.cross_entropy_loss(x, lab.int())
    with pytest.raises(RuntimeError, match=r"labels must have shape \[7\]"):
        lossfns.cross_entropy_loss(x, lab[:5])
