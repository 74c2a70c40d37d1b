#!/usr/bin/env python3
"""scripts/tokenize_shards.py: the shards it writes, and what it refuses and cleans up.

Usage: tokenize_shards_test.py WORK_DIR   (ctest: distill.scripts.TokenizeShards; needs the
`tokenizers` package). Prints PASS, or the first failed check and exits 1.
"""
import gzip
import json
import shutil
import signal
import subprocess
import sys
import time
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

    # An input that is not UTF-8: the error names it, and nothing is written (the documents of a
    # tokenizer batch are read before any is tokenized; removing shards written before a failure
    # is checked below); another prefix's files and the user's are kept.
    (text / "z.txt").write_bytes(b"to be \xff\xfe")
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", out, "--prefix", "bad", "--shard-tokens",
                 2, text)
    check(r.returncode == 1 and "Traceback" not in r.stderr, f"bad input: {r.returncode} {r.stderr}")
    check(f"{text / 'z.txt'}: cannot read as UTF-8" in r.stderr, r.stderr)
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

    # --split-on: documents inside a text file, read a block (1 MiB) at a time; the whitespace
    # around a document and empty pieces dropped; escapes read. A separator across the first
    # block's end.
    big = work / "big.txt"
    first = "to " * 349523  # 1048569 bytes: the separator spans bytes 1048569 .. 1048581
    big.write_text(first + "<|endoftext|>\nbe\n<|endoftext|>\n\n<|endoftext|>or", encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "split_tok", "--split-on",
                 "<|endoftext|>", big)
    check(r.returncode == 0 and "1 file, 3 documents" in r.stdout, f"split: {r.stdout} {r.stderr}")
    got = read_shard(work / "split_tok" / "train_000000.bin")
    check(len(got) == 349524 + 4 and set(got[1:349524].tolist()) == {2} and
          got[349524:].tolist() == [0, 3, 0, 4] and got[0] == 0, f"split tokens {got[-6:]}")
    (work / "paras.txt").write_text("to be\n\nor not\n\n\n\nbe\n", encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "split_tok", "--prefix", "para",
                 "--split-on", "\\n\\n", work / "paras.txt")
    check(r.returncode == 0 and "3 documents" in r.stdout, f"paras: {r.stdout} {r.stderr}")
    got = read_shard(work / "split_tok" / "para_000000.bin").tolist()
    check(got == [0, 2, 3, 0, 4, 5, 0, 3], f"paras tokens {got}")
    (work / "crlf.txt").write_bytes(b"to be\r\n\r\nor not\r\n")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "split_tok", "--prefix", "crlf",
                 "--split-on", "\\n\\n", work / "crlf.txt")
    check(r.returncode == 0 and f"warning: {work / 'crlf.txt'}: no '\\n\\n' in this file: it is one "
          "document (lines that end with \\r\\n are separated by '\\r\\n\\r\\n')" in r.stderr,
          f"crlf: {r.stderr}")

    # JSON Lines: a document per line, its text under "text" (\r\n line ends, a blank line and
    # an empty document; an escaped \r\n inside a text stays), or under --text-key; gzip-
    # compressed the same; a directory contributes *.jsonl and *.jsonl.gz beside *.txt, by name.
    jl = work / "jl"
    jl.mkdir()
    lines = [{"text": "to be", "id": 1}, {"text": ""}, {"text": "or not", "meta": {"a": 1}}]
    body = "\r\n".join(json.dumps(x) for x in lines[:2]) + "\r\n\r\n" + json.dumps(lines[2])
    (jl / "b.jsonl").write_bytes(body.encode("utf-8"))
    with gzip.open(jl / "c.jsonl.gz", "wb") as f:
        f.write(b'{"content": "not to"}\n{"content": "be be"}\n')
    (jl / "a.txt").write_text("be\n", encoding="utf-8")
    (jl / "ignored.json").write_text('{"text": "or"}\n', encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "jl_tok", jl / "b.jsonl")
    check(r.returncode == 0 and "1 file, 3 documents, 7 tokens" in r.stdout,
          f"jsonl: {r.returncode} {r.stdout} {r.stderr}")
    got = read_shard(work / "jl_tok" / "train_000000.bin").tolist()
    check(got == [0, 2, 3, 0, 0, 4, 5], f"jsonl tokens {got}")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "jl_tok", "--prefix", "gz",
                 "--text-key", "content", jl / "c.jsonl.gz")
    check(r.returncode == 0, f"jsonl.gz: {r.returncode} {r.stderr}")
    got = read_shard(work / "jl_tok" / "gz_000000.bin").tolist()
    check(got == [0, 5, 2, 0, 3, 3], f"jsonl.gz tokens {got}")
    # The directory: a.txt, b.jsonl, then c.jsonl.gz, whose lines have no "text": refused by line.
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "jl_tok", "--prefix", "dir",
                 "--shard-tokens", 3, jl)
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"{jl / 'c.jsonl.gz'}:1: no key 'text' in this line's object (its keys: 'content'); "
          "name the text's key with --text-key" in r.stderr, f"dir: {r.returncode} {r.stderr}")
    (jl / "c.jsonl.gz").unlink()
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "jl_tok", "--prefix", "dir", jl)
    check(r.returncode == 0 and "2 files, 4 documents" in r.stdout, f"dir: {r.stdout} {r.stderr}")
    got = read_shard(work / "jl_tok" / "dir_000000.bin").tolist()
    check(got == [0, 3, 0, 2, 3, 0, 0, 4, 5], f"dir tokens {got}")

    # What a JSON Lines file must hold, each refused with its line.
    bad = {
        '{"text": "to be"}\n{"text": "or"\n': ":2: not a JSON value: ",
        '{"text": "to"}\n["to", "be"]\n': ":2: expected a JSON object with the document's text "
                                          "under 'text'; found an array, [\"to\", \"be\"]",
        '{"text": 12}\n': ":1: 'text' must be a string (the document's text); found a number, 12",
        '\n\n': "no document in ",
        '[{"text": "to"},\n {"text": "be"}]\n': ":1: a JSON array, not JSON Lines",
    }
    for i, (content, message) in enumerate(bad.items()):
        path = work / f"bad{i}.{'json' if content.startswith('[') else 'jsonl'}"
        path.write_text(content, encoding="utf-8")
        r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "bad_tok", path)
        expected = message if message.startswith("no document") else f"{path}{message}"
        check(r.returncode == 1 and "Traceback" not in r.stderr and expected in r.stderr,
              f"{content!r}: {r.returncode} {r.stderr}")
    check(not (work / "bad_tok").exists(), "refused JSON Lines left an --out-dir behind")
    # An empty text file is no document either (it gave a shard of the separator alone).
    empty = work / "empty.txt"
    empty.write_bytes(b"")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "empty_tok", empty)
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"no document in {empty} (empty text files" in r.stderr, f"empty: {r.returncode} {r.stderr}")
    check(not (work / "empty_tok").exists(), "a refused empty file left an --out-dir behind")

    # A bad line after more than a tokenizer batch of documents (1024): the shards written
    # before it are removed.
    path = work / "long.jsonl"
    path.write_text('{"text": "to be"}\n' * 1100 + '{"text": null}\n', encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "long_tok", "--shard-tokens", 1000,
                 path)
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"{path}:1101: 'text' must be a string (the document's text); found null, null "
          "(removed the 3 shards this run had written)" in r.stderr, f"long: {r.stderr}")
    check(not (work / "long_tok").exists(), "the failed long run left its --out-dir behind")

    # A damaged .gz: an error naming the file, never a traceback (zlib's errors are no OSError).
    data = bytearray(gzip.compress(b"".join(b'{"text": "to be or not %d"}\n' % i
                                            for i in range(3000))))
    # At 10 the deflate block header (zlib.error), in the middle the text, at the end the CRC.
    for at in (10, len(data) // 2, len(data) - 6):
        damaged = bytearray(data)
        damaged[at] ^= 0x5A
        path = work / f"damaged{at}.jsonl.gz"
        path.write_bytes(bytes(damaged))
        r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "damaged_tok", path)
        check(r.returncode == 1 and "Traceback" not in r.stderr and str(path) in r.stderr,
              f"damaged at {at}: {r.returncode} {r.stderr}")
    # A lone surrogate escape (web corpora hold them): its line, not the tokenizer's TypeError. A
    # byte-order mark before a blank first line is not a document.
    (work / "surrogate.jsonl").write_text('{"text": "to"}\n{"text": "be \\ud800"}\n',
                                          encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "s_tok", work / "surrogate.jsonl")
    check(r.returncode == 1 and f"{work / 'surrogate.jsonl'}:2: the text holds '\\ud800'" in r.stderr,
          f"surrogate: {r.stderr}")
    (work / "bom.jsonl").write_bytes(b'\xef\xbb\xbf\n{"text": "to"}\n')
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "bom_tok", work / "bom.jsonl")
    check(r.returncode == 0, f"bom: {r.stderr}")
    check(read_shard(work / "bom_tok" / "train_000000.bin").tolist() == [0, 2], "bom tokens")

    # A failed run removes the --out-dir levels it created (only those, only when empty); an
    # indented JSON array is named as one; a directory of *.json files says why it reads none.
    (work / "array.json").write_text('[\n  {"text": "to"}\n]\n', encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "new" / "deeper", work / "array.json")
    check(r.returncode == 1 and f"{work / 'array.json'}:1: a JSON array, not JSON Lines" in r.stderr,
          f"array: {r.stderr}")
    check(not (work / "new").exists(), "the --out-dir levels the failed run created are left")
    (work / "jsondir").mkdir()
    (work / "jsondir" / "part.json").write_text('{"text": "to"}\n', encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "x", work / "jsondir")
    check(r.returncode == 1 and "no *.txt, *.jsonl, *.jsonl.gz file in this directory (its "
          "part.json is not read from a directory" in r.stderr, f"jsondir: {r.stderr}")
    # A file reached twice (named twice, or named and inside a named directory, any spelling)
    # is an error, not its documents tokenized twice.
    (work / "twice").mkdir()
    (work / "twice" / "b.txt").write_text("to be\n", encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "y", work / "twice",
                 work / "twice" / ".." / "twice" / "b.txt")
    check(r.returncode == 1 and "b.txt: given twice (also as " in r.stderr and not (work / "y").exists(),
          f"twice: {r.stderr}")

    # The separator: tokenizer_config.json's eos_token, unless it ends a chat turn and the
    # vocabulary has a document-end token; --eos-token by text; the summary names it.
    chat = work / "chat"
    chat.mkdir()
    chat_vocab = dict(vocab, **{"<|im_end|>": 6})
    chat_tok = Tokenizer(models.WordLevel(chat_vocab, unk_token="[UNK]"))
    chat_tok.pre_tokenizer = pre_tokenizers.Whitespace()
    chat_tok.save(str(chat / "tokenizer.json"))
    (chat / "tokenizer_config.json").write_text('{"eos_token": "<|im_end|>"}', encoding="utf-8")
    r = tokenize("--tokenizer", chat / "tokenizer.json", "--out-dir", work / "chat_tok",
                 text / "b.txt")
    check(r.returncode == 0 and "separator 0 '<|endoftext|>': tokenizer_config.json's eos_token "
          "'<|im_end|>' ends a chat turn, not a document" in r.stdout, f"chat: {r.stdout} {r.stderr}")
    check(read_shard(work / "chat_tok" / "train_000000.bin").tolist() == [0, 5, 2, 3], "chat tokens")
    r = tokenize("--tokenizer", chat / "tokenizer.json", "--out-dir", work / "chat_tok", "--prefix",
                 "im", "--eos-token", "<|im_end|>", text / "b.txt")
    check(r.returncode == 0 and "separator 6 '<|im_end|>': --eos-token" in r.stdout, r.stdout)
    check(read_shard(work / "chat_tok" / "im_000000.bin").tolist() == [6, 5, 2, 3], "im tokens")
    r = tokenize("--tokenizer", chat / "tokenizer.json", "--out-dir", work / "chat_tok", "--prefix",
                 "no", "--eos-token", "</s>", text / "b.txt")
    check(r.returncode == 1 and "--eos-token '</s>': not a token of" in r.stderr, r.stderr)
    (chat / "tokenizer_config.json").write_text('{"eos_token": "be"}', encoding="utf-8")
    r = tokenize("--tokenizer", chat / "tokenizer.json", "--out-dir", work / "chat_tok", "--prefix",
                 "be", text / "b.txt")
    check(r.returncode == 0 and "separator 3 'be': tokenizer_config.json's eos_token" in r.stdout,
          r.stdout)

    # A tokenizer_config.json that is not an object, and a --prefix holding a path, are refused
    # by name before anything is written.
    (chat / "tokenizer_config.json").write_text('["be"]', encoding="utf-8")
    r = tokenize("--tokenizer", chat / "tokenizer.json", "--out-dir", work / "list_tok", text / "b.txt")
    check(r.returncode == 1 and "Traceback" not in r.stderr and
          f"{chat / 'tokenizer_config.json'}: expected a JSON object, found list" in r.stderr,
          f"list config: {r.stderr}")
    check(not (work / "list_tok").exists(), "the refused config left an --out-dir behind")
    (chat / "tokenizer_config.json").write_text('{"eos_token": "be"}', encoding="utf-8")
    r = tokenize("--tokenizer", tokenizer, "--out-dir", work / "pre_tok", "--prefix", "../up",
                 text / "b.txt")
    check(r.returncode == 1 and "--prefix '../up': expected a file-name prefix without a path" in
          r.stderr, f"prefix: {r.stderr}")
    check(not (work / "pre_tok").exists() and not (work / "up_000000.bin").exists(),
          "the refused --prefix wrote something")

    # --tokenizer may name the model directory that holds tokenizer.json (its
    # tokenizer_config.json is read from there too); a directory without one is named.
    r = tokenize("--tokenizer", chat, "--out-dir", work / "dir_tok", text / "b.txt")
    check(r.returncode == 0 and "separator 3 'be'" in r.stdout, f"dir: {r.stdout} {r.stderr}")
    r = tokenize("--tokenizer", text, "--out-dir", work / "dir_tok", "--prefix", "x", text)
    check(r.returncode == 1 and f"--tokenizer {text}: a directory without tokenizer.json" in
          r.stderr, f"dir without: {r.stderr}")

    # Stopped part-way (Ctrl-C, SIGTERM, SIGHUP): the shards written so far are removed with the
    # --out-dir the run made, one line says so, and the script ends by the signal (a shell's
    # status 128 + its number; Popen's returncode minus it).
    path = work / "many.jsonl"
    path.write_text('{"text": "to be or not to be"}\n' * 1_000_000, encoding="utf-8")
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        out = work / f"stopped_{sig.name}"
        p = subprocess.Popen([sys.executable, str(SCRIPT), "--tokenizer", tokenizer, "--out-dir",
                              out, "--shard-tokens", "1000", path], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not (out.is_dir() and any(out.iterdir())) and p.poll() is None:
            check(time.monotonic() < deadline, f"{sig.name}: no shard after 60 s")
            time.sleep(0.005)
        check(p.poll() is None, f"{sig.name}: the run ended before the signal; a larger input?")
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        check(p.returncode == -sig and "Traceback" not in err and
              f"tokenize_shards: stopped by {sig.name} (removed the " in err and
              " this run had written)\n" in err, f"{sig.name}: {p.returncode} {err}")
        check(not out.exists(), f"{sig.name}: the stopped run left {out} behind")
    print("PASS")


if __name__ == "__main__":
    main()
