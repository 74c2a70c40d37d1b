"""distill_trainer's optimizer step in PyTorch (trainer/src/trainer.cpp, loss.cpp), eager or
under torch.compile, timed; one run per process (trainer_bench.py --worker).

The step, as Trainer::Step: learning rate of the schedule, zero_grad(set_to_none), for each of
train.grad_accum micro-batches: copy to the device, forward passes under bf16 autocast when
train.precision is bf16 (teacher without autograd), the loss sums in fp32, backward of
sum * (1 / non-ignored targets of the whole step); then the loss terms to the host (.item(), as
the trainer's), clip_grad_norm_ (max_norm inf when optim.grad_clip is 0: the norm, no clipping),
AdamW over two groups (matrices decay, vectors do not). torch.compile compiles the forward
passes and the loss of a micro-batch as one region; the backward is its AOT backward; the
optimizer step and clipping stay eager (as a new user would write it).
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from .data import SyntheticData
from .models import load_hf_dir, load_trainer_checkpoint, make_model, matmul_params


# ---- the loss (trainer/src/loss.cpp) -----------------------------------------------------------

def kd_sum_lossfns(student_logits, teacher_logits, targets, d: dict):
    """The trainer's own op: lossfns.distill_loss on the logits in their dtype, summed."""
    import lossfns  # the trainer's kernels (CPU and CUDA), through torch.ops.lossfns
    return lossfns.distill_loss(student_logits, teacher_logits.detach(), targets, d["divergence"],
                                d.get("jsd_beta", 0.5), d["temperature"], d["ignore_index"], "sum",
                                d["vocab_size"] or None)


def kd_sum_composite(student_logits, teacher_logits, targets, d: dict):
    """What a PyTorch user writes: float32 log-softmaxes and the divergence's formula (autograd
    gives 0 at ties for |x| too)."""
    width = max(student_logits.size(-1), teacher_logits.size(-1))
    s = align_logits(student_logits, width, d["vocab_size"]).reshape(-1, width).float()
    t = align_logits(teacher_logits.detach(), width, d["vocab_size"]).reshape(-1, width).float()
    lp = torch.log_softmax(s / d["temperature"], -1)
    lq = torch.log_softmax(t / d["temperature"], -1)
    p, q = lp.exp(), lq.exp()
    div, beta = d["divergence"], d.get("jsd_beta", 0.5)
    if div == "jsd" and beta in (0.0, 1.0):
        div = "forward_kl" if beta == 0.0 else "reverse_kl"
    if div == "tvd":
        rows = 0.5 * (p - q).abs().sum(-1)
    elif div == "forward_kl":
        rows = torch.where(q > 0, q * (lq - lp), 0.0).sum(-1)
    elif div == "reverse_kl":
        rows = torch.where(p > 0, p * (lp - lq), 0.0).sum(-1)
    else:
        lm = torch.logaddexp(lq + math.log(beta), lp + math.log(1 - beta))
        rows = (beta * torch.where(q > 0, q * (lq - lm), 0.0)
                + (1 - beta) * torch.where(p > 0, p * (lp - lm), 0.0)).sum(-1)
    return (rows * targets.reshape(-1).ne(d["ignore_index"])).sum()


KD_SUMS = {"lossfns": kd_sum_lossfns, "composite": kd_sum_composite}


def align_logits(logits: torch.Tensor, width: int, vocab_size: int) -> torch.Tensor:
    out, have = logits, logits.size(-1)
    if 0 < vocab_size < have:
        out = out.masked_fill(torch.arange(have, device=logits.device).ge(vocab_size), float("-inf"))
    if width > have:
        pad = torch.full((*logits.shape[:-1], width - have), float("-inf"), dtype=out.dtype,
                         device=out.device)
        out = torch.cat([out, pad], -1)
    return out


def loss_sums(student_logits, teacher_logits, targets, d: dict, tvd: str):
    """ComputeLossSums: (total, kd, ce) sums over the non-ignored targets of one micro-batch."""
    width = student_logits.size(-1)  # CE on the student's own columns, padding masked
    s = align_logits(student_logits, width, d["vocab_size"]).reshape(-1, width).to(torch.float32)
    y = targets.reshape(-1)
    ce = F.cross_entropy(s, y, reduction="sum", ignore_index=d["ignore_index"])
    if teacher_logits is None:
        return ce, torch.zeros_like(ce), ce.detach()
    kd = KD_SUMS[tvd](student_logits, teacher_logits, targets, d)
    total = d["kd_weight"] * kd
    if d["ce_weight"] != 0.0:  # as the trainer: no CE graph at weight 0
        total = total + d["ce_weight"] * ce
    return total, kd.detach(), ce.detach()


# ---- schedule and optimizer (trainer.cpp: LearningRate, MakeOptimizer) ------------------------

def learning_rate(config: dict, step: int) -> float:
    peak, s = config["optim"]["lr"], config["schedule"]
    if step < s["warmup_steps"]:
        return peak * (step + 1) / s["warmup_steps"]
    decay_steps = max(1, config["train"]["steps"] - s["warmup_steps"] - 1)
    progress = min(1.0, (step - s["warmup_steps"]) / decay_steps)
    floor = peak * s["min_lr_ratio"]
    if s["kind"] == "cosine":
        return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    if s["kind"] == "linear":
        return peak - (peak - floor) * progress
    return peak


def make_optimizer(config: dict, model, impl: str) -> torch.optim.AdamW:
    o = config["optim"]
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": o["weight_decay"]},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    kwargs = {"default": {}, "foreach": {"foreach": True}, "for-loop": {"foreach": False},
              "fused": {"fused": True}}[impl]
    return torch.optim.AdamW(groups, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], **kwargs)


# ---- one run ----------------------------------------------------------------------------------

def build(config: dict, device: torch.device, teacher_source: dict):
    """Teacher (distill mode) and student, initialised as the Trainer does: seed, teacher built
    (drawing its initialisation) then loaded, seed again, student built (its weights and dropout
    stream from the seed alone); all on the CPU, then moved."""
    torch.manual_seed(config["train"]["seed"])
    teacher = None
    if config["train"]["mode"] == "distill":
        teacher = make_model(config["teacher"])
        if teacher_source["kind"] == "hf":
            load_hf_dir(teacher, teacher_source["path"])
        elif teacher_source["kind"] == "checkpoint":
            load_trainer_checkpoint(teacher, teacher_source["path"])
        teacher = teacher.to(device).eval().requires_grad_(False)
    torch.manual_seed(config["train"]["seed"])
    student = make_model(config["student"])
    if config["student"].get("init_from_teacher") and teacher is not None:
        student.load_state_dict(teacher.state_dict())
    return teacher, student.to(device).train()


def run(spec: dict, config: dict) -> dict:
    """Runs spec["warmup"] + spec["steps"] optimizer steps; returns the per-step loss terms,
    the timed window's time and tokens, and the memory peaks."""
    device = torch.device(spec["device"])
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # LibTorch's default, as the trainer runs
        torch.backends.cudnn.allow_tf32 = True
    teacher, student = build(config, device, spec["teacher"])
    optimizer = make_optimizer(config, student, spec["optimizer"])
    bf16 = config["train"]["precision"] == "bf16"
    d, accum = config["distill"], config["train"]["grad_accum"]
    clip = config["optim"]["grad_clip"] if config["optim"]["grad_clip"] > 0 else math.inf

    def forward_loss(inputs, targets):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            teacher_logits = None
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(inputs)
            student_logits = student(inputs)
        return loss_sums(student_logits, teacher_logits, targets, d, spec["tvd"])

    if spec["mode"] == "compile":
        forward_loss = torch.compile(forward_loss, dynamic=False)

    data = SyntheticData(config)
    generator = torch.Generator().manual_seed(0)
    total_steps = spec["warmup"] + spec["steps"]
    batches = [[data.exact_batch(i) if s < spec["parity_steps"] else data.shaped_batch(i, generator)
                for i in range(s * accum, (s + 1) * accum)] for s in range(total_steps)]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    records, step_seconds = [], []
    timed_tokens, t0 = 0, None
    for step in range(total_steps):
        if step == spec["warmup"]:
            sync()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            t0 = time.perf_counter()
        start = time.perf_counter()
        lr = learning_rate(config, step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.zero_grad(set_to_none=True)
        tokens = sum(n for _, _, n in batches[step])
        scale = 1.0 / max(tokens, 1)
        kd_sum = torch.zeros((), device=device)
        ce_sum = torch.zeros((), device=device)
        for inputs, targets, _ in batches[step]:
            total, kd, ce = forward_loss(inputs.to(device), targets.to(device))
            (total * scale).backward()
            kd_sum += kd
            ce_sum += ce
        kd_loss, ce_loss = kd_sum.item() * scale, ce_sum.item() * scale
        grad_norm = torch.nn.utils.clip_grad_norm_(student.parameters(), clip).item()
        if all(math.isfinite(x) for x in (kd_loss, ce_loss, grad_norm)):
            optimizer.step()
        step_seconds.append(time.perf_counter() - start)
        if step >= spec["warmup"]:
            timed_tokens += tokens
        distill = teacher is not None
        records.append({"step": step + 1, "lr": lr, "grad_norm": grad_norm, "tokens": tokens,
                        "kd_loss": kd_loss if distill else None, "ce_loss": ce_loss,
                        "loss": d["kd_weight"] * kd_loss + d["ce_weight"] * ce_loss if distill else ce_loss})
    sync()
    seconds = time.perf_counter() - t0
    B, T = config["data"]["batch_size"], config["data"]["seq_len"]
    result = {"records": records, "step_seconds": step_seconds, "timed_seconds": seconds,
              "timed_tokens": timed_tokens, "timed_steps": spec["steps"],
              "positions_per_step": B * T * accum,
              "student_matmul_params": matmul_params(student),
              "teacher_matmul_params": matmul_params(teacher) if teacher is not None else 0}
    if device.type == "cuda":
        result["peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        result["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return result
