"""Benchmark of lossfns.fused_linear_distill_loss (the loss from hidden states and lm_heads, forward
+ backward) against the unfused paths and Liger's chunked LigerFusedLinearJSDLoss, on one device.

    python bench/fused_linear_bench.py                          # CUDA: the issue's shapes, bf16
    LIGER_PATH=.dev/liger python bench/fused_linear_bench.py     # adds Liger's rows
    python bench/fused_linear_bench.py --device cpu --short     # tiny shapes: checks that it runs

Shapes are BTxH_sxH_txV: 8192x896x1536x151936 (a Qwen2.5-0.5B student, a 1.5B teacher) and
8192x2048x4096x128256 (Llama-3.2-1B-like student, Llama-3.1-8B-like teacher).

Rows per (shape, divergence, ce_weight):
  composite   logits = hidden @ lm_head.T in the dtype; log_softmax in float32, the divergence
              (+ cross_entropy on the float32 logits) and autograd (bench/distill_bench.py's
              composite)
  unfused     the same logits, lossfns.distill_loss (+ lossfns.cross_entropy_loss: the fused ops
              on the full logits, no float32 copy)
  fused       lossfns.fused_linear_distill_loss (chunk_size automatic, or --chunk)
  liger       Liger's LigerFusedLinearJSDFunction with a float32 lm_head gradient (accum_dtype):
              jsd, and the KLs as beta 0 / 1; it has no TVD and no cross-entropy (those rows are
              left out), when LIGER_PATH points at a directory holding liger_kernel/
Columns: median ms of forward + backward (the implementations timed in interleaved rounds), the
peak MiB the step allocates beyond its inputs (the gradients included), and the largest
difference from the composite of the loss (relative) and of d loss / d lm_head (relative to its
largest element). Liger is never committed: copy its src/liger_kernel (ops/fused_linear_jsd.py and
what it imports) under LIGER_PATH.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from distill_bench import DTYPES, composite, load_lossfns, time_fn  # noqa: E402

SHAPES = "8192x896x1536x151936,8192x2048x4096x128256"
SHORT_SHAPES = "96x32x48x1000,50x16x24x3000"


def liger_fused():
    path = os.environ.get("LIGER_PATH")
    if not path:
        return None
    sys.path.insert(0, path)
    from liger_kernel.ops.fused_linear_jsd import LigerFusedLinearJSDFunction  # noqa: E402
    return LigerFusedLinearJSDFunction


def impls(lossfns, liger, divergence, beta, T, ce_weight, chunk):
    """name -> fn(sh, sw, th, tw, labels) returning the loss (batchmean over the labelled rows)."""
    F = torch.nn.functional

    def ce_of(s, labels):
        return F.cross_entropy(s.float(), labels, ignore_index=-100) if ce_weight else 0.0

    def comp(sh, sw, th, tw, labels):
        s = sh @ sw.T
        with torch.no_grad():
            t = th @ tw.T
        return composite(s, t, labels, divergence, beta, T) + ce_weight * ce_of(s, labels)

    def unfused(sh, sw, th, tw, labels):
        s = sh @ sw.T
        with torch.no_grad():
            t = th @ tw.T
        loss = lossfns.distill_loss(s, t, labels, divergence, beta, T)
        return loss + ce_weight * lossfns.cross_entropy_loss(s, labels) if ce_weight else loss

    def fused(sh, sw, th, tw, labels):
        return lossfns.fused_linear_distill_loss(sh, sw, th, tw, labels, divergence, beta, T, ce_weight=ce_weight,
                                                 chunk_size=chunk)

    out = {"composite": comp, "unfused": unfused, "fused": fused}
    if liger is not None and divergence != "tvd" and not ce_weight:
        b = {"forward_kl": 0.0, "reverse_kl": 1.0}.get(divergence, beta)
        out["liger"] = lambda sh, sw, th, tw, labels: liger.apply(sh, sw, th, tw, labels, b, -100, T, torch.float32)
    return out


def time_back_to_back(fn, device, iters, warmup=1):
    """Mean ms of `iters` runs queued one after the other, timed as a whole: the host runs ahead of
    the device, as in a training loop, so the launches before a step's first kernel (the checks and
    small ops of an op's host code) overlap the previous step's kernels instead of leaving the device
    idle, as they do in time_fn, which waits for each run."""
    if device != "cuda":
        return time_fn(fn, device, iters, warmup)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(iters):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / iters


def interleaved(steps, device, iters, rounds=4, back_to_back=False):
    """Median ms of each step function over `rounds` interleaved rounds (the order alternating), each
    the median of iters / rounds runs after one warm-up (back_to_back: their mean, queued together):
    the GPU's clocks drift by several percent between runs a minute apart (power and heat; 5-8%
    measured on the H200 in session 16), which timing one implementation after the other would
    attribute to the implementations."""
    per = max(1, -(-iters // rounds))  # at least iters runs in all
    timer = time_back_to_back if back_to_back else time_fn
    names = list(steps)
    medians = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            medians[name].append(timer(steps[name], device, per, warmup=1))
    return {name: statistics.median(m) for name, m in medians.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shapes", default=None, help=f"BTxH_sxH_txV,... (default {SHAPES})")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--divergences", default="forward_kl,jsd,tvd")
    ap.add_argument("--ce-weights", default="0,0.5")
    ap.add_argument("--beta", type=float, default=0.5)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--chunk", type=int, default=None, help="fused chunk_size (default: automatic)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--back-to-back", action="store_true",
                    help="time each round's runs queued together (the host ahead, as in training) "
                    "instead of waiting for each run")
    ap.add_argument("--impls", default="", help="rows to run, e.g. unfused,fused (default: every one; the "
                    "first one run is the reference of the 'vs comp' and difference columns)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--short", action="store_true", help=f"tiny shapes ({SHORT_SHAPES}), 2 iterations")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    chosen = set(args.impls.split(",")) if args.impls else None
    known = {"composite", "unfused", "fused", "liger"}
    if chosen is not None and not chosen <= known:
        ap.error(f"--impls: unknown row(s) {', '.join(sorted(chosen - known))}; "
                 f"choose from {', '.join(sorted(known))}")
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = args.shapes or (SHORT_SHAPES if args.short else SHAPES)
    iters = 2 if args.short else args.iters
    lossfns = load_lossfns()
    dev, dtype = args.device, DTYPES[args.dtype]
    cuda = dev == "cuda"
    liger = liger_fused() if cuda else None
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'} ({torch.get_num_threads()} threads), "
          f"dtype {args.dtype}, T {args.temperature}, beta {args.beta}, chunk {args.chunk or 'auto'}, "
          f"liger {'yes' if liger else 'no'}, timing {'back to back' if args.back_to_back else 'each run waited for'}")
    print(f"{'shape':>24} {'divergence':>10} {'ce':>4} {'impl':>9} {'ms':>9} {'peak MiB':>9} {'vs comp':>8} "
          f"{'d loss':>8} {'d dW':>8}")
    results = []
    for shape in shapes.split(","):
        BT, Hs, Ht, V = map(int, shape.split("x"))
        g = torch.Generator().manual_seed(0)
        sh = torch.randn(BT, Hs, generator=g).to(dev, dtype)
        sw = (torch.randn(V, Hs, generator=g) * Hs ** -0.5 * 3).to(dev, dtype)  # logits O(3)
        th = torch.randn(BT, Ht, generator=g).to(dev, dtype)
        tw = (torch.randn(V, Ht, generator=g) * Ht ** -0.5 * 3).to(dev, dtype)
        labels = torch.randint(0, V, (BT,), generator=g)
        labels[::7] = -100
        labels = labels.to(dev)
        for div in args.divergences.split(","):
            for ce in map(float, args.ce_weights.split(",")):
                steps, params = {}, {}
                for name, fn in impls(lossfns, liger, div, args.beta, args.temperature, ce, args.chunk).items():
                    if chosen is not None and name not in chosen:
                        continue
                    h, w = sh.clone().requires_grad_(), sw.clone().requires_grad_()

                    def step(fn=fn, h=h, w=w):
                        h.grad = w.grad = None
                        loss = fn(h, w, th, tw, labels)
                        loss.backward()
                        return loss
                    try:
                        step()
                    except Exception as e:  # noqa: BLE001 (a row that cannot run says why)
                        print(f"{shape:>24} {div:>10} {ce:>4} {name:>9} failed: {str(e).splitlines()[0][:80]}")
                        continue
                    steps[name], params[name] = step, (h, w)
                try:
                    times = interleaved(steps, dev, iters, back_to_back=args.back_to_back)
                except Exception as e:  # noqa: BLE001 (e.g. out of memory in a later round)
                    print(f"{shape:>24} {div:>10} {ce:>4} timing failed: {str(e).splitlines()[0][:80]}")
                    continue
                ref = None
                for name, step in steps.items():
                    h, w = params[name]
                    peak = None
                    if cuda:
                        h.grad = w.grad = None
                        torch.cuda.synchronize()
                        base = torch.cuda.memory_allocated()
                        torch.cuda.reset_peak_memory_stats()
                    loss = step().detach().float()
                    if cuda:
                        torch.cuda.synchronize()
                        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                    gw = w.grad.float()
                    ms = times[name]
                    if ref is None:
                        ref = (ms, loss, gw)
                    d_loss = ((loss - ref[1]).abs() / ref[1].abs().clamp_min(1e-30)).item()
                    d_gw = ((gw - ref[2]).abs().max() / ref[2].abs().max().clamp_min(1e-30)).item()
                    row = dict(shape=shape, divergence=div, ce_weight=ce, impl=name, ms=ms, peak_mib=peak,
                               speedup_vs_composite=ref[0] / ms, d_loss=d_loss, d_grad_lm_head=d_gw)
                    results.append(row)
                    peak_s = f"{peak:9.0f}" if peak is not None else f"{'-':>9}"
                    print(f"{shape:>24} {div:>10} {ce:>4} {name:>9} {ms:9.2f} {peak_s} {ref[0] / ms:7.2f}x "
                          f"{d_loss:8.1e} {d_gw:8.1e}", flush=True)
                    del gw
                del ref, steps, params
        del sh, sw, th, tw
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=dev, dtype=args.dtype, results=results), fh, indent=1)


if __name__ == "__main__":
    main()
