#!/usr/bin/env python3
"""Plot bench/distill_bench.py's JSON: forward + backward time of lossfns.distill_loss against the
composite and Liger, per shape and divergence (grad_output 1), on a log scale.
Usage: plot_distill.py distill_bench.json [out.png] [--update-docs]
out.png defaults to the JSON's name with .png; the repository's docs/img is refused unless
--update-docs is given."""
import json
import pathlib
import sys

from plot_common import refuse_docs_img  # first: selects the Agg backend

import matplotlib.pyplot as plt  # noqa: E402

IMPLS = [("composite", "PyTorch composite (eager)"), ("liger", "Liger (Triton)"), ("ours", "lossfns.distill_loss"),
         ("ours+scale", "lossfns, grad_scale given")]


def main(src, dst):
    data = json.load(open(src))
    rows = [r for r in data["results"] if r["grad_output"] == 1.0]
    keys = []
    for r in rows:
        k = (r["shape"], r["divergence"])
        if k not in keys:
            keys.append(k)
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(keys) + 1.5))
    h = 0.8 / len(IMPLS)
    for n, (impl, label) in enumerate(IMPLS):
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
    fig.savefig(dst, dpi=110)
    print(f"wrote {dst}")


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--update-docs"]
    if not args:
        sys.exit(__doc__)
    src = pathlib.Path(args[0])
    dst = pathlib.Path(args[1]) if len(args) > 1 else src.with_suffix(".png")
    refuse_docs_img(dst, "--update-docs" in sys.argv)
    main(src, dst)
