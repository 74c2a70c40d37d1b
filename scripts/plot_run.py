#!/usr/bin/env python3
"""Plot the curves of one or more distill_trainer runs into one PNG (matplotlib, Agg).

    python scripts/plot_run.py RUN [RUN ...] --out runs.png [--title T] [--update-docs]

Each RUN is a run directory (its metrics.jsonl is read) or a metrics.jsonl file itself; the
label is the directory's name (or the file's stem). Two panels, shared step axis:
  left:  training loss, kd_loss and ce_loss (each run's colour; kd dashed, ce dotted)
  right: validation cross-entropy of the student (val_loss), and the teacher's when the run
         logged one (grey, dashed)
The repository's docs/img (committed plots) is refused unless --update-docs is given.
A last line cut off by a crash is skipped (it is not JSON yet). Uses the standard library and
matplotlib only (the set-up's virtualenv has it: `build/setup.env`'s LOSSFNS_PYTHON).
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

from plot_common import refuse_docs_img, plt  # pyplot, Agg backend


def read_metrics(path: pathlib.Path) -> list[dict]:
    """The trainer's records: JSON objects with an integer "step" (a partial last line, or a line
    that is not such a record, is skipped)."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a partial last line
                if isinstance(record, dict) and isinstance(record.get("step"), int):
                    records.append(record)
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"plot_run: error: cannot read {path} as the trainer's metrics.jsonl: {e}")
    return records


def series(records: list[dict], kind: str, key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        value = r.get(key)
        if r.get("type") == kind and isinstance(value, (int, float)) and math.isfinite(value):
            xs.append(r["step"])
            ys.append(value)
    return xs, ys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=pathlib.Path, help="run directories or metrics.jsonl files")
    parser.add_argument("--out", required=True, type=pathlib.Path, help="the PNG to write")
    parser.add_argument("--title", default="", help="a title over both panels")
    parser.add_argument("--update-docs", action="store_true",
                        help="allow writing into the repository's docs/img (committed plots)")
    args = parser.parse_args()
    refuse_docs_img(args.out.parent, args.update_docs)
    if args.out.is_dir():
        sys.exit(f"plot_run: error: --out {args.out} is a directory; give the image's file name "
                 "(e.g. runs.png)")

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), sharex=True)
    teacher_drawn = False
    for i, run in enumerate(args.runs):
        path = run / "metrics.jsonl" if run.is_dir() else run
        if not path.is_file():
            # A pipeline's directory holds its stages' runs, each with its metrics.jsonl.
            stages = sorted(d for d in run.iterdir() if (d / "metrics.jsonl").is_file()) \
                if run.is_dir() else []
            hint = (f"; it holds the runs {', '.join(str(d) for d in stages)}: plot those "
                    f"(a pipeline's stages)") if stages else " (give a run directory or a metrics.jsonl)"
            print(f"plot_run: error: {path} does not exist{hint}", file=sys.stderr)
            return 2
        records = read_metrics(path)
        if not any(r.get("type") in ("train", "eval") for r in records):
            print(f"plot_run: error: {path} has no training or evaluation records (is it the "
                  "trainer's metrics.jsonl, of a run that logged a step?)", file=sys.stderr)
            return 2
        label = run.name if run.is_dir() else run.name.removesuffix(".metrics.jsonl").removesuffix(".jsonl")
        colour = f"C{i}"
        for key, style in (("loss", "-"), ("kd_loss", "--"), ("ce_loss", ":")):
            xs, ys = series(records, "train", key)
            if xs and not (key == "ce_loss" and series(records, "train", "kd_loss")[0] == []):
                left.plot(xs, ys, style, color=colour, label=f"{label} {key}")
        xs, ys = series(records, "eval", "val_loss")
        right.plot(xs, ys, "o-", color=colour, label=f"{label} val_loss")
        xs, ys = series(records, "eval", "teacher_val_loss")
        if xs and not teacher_drawn:
            right.plot(xs, ys, "--", color="grey", label="teacher val_loss")
            teacher_drawn = True
    left.set_title("training (per step)")
    right.set_title("validation cross-entropy (nats/token)")
    for ax in (left, right):
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(args.out, dpi=110)
    except ValueError as e:  # an extension matplotlib has no writer for
        sys.exit(f"plot_run: error: --out {args.out}: {e}")
    except OSError as e:  # a directory that cannot be made or written
        sys.exit(f"plot_run: error: cannot write --out {args.out}: {e}")
    print(f"plot_run: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
