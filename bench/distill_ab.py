"""Quick A/B timing of lossfns.distill_loss: forward alone, forward + backward, and forward (with
grad_scale) + backward, per shape and divergence, for the library LOSSFNS_LIBRARY names. Compare
two builds by running it once per library, interleaved (docs/benchmarks.md, issue 16, session 11):

    for rep in 1 2; do for lib in old new; do
      LOSSFNS_LIBRARY=/tmp/$lib.so python bench/distill_ab.py --tag $lib
    done; done

Columns: median ms (CUDA events; CPU wall clock) and, on CUDA, the % of the 2-stream (forward),
5-stream (forward + backward) and 3-stream (with grad_scale) limits at --bandwidth bytes/s.
bench/distill_bench.py is the full comparison (composite, torch.compile, Liger).
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from distill_bench import DTYPES, load_lossfns, time_fn  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="8192x151936,4096x32000")
    ap.add_argument("--divergences", default="tvd,forward_kl,reverse_kl,jsd")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--bandwidth", type=float, default=3.98e12, help="copy bandwidth, bytes/s (H200: 3.98e12)")
    ap.add_argument("--tag", default="", help="a label printed at the start of every row")
    args = ap.parse_args()
    dev, dtype = args.device, DTYPES[args.dtype]
    lossfns = load_lossfns()
    for shape in args.shapes.split(","):
        rows, V = map(int, shape.split("x"))
        g = torch.Generator(device=dev).manual_seed(0)
        s0 = (torch.randn(rows, V, device=dev, generator=g) * 2).to(dtype)
        t = (torch.randn(rows, V, device=dev, generator=g) * 2).to(dtype)
        labels = torch.zeros(rows, dtype=torch.long, device=dev)
        gs = torch.ones(1, device=dev)
        stream_ms = 1e3 * rows * V * s0.element_size() / args.bandwidth
        for div in args.divergences.split(","):
            s = s0.clone().requires_grad_(True)

            def fwd():
                with torch.no_grad():
                    lossfns.distill_loss(s, t, labels, div)

            def fwd_bwd(grad_scale=None):
                s.grad = None
                lossfns.distill_loss(s, t, labels, div, grad_scale=grad_scale).backward()

            f = time_fn(fwd, dev, args.iters)
            b5 = time_fn(fwd_bwd, dev, args.iters)
            b3 = time_fn(lambda: fwd_bwd(gs), dev, args.iters)
            pct = (lambda n, ms: f" ({100 * n * stream_ms / ms:3.0f}%)") if dev == "cuda" else (lambda n, ms: "")
            print(f"{args.tag:6s} {shape:>12s} {div:10s} fwd {f:8.3f} ms{pct(2, f)}  fwd+bwd {b5:8.3f}{pct(5, b5)}"
                  f"  +scale {b3:8.3f}{pct(3, b3)}", flush=True)


if __name__ == "__main__":
    main()
