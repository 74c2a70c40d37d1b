"""Accuracy of lossfns.distill_loss's and cross_entropy_loss's forwards at long rows, against
float64, on one device. Prints one line per (V, rows, dtype, loss): the largest relative error
of the per-row loss over 2 rows.

    python bench/distill_accuracy.py                       # CUDA, V = 151936 .. 2^24
    python bench/distill_accuracy.py --device cpu --vocab 151936,262144

Rows:
  structured  a uniform student against a teacher raised on the first half of the row (in the
              second row at two levels: 0.7 on its first third, 1.09375 up to its half): many
              equal probabilities, the worst case for running float sums
  random      student and teacher logits N(0, 2^2)
The reference is the same inputs (after rounding to the dtype) in float64. docs/distill.md
("Accuracy at long rows") has the measured numbers.
"""
from __future__ import annotations

import argparse

import torch

from distill_bench import load_lossfns  # the checkout's python/ package, LOSSFNS_LIBRARY's library

lossfns = load_lossfns()

DIVERGENCES = ("tvd", "forward_kl", "reverse_kl", "jsd")


def reference(s: torch.Tensor, t: torch.Tensor, divergence: str, beta: float) -> torch.Tensor:
    s, t = s.double(), t.double()
    lp, lq = s.log_softmax(-1), t.log_softmax(-1)
    p, q = lp.exp(), lq.exp()
    if divergence == "tvd":
        return 0.5 * (p - q).abs().sum(-1)
    if divergence == "forward_kl":
        return (q * (lq - lp)).sum(-1)
    if divergence == "reverse_kl":
        return (p * (lp - lq)).sum(-1)
    lm = (beta * q + (1 - beta) * p).log()
    return beta * (q * (lq - lm)).sum(-1) + (1 - beta) * (p * (lp - lm)).sum(-1)


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double().cpu() - want).abs() / want.abs().clamp_min(1e-30)).max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--vocab", default="151936,262144,1048576,16777216",
                        help="comma-separated row lengths")
    parser.add_argument("--beta", type=float, default=0.5, help="JSD's beta, in (0, 1)")
    args = parser.parse_args()
    if not 0 < args.beta < 1:  # at 0 and 1 the library runs the KLs; the reference here is JSD's
        parser.error(f"--beta: expected a number in (0, 1), got {args.beta}")
    dev = args.device
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"device {dev} ({name}); relative error of the loss against float64, 2 rows")
    print(f"{'V':>9} {'rows':>10} {'dtype':>8} {'loss':>10} {'rel. error':>10}")
    torch.manual_seed(0)
    for V in (int(v) for v in args.vocab.split(",")):
        for rows in ("structured", "random"):
            if rows == "structured":
                s, t = torch.zeros(2, V), torch.zeros(2, V)
                t[:, : V // 2] = 1.09375
                t[1, : V // 3] = 0.7
            else:
                s, t = torch.randn(2, V) * 2, torch.randn(2, V) * 2
            labels = torch.randint(0, V, (2,))
            for dtype in (torch.float32, torch.bfloat16):
                sd, td = s.to(dtype), t.to(dtype)
                for div in DIVERGENCES:
                    got = lossfns.distill_loss(sd.to(dev), td.to(dev), divergence=div,
                                               beta=args.beta, reduction="none")
                    err = relative_error(got, reference(sd, td, div, args.beta))
                    print(f"{V:>9} {rows:>10} {str(dtype)[6:]:>8} {div:>10} {err:>10.2e}",
                          flush=True)
                want = torch.nn.functional.cross_entropy(sd.double(), labels, reduction="none")
                got = lossfns.cross_entropy_loss(sd.to(dev), labels.to(dev), reduction="none")
                err = relative_error(got, want)
                print(f"{V:>9} {rows:>10} {str(dtype)[6:]:>8} {'ce':>10} {err:>10.2e}", flush=True)


if __name__ == "__main__":
    main()
