#!/usr/bin/env python3
"""distill_trainer against a PyTorch port of its step, eager and torch.compile (issue 18).

For each row (a config and its overrides) the config is resolved by `distill_trainer
--print-config`, then three runs of warm-up + timed steps on the same resolved config and the
same synthetic data, each in its own process: distill_trainer itself (step times from its
metrics.jsonl, log_interval 1), the port eager, the port under torch.compile (trainer_port/).
The port starts from the trainer's exact weights (same initialisation draws; teachers from the
trainer's checkpoint or Hugging Face files) and its first --parity-steps steps use the
trainer's exact tokens, so its loss terms and gradient norms there must match the trainer's
(the parity check). One table, JSON with everything.

  python bench/trainer_bench.py --device cuda --json out/trainer_bench.json      # all rows
  python bench/trainer_bench.py --device cpu --tiny --steps 3 --modes trainer,eager
  python bench/trainer_bench.py --rows 235m-pretrain --device cuda data.batch_size=8

tokens/s counts non-ignored target tokens (as the trainer's tokens_per_s). MFU counts the
model FLOPs of every position of the padded micro-batches: 6 * N * positions + attention
12 * n_layer * n_head * head_dim * T * positions for the student (fwd + bwd), 2 * N +
4 * n_layer * n_head * head_dim * T per position for the teacher's forward, with N the
parameters of the matmuls (every linear layer and the lm_head; not input embeddings), over
--peak-tflops (default: H100/H200 989 bf16 / 67 fp32 dense, A100 312 / 19.5).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

ARCH_KEYS = ["family", "hf_dir", "vocab_size", "pad_vocab_to_multiple_of", "context_length", "n_layer",
             "n_head", "d_model", "mlp_ratio", "dropout", "tie_embeddings", "n_kv_head", "head_dim",
             "intermediate_size", "norm_eps", "rope_theta", "attention_bias", "attention_out_bias",
             "mlp_bias", "qk_norm", "hf_model_type"]


@dataclass
class Row:
    name: str
    config: str                 # relative to the repository root
    stage: str                  # "teacher": pretrain the config's teacher; "student": distil; "single"
    overrides: list = field(default_factory=list)
    teacher_row: str = ""       # "student" rows: whose trainer run is the teacher checkpoint
    smollm2: bool = False       # teacher.hf_dir = the SmolLM2-135M directory (or the stand-in)


ROWS = [
    Row("ddp-pretrain", "configs/ddp.yaml", "teacher"),
    Row("ddp-distill", "configs/ddp.yaml", "student", teacher_row="ddp-pretrain"),
    Row("235m-pretrain", "bench/configs/gpt235m.yaml", "teacher"),
    Row("82m-distill", "bench/configs/gpt235m.yaml", "student", teacher_row="235m-pretrain"),
    Row("smollm2-distill", "configs/smollm2_distill.yaml", "single", smollm2=True,
        overrides=["data.source=synthetic", 'data.path=""', 'data.val_path=""', "data.seq_len=2048",
                   "data.min_seq_len=2048", "data.batch_size=8", "train.grad_accum=2",
                   "train.baseline=false"]),
]

# --tiny: every row small enough for a 2-core CPU (the SmolLM2 teacher, when real, keeps its size).
TINY_MODEL = ["n_layer=2", "n_head=4", "d_model=64", "n_kv_head=0", "head_dim=0", "intermediate_size=0"]
TINY_DATA = ["data.batch_size=2", "data.seq_len=32", "data.min_seq_len=24", "train.grad_accum=2"]

# SmolLM2-135M's config.json (the architecture of the random stand-in when the weights are absent).
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
    "intermediate_size": 1536, "num_attention_heads": 9, "num_hidden_layers": 30,
    "num_key_value_heads": 3, "head_dim": 64, "vocab_size": 49152, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "rope_theta": 100000.0, "rope_scaling": None, "tie_word_embeddings": True,
    "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "torch_dtype": "float32"}


def log(message: str) -> None:
    print(f"trainer_bench: {message}", file=sys.stderr, flush=True)


# ---- configs ----------------------------------------------------------------------------------

def resolve(trainer: str, config: str, overrides: list) -> tuple[str, dict]:
    from trainer_port.config import parse_config
    proc = subprocess.run([trainer, "--config", config, *overrides, "--print-config"], cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"trainer_bench: {trainer} --print-config failed for {config} "
                         f"{' '.join(overrides)}:\n{proc.stderr.strip()}")
    return proc.stdout, parse_config(proc.stdout)


def flatten(section: str, value, out: list) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            flatten(f"{section}.{k}", v, out)
    else:
        text = "true" if value is True else "false" if value is False else "" if value is None else str(value)
        out.append(f"{section}={text}")


def stage_overrides(row: Row, base: dict) -> list:
    """The overrides that make a (possibly pipeline) config the row's single run."""
    if row.stage == "teacher":  # run.cpp's TeacherStageConfig: the teacher's architecture, pretrain
        out = []
        for k in ARCH_KEYS + ["rope_scaling"]:
            flatten(f"student.{k}", base["teacher"][k], out)
        return out + ["train.mode=pretrain", "teacher.pretrain_steps=0", "teacher.checkpoint="]
    if row.stage == "student":
        return ["train.mode=distill", "teacher.pretrain_steps=0"]
    return []


def bench_overrides(args, work: Path, steps: int) -> list:
    out = [f"train.steps={steps}", "train.log_interval=1", "train.eval_interval=0",
           "train.eval_batches=1", "train.checkpoint_interval=0", "train.keep_checkpoints=1",
           "train.baseline=false", "train.export_hf=false", f"train.out_dir={work / 'trainer'}",
           f"train.device={args.device}"]
    if args.device == "cpu":
        out.append("train.precision=fp32")  # bf16 autocast is CUDA-only in the trainer
    return out


def smollm2_teacher(args, work: Path) -> tuple[str, str]:
    """(hf_dir, label): the prepared SmolLM2-135M, or a random stand-in of its shape."""
    real = Path(args.smollm2) / "hf"
    if (real / "model.safetensors").exists():
        return str(real), "SmolLM2-135M"
    import torch
    from trainer_port.models import make_model, write_hf_dir
    cfg = dict(SMOLLM2_CONFIG)
    if args.tiny:
        cfg.update(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_hidden_layers=2,
                   num_key_value_heads=2, head_dim=16)
    out = work.parent / ("standin-teacher-tiny" if args.tiny else "standin-teacher")
    if not (out / "model.safetensors").exists():
        log(f"{real} not found: writing a random llama teacher of SmolLM2-135M's shape to {out} "
            "(timing only; the row is labelled a stand-in)")
        section = {"family": "llama", "vocab_size": cfg["vocab_size"], "pad_vocab_to_multiple_of": 1,
                   "context_length": cfg["max_position_embeddings"], "n_layer": cfg["num_hidden_layers"],
                   "n_head": cfg["num_attention_heads"], "n_kv_head": cfg["num_key_value_heads"],
                   "d_model": cfg["hidden_size"], "head_dim": cfg["head_dim"], "mlp_ratio": 4.0,
                   "intermediate_size": cfg["intermediate_size"], "norm_eps": cfg["rms_norm_eps"],
                   "rope_theta": cfg["rope_theta"], "tie_embeddings": True, "dropout": 0.0,
                   "rope_scaling": {"type": ""}, "attention_bias": False, "attention_out_bias": False,
                   "mlp_bias": False, "qk_norm": False}
        torch.manual_seed(0)
        write_hf_dir(make_model(section), str(out), cfg)
    return str(out), "random stand-in of SmolLM2-135M's shape"


# ---- runs -------------------------------------------------------------------------------------

class PeakMemory:
    """The peak memory of one child process: on CUDA the device's used memory (nvidia-smi)
    above what was used before the child started, polled every 0.25 s; on the CPU the child's
    maximum resident set (wait4)."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        self.peak, self.baseline, self._stop = 0, None, threading.Event()
        if self.cuda:
            self.baseline = self._used()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()

    @staticmethod
    def _used():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                  "-i", os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.strip().splitlines()[0]) * 2**20
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None

    def _poll(self):
        while not self._stop.wait(0.25):
            used = self._used()
            if used is not None and self.baseline is not None:
                self.peak = max(self.peak, used - self.baseline)

    def finish(self, rusage) -> int | None:
        if not self.cuda:
            return rusage.ru_maxrss * 1024
        self._stop.set()
        self._thread.join()
        return self.peak if self.baseline is not None else None


def run_child(cmd: list, work: Path, name: str, device: str, env: dict | None = None) -> int | None:
    """Runs `cmd` with stdout/stderr in work/<name>.log; returns its peak memory (bytes)."""
    log_path = work / f"{name}.log"
    with open(log_path, "w") as out:
        memory = PeakMemory(device)
        # On the CPU, OpenMP threads that spin while they wait slow a run on a busy machine 10x and
        # more (scripts/doc_numbers.py too): passive waiting, unless the caller chose a policy.
        passive = {"OMP_WAIT_POLICY": "PASSIVE"} if device == "cpu" and "OMP_WAIT_POLICY" not in os.environ else {}
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **passive, **(env or {})})
        _, status, rusage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    peak = memory.finish(rusage)
    if proc.returncode != 0:
        tail = log_path.read_text()[-3000:]
        raise RuntimeError(f"{name} failed (exit {proc.returncode}); {log_path}:\n{tail}")
    return peak


def run_trainer(args, work: Path, config_file: Path, warmup: int) -> dict:
    peak = run_child([args.trainer, "--config", str(config_file), "--fresh"], work, "trainer", args.device,
                     {"PYTHONWARNINGS": "ignore"})
    records = [json.loads(line) for line in (work / "trainer" / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if r["type"] == "train"]
    window = records[warmup:]
    seconds = window[-1]["elapsed_s"] - records[warmup - 1]["elapsed_s"] if warmup > 0 else window[-1]["elapsed_s"]
    steps = [(r["elapsed_s"] - (records[i - 1]["elapsed_s"] if i else 0.0)) for i, r in enumerate(records)]
    tokens = sum(r["tokens_per_s"] * steps[warmup + i] for i, r in enumerate(window))
    return {"records": records, "step_seconds": steps, "timed_seconds": seconds,
            "timed_tokens": round(tokens), "timed_steps": len(window), "peak_process_bytes": peak}


def port_library(args) -> Path:
    """The liblossfns the port loads: --library, else $LOSSFNS_LIBRARY, else the trainer's build's."""
    library = args.library or os.environ.get("LOSSFNS_LIBRARY") or \
        Path(args.trainer).resolve().parent.parent / "lib" / "liblossfns.so"
    library = Path(library).resolve()  # the port runs in the repository root
    if not library.is_file():
        sys.exit(f"trainer_bench: no liblossfns at {library} for the PyTorch port; pass --library "
                 "(or set LOSSFNS_LIBRARY) to the library the trainer runs with")
    return library


def run_port(args, work: Path, config_file: Path, mode: str, teacher: dict, warmup: int) -> dict:
    spec = {"config": str(config_file), "mode": mode, "device": args.device, "warmup": warmup,
            "steps": args.steps, "parity_steps": args.parity_steps, "tvd": args.tvd,
            "optimizer": args.optimizer, "teacher": teacher, "out": str(work / f"{mode}.json")}
    (work / f"{mode}.spec.json").write_text(json.dumps(spec, indent=1))
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "python"), str(HERE)]),
           "LOSSFNS_LIBRARY": str(port_library(args)), "PYTHONWARNINGS": "ignore"}
    peak = run_child([sys.executable, str(Path(__file__).resolve()), "--worker", str(work / f"{mode}.spec.json")],
                     work, mode, args.device, env)
    result = json.loads(Path(spec["out"]).read_text())
    result["peak_process_bytes"] = peak
    return result


def worker(spec_path: str) -> None:
    from trainer_port.config import parse_config
    from trainer_port.train import run
    spec = json.loads(Path(spec_path).read_text())
    config = parse_config(Path(spec["config"]).read_text())
    Path(spec["out"]).write_text(json.dumps(run(spec, config)))


# ---- parity, FLOPs, the table -----------------------------------------------------------------

def parity(trainer: dict, port: dict, steps: int, bf16: bool) -> dict:
    """Loss terms and gradient norms of the first `steps` steps: |a - b| <= atol + rtol * |b|.
    fp32: rtol 1e-4 (the same ops in another order of float sums; 1e-6 seen on CPU), bf16:
    rtol 2e-2 for the losses, 5e-2 for the gradient norm (bf16 rounding, guessed, not measured).
    A step either side lacks, or a value only one side has (the trainer writes a non-finite
    value as null; a pretraining row has no kd_loss on either side), fails the check: parity
    that compared nothing is no parity."""
    rtol_loss, rtol_norm, atol = (2e-2, 5e-2, 1e-5) if bf16 else (1e-4, 1e-3, 1e-6)
    worst, ok, compared = 0.0, True, 0
    records = list(zip(trainer["records"][:steps], port["records"][:steps]))
    ok = len(records) == steps
    for t, p in records:
        for key, rtol in (("loss", rtol_loss), ("kd_loss", rtol_loss), ("ce_loss", rtol_loss),
                          ("grad_norm", rtol_norm)):
            a, b = p.get(key), t.get(key)
            if a is None and b is None:
                continue
            if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
                ok = False
                continue
            diff = abs(a - b)
            worst = max(worst, diff / max(abs(b), 1e-12))
            ok = ok and diff <= atol + rtol * abs(b)
            compared += 1
    return {"ok": ok and compared > 0, "max_rel_diff": worst, "steps": len(records),
            "values_compared": compared}


def flops_per_step(config: dict) -> float:
    import torch
    from trainer_port.models import head_size, make_model, matmul_params

    def per_position(c, training):
        with torch.device("meta"):
            n = matmul_params(make_model(c))
        attention = c["n_layer"] * c["n_head"] * head_size(c) * config["data"]["seq_len"]
        return 6 * n + 12 * attention if training else 2 * n + 4 * attention

    positions = config["data"]["batch_size"] * config["data"]["seq_len"] * config["train"]["grad_accum"]
    total = per_position(config["student"], True)
    if config["train"]["mode"] == "distill":
        total += per_position(config["teacher"], False)
    return positions * total


def peak_tflops(args, config: dict) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if args.device == "cpu":
        return None
    try:  # not torch.cuda: a CUDA context in this process would hold memory during every run
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    bf16 = config["train"]["precision"] == "bf16"
    for key, (b, f) in {"H100": (989.4, 66.9), "H200": (989.4, 66.9), "A100": (312.0, 19.5)}.items():
        if key in name:
            return b if bf16 else f
    return None


def table(results: list) -> str:
    head = ["config", "mode", "tokens/s", "vs trainer", "step ms", "MFU", "peak GiB", "parity"]
    lines = [head]
    for r in results:
        if "error" in r:
            lines.append([r["row"], r["mode"], "-", "-", "-", "-", "-", r["error"][:60]])
            continue
        par = r.get("parity")
        lines.append([r["row"], r["mode"], f"{r['tokens_per_s'] / 1e3:.1f}k",
                      f"{r['vs_trainer']:.2f}x" if r.get("vs_trainer") else "-", f"{r['step_ms']:.1f}",
                      f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-",
                      f"{r['peak_bytes'] / 2**30:.2f}" if r.get("peak_bytes") else "-",
                      "-" if par is None else f"{'ok' if par['ok'] else 'FAIL'} {par['max_rel_diff']:.1e}"])
    widths = [max(len(str(x[i])) for x in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(x[i]).ljust(widths[i]) if i < 2 else str(x[i]).rjust(widths[i])
                               for i in range(len(head))) for x in lines)


# ---- main -------------------------------------------------------------------------------------

def bench_row(args, row: Row, work: Path, done: dict) -> list:
    work.mkdir(parents=True, exist_ok=True)
    steps = args.warmup + args.steps
    overrides = list(row.overrides) + (TINY_DATA if args.tiny else [])
    label = row.name
    if row.smollm2:
        hf_dir, label_note = smollm2_teacher(args, work)
        overrides.append(f"teacher.hf_dir={hf_dir}")
        if "stand-in" in label_note:
            label += " (stand-in)"
    _, base = resolve(args.trainer, row.config, overrides + list(args.overrides))
    overrides += stage_overrides(row, base)
    if args.tiny:
        sections = ["student"] + ([] if row.smollm2 or row.stage == "teacher" else ["teacher"])
        overrides += [f"{s}.{kv}" for s in sections for kv in TINY_MODEL]
    if row.stage == "student":
        teacher_dir = done.get(row.teacher_row)
        if teacher_dir is None:  # a 1-step pretraining run of the teacher: a checkpoint to load
            teacher_work = work / "teacher"
            trow = Row(row.name + "-teacher", row.config, "teacher", row.overrides)
            tcfg, _ = resolve(args.trainer, trow.config, trow.overrides + list(args.overrides)
                              + stage_overrides(trow, base) + (TINY_DATA if args.tiny else [])
                              + ([f"student.{kv}" for kv in TINY_MODEL] if args.tiny else [])
                              + bench_overrides(args, teacher_work, 1))
            teacher_work.mkdir(parents=True, exist_ok=True)
            (teacher_work / "config.yaml").write_text(tcfg)
            log(f"{row.name}: pretraining a teacher for 1 step (no {row.teacher_row} run here)")
            run_child([args.trainer, "--config", str(teacher_work / "config.yaml"), "--fresh"],
                      teacher_work, "trainer", args.device)
            teacher_dir = str(teacher_work / "trainer")
        overrides.append(f"teacher.checkpoint={teacher_dir}")
    text, config = resolve(args.trainer, row.config,
                           overrides + list(args.overrides) + bench_overrides(args, work, steps))
    config_file = work / "config.yaml"
    config_file.write_text(text)
    mode = config["train"]["mode"]
    teacher = ({"kind": "hf", "path": config["teacher"]["hf_dir"]} if mode == "distill" and config["teacher"]["hf_dir"]
               else {"kind": "checkpoint", "path": config["teacher"]["checkpoint"]} if mode == "distill"
               else {"kind": "none"})
    bf16 = config["train"]["precision"] == "bf16"
    flops, peak = flops_per_step(config), peak_tflops(args, config)
    warmup = max(args.warmup, 1)
    results, trainer_tps = [], None
    for mode_name in args.modes:
        entry = {"row": label, "mode": mode_name, "config_file": str(config_file)}
        log(f"{label}: {mode_name} ({warmup} warm-up + {args.steps} timed steps)")
        try:
            if mode_name == "trainer":
                r = run_trainer(args, work, config_file, warmup)
                done[row.name] = str(work / "trainer")
            else:
                if mode_name == "compile" and args.device == "cpu" and args.no_cpu_compile:
                    raise RuntimeError("skipped on the CPU (--no-cpu-compile)")
                r = run_port(args, work, config_file, mode_name, teacher, warmup)
        except RuntimeError as e:
            log(f"{label}: {mode_name}: {e}")
            results.append({**entry, "error": str(e).splitlines()[0]})
            continue
        step_s = r["timed_seconds"] / r["timed_steps"]
        entry.update(tokens_per_s=r["timed_tokens"] / r["timed_seconds"], step_ms=1e3 * step_s,
                     flops_per_step=flops, mfu=flops / step_s / (peak * 1e12) if peak else None,
                     peak_bytes=r.get("peak_process_bytes"), raw=r)
        if mode_name == "trainer":
            trainer_tps, trainer_run = entry["tokens_per_s"], r
        elif trainer_tps:
            entry["vs_trainer"] = entry["tokens_per_s"] / trainer_tps
            if args.parity_steps > 0:
                entry["parity"] = parity(trainer_run, r, args.parity_steps, bf16)
        results.append(entry)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="key=value overrides for every row, as distill_trainer's")
    ap.add_argument("--rows", default=",".join(r.name for r in ROWS),
                    help="comma-separated rows (default: all): " + ", ".join(r.name for r in ROWS))
    ap.add_argument("--config", help="bench this config (a single run) instead of the rows")
    ap.add_argument("--modes", default="trainer,eager,compile")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--tiny", action="store_true", help="tiny models and batches (CPU tests)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (at least 1)")
    ap.add_argument("--steps", type=int, default=15, help="timed steps")
    ap.add_argument("--parity-steps", type=int, default=3, help="steps on the trainer's exact data, compared")
    ap.add_argument("--trainer", default=str(ROOT / "build" / "trainer" / "distill_trainer"))
    ap.add_argument("--library", help="the liblossfns.so the PyTorch port loads (default: $LOSSFNS_LIBRARY, "
                    "else lib/liblossfns.so beside the trainer's build directory)")
    ap.add_argument("--smollm2", default=os.environ.get("LOSSFNS_SMOLLM2_DIR",
                                                       str(Path.home() / ".cache" / "lossfns" / "smollm2")))
    ap.add_argument("--tvd", default="lossfns", choices=["lossfns", "composite"],
                    help="the port's TVD: liblossfns' op (the trainer's kernel) or PyTorch ops")
    ap.add_argument("--optimizer", default="default", choices=["default", "foreach", "for-loop", "fused"],
                    help="the port's AdamW implementation (default: PyTorch's choice, foreach on CUDA)")
    ap.add_argument("--no-cpu-compile", action="store_true", help="skip torch.compile on the CPU")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak for MFU")
    ap.add_argument("--work", default=str(ROOT / "runs" / "trainer_bench"), help="run directories")
    ap.add_argument("--json", help="write every result here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or (unknown := sorted(set(args.modes) - {"trainer", "eager", "compile"})):
        ap.error(f"--modes: expected some of trainer, eager, compile, got {args.modes or 'none'}")
    if args.steps < 1 or args.warmup < 1 or args.parity_steps < 0:
        ap.error(f"--steps and --warmup must be at least 1, --parity-steps at least 0 (got "
                 f"{args.steps}, {args.warmup}, {args.parity_steps})")
    if args.parity_steps > args.warmup + args.steps:
        ap.error(f"--parity-steps {args.parity_steps}: at most --warmup + --steps "
                 f"({args.warmup + args.steps}), the steps each run takes")
    args.trainer = str(Path(args.trainer).resolve())
    if not Path(args.trainer).exists():
        raise SystemExit(f"trainer_bench: {args.trainer} not found: build distill_trainer or pass --trainer")
    if {"eager", "compile"} & set(args.modes):
        args.library = str(port_library(args))  # checked before any run
    if args.config:
        rows = [Row(Path(args.config).stem, str(Path(args.config).resolve()), "single")]
    else:
        by_name = {r.name: r for r in ROWS}
        unknown = [n for n in args.rows.split(",") if n not in by_name]
        if unknown:
            raise SystemExit(f"trainer_bench: unknown rows {unknown}; rows: {', '.join(by_name)}")
        rows = [by_name[n] for n in args.rows.split(",")]
    work = Path(args.work)
    results, done = [], {}
    for row in rows:
        results += bench_row(args, row, work / row.name, done)
    print(table(results))
    failed = [f"{r['row']} {r['mode']}" for r in results if not r.get("parity", {"ok": True})["ok"]]
    errors = [f"{r['row']} {r['mode']}" for r in results if "error" in r and "skipped" not in r["error"]]
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"argv": sys.argv, "results": results}, indent=1))
    if failed:
        log("parity FAILED: " + ", ".join(failed))
    if errors:
        log("errors: " + ", ".join(errors))
    return 1 if failed or errors else 0


if __name__ == "__main__":
    sys.exit(main())
