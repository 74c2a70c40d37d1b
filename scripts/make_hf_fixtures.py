#!/usr/bin/env python3
"""Write the tiny random Hugging Face models that the C++ model loaders are tested against.

Each fixture is a directory tests/fixtures/hf/<name>/ with
  config.json          the model's config, as transformers saves it (or in the older layout, below)
  model.safetensors    its weights, float32
  expected.safetensors input_ids (int64, shape (2, 11)) and logits (float32, (2, 11, vocab_size)):
                       the model's output in float32, eval mode, on CPU, eager attention
and, where a fixture needs one, a fixture.json with extra facts (e.g. the tokenizer's real vocabulary
size of a padded embedding matrix).

The weights are random but not default-initialised: a larger initializer_range makes the attention
sharp and position dependent (so a RoPE error shows in the logits), RMSNorm weights are drawn around 1
and biases around 0 (not all ones / zeros), so a wrong or missing tensor mapping changes the logits.

Config layouts: transformers 5 writes `dtype` and `rope_parameters` (with rope_theta inside); the
configs of most published models (and transformers 4.x) use `torch_dtype`, top-level `rope_theta` and
`rope_scaling`. Fixtures marked "legacy" below are rewritten to the older layout, so the loaders are
tested on both; this script checks that transformers reads the rewritten file back to the same logits.

Everything is seeded: running it again writes the same files (with the same transformers and torch,
on the same CPU type: the reference logits may differ in the last bits on another).

It replaces only fixture directories (and a README.md) that it wrote: --out pointing at other files
stops before changing them.

    python scripts/make_hf_fixtures.py [--out tests/fixtures/hf] [--only NAME ...]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from hf_layout import legacy_config

REPO_ROOT = Path(__file__).resolve().parent.parent
BATCH, SEQ = 2, 11
INIT_STD = 0.2  # initializer_range: large enough for sharp attention in a 32-wide model
NORM_SPREAD = 0.3  # RMSNorm weights ~ 1 + U(-spread, spread)
BIAS_STD = 0.1


@dataclass
class Fixture:
    name: str
    seed: int
    make_config: Callable[[], Any]
    legacy_layout: bool = False  # rewrite config.json to torch_dtype / rope_theta / rope_scaling
    # GPT-2: write the weights as the original GPT-2 repositories hold them (GPT2Model's names,
    # without "transformer.", no lm_head, the attention's causal-mask buffers "h.<i>.attn.bias")
    bare_base_model: bool = False
    max_input_id: int | None = None  # input ids are drawn below this (default: vocab_size)
    input_seed: int | None = None  # share input_ids between fixtures (teacher / student)
    extra: dict[str, Any] = field(default_factory=dict)  # written to fixture.json when not empty
    notes: str = ""


def _common(**kw: Any) -> dict[str, Any]:
    base = dict(num_hidden_layers=2, initializer_range=INIT_STD, rms_norm_eps=1e-5,
                bos_token_id=1, eos_token_id=2, pad_token_id=None)
    base.update(kw)
    return base


def _llama_gqa_rope3():
    from transformers import LlamaConfig
    return LlamaConfig(**_common(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=True, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 16}))


def _llama_untied_mha():
    from transformers import LlamaConfig
    return LlamaConfig(**_common(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
        max_position_embeddings=64, tie_word_embeddings=False, rope_theta=10000.0,
        attention_bias=True, mlp_bias=True))


REAL_VOCAB = 130  # the "tokenizer" of the qwen2 pair: both embedding matrices are padded past it


def _qwen2_teacher():
    from transformers import Qwen2Config
    return Qwen2Config(**_common(
        vocab_size=160, hidden_size=48, intermediate_size=48, num_attention_heads=6, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False))


def _qwen2_student():
    from transformers import Qwen2Config
    return Qwen2Config(**_common(
        vocab_size=144, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        use_sliding_window=False))


def _qwen3_qknorm():
    from transformers import Qwen3Config
    return Qwen3Config(**_common(
        vocab_size=192, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=64, tie_word_embeddings=True, rope_theta=1000000.0,
        rms_norm_eps=1e-6, use_sliding_window=False))


def _mistral():
    from transformers import MistralConfig
    return MistralConfig(**_common(
        vocab_size=256, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=64, tie_word_embeddings=False, rope_theta=10000.0, sliding_window=None))


def _gpt2_tanh():
    from transformers import GPT2Config
    return GPT2Config(vocab_size=96, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=None,
                      activation_function="gelu_new", initializer_range=INIT_STD, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=True)


def _gpt2_erf_untied():
    from transformers import GPT2Config
    return GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=2, n_inner=48,
                      activation_function="gelu", initializer_range=INIT_STD, bos_token_id=1,
                      eos_token_id=2, tie_word_embeddings=False)


FIXTURES = [
    Fixture("llama_gqa_rope3", 1001, _llama_gqa_rope3, legacy_layout=True,
            notes="Llama, 4 query / 2 KV heads (head_dim 8), llama3 RoPE scaling, tied embeddings"),
    Fixture("llama_untied_mha", 1002, _llama_untied_mha,
            notes="Llama, n_kv = n_heads, attention and MLP biases, untied lm_head"),
    Fixture("qwen2_teacher", 1003, _qwen2_teacher, legacy_layout=True, max_input_id=REAL_VOCAB, input_seed=2000,
            extra={"real_vocab_size": REAL_VOCAB},
            notes="Qwen2 (q/k/v bias), vocab padded to 160 (real 130), untied, 6 / 2 heads"),
    Fixture("qwen2_student", 1004, _qwen2_student, max_input_id=REAL_VOCAB, input_seed=2000,
            extra={"real_vocab_size": REAL_VOCAB},
            notes="Qwen2 (q/k/v bias), vocab padded to 144 (real 130), tied; same input_ids as qwen2_teacher"),
    Fixture("qwen3_qknorm", 1005, _qwen3_qknorm,
            notes="Qwen3, head_dim 16 != hidden 32 / 4 heads, q/k RMSNorm, tied"),
    Fixture("mistral", 1006, _mistral, legacy_layout=True,
            notes="Mistral, sliding_window null, 4 / 2 heads, untied"),
    Fixture("gpt2_tanh", 1007, _gpt2_tanh, legacy_layout=True, bare_base_model=True,
            notes="GPT-2, gelu_new (tanh), tied, n_inner null (4 * n_embd); weights as the original "
                  "GPT-2 repositories hold them (GPT2Model's names, attn.bias mask buffers)"),
    Fixture("gpt2_erf_untied", 1008, _gpt2_erf_untied,
            notes="GPT-2 layout, exact gelu, untied lm_head, n_inner 48, 2 heads"),
]


def randomize_(model: torch.nn.Module) -> None:
    """Norm weights around 1 and biases around 0, so that a mix-up of tensors changes the output."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or re.search(r"\.ln_(1|2|f)\.weight$", name):
                p.copy_(1.0 + NORM_SPREAD * (2 * torch.rand_like(p) - 1))
            elif name.endswith(".bias"):
                p.copy_(BIAS_STD * torch.randn_like(p))


def logits_of(model: torch.nn.Module, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=input_ids).logits.float().contiguous()


def load_fp32(path: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM
    import transformers
    kw = {"dtype": torch.float32} if int(transformers.__version__.split(".")[0]) >= 5 else {"torch_dtype": torch.float32}
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **kw).eval()


def llama3_regimes(cfg: Any) -> str:
    """Describe which RoPE frequencies the llama3 scaling leaves, smooths or divides (it must change some)."""
    import math
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
    theta = rope.get("rope_theta", getattr(cfg, "rope_theta", None))
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    inv = [theta ** (-2 * i / hd) for i in range(hd // 2)]
    orig = rope["original_max_position_embeddings"]
    low_wl, high_wl = orig / rope["low_freq_factor"], orig / rope["high_freq_factor"]
    kinds = []
    for f in inv:
        wl = 2 * math.pi / f
        kinds.append("kept" if wl < high_wl else "divided" if wl > low_wl else "smoothed")
    assert any(k != "kept" for k in kinds), "llama3 scaling changes no frequency at this size"
    return ", ".join(f"{k}: {kinds.count(k)}" for k in ("kept", "smoothed", "divided"))


def write_bare_base_model(path: Path, cfg: Any) -> None:
    """Rewrites a GPT2LMHeadModel's weights as GPT2Model's, with GPT-2's old causal-mask buffers."""
    from safetensors.torch import load_file, save_file
    tensors = load_file(str(path))
    bare = {name.removeprefix("transformer."): t for name, t in tensors.items() if name != "lm_head.weight"}
    n = cfg.n_positions
    for i in range(cfg.n_layer):
        bare[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)  # float32, as GPT-2 stored it
    save_file(dict(sorted(bare.items())), str(path), metadata={"format": "pt"})


def make_one(fx: Fixture, out_root: Path) -> dict[str, Any]:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(fx.seed)
    cfg = fx.make_config()
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    randomize_(model)
    model.eval()

    gen = torch.Generator().manual_seed(fx.input_seed if fx.input_seed is not None else fx.seed + 7)
    input_ids = torch.randint(0, fx.max_input_id or cfg.vocab_size, (BATCH, SEQ), generator=gen, dtype=torch.int64)
    logits = logits_of(model, input_ids)

    dest = out_root / fx.name
    with tempfile.TemporaryDirectory(dir=out_root) as tmp:
        tmpdir = Path(tmp) / fx.name
        model.save_pretrained(tmpdir, safe_serialization=True)
        for extra in ("generation_config.json",):  # random models have no generation settings worth keeping
            (tmpdir / extra).unlink(missing_ok=True)
        cfg_path = tmpdir / "config.json"
        cfg_json = json.loads(cfg_path.read_text())
        cfg_json.pop("_attn_implementation", None)
        if fx.legacy_layout:
            cfg_json = legacy_config(cfg_json)
        cfg_path.write_text(json.dumps(cfg_json, indent=2, sort_keys=True) + "\n")
        if fx.bare_base_model:
            write_bare_base_model(tmpdir / "model.safetensors", cfg)
        save_file({"input_ids": input_ids, "logits": logits}, str(tmpdir / "expected.safetensors"),
                  metadata={"format": "pt"})
        if fx.extra:
            (tmpdir / "fixture.json").write_text(json.dumps(fx.extra, indent=2, sort_keys=True) + "\n")

        # What a reader of the files gets must be what we computed (also checks the legacy layout).
        again = logits_of(load_fp32(tmpdir), input_ids)
        if not torch.equal(again, logits):
            diff = (again - logits).abs().max().item()
            raise SystemExit(f"{fx.name}: reloaded model differs from the one written (max |diff| {diff:g})")
        for f in tmpdir.iterdir():
            f.chmod(0o644)
        if dest.exists():
            refuse_foreign(dest)
            shutil.rmtree(dest)
        tmpdir.rename(dest)

    n_params = sum(p.numel() for p in model.parameters())
    info = {"name": fx.name, "params": n_params, "vocab": cfg.vocab_size, "notes": fx.notes,
            "layout": "legacy (torch_dtype, rope_theta, rope_scaling)" if fx.legacy_layout
            else "transformers 5 (dtype, rope_parameters)",
            "bytes": sum(f.stat().st_size for f in dest.iterdir()),
            "max_abs_logit": logits.abs().max().item()}
    if fx.name == "llama_gqa_rope3":
        info["notes"] += f" (RoPE frequencies {llama3_regimes(cfg)})"
    return info


# The files a fixture directory holds: one holding anything else (or lacking the reference logits)
# is not one this script wrote, and is never deleted to make room for one.
FIXTURE_FILES = {"config.json", "model.safetensors", "expected.safetensors", "fixture.json"}
README_MARK = "Generated by `scripts/make_hf_fixtures.py`"


def refuse_foreign(dest: Path) -> None:
    """Exits (status 1) where `dest` is not a fixture directory this script wrote."""
    names = {p.name for p in dest.iterdir()} if dest.is_dir() else None
    if names is None or "expected.safetensors" not in names or not names <= FIXTURE_FILES:
        what = ("not a directory" if names is None else
                f"holds {sorted(names - FIXTURE_FILES) or 'no expected.safetensors'}")
        raise SystemExit(f"make_hf_fixtures: {dest} exists and is not a fixture this script wrote "
                         f"({what}); nothing was changed there: move it away or choose another --out")


def write_readme(out_root: Path, infos: list[dict[str, Any]], argv: list[str]) -> None:
    import safetensors
    import transformers
    rel = out_root.resolve()
    try:
        rel = rel.relative_to(REPO_ROOT)
    except ValueError:
        pass
    lines = [
        "# Tiny random Hugging Face models (test fixtures)",
        "",
        README_MARK + " (do not edit by hand); regenerate with",
        "",
        "    python " + " ".join(["scripts/make_hf_fixtures.py", *argv]),
        "",
        f"with transformers {transformers.__version__}, torch {torch.__version__.split('+')[0]}, "
        f"safetensors {safetensors.__version__}.",
        "",
        "Each directory: `config.json`, `model.safetensors` (float32), `expected.safetensors` with `input_ids`",
        f"(int64, ({BATCH}, {SEQ})) and `logits` (float32, ({BATCH}, {SEQ}, vocab_size)) computed by transformers",
        "on CPU in float32, eval mode, eager attention; `fixture.json` where there are extra facts",
        "(`real_vocab_size`: ids at or past it are padding rows of the embedding matrix).",
        f"Weights are drawn with initializer_range {INIT_STD}; RMSNorm weights are 1 + U(-{NORM_SPREAD}, "
        f"{NORM_SPREAD}), biases N(0, {BIAS_STD}^2).",
        "Config layout: \"legacy\" fixtures use `torch_dtype`, top-level `rope_theta` and `rope_scaling` (as most",
        "published models and transformers 4.x); the others use transformers 5's `dtype` and `rope_parameters`",
        "(which transformers 4.x ignores: scripts/hf_logits.py translates it there; checked with 4.57.6 too).",
        "",
        "Check a model directory against a fixture's reference logits with",
        "",
        "    python scripts/hf_logits.py --hf-dir DIR --check tests/fixtures/hf/<name>/expected.safetensors",
        "",
        "| fixture | parameters | vocab | config layout | bytes | max abs logit | what it covers |",
        "| --- | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for i in infos:
        lines.append(f"| `{i['name']}` | {i['params']} | {i['vocab']} | {i['layout']} | {i['bytes']} | "
                     f"{i['max_abs_logit']:.2f} | {i['notes']} |")
    (out_root / "README.md").write_text("\n".join(lines) + "\n")  # checked in main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO_ROOT / "tests" / "fixtures" / "hf",
                    help="fixture root (default: tests/fixtures/hf of this repository)")
    ap.add_argument("--only", nargs="*", default=None, help="fixture names to (re)write; default: all")
    args = ap.parse_args()

    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)  # same reduction order on every machine
    names = {f.name for f in FIXTURES}
    if args.only and (unknown := set(args.only) - names):
        ap.error(f"unknown fixture(s) {sorted(unknown)}; known: {sorted(names)}")
    # What would be replaced is checked before anything is written.
    for fx in FIXTURES:
        if (not args.only or fx.name in args.only) and (args.out / fx.name).exists():
            refuse_foreign(args.out / fx.name)
    readme = args.out / "README.md"
    if not args.only and readme.exists() and README_MARK not in readme.read_text(errors="replace"):
        raise SystemExit(f"make_hf_fixtures: {readme} exists and was not written by this script; "
                         "nothing was changed: move it away or choose another --out")
    args.out.mkdir(parents=True, exist_ok=True)
    infos = []
    for fx in FIXTURES:
        if args.only and fx.name not in args.only:
            continue
        info = make_one(fx, args.out)
        infos.append(info)
        print(f"{fx.name}: {info['params']} parameters, {info['bytes']} bytes, max |logit| {info['max_abs_logit']:.2f}")
    if not args.only:
        argv = [] if args.out.resolve() == (REPO_ROOT / "tests/fixtures/hf").resolve() else ["--out", str(args.out)]
        write_readme(args.out, infos, argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
