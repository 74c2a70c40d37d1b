"""Benchmark of lossfns.distill_loss (forward + backward from logits) against the LibTorch/PyTorch
composite (eager and torch.compile) and Liger's Triton kernels, side by side, on one device.

    python bench/distill_bench.py                          # CUDA: the issue's shapes, bf16
    python bench/distill_bench.py --device cpu --shapes 1024x32000 --dtype fp32 --threads 2
    LIGER_PATH=/path/to/Liger-Kernel/src python bench/distill_bench.py   # adds Liger's rows

Rows per (shape, divergence, grad_output):
  ours            lossfns.distill_loss; the backward recomputes from the logits (5 streams of
                  BT*V: s and t in forward, s, t and the gradient in backward)
  ours fwd, +scale fwd   the forward pass of the two rows above alone
  ours+scale      the same with grad_scale = the grad_output given in advance: the CUDA forward
                  computes the gradient (3 streams: s, t, the gradient)
  composite       log_softmax / softmax in float32 + the divergence + autograd, eager
  compiled        the same under torch.compile
  liger           log_softmax in float32 + Liger's JSD (forward/reverse KL: beta 0 / 1), KLDiv or
                  TVD (on softmax probabilities) kernels, when LIGER_PATH points at Liger's src/
Columns: median ms of forward + backward, the % of the 3- and 5-stream limits (bytes of those
streams at the measured device copy bandwidth; CUDA), the speedup over the composite, and the
peak memory beyond the inputs and the gradient. Prints a table and writes JSON (--json).
Liger is never committed: fetch its repository and point LIGER_PATH at its src/.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
DIVERGENCES = ["tvd", "forward_kl", "reverse_kl", "jsd"]
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def load_lossfns():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import lossfns  # noqa: E402  (LOSSFNS_LIBRARY names the build's library)
    return lossfns


def composite(s, t, labels, divergence, beta, T):
    """The divergence with ATen ops in float32, summed over rows, / valid rows (batchmean)."""
    lp = torch.log_softmax(s.float() / T, -1)
    lq = torch.log_softmax(t.float() / T, -1)
    p, q = lp.exp(), lq.exp()
    if divergence == "tvd":
        rows = 0.5 * (p - q).abs().sum(-1)
    elif divergence == "forward_kl":
        rows = torch.where(q > 0, q * (lq - lp), 0.0).sum(-1)
    elif divergence == "reverse_kl":
        rows = torch.where(p > 0, p * (lp - lq), 0.0).sum(-1)
    else:
        lm = torch.logaddexp(lq + math.log(beta), lp + math.log(1 - beta))
        rows = (beta * torch.where(q > 0, q * (lq - lm), 0.0) + (1 - beta) * torch.where(p > 0, p * (lp - lm), 0.0)).sum(-1)
    valid = labels.ne(-100)
    return (rows * valid).sum() / valid.sum().clamp_min(1)


def liger_fn(divergence):
    path = os.environ.get("LIGER_PATH")
    if not path:
        return None
    sys.path.insert(0, path)
    from liger_kernel.ops.jsd import LigerJSDFunction  # noqa: E402
    from liger_kernel.ops.tvd import LigerTVDLossFunction  # noqa: E402

    def run(s, t, labels, _divergence, beta, T):
        if divergence == "tvd":
            p, q = torch.softmax(s.float() / T, -1), torch.softmax(t.float() / T, -1)
            return LigerTVDLossFunction.apply(p, q, labels, "batchmean", -100)
        X, Y = torch.log_softmax(s.float() / T, -1), torch.log_softmax(t.float() / T, -1)
        b = {"forward_kl": 0.0, "reverse_kl": 1.0}.get(divergence, beta)
        return LigerJSDFunction.apply(X, Y, labels, b, -100)
    return run


def sync(device):
    if device == "cuda":
        torch.cuda.synchronize()


def time_fn(fn, device, iters, warmup=3):
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(iters):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def extra_memory_mb(step, x):
    """MiB of CUDA memory one step (which sets x.grad) peaks at beyond what is allocated before it
    (the inputs) and x's gradient."""
    x.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base - x.numel() * x.element_size()) / 2**20


def copy_bandwidth(x, device, iters):
    """Bytes per ms of a device copy of x (read + write)."""
    y = torch.empty_like(x)
    ms = time_fn(lambda: y.copy_(x), device, iters)
    return 2 * x.numel() * x.element_size() / ms


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default="8192x128256,8192x151936,4096x256,4096x32000")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--divergences", default=",".join(DIVERGENCES))
    ap.add_argument("--grad-outputs", default="1.0,0.5")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--short", action="store_true", help="leave out the '+scale fwd' rows")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if unknown := sorted(set(args.divergences.split(",")) - set(DIVERGENCES)):
        ap.error(f"--divergences: unknown {unknown}; expected some of {', '.join(DIVERGENCES)}")
    if not 0 <= args.beta <= 1:
        ap.error(f"--beta: expected a number in [0, 1], got {args.beta}")
    if args.iters < 1:
        ap.error(f"--iters: expected at least 1, got {args.iters}")
    if args.threads:
        torch.set_num_threads(args.threads)
    lossfns = load_lossfns()
    dev, dtype = args.device, DTYPES[args.dtype]
    compiled = None if args.no_compile else torch.compile(composite, dynamic=False)
    results = []
    print(f"device {torch.cuda.get_device_name() if dev == 'cuda' else 'cpu'} "
          f"({torch.get_num_threads()} threads), dtype {args.dtype}, T {args.temperature}, beta {args.beta}, "
          f"liger {'yes' if os.environ.get('LIGER_PATH') else 'no'}")
    hdr = f"{'shape':>13} {'divergence':>10} {'go':>4} {'impl':>11} {'ms':>8} {'%3-str':>7} {'%5-str':>7} {'vs comp':>8} {'extra MB':>9}"
    print(hdr)
    for shape in args.shapes.split(","):
        BT, V = map(int, shape.split("x"))
        g = torch.Generator(device="cpu").manual_seed(0)
        s0 = (torch.randn(BT, V, generator=g) * 2).to(dev, dtype)
        t = (torch.randn(BT, V, generator=g) * 2).to(dev, dtype)
        labels = torch.randint(0, V, (BT,), generator=g).to(dev)
        elem = s0.element_size()
        bw = copy_bandwidth(s0, dev, args.iters) if dev == "cuda" else None
        for div in args.divergences.split(","):
            for go in map(float, args.grad_outputs.split(",")):
                go_t = torch.tensor(go, device=dev)
                impls = {"composite": composite}  # first: the other rows' speedups are over it
                if compiled is not None:
                    impls["compiled"] = compiled
                lg = liger_fn(div)
                if lg is not None and dev == "cuda":
                    impls["liger"] = lg
                impls["ours"] = lambda s, t, l, d, b, T: lossfns.distill_loss(s, t, l, d, b, T)
                impls["ours+scale"] = lambda s, t, l, d, b, T: lossfns.distill_loss(
                    s, t, l, d, b, T, grad_scale=go_t.reshape(1))
                # Forward alone (what a step's forward costs before its backward):
                impls["ours fwd"] = impls["ours"]
                if not args.short:
                    impls["+scale fwd"] = impls["ours+scale"]
                comp_ms = None
                for name, fn in impls.items():
                    s = s0.clone().requires_grad_()

                    forward_only = name.endswith(" fwd")

                    def step():
                        s.grad = None
                        loss = fn(s, t, labels, div, args.beta, args.temperature)
                        if not forward_only:
                            loss.backward(go_t)
                    try:
                        ms = time_fn(step, dev, args.iters)
                        extra = extra_memory_mb(step, s) if dev == "cuda" else None
                    except Exception as e:  # noqa: BLE001 (a row that cannot run says why)
                        print(f"{shape:>13} {div:>10} {go:>4} {name:>11} failed: {str(e).splitlines()[0][:80]}")
                        continue
                    if name == "composite":
                        comp_ms = ms
                    lim3 = 3 * BT * V * elem / bw if bw else None
                    lim5 = 5 * BT * V * elem / bw if bw else None
                    row = dict(shape=shape, divergence=div, grad_output=go, impl=name, ms=ms,
                               pct3=100 * lim3 / ms if lim3 else None, pct5=100 * lim5 / ms if lim5 else None,
                               speedup_vs_composite=(comp_ms / ms) if comp_ms else None, extra_mb=extra,
                               copy_gbps=bw / 1e6 if bw else None)
                    results.append(row)
                    f = lambda v, fmt: (fmt % v) if v is not None else "-"  # noqa: E731
                    print(f"{shape:>13} {div:>10} {go:>4} {name:>11} {ms:8.3f} {f(row['pct3'], '%6.1f%%'):>7} "
                          f"{f(row['pct5'], '%6.1f%%'):>7} {f(row['speedup_vs_composite'], '%7.2fx'):>8} "
                          f"{f(extra, '%9.1f'):>9}", flush=True)
        del s0, t
    if bw:
        print(f"copy bandwidth (last shape): {bw / 1e6:.0f} GB/s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=dev, dtype=args.dtype, results=results), fh, indent=1)


if __name__ == "__main__":
    main()
