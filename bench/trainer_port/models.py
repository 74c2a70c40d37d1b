"""distill_trainer's two model families in PyTorch, op for op (trainer/src/models/gpt.cpp, llama.cpp).

The modules are built in the C++ constructors' order and initialised by the same calls, so that
after ``torch.manual_seed(train.seed)`` they draw the same numbers from the CPU generator as the
trainer does: the port starts from the trainer's exact weights without a file between them (the
parity check's step-1 loss verifies it). Teachers are loaded from the files the trainer reads:
a trainer checkpoint (TorchScript archive behind a 32-byte header) or a Hugging Face directory.
"""
from __future__ import annotations

import io
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


def padded_vocab(c: dict) -> int:
    m = c["pad_vocab_to_multiple_of"]
    return (c["vocab_size"] + m - 1) // m * m


def mlp_width(c: dict) -> int:
    if c.get("intermediate_size", 0) > 0:
        return c["intermediate_size"]
    # std::llround: halves away from zero (Python's round() rounds them to even).
    return max(1, int(math.floor(c["mlp_ratio"] * c["d_model"] + 0.5)))


def head_size(c: dict) -> int:
    return c["head_dim"] if c.get("head_dim", 0) > 0 else c["d_model"] // c["n_head"]


def kv_heads(c: dict) -> int:
    return c["n_kv_head"] if c.get("n_kv_head", 0) > 0 else c["n_head"]


# ---- family "gpt": pre-LayerNorm, learned positions, GELU MLP --------------------------------

class GptBlock(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d = c["d_model"]
        self.n_head, self.dropout = c["n_head"], c["dropout"]
        self.ln_attn = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.attn_out = nn.Linear(d, d)
        self.ln_mlp = nn.LayerNorm(d)
        self.mlp_in = nn.Linear(d, mlp_width(c))
        self.mlp_out = nn.Linear(mlp_width(c), d)
        self.resid_dropout = nn.Dropout(c["dropout"])
        # model.activation: gelu (exact) | gelu_tanh (GPT-2's gelu_new)
        self.approximate = "tanh" if c.get("activation", "gelu") == "gelu_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        B, T, D = x.shape
        qkv = self.qkv(self.ln_attn(x)).view(B, T, 3, self.n_head, D // self.n_head)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        attn = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2],
                                              dropout_p=self.dropout if self.training else 0.0,
                                              is_causal=True)
        attn = attn.transpose(1, 2).reshape(B, T, D)
        h = x + self.resid_dropout(self.attn_out(attn))
        m = self.mlp_out(F.gelu(self.mlp_in(self.ln_mlp(h)), approximate=self.approximate))
        return h + self.resid_dropout(m)


class GptLM(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.c = c
        v = padded_vocab(c)
        self.token_embedding = nn.Embedding(v, c["d_model"])
        self.position_embedding = nn.Embedding(c["context_length"], c["d_model"])
        self.embedding_dropout = nn.Dropout(c["dropout"])
        self.blocks = nn.ModuleList([GptBlock(c) for _ in range(c["n_layer"])])
        self.ln_final = nn.LayerNorm(c["d_model"])
        if not c["tie_embeddings"]:
            self.lm_head = nn.Parameter(torch.empty(v, c["d_model"]))
        self.register_buffer("padded_mask", torch.arange(v).ge(c["vocab_size"]))
        # GPT-2 initialisation, as gpt.cpp: N(0, 0.02), residual projections 0.02/sqrt(2 L).
        residual_std = 0.02 / math.sqrt(2.0 * c["n_layer"])
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 1:
                    continue
                residual = "attn_out" in name or "mlp_out" in name
                p.normal_(0.0, residual_std if residual else 0.02)
            for name, p in self.named_parameters():
                if p.dim() == 1 and "bias" in name:
                    p.zero_()

    def lm_head_weight(self) -> torch.Tensor:
        return self.token_embedding.weight if self.c["tie_embeddings"] else self.lm_head

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V_padded)
        T = tokens.size(1)
        positions = torch.arange(T, device=tokens.device)
        h = self.embedding_dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            h = block(h)
        logits = F.linear(self.ln_final(h), self.lm_head_weight())
        if padded_vocab(self.c) == self.c["vocab_size"]:
            return logits
        return logits.masked_fill(self.padded_mask, float("-inf"))


# ---- family "llama": RMSNorm, RoPE, GQA, SwiGLU ----------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.to(torch.float32)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def inverse_frequencies(c: dict) -> torch.Tensor:  # (head_dim / 2,) fp32, as llama.cpp
    dim = head_size(c)
    exponents = torch.arange(0, dim, 2, dtype=torch.long).to(torch.float32) / float(dim)
    inv_freq = 1.0 / torch.pow(float(c["rope_theta"]), exponents)
    r = c["rope_scaling"]
    if r["type"] != "llama3":
        return inv_freq
    old_context = float(r["original_max_position_embeddings"])
    low_freq_wavelen = old_context / r["low_freq_factor"]
    high_freq_wavelen = old_context / r["high_freq_factor"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / r["factor"], inv_freq)
    smooth = (old_context / wavelen - r["low_freq_factor"]) / (r["high_freq_factor"] - r["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / r["factor"] + smooth * scaled
    medium = wavelen.ge(high_freq_wavelen).logical_and(wavelen.le(low_freq_wavelen))
    return torch.where(medium, smoothed, scaled)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    return torch.cat([-x.narrow(-1, half, half), x.narrow(-1, 0, half)], -1)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d = c["d_model"]
        self.n_head, self.n_kv_head, self.head_dim = c["n_head"], kv_heads(c), head_size(c)
        self.dropout = c["dropout"]
        self.q_proj = nn.Linear(d, self.n_head * self.head_dim, bias=c["attention_bias"])
        self.k_proj = nn.Linear(d, self.n_kv_head * self.head_dim, bias=c["attention_bias"])
        self.v_proj = nn.Linear(d, self.n_kv_head * self.head_dim, bias=c["attention_bias"])
        self.o_proj = nn.Linear(self.n_head * self.head_dim, d, bias=c["attention_out_bias"])
        self.qk_norm = c["qk_norm"]
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, c["norm_eps"])
            self.k_norm = RMSNorm(self.head_dim, c["norm_eps"])

    def forward(self, x, cos, sin):  # x (B, T, d_model); cos, sin (T, head_dim) fp32
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        c, s = cos.to(q.dtype), sin.to(q.dtype)
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0,
                                             is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class Mlp(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        d, h = c["d_model"], mlp_width(c)
        self.gate_proj = nn.Linear(d, h, bias=c["mlp_bias"])
        self.up_proj = nn.Linear(d, h, bias=c["mlp_bias"])
        self.down_proj = nn.Linear(h, d, bias=c["mlp_bias"])

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = Mlp(c)
        self.input_layernorm = RMSNorm(c["d_model"], c["norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["d_model"], c["norm_eps"])

    def forward(self, x, cos, sin):
        h = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(padded_vocab(c), c["d_model"])
        self.layers = nn.ModuleList([DecoderLayer(c) for _ in range(c["n_layer"])])
        self.norm = RMSNorm(c["d_model"], c["norm_eps"])


class LlamaLM(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.c = c
        self.inv_freq = inverse_frequencies(c)  # not a parameter or buffer, as in llama.cpp
        self.model = Backbone(c)
        if not c["tie_embeddings"]:
            self.lm_head = nn.Linear(c["d_model"], padded_vocab(c), bias=False)
        with torch.no_grad():  # transformers' initialisation, as llama.cpp
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    p.normal_(0.0, 0.02)
                elif name.endswith("bias"):
                    p.zero_()

    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.c["tie_embeddings"] else self.lm_head.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V_padded)
        T = tokens.size(1)
        positions = torch.arange(T, dtype=torch.float32, device=tokens.device)
        freqs = torch.outer(positions, self.inv_freq.to(tokens.device))
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer(h, cos, sin)
        logits = F.linear(self.model.norm(h), self.lm_head_weight())
        v = padded_vocab(self.c)
        if v == self.c["vocab_size"]:
            return logits
        return logits.masked_fill(torch.arange(v, device=logits.device).ge(self.c["vocab_size"]),
                                  float("-inf"))


def make_model(c: dict) -> nn.Module:
    """A freshly initialised model of section `c` (student/teacher of the resolved config), on
    the CPU, drawing from the default generator exactly as distill::MakeModel does."""
    return {"gpt": GptLM, "llama": LlamaLM}[c["family"]](c)


def matmul_params(model: nn.Module) -> int:
    """Parameters that take part in a matmul per token: every Linear weight and the lm_head
    (the tied embedding counted once, as the output projection); not the input embeddings."""
    n = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    if isinstance(model, GptLM) or model.c["tie_embeddings"]:  # else llama's lm_head Linear
        n += model.lm_head_weight().numel()
    return n


# ---- teacher weights from the trainer's files --------------------------------------------------

def load_trainer_checkpoint(model: nn.Module, path: str) -> str:
    """Loads the model part of a distill_trainer checkpoint (a file, or a run directory: its
    latest checkpoints/step_*.pt). The file is "DISTILL-CKPT-1\\n" + 16 hex digits + "\\n" and
    then the TorchScript archive of torch::serialize::OutputArchive, or that archive alone."""
    p = Path(path)
    if p.is_dir():
        files = sorted((p / "checkpoints").glob("step_*.pt"))
        if not files:
            raise FileNotFoundError(f"{path}: no checkpoints/step_*.pt")
        p = files[-1]
    data = p.read_bytes()
    offset = 0 if data[:2] == b"PK" else 32
    archive = torch.jit.load(io.BytesIO(data[offset:]), map_location="cpu")
    saved = dict(archive.model.named_parameters())
    saved.update(dict(archive.model.named_buffers()))
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name not in saved or saved[name].shape != t.shape:
                raise ValueError(f"{p}: tensor {name} missing or of another shape "
                                 f"({tuple(saved[name].shape) if name in saved else 'missing'}, "
                                 f"the model's {tuple(t.shape)})")
            t.copy_(saved[name])
    return str(p)


def load_hf_dir(model: nn.Module, hf_dir: str) -> None:
    """The weights of a Hugging Face directory (*.safetensors; names as transformers', shapes
    exactly the module's), converted to the parameters' dtype as the trainer does. The llama
    family only (the port does not rename GPT-2's tensors)."""
    if isinstance(model, GptLM):
        raise ValueError(f"{hf_dir}: a GPT-2 teacher from Hugging Face is not supported by the port")
    from safetensors.torch import load_file
    tensors = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    with torch.no_grad():
        for name, t in model.named_parameters():
            if name not in tensors or tuple(tensors[name].shape) != tuple(t.shape):
                raise ValueError(f"{hf_dir}: tensor {name} missing or of another shape")
            t.copy_(tensors[name].to(t.dtype))


def write_hf_dir(model: LlamaLM, hf_dir: str, config_json: dict) -> None:
    """A Hugging Face directory of `model`'s weights (fp32) with `config_json`: the stand-in
    for a teacher whose real weights are absent."""
    from safetensors.torch import save_file
    out = Path(hf_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config_json, indent=2) + "\n")
    tensors = {n: p.detach().contiguous() for n, p in model.named_parameters()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
