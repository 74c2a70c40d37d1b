#!/usr/bin/env python3
"""The numbers of docs/ that come from CPU runs: run the documented commands, render the
documented tables from what the programs print and write, and compare them with the docs.

    python3 scripts/doc_numbers.py SECTION --build BUILD_DIR [--work DIR] [--update]

SECTION is one of
  quickstart   docs/trainer.md: `distill_trainer` with no arguments (the embedded quickstart),
               OMP_NUM_THREADS=2; about a minute on 2 cores
  scenarios    docs/scenarios.md: the self-distillation configs and configs/padded_vocab.yaml,
               OMP_NUM_THREADS=2; about a minute
  convergence  docs/convergence.md: the nine `convergence ... --small` runs,
               OMP_NUM_THREADS=1; seconds

The commands run in the work directory (default BUILD_DIR/doc_numbers/SECTION, emptied first),
which is their working directory: `runs/...` lands there, as it lands in the repository root
when you type the documented command there. Each generated part of a doc sits between
`<!-- doc_numbers: NAME ... -->` and `<!-- /doc_numbers: NAME -->`; without --update the script
prints a diff and exits 1 when a part differs from what the programs produced (the ctest tests
`docs.numbers.SECTION` run it so); with --update it rewrites those parts of the doc.

The numbers are deterministic for a given build, thread count and CPU type (the vector
instructions that LibTorch's kernels pick): on another CPU type the last digits differ. So each
block's opening comment records the CPU it was generated on (vendor, family/model, the vector
extensions that matter); on a different CPU a mismatch of the last digits is not a failure: the
script prints the diff and exits 77 (ctest: skipped). A changed PASS/FAIL, or a number off by more
than 10% of it + 1e-3, another table, word or parameter count fail on any CPU (see REL_TOL).
Standard library only.
"""
from __future__ import annotations

import argparse
import csv
import difflib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
MARK = ".doc_numbers"  # a work directory this script made (and may empty)
SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests
ISA = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "avx_vnni", "amx_tile")


def cpu_fingerprint() -> str:
    """The CPU type as far as LibTorch's kernel choice goes, e.g. 'AMD EPYC, family 26 model 2,
    avx2 avx512f ...'."""
    info: dict[str, str] = {}
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    except OSError:
        return "unknown CPU"
    flags = set(info.get("flags", "").split())
    return (f"{info.get('model name', '?')}, family {info.get('cpu family', '?')} model "
            f"{info.get('model', '?')}, {' '.join(f for f in ISA if f in flags) or 'no AVX2'}")


# ---- running -------------------------------------------------------------------------------

def run(cmd: list[str], work: pathlib.Path, threads: int, log: str) -> str:
    # CPU numbers: a GPU machine's `train.device: auto` would pick CUDA. OMP_WAIT_POLICY=PASSIVE
    # changes no number, but spinning OpenMP threads on a busy machine slow a run 10x and more.
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), CUDA_VISIBLE_DEVICES="",
               OMP_WAIT_POLICY="PASSIVE")
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)
    (work / log).write_text(proc.stdout)
    print(f"doc_numbers: {' '.join(cmd)}  ({time.monotonic() - start:.0f} s, "
          f"OMP_NUM_THREADS={threads}, exit {proc.returncode})", flush=True)
    if proc.returncode != 0:
        sys.exit(f"doc_numbers: the command failed; its output is in {work / log}:\n"
                 + proc.stdout[-3000:])
    return proc.stdout


def summary(work: pathlib.Path, run_dir: str) -> dict:
    return json.loads((work / run_dir / "summary.json").read_text())


def evals(work: pathlib.Path, run_dir: str) -> dict[int, dict]:
    out = {}
    for line in (work / run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("type") == "eval":
            out[record["step"]] = record
    return out


def fence(text: str) -> str:
    return "```text\n" + text.rstrip("\n") + "\n```"


# ---- quickstart (docs/trainer.md) ----------------------------------------------------------

def quickstart(build: pathlib.Path, work: pathlib.Path) -> dict[str, str]:
    run([str(build / "trainer/distill_trainer"), "--quiet"], work, 2, "quickstart.log")
    return {"quickstart": fence((work / "runs/quickstart/results.txt").read_text())}


# ---- scenarios (docs/scenarios.md) ---------------------------------------------------------

def scenarios(build: pathlib.Path, work: pathlib.Path) -> dict[str, str]:
    trainer = str(build / "trainer/distill_trainer")
    configs = REPO / "configs"
    run([trainer, "--quiet", "--config", str(configs / "self_distill_teacher.yaml")], work, 2,
        "self_distill_teacher.log")
    run([trainer, "--quiet", "--config", str(configs / "self_distill.yaml")], work, 2,
        "self_distill.log")
    run([trainer, "--quiet", "--config", str(configs / "self_distill.yaml"), "distill.kd_weight=0",
         "train.out_dir=runs/self_distill_ce_only"], work, 2, "self_distill_ce_only.log")
    run([trainer, "--quiet", "--config", str(configs / "padded_vocab.yaml")], work, 2,
        "padded_vocab.log")

    teacher = summary(work, "runs/self_distill_teacher")
    sd = summary(work, "runs/self_distill")
    ce = summary(work, "runs/self_distill_ce_only")
    floor = sd["entropy_floor"]
    rows = [
        ("the original (teacher) on the new data", sd["teacher_val_loss"], "0"),
        ("fine-tuned, CE only (`kd_weight=0`)", ce["val_loss"], f"{ce['val_kd']:.4f}"),
        ("self-distilled, TVD + CE", sd["val_loss"], f"**{sd['val_kd']:.4f}**"),
    ]
    lines = [f"| run ({sd['steps']} steps, CPU) | val_loss (new data) | floor | excess | "
             "val_kd to the original |", "|---|---|---|---|---|"]
    for name, loss, kd in rows:
        lines.append(f"| {name} | {loss:.4f} | {floor:.4f} | {loss - floor:+.4f} | {kd} |")
    lines += ["",
              f"The teacher itself reaches val_loss {teacher['val_loss']:.4f} on its own language "
              f"(floor {teacher['entropy_floor']:.4f}, excess "
              f"{teacher['val_loss'] - teacher['entropy_floor']:+.4f}).",
              f"The TVD term costs "
              f"{sd['val_loss'] - ce['val_loss']:.3f} nats of fit to the new data and cuts the "
              f"drift from {ce['val_kd']:.3f} to {sd['val_kd']:.3f} "
              f"({sd['val_kd'] / ce['val_kd']:.0%} of it)."]
    parts = {"self_distill": "\n".join(lines)}

    parts["padded_table"] = fence((work / "runs/padded_vocab/results.txt").read_text())
    student = evals(work, "runs/padded_vocab/student")
    baseline = evals(work, "runs/padded_vocab/baseline")
    steps = sorted(s for s in student if s > 0 and s in baseline)
    lines = ["| step | " + " | ".join(str(s) for s in steps) + " |",
             "|---|" + "---|" * len(steps)]
    lines.append("| student (distilled) | " + " | ".join(f"{student[s]['val_loss']:.4f}" for s in steps) + " |")
    lines.append("| student (hard labels) | " + " | ".join(f"{baseline[s]['val_loss']:.4f}" for s in steps) + " |")
    lines.append("| val_kd (distilled vs teacher) | " + " | ".join(f"{student[s]['val_kd']:.4f}" for s in steps) + " |")
    parts["padded_curve"] = "\n".join(lines)
    return parts


# ---- convergence --small (docs/convergence.md) ---------------------------------------------

SPECS = [("kernel_vs_reference", "fp32"), ("kernel_vs_reference", "bf16"), ("ties", "fp32"),
         ("ties", "bf16"), ("padded", "fp32"), ("padded", "bf16"), ("distill_works", "fp32"),
         ("divergences", "fp32"), ("divergences", "bf16")]
DIVERGENCES = ("tvd", "forward_kl", "reverse_kl", "jsd")


def sci(x: float) -> str:
    """3.9e-8 style (two significant digits, no exponent padding); 0 as 0."""
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def grab(pattern: str, text: str) -> tuple[str, ...]:
    m = re.search(pattern, text, re.M)
    if not m:
        sys.exit(f"doc_numbers: the output has no line matching {pattern!r}:\n{text}")
    return m.groups()


def read_csv(path: pathlib.Path) -> list[dict[str, float]]:
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def convergence(build: pathlib.Path, work: pathlib.Path) -> dict[str, str]:
    logs = {}
    for name, dtype in SPECS:
        logs[name, dtype] = run([str(build / "examples/convergence/convergence"), name, "--small",
                                 "--device", "cpu", "--dtype", dtype, "--out", "out"], work, 1,
                                f"{name}_{dtype}.log")
    result = lambda log, name, dtype: grab(rf"^(PASS|FAIL) {name} {dtype}$", log)[0]  # noqa: E731
    parts = {}

    lines = ["| --small, 40 steps | max rel. loss diff | final max \\|w_op - w_ref\\| | "
             "final val CE op / ref | result |", "|---|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        log = logs["kernel_vs_reference", dtype]
        rel = float(grab(r"per-step loss: max relative difference (\S+)", log)[0])
        dw = float(grab(r"final weights: max \|op - ref\| (\S+)", log)[0])
        op, ref = grab(r"^final val CE: op (\S+)\s+ref (\S+)$", log)
        lines.append(f"| {dtype} | {'**0**' if rel == 0 else sci(rel)} | "
                     f"{'**0 (bit-identical)**' if dw == 0 else sci(dw)} | {op} / {ref} | "
                     f"{result(log, 'kernel_vs_reference', dtype)} |")
    parts["kernel_vs_reference"] = "\n".join(lines)

    lines = ["| rule | dtype | tie fraction (real columns) | dL/dp at the ties | "
             "max \\|dL/dlogits\\| |", "|---|---|---|---|---|"]
    for rule in ("op", "legacy"):
        for dtype in ("fp32", "bf16"):
            frac, _, at_ties, dlogits = grab(rf"^{rule}\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$",
                                             logs["ties", dtype])
            at_ties, dlogits = float(at_ties), float(dlogits)
            lines.append(f"| {rule} | {dtype} | {float(frac):.4g} | "
                         + ("**0 exactly**" if at_ties == 0 else f"{at_ties:.3e} (every tie)")
                         + " | " + ("**0 exactly**" if dlogits == 0 else sci(dlogits)) + " |")
    parts["ties_a"] = "\n".join(lines)

    lines = ["| --small, 40 steps | exact ties after step 1 (mean; range per step) | "
             "final val CE op / legacy | final val TVD to teacher op / legacy |",
             "|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        log = logs["ties", dtype]
        mean = grab(r"partial ties are \w+: (\S+)% of real elements after step 1", log)[0]
        rows = [r for r in read_csv(work / f"out/ties_{dtype}.csv") if r["step"] >= 2]
        lo, hi = min(r["ties_op"] for r in rows), max(r["ties_op"] for r in rows)
        ce_op, ce_leg, diff, tvd_op, tvd_leg = grab(
            r"^shifted data, final: val CE op (\S+) legacy (\S+) \(\|diff\| (\S+)\); "
            r"TVD to the teacher op (\S+) legacy (\S+);", log)
        spread = "none at any step" if hi == 0 else f"{100 * lo:.1f}-{100 * hi:.1f}%"
        lines.append(f"| {dtype} | **{float(mean):.2f}%** ({spread}) | "
                     f"{ce_op} / {ce_leg} (diff {sci(float(diff))}) | {tvd_op} / {tvd_leg} |")
    parts["ties_b"] = "\n".join(lines)

    lines = ["| --small, 40 steps, kd only | op: max \\|w - w_teacher\\| | "
             "legacy: max \\|w - w_teacher\\| | legacy: val TVD to the teacher, step 10 / 40 |",
             "|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        rows = {int(r["step"]): r for r in read_csv(work / f"out/ties_{dtype}.csv")}
        last = rows[max(rows)]
        op = last["pure_drift_op"]
        lines.append(f"| {dtype} | {'**0 (bit-identical)**' if op == 0 else sci(op)} | "
                     f"{sci(last['pure_drift_legacy'])} | {rows[10]['pure_val_tvd_legacy']:.4f} / "
                     f"{last['pure_val_tvd_legacy']:.4f} |")
    parts["ties_c"] = "\n".join(lines)

    lines = ["| --small, 40 steps | max rel. loss diff | final max \\|w_pad - w\\| (real rows) | "
             "padded rows | val CE unpadded / padded | result |", "|---|---|---|---|---|---|"]
    for dtype in ("fp32", "bf16"):
        log = logs["padded", dtype]
        rel, dw = grab(r"^whole run: max rel. loss diff (\S+), final max \|dw\| (\S+) ", log)
        unpadded, padded = grab(r"^final val CE: unpadded (\S+)\s+padded (\S+)$", log)
        rows_ok = "[ok] padded lm_head rows bit-identical" in log
        lines.append(f"| {dtype} | {sci(float(rel))} | {sci(float(dw))} | "
                     f"{'bit-identical to the decay replay, every step' if rows_ok else 'NOT bit-identical'}"
                     f" | {unpadded} / {padded} | {result(log, 'padded', dtype)} |")
    parts["padded"] = "\n".join(lines)

    log = logs["distill_works", "fp32"]
    lines = ["| --small, step | distilled | hard labels | teacher | floor |", "|---|---|---|---|---|"]
    table = re.findall(r"^\s+(\d+)\s+(\d\.\d+)\s+(\d\.\d+)\s+(\d\.\d+)\s+(\d\.\d+)$", log, re.M)
    for i, (step, d, h, t, f) in enumerate(table):
        d = f"**{d}**" if i == len(table) - 1 else d
        lines.append(f"| {step} | {d} | {h} | {t} | {f} |")
    t, d, h = grab(r"^excess over the floor: teacher (\S+), distilled (\S+), hard labels (\S+)$", log)
    lines += ["", f"Excess over the floor at the end: teacher {t}, distilled {d}, hard labels {h} "
              f"({result(log, 'distill_works', 'fp32')})."]
    parts["distill_works"] = "\n".join(lines)

    lines = ["| --small, 100 steps, 1 thread | step 1 | steps 1-100 (budget) | "
             "final max \\|w_op − w_ref\\| | val CE op / ref | hard labels | result |",
             "|---|---|---|---|---|---|---|"]
    worst = {}  # dtype -> (the largest steps 1-100 difference, its divergence)
    for dtype in ("fp32", "bf16"):
        log = logs["divergences", dtype]
        for div in DIVERGENCES:
            step1, steps, _, _, dw, ce_op, ce_ref, hard = grab(
                rf"^{div}\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", log)
            budget = grab(rf"^\s+\[\w+\] {div}: steps 1-100, .* <= (\S+)$", log)[0]
            failed = re.search(rf"^\s+\[FAIL\] {div}:", log, re.M) is not None
            lines.append(f"| {div} {dtype} | {sci(float(step1))} | {sci(float(steps))} "
                         f"({sci(float(budget)).replace('.0e', 'e')}) | {sci(float(dw))} | {ce_op} / {ce_ref} | {hard} | "
                         f"{'FAIL' if failed else 'PASS'} |")
            worst[dtype] = max(worst.get(dtype, (0.0, "")), (float(steps), div))
    lines += ["", "Steps 1-100, the largest relative difference: " + ", ".join(
        f"{dtype} {sci(worst[dtype][0])} ({worst[dtype][1]})" for dtype in ("fp32", "bf16")) + "."]
    parts["divergences"] = "\n".join(lines)
    return parts


SECTIONS = {"quickstart": (quickstart, "docs/trainer.md"),
            "scenarios": (scenarios, "docs/scenarios.md"),
            "convergence": (convergence, "docs/convergence.md")}
PROGRAMS = {"quickstart": "trainer/distill_trainer", "scenarios": "trainer/distill_trainer",
            "convergence": "examples/convergence/convergence"}  # what each section runs


# ---- the docs ------------------------------------------------------------------------------

def block_re(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- doc_numbers: {re.escape(name)}\b[^\n]*-->\n)(.*?)(<!-- /doc_numbers: "
                      rf"{re.escape(name)} -->)", re.S)


def opening(name: str, section: str, cpu: str) -> str:
    return (f"<!-- doc_numbers: {name} (generated by scripts/doc_numbers.py {section}; do not edit; "
            f"cpu: {cpu}) -->\n")


# Another CPU type moves the last digits of a sum and, through them, a trajectory: measured on
# an AMD EPYC (family 25 model 17) against the Intel Xeon the docs were made on, the quickstart's
# distilled student ended at val_loss 1.7036 instead of 1.6838 (its excess over the floor
# +0.4266 instead of +0.4068, 5% apart), the padded-vocabulary curve's val_kd 2% apart, and the
# convergence examples bit for bit the same. A value at the rounding noise (3e-9 where this CPU
# printed an exact 0) may also be printed in other words. What another CPU does not do: change
# the table (its lines, labels and words), a parameter count, a PASS/FAIL, or move a number by
# more than REL_TOL of it plus ABS_TOL (twice the largest difference measured; a distilled loss
# equal to the hard-label one, a floor printed as 0.0000, an exact 0 turned into -5.9e-3 all
# fail). Those fail on any CPU; the rest of a difference is a skip there.
REL_TOL, ABS_TOL = 0.1, 1e-3
NOISE = 1e-6  # a line that reads differently is allowed where its numbers are all this small
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
VERDICT = re.compile(r"\b(?:PASS|FAIL)\b")


def words(line: str) -> str:
    """A line without its numbers and its columns' padding (a wider number shifts them)."""
    return " ".join(NUMBER.sub("#", line).split())


def last_digits_only(doc_block: str, program_block: str) -> bool:
    """Whether another CPU type could print `program_block` where the doc has `doc_block`: the same
    lines with the same words around the numbers, cell by cell in a table (or, in a cell, only
    noise-level numbers either way), the same PASS/FAIL verdicts, integers of 4 digits or more
    (parameter counts) equal, and every other number within REL_TOL relative plus ABS_TOL absolute
    of the doc's."""
    if VERDICT.findall(doc_block) != VERDICT.findall(program_block):
        return False
    doc_lines, program_lines = doc_block.splitlines(), program_block.splitlines()
    if len(doc_lines) != len(program_lines):
        return False
    for doc_line, program_line in zip(doc_lines, program_lines):
        doc_cells, program_cells = doc_line.split("|"), program_line.split("|")
        if len(doc_cells) != len(program_cells):
            return False
        for doc_cell, program_cell in zip(doc_cells, program_cells):
            doc_numbers, program_numbers = NUMBER.findall(doc_cell), NUMBER.findall(program_cell)
            if words(doc_cell) != words(program_cell):
                if all(abs(float(x)) <= NOISE for x in doc_numbers + program_numbers):
                    continue  # e.g. "0 (bit-identical)" where another CPU prints "3.1e-9"
                return False
            for a, b in zip(doc_numbers, program_numbers):
                x, y = float(a), float(b)
                if re.fullmatch(r"[-+]?\d{4,}", a) and a != b:
                    return False
                if abs(x - y) > REL_TOL * max(abs(x), abs(y)) + ABS_TOL:
                    return False
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("section", choices=sorted(SECTIONS))
    parser.add_argument("--build", required=True, type=pathlib.Path, help="the build directory")
    parser.add_argument("--work", type=pathlib.Path, help="default BUILD/doc_numbers/SECTION")
    parser.add_argument("--update", action="store_true", help="rewrite the doc's generated parts")
    parser.add_argument("--doc", type=pathlib.Path, help="the doc to check or update (default: the "
                        "section's file in this repository)")
    args = parser.parse_args()
    produce, doc_name = SECTIONS[args.section]
    build = args.build.resolve()
    # Checked before minutes of runs: the build's program and the doc.
    if not (build / PROGRAMS[args.section]).is_file():
        sys.exit(f"doc_numbers: --build {args.build}: no {PROGRAMS[args.section]} in it (build "
                 "first: make build)")
    doc = (args.doc or REPO / doc_name).resolve()  # a link: its target is rewritten
    try:
        text = doc.read_text()
    except (OSError, UnicodeDecodeError) as e:
        sys.exit(f"doc_numbers: cannot read the doc {doc}: {e}")
    work = (args.work or build / "doc_numbers" / args.section).resolve()
    if work.exists() and not work.is_dir():
        sys.exit(f"doc_numbers: --work {work} is a file; give a directory")
    if work.exists() and any(work.iterdir()):
        if not (work / MARK).exists():
            sys.exit(f"doc_numbers: {work} is not empty and not a doc_numbers work directory")
        shutil.rmtree(work)
    work.mkdir(parents=True)
    (work / MARK).write_text("made by scripts/doc_numbers.py; emptied on every run\n")

    parts = produce(build, work)
    cpu = cpu_fingerprint()
    failures, other_cpu, missing, far = [], set(), False, []
    for name, body in parts.items():
        pattern = block_re(name)
        m = pattern.search(text)
        if not m:
            missing = True
            failures.append(f"{doc}: no block <!-- doc_numbers: {name} --> ... "
                            f"<!-- /doc_numbers: {name} -->")
            continue
        recorded = re.search(r"cpu: (.*?)\) -->", m.group(1))
        if recorded and recorded.group(1) != cpu:
            other_cpu.add(recorded.group(1))
        want = body.rstrip("\n") + "\n"
        if args.update:
            head = opening(name, args.section, cpu)
            text = text[:m.start(1)] + head + want + text[m.end(2):]
        elif m.group(2) != want:
            if not last_digits_only(m.group(2), want):
                far.append(name)
            failures.append(f"{doc}: block {name} differs from what the programs print "
                            f"(- doc, + program; outputs in {work}):\n" + "".join(
                                difflib.unified_diff(m.group(2).splitlines(True),
                                                     want.splitlines(True), "doc", "program")))
    if args.update and not missing:
        tmp = doc.with_name(f".{doc.name}.tmp-{os.getpid()}")
        tmp.write_text(text)
        shutil.copymode(doc, tmp)
        tmp.replace(doc)  # whole or not at all
        print(f"doc_numbers: updated {doc}")
    for f in failures:
        print(f, file=sys.stderr)
    if failures and not args.update:
        if other_cpu and not missing and not far:
            print(f"doc_numbers: SKIPPED: the doc's numbers were generated on another CPU type "
                  f"({'; '.join(sorted(other_cpu))}), this is {cpu}; its last digits differ, so "
                  "this is not a failure (the diff above shows this CPU's numbers)", file=sys.stderr)
            return SKIP
        if other_cpu and far:
            print(f"doc_numbers: the doc's numbers were generated on another CPU type "
                  f"({'; '.join(sorted(other_cpu))}), but block(s) {', '.join(far)} differ by more "
                  f"than another CPU's last digits (another line, word or parameter count, a "
                  f"PASS/FAIL, or a number off by more than {REL_TOL:.0%} of it + {ABS_TOL:g}): a "
                  "failure on any CPU", file=sys.stderr)
        print(f"doc_numbers: to regenerate: python3 scripts/doc_numbers.py {args.section} "
              f"--build BUILD_DIR --update", file=sys.stderr)
        return 1
    if not failures:
        print(f"doc_numbers: {len(parts)} generated parts of {doc_name} match the programs' output")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
