#!/usr/bin/env python3
"""Plot bench/distill_bench.py's JSON: forward + backward time of lossfns.distill_loss against the
composite and Liger, per shape and divergence (grad_output 1), on a log scale.
Usage: plot_distill.py distill_bench.json [out.png] [--update-docs]
out.png defaults to the JSON's name with .png; the repository's docs/img is refused unless
--update-docs is given."""
import pathlib
import sys

from plot_common import file_args, load_json, refuse_docs_img, save_figure, plt  # pyplot, Agg backend

IMPLS = [("composite", "PyTorch composite (eager)"), ("liger", "Liger (Triton)"), ("ours", "lossfns.distill_loss"),
         ("ours+scale", "lossfns, grad_scale given")]


def main(src, dst):
    data = load_json(src, ["results", "device", "dtype"], "bench/distill_bench.py --json")
    try:
        rows = [r for r in data["results"] if r["grad_output"] == 1.0 and "ms" in r]
        rows = [r for r in rows if isinstance(r["ms"], (int, float)) and r["shape"] and r["divergence"]
                and r["impl"]]
    except (KeyError, TypeError) as e:
        sys.exit(f"plot_distill.py: error: {src}: a result without {e}: not bench/distill_bench.py's JSON")
    if not rows:
        sys.exit(f"plot_distill.py: error: {src} has no timed results at grad_output 1: nothing to plot")
    keys = []
    for r in rows:
        k = (r["shape"], r["divergence"])
        if k not in keys:
            keys.append(k)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(keys) + 1.5))
    impls = [(impl, label) for impl, label in IMPLS if any(r["impl"] == impl for r in rows)]
    h = 0.8 / len(impls)
    for n, (impl, label) in enumerate(impls):
        ms = {(r["shape"], r["divergence"]): r["ms"] for r in rows if r["impl"] == impl}
        ys = [i + n * h for i, k in enumerate(keys) if k in ms]
        ax.barh(ys, [ms[k] for k in keys if k in ms], h, label=label)
    ax.set_yticks([i + 0.4 - h / 2 for i in range(len(keys))])
    ax.set_yticklabels([f"{s} {d}" for s, d in keys])
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"forward + backward, ms (log scale); {data['device']}, {data['dtype']}")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    save_figure(fig, dst)


if __name__ == "__main__":
    args, update_docs = file_args(__doc__)
    if len(args) > 2:
        sys.exit(__doc__)
    src = pathlib.Path(args[0])
    dst = pathlib.Path(args[1]) if len(args) > 1 else src.with_suffix(".png")
    refuse_docs_img(dst.parent, update_docs)
    main(src, dst)
