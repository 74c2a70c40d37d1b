#!/usr/bin/env python3
"""Run a Hugging Face causal LM directory with transformers, to check exported models or compare generations.

Check mode (used by ctest on models that distill_trainer exports, and on the fixtures):

    python scripts/hf_logits.py --hf-dir DIR --check FILE.safetensors [--rtol R] [--atol A]

loads DIR with AutoModelForCausalLM.from_pretrained(DIR, dtype float32) on CPU in eval mode, runs the
`input_ids` (int64, (B, T)) stored in FILE and compares the logits with FILE's `logits` (float32,
(B, T, V)). It prints the max |diff| absolute and relative to max |reference logit| and passes when
max |diff| <= max(atol, rtol * max |ref|) (defaults 1e-4 and 1e-4, i.e. 1e-4 * max(1, max |ref|)).
A weight the directory lacks (or has to spare) fails the check too: transformers would otherwise
initialise it at random and say little.

Generate mode (used by the docs to show a teacher and its student side by side):

    python scripts/hf_logits.py --hf-dir DIR --generate "The capital of France is" "To be, or" \
        [--max-new-tokens 16] [--tokenizer-dir TOKDIR]

prints one line per prompt, `"prompt" -> "greedy continuation"` (JSON-quoted, so a newline shows
as \\n), with the tokenizer files of DIR or of --tokenizer-dir.

Exit status: 0 pass, 1 logits over tolerance or weights missing / unexpected, 2 bad input.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

from hf_layout import split_rope_parameters


# What AutoTokenizer can build a tokenizer from (fast, sentencepiece, byte-level BPE, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "vocab.txt")


def bad_input(msg: str) -> NoReturn:
    print(f"hf_logits: error: {msg}", file=sys.stderr)
    sys.exit(2)


def quiet_transformers() -> None:
    import transformers
    transformers.utils.logging.set_verbosity_error()
    try:
        transformers.utils.logging.disable_progress_bar()
    except AttributeError:  # older transformers
        pass


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """transformers 5 takes `dtype=`, 4.x `torch_dtype=` (4.56+ takes both, with a warning for the old)."""
    import transformers
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def load_config(hf_dir: Path) -> Any:
    """The directory's config; for transformers 4.x, with transformers 5's `rope_parameters` (which 4.x
    ignores, falling back to rope_theta 10000) turned into `rope_theta` and `rope_scaling`."""
    import transformers
    from transformers import AutoConfig
    if not (hf_dir / "config.json").is_file():
        bad_input(f"{hf_dir} has no config.json")
    try:
        raw = json.loads((hf_dir / "config.json").read_text())
        config = AutoConfig.from_pretrained(hf_dir)
    except (OSError, ValueError, KeyError) as e:
        bad_input(f"cannot read {hf_dir / 'config.json'}: {e}")
    rope = raw.get("rope_parameters")
    if int(transformers.__version__.split(".")[0]) < 5 and isinstance(rope, dict) and "rope_theta" not in raw:
        rope_theta, config.rope_scaling = split_rope_parameters(rope)
        if rope_theta is not None:
            config.rope_theta = rope_theta
    return config


def load_model(hf_dir: Path, attn: str) -> tuple[Any, dict[str, list[str]]]:
    import torch
    from transformers import AutoModelForCausalLM
    config = load_config(hf_dir)
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            hf_dir, config=config, output_loading_info=True, attn_implementation=attn,
            **dtype_kwargs(torch.float32))
    except (OSError, ValueError, KeyError) as e:
        bad_input(f"transformers could not load {hf_dir}: {e}")
    return model.to("cpu").eval(), info


def loading_problems(info: dict[str, Any]) -> list[str]:
    problems = []
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        items = sorted(str(k) for k in (info.get(key) or []))
        if items:
            shown = ", ".join(items[:8]) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")
            problems.append(f"{key.replace('_', ' ')}: {shown}")
    return problems


def check(args: argparse.Namespace) -> int:
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if not args.check.is_file():
        bad_input(f"no such file: {args.check}")
    try:
        ref = load_file(str(args.check))
    except (SafetensorError, OSError) as e:
        bad_input(f"cannot read {args.check} as safetensors: {e}")
    for key in ("input_ids", "logits"):
        if key not in ref:
            names = sorted(ref)
            bad_input(f"{args.check} has no tensor '{key}' (has: {', '.join(names[:6])}"
                      f"{', ...' if len(names) > 6 else ''})")
    ids, want = ref["input_ids"], ref["logits"]
    if ids.dtype != torch.int64 or ids.dim() != 2:
        bad_input(f"input_ids must be int64 (B, T); got {ids.dtype} {tuple(ids.shape)}")
    if want.dtype != torch.float32 or want.dim() != 3 or tuple(want.shape[:2]) != tuple(ids.shape):
        bad_input(f"logits must be float32 (B, T, V) with (B, T) = {tuple(ids.shape)}; "
                  f"got {want.dtype} {tuple(want.shape)}")

    model, info = load_model(args.hf_dir, args.attn)
    vocab = model.get_output_embeddings().weight.shape[0]
    if want.shape[2] != vocab:
        bad_input(f"reference logits have {want.shape[2]} columns, the model's vocabulary has {vocab}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
        bad_input(f"input_ids outside [0, {vocab}): min {ids.min().item()}, max {ids.max().item()}")

    with torch.no_grad():
        got = model(input_ids=ids).logits.float()
    max_ref = want.abs().max().item()
    max_diff = (got - want).abs().max().item()
    tol = max(args.atol, args.rtol * max_ref)
    rel = max_diff / max(max_ref, 1e-30)
    print(f"{args.hf_dir}: max |diff| {max_diff:.3e}, relative to max |ref| {max_ref:.4g}: {rel:.3e} "
          f"(tolerance {tol:.3e}; {tuple(ids.shape)} tokens, vocab {vocab})")
    failed = False
    if problems := loading_problems(info):
        print("FAIL: the directory's weights do not match the model: " + "; ".join(problems))
        failed = True
    if not max_diff <= tol:  # also catches NaN
        print(f"FAIL: max |diff| {max_diff:.3e} > tolerance {tol:.3e}")
        failed = True
    if not failed:
        print("OK")
    return 1 if failed else 0


def generate(args: argparse.Namespace) -> int:
    import torch
    from transformers import AutoTokenizer

    tok_dir = args.tokenizer_dir or args.hf_dir
    if not any((tok_dir / name).is_file() for name in TOKENIZER_FILES):
        hint = ("" if args.tokenizer_dir else
                "; a model exported without them (or a gpt-family export, which has none) takes "
                "--tokenizer-dir DIR: the model whose tokenizer made its training data")
        bad_input(f"no tokenizer files in {tok_dir} (none of {', '.join(TOKENIZER_FILES)}){hint}")
    try:
        tok = AutoTokenizer.from_pretrained(tok_dir)
    except Exception as e:  # noqa: BLE001 (transformers raises several kinds for files it cannot use)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        bad_input(f"cannot load the tokenizer in {tok_dir} (give --tokenizer-dir): {first}")
    model, info = load_model(args.hf_dir, args.attn)
    if problems := loading_problems(info):
        print(f"warning: {args.hf_dir}: " + "; ".join(problems), file=sys.stderr)
    rows = model.get_input_embeddings().weight.shape[0]
    tok_size = len(tok)
    if tok_size > rows:  # ids the model has no embedding row for: not its tokenizer
        print(f"warning: the tokenizer in {tok_dir} has {tok_size} ids, the model in {args.hf_dir} "
              f"{rows} embedding rows: is it the tokenizer that made the model's training data?",
              file=sys.stderr)
    for prompt in args.generate:
        enc = tok(prompt, return_tensors="pt")
        if enc["input_ids"].numel() and int(enc["input_ids"].max()) >= rows:
            bad_input(f"the prompt {json.dumps(prompt, ensure_ascii=False)} becomes ids up to "
                      f"{int(enc['input_ids'].max())} with the tokenizer in {tok_dir}, but the model in "
                      f"{args.hf_dir} has {rows} embedding rows: give --tokenizer-dir the tokenizer "
                      "that made its training data")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=args.max_new_tokens, do_sample=False,
                                 num_beams=1, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None
                                 else tok.eos_token_id)
        cont = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
        print(f"{json.dumps(prompt, ensure_ascii=False)} -> {json.dumps(cont, ensure_ascii=False)}", flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hf-dir", type=Path, required=True, help="Hugging Face model directory (config.json + weights)")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", type=Path, metavar="FILE.safetensors",
                      help="reference with input_ids int64 (B,T) and logits float32 (B,T,V)")
    mode.add_argument("--generate", nargs="+", metavar="PROMPT", help="prompts to continue greedily")
    ap.add_argument("--rtol", type=float, default=1e-4, help="tolerance relative to max |ref logit| (1e-4)")
    ap.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance floor (1e-4)")
    ap.add_argument("--max-new-tokens", type=int, default=16, help="tokens to generate per prompt (16)")
    ap.add_argument("--tokenizer-dir", type=Path, help="tokenizer files, if not in --hf-dir")
    ap.add_argument("--attn", default="eager", choices=["eager", "sdpa"], help="attention implementation (eager)")
    args = ap.parse_args()
    if not args.hf_dir.is_dir():
        bad_input(f"no such directory: {args.hf_dir}")
    if args.rtol < 0 or args.atol < 0 or args.max_new_tokens < 1:
        bad_input("--rtol and --atol must be >= 0, --max-new-tokens >= 1")

    import torch
    torch.set_grad_enabled(False)
    quiet_transformers()
    return check(args) if args.check else generate(args)


if __name__ == "__main__":
    sys.exit(main())
