#!/usr/bin/env python3
"""The scripts that write a whole directory (scripts/prepare_smollm2.py, bench/make_random_hf.py)
never replace or delete one they did not make, and say so without a traceback; scripts/plot_run.py
reads only the trainer's records and names a file it cannot read or an --out it cannot write.

Usage: script_outputs_test.py WORK_DIR   (ctest: distill.scripts.OutputDirectories). Prints PASS,
or the first failed check and exits 1. Nothing here downloads or builds a model: every refusal
comes before that work.
"""
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREPARE = ROOT / "scripts" / "prepare_smollm2.py"
RANDOM_HF = ROOT / "bench" / "make_random_hf.py"
PLOT_RUN = ROOT / "scripts" / "plot_run.py"


def check(ok, what):
    if not ok:
        print(f"FAIL: {what}")
        sys.exit(1)


def run(script, *args):
    return subprocess.run([sys.executable, str(script), *map(str, args)], capture_output=True,
                          text=True)


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def main():
    work = Path(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # prepare_smollm2.py: an --out that holds anything but its own earlier output is refused
    # (before it replaced it and deleted the user's files), and so is a file.
    user = work / "project"
    (user / "src").mkdir(parents=True)
    (user / "main.c").write_text("int main() {}\n")
    before = tree(user)
    r = run(PREPARE, "--out", user)
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"--out {user} exists and is not an earlier output of this script (no COMPLETE in it)"
          in r.stderr, f"non-empty --out: {r.returncode} {r.stderr}")
    check(tree(user) == before, f"the refused --out changed: {tree(user)}")
    (work / "afile").write_text("x")
    r = run(PREPARE, "--out", work / "afile")
    check(r.returncode == 1 and "is not an earlier output" in r.stderr and
          (work / "afile").read_text() == "x", f"file --out: {r.stderr}")

    # Its clean-up of dead runs' DIR.tmp-<pid> / DIR.old-<pid> takes only directories it made:
    # its work in progress (the owner file), an earlier output (COMPLETE, its JSON with a format),
    # or empty ones; a user's file that happens to be named COMPLETE does not make it ours.
    sys.path.insert(0, str(PREPARE.parent))
    spec = importlib.util.spec_from_file_location("prepare_smollm2", PREPARE)
    prepare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(prepare)
    out = work / "data"
    dead = 5_000_000  # above Linux's largest pid (PID_MAX_LIMIT, 2^22): no such process
    names = {f"data.old-{dead}": ("notes.txt", "x"), f"data.tmp-{dead + 1}": ("keep.bin", "x"),
             f"data.tmp-{dead + 2}": (prepare.OWNER, "x"),
             f"data.old-{dead + 3}": (prepare.MARKER, '{"format": 1}'),
             f"data.old-{dead + 4}": None, f"data.old-{dead + 5}": (prepare.MARKER, "done\n")}
    for name, file in names.items():
        (work / name).mkdir()
        if file:
            (work / name / file[0]).write_text(file[1])
    prepare.remove_stale(out)
    left = sorted(p.name for p in work.glob("data.*"))
    check(left == [f"data.old-{dead}", f"data.old-{dead + 5}", f"data.tmp-{dead + 1}"],
          f"remove_stale left {left}")
    check(prepare.ours(work / f"data.old-{dead}") is False and prepare.ours(work / "missing") is False,
          "ours() of a user's directory or of nothing")

    # make_random_hf.py: an OUT that is a file or a non-empty directory is refused, not reported
    # as written.
    r = run(RANDOM_HF, work / "afile", "--size", "0.5b", "--device", "cpu")
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"make_random_hf: {work / 'afile'} exists and is not an empty directory" in r.stderr and
          (work / "afile").read_text() == "x", f"make_random_hf file: {r.returncode} {r.stderr}")
    r = run(RANDOM_HF, user, "--size", "0.5b", "--device", "cpu")
    check(r.returncode == 1 and "exists and is not an empty directory" in r.stderr and
          tree(user) == before, f"make_random_hf dir: {r.stderr}")

    # plot_run.py: lines that are not the trainer's records (an array, a record without a step)
    # are skipped; an undecodable file and an --out that is a directory or an unknown format
    # are one-line errors.
    run_dir = work / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text('{"type":"train","step":1,"loss":2.0}\n[1,2]\n'
                                           '{"type":"train","loss":1}\n'
                                           '{"type":"eval","step":2,"val_loss":1.5}\n{"type":')
    r = run(PLOT_RUN, run_dir, "--out", work / "run.png")
    check(r.returncode == 0 and (work / "run.png").stat().st_size > 0, f"plot_run: {r.stderr}")
    (work / "bad.jsonl").write_bytes(b"\xff\n")
    for args, said in (([run_dir, "--out", work], f"--out {work} is a directory"),
                       ([run_dir, "--out", work / "p.xyz"], "Format 'xyz' is not supported"),
                       ([work / "bad.jsonl", "--out", work / "b.png"],
                        f"cannot read {work / 'bad.jsonl'} as the trainer's metrics.jsonl")):
        r = run(PLOT_RUN, *args)
        check(r.returncode == 1 and "Traceback" not in r.stderr and
              "plot_run: error: " in r.stderr and said in r.stderr, f"plot_run {args}: {r.stderr}")
    print("PASS")


if __name__ == "__main__":
    main()
