"""torch.ops.lossfns.tvd_loss from Python: loaded with torch.ops.load_library, checked against
torch's own composite reference (float64), ties and autograd included. CUDA cases skip without a GPU.

Usage: python test_tvd_op.py path/to/liblossfns.so
"""
import sys
import unittest

import torch

LIB = sys.argv.pop(1) if len(sys.argv) > 1 else None
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def reference(p, q, labels=None, ignore_index=-100, reduction="batchmean"):
    """0.5*|p - q| in float64 with torch's autograd (abs' backward is 0 at 0)."""
    elem = 0.5 * (p - q).abs()
    mask = torch.ones(p.shape[:-1], dtype=p.dtype, device=p.device)
    if labels is not None:
        mask = labels.reshape(mask.shape).ne(ignore_index).to(p.dtype)
    elem = elem * mask.unsqueeze(-1)
    if reduction == "none":
        return elem
    total = elem.sum()
    if reduction == "sum":
        return total
    n = mask.sum()
    if reduction == "mean":
        return total / (n * p.shape[-1]).clamp_min(1)
    return total / n.clamp_min(1)


def probs(*shape, device="cpu", dtype=torch.float32):
    return torch.softmax(torch.randn(*shape, dtype=torch.float64) * 2, -1).to(device, dtype)


class TvdOpTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.ops.load_library(LIB)
        cls.op = torch.ops.lossfns.tvd_loss

    def setUp(self):
        torch.manual_seed(0)

    def check(self, p, q, labels=None, reduction="batchmean", grad_scale=1.0):
        p = p.detach().requires_grad_(True)
        q = q.detach().requires_grad_(True)
        loss = self.op(p, q, labels, -100, reduction)
        pd = p.detach().double().cpu().requires_grad_(True)
        qd = q.detach().double().cpu().requires_grad_(True)
        ref = reference(pd, qd, None if labels is None else labels.cpu(), -100, reduction)
        torch.testing.assert_close(loss.double().cpu(), ref, rtol=1e-4, atol=0)
        g = torch.full_like(loss, grad_scale) if reduction != "none" else torch.rand_like(loss)
        gp, gq = torch.autograd.grad(loss, (p, q), g)
        rp, rq = torch.autograd.grad(ref, (pd, qd), g.double().cpu())
        # Gradients are 0.5*scale*grad_output rounded once to p's dtype: rtol of that dtype.
        rtol = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 8e-3}[p.dtype]
        torch.testing.assert_close(gp.double().cpu(), rp, rtol=rtol, atol=0)
        torch.testing.assert_close(gq.double().cpu(), rq, rtol=rtol, atol=0)
        ties = p.detach() == q.detach()
        self.assertTrue(bool((gp[ties] == 0).all()), "a tie got a non-zero gradient")

    def test_matches_reference_with_ties_every_reduction(self):
        for device in DEVICES:
            for dtype in [torch.float32, torch.bfloat16] + ([torch.float64] if device == "cpu" else []):
                for reduction in ["batchmean", "sum", "mean", "none"]:
                    with self.subTest(device=device, dtype=dtype, reduction=reduction):
                        p = probs(13, 1271, device=device, dtype=dtype)
                        q = probs(13, 1271, device=device, dtype=dtype)
                        self.check(p, q, reduction=reduction)
                        self.check(p, p.clone(), reduction=reduction)  # self-distillation
                        pad = torch.zeros(13, 64, device=device, dtype=dtype)  # padded vocabulary
                        self.check(torch.cat([p, pad], 1), torch.cat([q, pad], 1), reduction=reduction)
                        mixed = torch.where(torch.rand(13, 1271, device=device) < 0.5, p, q)
                        self.check(p, mixed, reduction=reduction, grad_scale=0.5)

    def test_ignore_index_and_three_dimensional_inputs(self):
        for device in DEVICES:
            with self.subTest(device=device):
                p, q = probs(2, 5, 300, device=device), probs(2, 5, 300, device=device)
                labels = torch.tensor([[1, -100, 2, 3, -100], [0, 0, -100, 1, 1]], device=device)
                self.check(p, q, labels=labels)
                all_ignored = torch.full((2, 5), -100, device=device)
                p.requires_grad_(True)
                loss = self.op(p, q, all_ignored)
                (g,) = torch.autograd.grad(loss, p)
                self.assertEqual(loss.item(), 0.0)
                self.assertTrue(bool((g == 0).all()))

    def test_gradcheck_away_from_ties(self):
        p = probs(4, 9, dtype=torch.float64).requires_grad_(True)
        q = probs(4, 9, dtype=torch.float64).requires_grad_(True)
        for reduction in ["batchmean", "sum", "mean", "none"]:
            with self.subTest(reduction=reduction):
                self.assertTrue(torch.autograd.gradcheck(lambda a, b: self.op(a, b, None, -100, reduction), (p, q)))

    def test_defaults_and_errors(self):
        p, q = probs(3, 10), probs(3, 10)
        torch.testing.assert_close(self.op(p, q), self.op(p, q, None, -100, "batchmean"))
        with self.assertRaisesRegex(RuntimeError, r"q must have p's shape \[3, 10\]; got \[3, 11\]"):
            self.op(p, probs(3, 11))
        with self.assertRaisesRegex(RuntimeError, r"reduction must be one of .* got 'avg'"):
            self.op(p, q, reduction="avg")


if __name__ == "__main__":
    unittest.main(verbosity=2)
