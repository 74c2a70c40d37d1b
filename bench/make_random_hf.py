"""A Hugging Face checkpoint with random weights in the shape of a Qwen2.5 model, for benchmarks
that need a real-size teacher and no download (bench/fused_linear_trainer.sh).

    python bench/make_random_hf.py OUT_DIR [--size 0.5b|1.5b] [--device cuda]
"""
import argparse
import os
import shutil
import sys
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--size", default="1.5b", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        sys.exit(f"make_random_hf: {out} exists and is not an empty directory: give a new path")
    cfg = Qwen2Config(vocab_size=151936, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, torch_dtype="bfloat16", **SHAPES[args.size])
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    # Written beside OUT and renamed into place: OUT is either absent (or empty) or complete.
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        model.save_pretrained(tmp)
        if not (tmp / "config.json").is_file() or not any(tmp.glob("*.safetensors")):
            sys.exit(f"make_random_hf: transformers wrote no config.json and safetensors into {tmp}")
        if out.is_dir():
            out.rmdir()
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.size}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters -> {out}")


if __name__ == "__main__":
    main()
