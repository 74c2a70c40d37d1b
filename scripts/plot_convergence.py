#!/usr/bin/env python3
"""Turns the CSVs of the `convergence` examples into PNG plots (matplotlib, Agg).

Usage: python3 scripts/plot_convergence.py CSV_DIR [OUT_DIR] [--prefix P] [--update-docs]

Reads every <name>_<dtype>.csv under CSV_DIR (recursively; only .csv files, so the .log files
next to them are ignored) for the names kernel_vs_reference, ties, padded, distill_works,
divergences, and
writes OUT_DIR/<P><name>_<dtype>.png, P being "convergence_" by default. OUT_DIR defaults to
CSV_DIR/plots. The repository's docs/img (the committed plots of docs/convergence.md) is refused
unless --update-docs is given. A different prefix
keeps plots of another machine apart, e.g. --prefix convergence_cuda_ writes
OUT_DIR/convergence_cuda_<name>_<dtype>.png next to the CPU ones. Uses only the standard
library's csv module and matplotlib.
"""
import csv
import math
import pathlib
import sys

from plot_common import refuse_docs_img, plt  # pyplot, Agg backend


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    # A run stopped mid-write leaves a short last row: keep the complete ones.
    rows = [r for r in rows if all(v not in (None, "") for v in r.values())]
    cols = {k: [float(r[k]) for r in rows] for k in rows[0]} if rows else {}
    return cols


def series(cols, x, y):
    """(xs, ys) without the NaN entries of y (metrics logged every k steps)."""
    pairs = [(a, b) for a, b in zip(cols[x], cols[y]) if not math.isnan(b)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def plot_kernel_vs_reference(c, axes, dtype):
    axes[0].plot(c["step"], c["loss_op"], label="lossfns op")
    axes[0].plot(c["step"], c["loss_ref"], "--", label="composite reference")
    axes[0].set(title=f"training loss ({dtype})", xlabel="step", ylabel="loss")
    axes[1].semilogy(c["step"], [max(v, 1e-12) for v in c["rel_diff"]], label="|loss diff| / loss")
    axes[1].semilogy(c["step"], [max(v, 1e-12) for v in c["weight_diff"]], label="max |w_op - w_ref|")
    axes[1].set(title="op vs reference (floored at 1e-12)", xlabel="step")


def plot_ties(c, axes, dtype):
    axes[0].plot(c["step"], c["ties_op"], label="op")
    axes[0].plot(c["step"], c["ties_legacy"], "--", label="legacy sign")
    axes[0].set(title=f"exact-tie fraction of p vs q ({dtype})", xlabel="step", ylim=(-0.02, 1.02))
    for key, style, label in (("val_ce_op", "-o", "op"), ("val_ce_legacy", "--x", "legacy sign")):
        axes[1].plot(*series(c, "step", key), style, label=label)
    axes[1].set(title="shifted data: validation CE", xlabel="step")
    axes[2].plot(c["step"], c["pure_drift_op"], label="op (stays 0)")
    axes[2].plot(c["step"], c["pure_drift_legacy"], "--", label="legacy sign")
    axes[2].set_yscale("symlog", linthresh=1e-9)
    axes[2].set(title="pure self-distillation: max |w - w_teacher|", xlabel="step")


def plot_padded(c, axes, dtype):
    axes[0].plot(c["step"], c["loss_unpadded"], label="unpadded")
    axes[0].plot(c["step"], c["loss_padded"], "--", label="padded")
    axes[0].set(title=f"training loss ({dtype})", xlabel="step", ylabel="loss")
    axes[1].semilogy(c["step"], [max(v, 1e-12) for v in c["rel_diff"]], label="|loss diff| / loss")
    axes[1].semilogy(c["step"], [max(v, 1e-12) for v in c["real_weight_diff"]],
                     label="max |w_pad - w| (real rows)")
    axes[1].set(title="padded vs unpadded (floored at 1e-12)", xlabel="step")


def plot_distill_works(c, axes, dtype):
    axes[0].plot(*series(c, "step", "val_distilled"), "-o", label="distilled (TVD + 0.1 CE)")
    axes[0].plot(*series(c, "step", "val_hard_labels"), "-x", label="hard labels only")
    axes[0].axhline(c["val_teacher"][0], color="gray", ls="--", label="teacher")
    axes[0].axhline(c["entropy_floor"][0], color="black", ls=":", label="entropy floor")
    axes[0].set(title=f"validation CE, nats/token ({dtype})", xlabel="step")


# The divergence column of divergences_<dtype>.csv: lossfns::Divergence's values; -1 is the
# hard-label student (CE alone).
DIVERGENCE_NAMES = {0: "tvd", 1: "forward_kl", 2: "reverse_kl", 3: "jsd"}


def plot_divergences(c, axes, dtype):
    def rows_of(code):
        return {k: [v for d, v in zip(c["divergence"], col) if d == code] for k, col in c.items()}

    hard = rows_of(-1)
    axes[0].plot(*series(hard, "step", "val_ce_op"), "k-x", label="hard labels only")
    for code, name in DIVERGENCE_NAMES.items():
        rows = rows_of(code)
        if not rows["step"]:
            continue
        line, = axes[0].plot(*series(rows, "step", "val_ce_op"), "-o", ms=3, label=f"{name} op")
        axes[0].plot(*series(rows, "step", "val_ce_ref"), "--", color=line.get_color(),
                     label=f"{name} float64 ref")
        axes[1].semilogy(rows["step"], [max(v, 1e-12) for v in rows["rel_diff"]],
                         color=line.get_color(), label=name)
    axes[0].set(title=f"validation CE, nats/token ({dtype})", xlabel="step")
    axes[1].set(title="|kd op - kd ref| / kd ref (floored at 1e-12)", xlabel="step")


PLOTS = {"kernel_vs_reference": (plot_kernel_vs_reference, 2), "ties": (plot_ties, 3),
         "padded": (plot_padded, 2), "distill_works": (plot_distill_works, 1),
         "divergences": (plot_divergences, 2)}


def parse(argv):
    """(CSV_DIR, OUT_DIR, prefix) from the command line; exits with the usage otherwise."""
    prefix, positional, i, update_docs = "convergence_", [], 1, False
    if "-h" in argv[1:] or "--help" in argv[1:]:  # as the other plot scripts: stdout, 0
        print(__doc__)
        sys.exit(0)

    def usage():
        print(__doc__, file=sys.stderr)
        sys.exit(2)

    while i < len(argv):
        arg = argv[i]
        if arg == "--prefix" and i + 1 < len(argv):
            prefix, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--prefix="):
            prefix = arg[len("--prefix="):]
        elif arg == "--update-docs":
            update_docs = True
        elif arg.startswith("-"):
            usage()
        else:
            positional.append(arg)
        i += 1
    if len(positional) not in (1, 2):
        usage()
    csv_dir = pathlib.Path(positional[0])
    out_dir = pathlib.Path(positional[1]) if len(positional) == 2 else csv_dir / "plots"
    refuse_docs_img(out_dir, update_docs)
    return csv_dir, out_dir, prefix


def main(argv):
    csv_dir, out_dir, prefix = parse(argv)
    if not csv_dir.is_dir():
        sys.exit(f"plot_convergence: error: {csv_dir} is not a directory (give the directory of the "
                 "convergence examples' CSVs, their --out)")
    written = 0
    for path in sorted(csv_dir.rglob("*.csv")):
        name, _, dtype = path.stem.rpartition("_")
        if name not in PLOTS:
            continue
        try:
            cols = read(path)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            sys.exit(f"plot_convergence: error: cannot read {path} as a convergence CSV: {e}")
        if not cols:
            continue
        fn, panels = PLOTS[name]
        fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.2), squeeze=False)
        try:
            fn(cols, axes[0], dtype)
        except KeyError as e:
            sys.exit(f"plot_convergence: error: {path} has no column {e}: not a CSV of this version's "
                     f"`convergence {name}`")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            sys.exit(f"plot_convergence: error: cannot make {out_dir}: {e}")
        for ax in axes[0]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        fig.tight_layout()
        out = out_dir / f"{prefix}{name}_{dtype}.png"
        try:
            fig.savefig(out, dpi=80)
        except OSError as e:
            sys.exit(f"plot_convergence: error: cannot write {out}: {e}")
        plt.close(fig)
        print(out)
        written += 1
    if written == 0:
        sys.exit(f"no convergence CSVs under {csv_dir}")


if __name__ == "__main__":
    main(sys.argv)
