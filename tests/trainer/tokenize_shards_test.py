#!/usr/bin/env python3
"""scripts/tokenize_shards.py: the shards it writes, and what it refuses and cleans up.

Usage: tokenize_shards_test.py WORK_DIR   (ctest: distill.scripts.TokenizeShards; needs the
`tokenizers` package). Prints PASS, or the first failed check and exits 1.
"""
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer, models, pre_tokenizers

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "tokenize_shards.py"


def check(ok, what):
    if not ok:
        print(f"FAIL: {what}")
        sys.exit(1)


def tokenize(*args):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True,
                          text=True)


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    tokens = np.fromfile(path, dtype="<u2", offset=1024)
    check(header[0] == 20240520 and header[1] == 1 and header[2] == len(tokens),
          f"{path}: header {header[:3]} for {len(tokens)} uint16 tokens")
    return tokens


def main():
    work = Path(sys.argv[1])
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    # A word-level tokenizer: one id per word, <|endoftext|> the separator.
    vocab = {"<|endoftext|>": 0, "[UNK]": 1, "to": 2, "be": 3, "or": 4, "not": 5}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = work / "tokenizer.json"
    tok.save(str(tokenizer))
    text = work / "text"
    text.mkdir()
    (text / "a.txt").write_text("to be or not to be\n", encoding="utf-8")
    (text / "b.txt").write_text("not to be\n", encoding="utf-8")

    # Two documents, each after the separator, in shards of 4 tokens.
    out = work / "tok"
    r = tokenize("--tokenizer", tokenizer, "--out-dir", out, "--shard-tokens", 4, text)
    check(r.returncode == 0, f"tokenize: {r.returncode} {r.stderr}")
    names = sorted(p.name for p in out.iterdir())
    check(names == [f"train_{i:06d}.bin" for i in range(3)], f"shards {names}")
    stream = np.concatenate([read_shard(out / n) for n in names])
    check(stream.tolist() == [0, 2, 3, 4, 5, 2, 3, 0, 5, 2, 3], f"tokens {stream.tolist()}")

    # Again into the same directory and prefix: refused, the shards there untouched.
    before = {n: (out / n).read_bytes() for n in names}
    (text / "c.txt").write_text("be\n", encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", out, text)
    check(r.returncode == 1 and "Traceback" not in r.stderr, f"second run: {r.returncode} {r.stderr}")
    check(f"--out-dir {out} already holds 3 shards named train_*.bin (train_000000.bin, "
          "train_000001.bin, train_000002.bin): a glob over them would mix two tokenizations"
          in r.stderr, r.stderr)
    check({n: (out / n).read_bytes() for n in sorted(p.name for p in out.iterdir())} == before,
          "the first run's shards changed")
    # Another prefix in the same directory is fine.
    r = tokenize("--tokenizer", tokenizer, "--out-dir", out, "--prefix", "val", text / "c.txt")
    check(r.returncode == 0 and (out / "val_000000.bin").is_file(), f"val: {r.stderr}")

    # An input that is not UTF-8 after shards were written: the error names it, and the shards
    # this run wrote are removed (another prefix's files and the user's are kept).
    (text / "z.txt").write_bytes(b"to be \xff\xfe")
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", out, "--prefix", "bad", "--shard-tokens",
                 2, text)
    check(r.returncode == 1 and "Traceback" not in r.stderr, f"bad input: {r.returncode} {r.stderr}")
    check(f"{text / 'z.txt'}: cannot read as UTF-8" in r.stderr and
          "(removed the 6 shards this run had written)" in r.stderr, r.stderr)
    left = sorted(p.name for p in out.iterdir())
    check(left == ["notes.txt", "train_000000.bin", "train_000001.bin", "train_000002.bin",
                   "val_000000.bin"], f"left behind: {left}")

    # --out-dir naming a file: an error, not a traceback.
    r = tokenize("--tokenizer", tokenizer, "--out-dir", out / "notes.txt", text / "a.txt")
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"--out-dir {out / 'notes.txt'}: exists and is not a directory" in r.stderr, r.stderr)

    # The file's bytes as they are: \r\n and a lone \r stay (universal newlines made them \n),
    # a leading byte-order mark is dropped. A character-level tokenizer shows each one.
    chars = {"<|endoftext|>": 0, "[UNK]": 1, "a": 2, "b": 3, "c": 4, "\r": 5, "\n": 6, "\ufeff": 7}
    char_tok = Tokenizer(models.WordLevel(chars, unk_token="[UNK]"))
    char_tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    char_tokenizer = work / "chars.json"
    char_tok.save(str(char_tokenizer))
    (work / "crlf").mkdir()
    (work / "crlf" / "d.txt").write_bytes(b"\xef\xbb\xbfa\r\nb\rc")
    r = tokenize("--tokenizer", char_tokenizer, "--eos-id", 0, "--out-dir", work / "crlf_tok",
                 work / "crlf")
    check(r.returncode == 0, f"crlf: {r.returncode} {r.stderr}")
    got = read_shard(work / "crlf_tok" / "train_000000.bin").tolist()
    check(got == [0, 2, 5, 6, 3, 5, 4], f"crlf tokens {got}")
    print("PASS")


if __name__ == "__main__":
    main()
