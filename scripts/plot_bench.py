#!/usr/bin/env python3
"""Plot tvd_bench's JSON: full-pass time of lossfns vs the LibTorch composite, and the full pass as
a fraction of the three-stream limit (CUDA); print the same numbers as a Markdown table.
Usage: plot_bench.py tvd_bench.json [out.png] [--update-docs]
out.png defaults to the JSON's name with .png (next to it). The repository's docs/img (the
committed plots of docs/benchmarks.md) is refused unless --update-docs is given."""
import pathlib
import sys

from plot_common import file_args, load_json, refuse_docs_img, save_figure, plt  # pyplot, Agg backend


def label(c):
    ign = ", ign" if c["ignored_rows"] else ""
    return f'{c["device"]} {c["BT"]}x{c["V"]} {c["dtype"]} g={c["grad_output"]:g}{ign}'


CASE_KEYS = ("device", "BT", "V", "dtype", "grad_output", "ignored_rows", "ours_fwd_ms", "ours_bwd_ms",
             "ours_full_ms", "ref_full_ms", "limit_ms")


def main(src, dst):
    data = load_json(src, ["cases", "device", "copy_bandwidth_gbs"], "tvd_bench --json")
    cases = data["cases"]
    if not isinstance(cases, list) or not cases:
        sys.exit(f"plot_bench.py: error: {src} has no cases: nothing to plot")
    for c in cases:
        if missing := [k for k in CASE_KEYS if not isinstance(c, dict) or k not in c]:
            sys.exit(f"plot_bench.py: error: {src}: a case without {', '.join(missing)}: not the JSON "
                     "that tvd_bench --json writes")
    cuda = [c for c in cases if c["device"] == "cuda"]
    fig, axes = plt.subplots(1, 2 if cuda else 1, figsize=(15 if cuda else 8, 0.35 * len(cases) + 2))
    axes = axes if cuda else [axes]
    names = [label(c) for c in cases]
    y = range(len(cases))
    ax = axes[0]
    ax.barh([i + 0.2 for i in y], [c["ref_full_ms"] for c in cases], 0.4, label="LibTorch composite")
    ax.barh([i - 0.2 for i in y], [c["ours_full_ms"] for c in cases], 0.4, label="lossfns")
    ax.set_yticks(list(y), names, fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("full pass (forward + backward), median ms, log scale")
    ax.invert_yaxis()
    ax.legend()
    if cuda:
        ax = axes[1]
        frac = [100 * c["limit_ms"] / c["ours_full_ms"] for c in cuda]
        ax.barh(range(len(cuda)), frac, color="tab:green")
        ax.axvline(90, color="k", ls="--", lw=1, label="90% target")
        ax.set_yticks(range(len(cuda)), [label(c) for c in cuda], fontsize=8)
        ax.set_xlabel(f'% of the three-stream limit at {data["copy_bandwidth_gbs"]:.0f} GB/s copy bandwidth')
        ax.set_xlim(0, 110)
        ax.invert_yaxis()
        ax.legend()
    fig.suptitle(f'TVD loss benchmark on {data["device"]}')
    fig.tight_layout()
    save_figure(fig, dst)
    print_table(data)


def print_table(data):
    print("| device | BT | V | dtype | grad_output | ignored rows | fwd ms | bwd ms | full ms "
          "| composite full ms | speedup | % of 3-stream limit |")
    print("|---|---:|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for c in data["cases"]:
        frac = f'{100 * c["limit_ms"] / c["ours_full_ms"]:.0f}%' if c["limit_ms"] > 0 else "-"
        print(f'| {c["device"]} | {c["BT"]} | {c["V"]} | {c["dtype"]} | {c["grad_output"]:g} '
              f'| {"yes" if c["ignored_rows"] else "no"} | {c["ours_fwd_ms"]:.3f} | {c["ours_bwd_ms"]:.3f} '
              f'| {c["ours_full_ms"]:.3f} | {c["ref_full_ms"]:.3f} | {c["ref_full_ms"] / c["ours_full_ms"]:.1f}x '
              f'| {frac} |')


if __name__ == "__main__":
    args, update = file_args(__doc__)
    if len(args) > 2:
        sys.exit(__doc__)
    dst = pathlib.Path(args[1]) if len(args) == 2 else pathlib.Path(args[0]).with_suffix(".png")
    refuse_docs_img(dst.parent, update)
    main(args[0], dst)
