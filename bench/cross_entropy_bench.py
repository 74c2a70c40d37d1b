"""Benchmark of lossfns.cross_entropy_loss (forward + backward from logits) against the composite
the trainer ran before it (a float32 copy of the logits + cross_entropy), eager and torch.compile.

    python bench/cross_entropy_bench.py                        # CUDA: the trainer's shapes, bf16
    python bench/cross_entropy_bench.py --device cpu --short   # tiny shapes: a smoke run
    python bench/cross_entropy_bench.py --shapes 4096x32000 --dtype fp32 --json out/ce.json

with the library named by LOSSFNS_LIBRARY where it is not in the package (a build tree's:
LOSSFNS_LIBRARY=build/lib/liblossfns.so; docs/cross_entropy.md has the commands).

Rows per shape:
  composite   F.cross_entropy(logits.float(), labels), eager: the fp32 copy, a log_softmax
              output, softmax backward and the copy back to the logits' dtype (what the trainer's
              at::cross_entropy_loss on logits.to(float) costs)
  compiled    the same under torch.compile
  direct      F.cross_entropy(logits, labels) on the logits' own dtype (no copy; the log_softmax
              output and its backward in that dtype)
  ours        lossfns.cross_entropy_loss(logits, labels)
  ours fwd    its forward alone
Columns: median ms (forward + backward, except "fwd"), the % of the 3-stream limit (the logits
read in forward, read again and the gradient written in backward, at the measured device copy
bandwidth; CUDA), the speedup over the composite, the peak memory beyond the inputs and the
gradient (CUDA), and |loss - composite's loss|. Labels: 5% of the rows ignored (-100). Timing
and bandwidth helpers are distill_bench.py's.
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from distill_bench import DTYPES, copy_bandwidth, extra_memory_mb, load_lossfns, time_fn

SHAPES = "16384x32000,8192x128256,8192x151936"
SHORT_SHAPES = "256x1000,64x32003"


def composite(x, labels):
    return F.cross_entropy(x.float(), labels, ignore_index=-100)


def direct(x, labels):
    return F.cross_entropy(x, labels, ignore_index=-100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="", help=f"BTxV,... (default {SHAPES}; --short: {SHORT_SHAPES})")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--iters", type=int, default=0, help="timed iterations (default 10; --short: 3)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--short", action="store_true", help="tiny shapes and few iterations (a smoke run)")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = args.shapes or (SHORT_SHAPES if args.short else SHAPES)
    iters = args.iters or (3 if args.short else 10)
    lossfns = load_lossfns()
    dev, dtype = args.device, DTYPES[args.dtype]
    impls = {"composite": composite}  # first: the other rows' speedups and loss differences are against it
    if not args.no_compile:
        impls["compiled"] = torch.compile(composite, dynamic=False)
    impls["direct"] = direct
    impls["ours"] = lossfns.cross_entropy_loss
    impls["ours fwd"] = lossfns.cross_entropy_loss
    print(f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'} ({torch.get_num_threads()} threads), "
          f"dtype {args.dtype}")
    print(f"{'shape':>13} {'impl':>10} {'ms':>8} {'%3-str':>7} {'vs comp':>8} {'extra MB':>9} {'|dloss|':>9}")
    results, bw = [], None
    for shape in shapes.split(","):
        BT, V = map(int, shape.split("x"))
        g = torch.Generator(device="cpu").manual_seed(0)
        x0 = (torch.randn(BT, V, generator=g) * 2).to(dev, dtype)
        labels = torch.randint(0, V, (BT,), generator=g)
        labels[torch.rand(BT, generator=g) < 0.05] = -100
        labels = labels.to(dev)
        elem = x0.element_size()
        bw = copy_bandwidth(x0, dev, iters) if dev == "cuda" else None
        comp_ms = comp_loss = None
        for name, fn in impls.items():
            x = x0.clone().requires_grad_()
            forward_only = name.endswith(" fwd")

            def step():
                x.grad = None
                loss = fn(x, labels)
                if not forward_only:
                    loss.backward()
                return loss

            try:
                ms = time_fn(step, dev, iters)
                loss = step().item()
                extra = extra_memory_mb(step, x) if dev == "cuda" else None
            except Exception as e:  # noqa: BLE001 (a row that cannot run says why)
                print(f"{shape:>13} {name:>10} failed: {str(e).splitlines()[0][:80]}")
                continue
            if name == "composite":
                comp_ms, comp_loss = ms, loss
            lim3 = 3 * BT * V * elem / bw if bw else None
            row = dict(shape=shape, impl=name, ms=ms, pct3=100 * lim3 / ms if lim3 else None,
                       speedup_vs_composite=comp_ms / ms if comp_ms else None, extra_mb=extra, loss=loss,
                       loss_diff=abs(loss - comp_loss) if comp_loss is not None else None,
                       copy_gbps=bw / 1e6 if bw else None)
            results.append(row)
            f = lambda v, fmt: (fmt % v) if v is not None else "-"  # noqa: E731
            print(f"{shape:>13} {name:>10} {ms:8.3f} {f(row['pct3'], '%6.1f%%'):>7} "
                  f"{f(row['speedup_vs_composite'], '%7.2fx'):>8} {f(extra, '%9.1f'):>9} "
                  f"{f(row['loss_diff'], '%9.2e'):>9}", flush=True)
        del x0
    if bw:
        print(f"copy bandwidth (last shape): {bw / 1e6:.0f} GB/s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=dev, dtype=args.dtype, results=results), fh, indent=1)


if __name__ == "__main__":
    main()
