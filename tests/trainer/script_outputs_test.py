#!/usr/bin/env python3
"""The scripts that write a whole directory (scripts/prepare_smollm2.py, bench/make_random_hf.py,
scripts/make_hf_fixtures.py) never replace or delete one they did not make, and say so without a
traceback; the plotting scripts (plot_run.py, plot_bench.py, plot_distill.py, plot_convergence.py)
read only their program's output and name a file they cannot read or an --out they cannot write;
the benches refuse arguments they would misread; scripts/doc_numbers.py tells another CPU type's
last digits from a broken build's numbers.

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
SCRIPTS = ROOT / "scripts"


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
    # ... and a file without one training or evaluation record is not plotted as an empty figure.
    (work / "empty.jsonl").write_text("")
    r = run(PLOT_RUN, work / "empty.jsonl", "--out", work / "e.png")
    check(r.returncode == 2 and "has no training or evaluation records" in r.stderr and
          not (work / "e.png").exists(), f"plot_run empty: {r.returncode} {r.stderr}")

    # make_hf_fixtures.py: a fixture name that holds a user's directory, or a README.md it did not
    # write, stops it before anything is changed.
    fixtures = work / "fixtures"
    (fixtures / "mistral").mkdir(parents=True)
    (fixtures / "mistral" / "model.safetensors").write_text("mine")
    before = tree(fixtures)
    r = run(SCRIPTS / "make_hf_fixtures.py", "--out", fixtures, "--only", "mistral")
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"{fixtures / 'mistral'} exists and is not a fixture this script wrote" in r.stderr and
          tree(fixtures) == before, f"make_hf_fixtures dir: {r.returncode} {r.stderr}")
    shutil.rmtree(fixtures / "mistral")
    (fixtures / "README.md").write_text("my notes\n")
    r = run(SCRIPTS / "make_hf_fixtures.py", "--out", fixtures)
    check(r.returncode == 1 and "README.md exists and was not written by this script" in r.stderr
          and tree(fixtures) == ["README.md"] and (fixtures / "README.md").read_text() == "my notes\n",
          f"make_hf_fixtures README: {r.returncode} {r.stderr}")

    # plot_bench.py / plot_distill.py: a missing file, a file that is not JSON, the other bench's
    # JSON and no results are one-line errors; --help is the usage; nothing is written.
    (work / "not.json").write_text("xx")
    (work / "other.json").write_text('{"results": [], "device": "cpu", "dtype": "fp32"}')
    (work / "nocases.json").write_text('{"cases": [], "device": "cpu", "copy_bandwidth_gbs": 1}')
    for script, args, said in (
            ("plot_bench.py", [work / "missing.json"], "cannot read"),
            ("plot_bench.py", [work / "not.json"], "is not JSON"),
            ("plot_bench.py", [work / "other.json"], "not the JSON that tvd_bench --json writes"),
            ("plot_bench.py", [work / "nocases.json"], "has no cases"),
            ("plot_distill.py", [work / "nocases.json"], "not the JSON that bench/distill_bench.py"),
            ("plot_distill.py", [work / "other.json"], "has no timed results")):
        r = run(SCRIPTS / script, *args, work / "plot.png")
        check(r.returncode == 1 and "Traceback" not in r.stderr and said in r.stderr and
              not (work / "plot.png").exists(), f"{script} {args}: {r.returncode} {r.stderr}")
    for script in ("plot_bench.py", "plot_distill.py"):
        r = run(SCRIPTS / script, "--help")
        check(r.returncode == 0 and "Usage:" in r.stdout, f"{script} --help: {r.returncode} {r.stdout}")

    # plot_convergence.py: a CSV directory that does not exist is named, and no plots/ is made.
    r = run(SCRIPTS / "plot_convergence.py", work / "no_csvs")
    check(r.returncode == 1 and "is not a directory" in r.stderr and not (work / "no_csvs").exists(),
          f"plot_convergence: {r.returncode} {r.stderr}")
    r = run(SCRIPTS / "plot_convergence.py", "--help")
    check(r.returncode == 0 and "Usage:" in r.stdout and not r.stderr,
          f"plot_convergence --help: {r.returncode} {r.stdout} {r.stderr}")
    r = run(SCRIPTS / "plot_convergence.py", "--bogus", work)
    check(r.returncode == 2 and "Usage:" in r.stderr, f"plot_convergence --bogus: {r.returncode}")

    # A python without matplotlib (a stand-in module that fails to import hides the real one):
    # every plotting script still prints its usage, and otherwise names the python and the fix
    # in one line instead of an ImportError's traceback.
    hidden = work / "no_matplotlib"
    hidden.mkdir()
    (hidden / "matplotlib.py").write_text("raise ImportError('hidden by the test')\n")
    for script in ("plot_run.py", "plot_bench.py", "plot_distill.py", "plot_convergence.py"):
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(hidden)}
        r = subprocess.run([sys.executable, str(SCRIPTS / script), "--help"], capture_output=True,
                           text=True, env=env)
        check(r.returncode == 0 and "usage" in r.stdout.lower() and not r.stderr,
              f"{script} --help without matplotlib: {r.returncode} {r.stderr}")
        r = subprocess.run([sys.executable, str(SCRIPTS / script), str(work / "x.json")],
                           capture_output=True, text=True, env=env)
        check(r.returncode == 1 and "Traceback" not in r.stderr and
              f"{script}: error: matplotlib cannot be imported by {sys.executable} (hidden by the test)"
              in r.stderr and "LOSSFNS_PYTHON" in r.stderr,
              f"{script} without matplotlib: {r.returncode} {r.stderr}")

    # The benches refuse a divergence or mode they do not know (instead of timing another one).
    r = run(ROOT / "bench" / "distill_bench.py", "--device", "cpu", "--divergences", "kl")
    check(r.returncode == 2 and "--divergences: unknown ['kl']" in r.stderr,
          f"distill_bench: {r.returncode} {r.stderr}")
    r = run(ROOT / "bench" / "trainer_bench.py", "--device", "cpu", "--tiny", "--modes", "trainer,eagr")
    check(r.returncode == 2 and "--modes: expected some of trainer, eager, compile" in r.stderr,
          f"trainer_bench: {r.returncode} {r.stderr}")

    QUICKSTART_ROWS = ("teacher 607360 1.3367 1.2770 +0.0597 runs/quickstart/teacher\n"
                       "student (distilled) 106240 1.6838 1.2770 +0.4068 runs/quickstart/student\n"
                       "student (hard labels) 106240 2.6756 1.2770 +1.3986 runs/quickstart/baseline")
    # doc_numbers.py: what another CPU type may print (last digits, a noise-level value in other
    # words) against what it may not (another table, a PASS turned FAIL, a broken build's zeros).
    sys.path.insert(0, str(SCRIPTS))
    from doc_numbers import last_digits_only
    for doc, program, same in (("1.2770 | +0.0597", "1.2771 | +0.0601", True),
                               ("costs 0.023 nats", "costs 0.026 nats", True),
                               ("**0 (bit-identical)**", "3.1e-9", True),
                               ("| bf16 | **0** | **0 (bit-identical)** | 2.366959 / 2.366959 | PASS |",
                                "| bf16 | 1.2e-9 | 3.1e-9 | 2.366961 / 2.366958 | PASS |", True),
                               ("| bf16 | **0** | 2.366959 |", "| bf16 | **0** | 2.366959 | 1 |", False),
                               ("| fp32 | PASS |", "| fp32 | FAIL |", False),
                               ("floor 1.2770 excess +0.0597", "floor 0.0000 excess +1.3367", False),
                               # measured: the quickstart's distilled row on an AMD EPYC (Zen 4)
                               # against the Intel Xeon the doc was made on
                               (QUICKSTART_ROWS, QUICKSTART_ROWS.replace("1.6838 1.2770 +0.4068",
                                                                         "1.7036 1.2770 +0.4266"), True),
                               # a distilled student no better than the hard-label one, a row
                               # gone, a table gone, a parameter count, an exact 0 turned into a
                               # value: on any CPU a failure
                               (QUICKSTART_ROWS, QUICKSTART_ROWS.replace("1.6838 1.2770 +0.4068",
                                                                         "2.6756 1.2770 +1.3986"), False),
                               (QUICKSTART_ROWS, QUICKSTART_ROWS.rsplit("\n", 1)[0], False),
                               (QUICKSTART_ROWS, "", False),
                               (QUICKSTART_ROWS, QUICKSTART_ROWS.replace("106240", "106241", 1), False),
                               ("| ties | 0 exactly |", "| ties | -5.882e-03 exactly |", False),
                               ("| +0.0597 |", "|  -0.0597 |", False),
                               ("| 12.3 | x |", "|  12.4 | x |", True)):
        check(last_digits_only(doc, program) == same, f"doc_numbers {doc!r} vs {program!r}")
    print("PASS")


if __name__ == "__main__":
    main()
