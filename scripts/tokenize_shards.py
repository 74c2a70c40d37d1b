#!/usr/bin/env python3
"""Tokenize text files with a Hugging Face tokenizer (tokenizer.json) into llm.c token shards, the
input of distill_trainer's data.source "tokens".

The format is llm.c's (dev/data/data_common.py, write_datafile): a header of 256 little-endian
int32 ([0] magic, [1] version, [2] token count, the rest 0), then the tokens: uint16 (magic
20240520, version 1) when the vocabulary has at most 65536 entries, else uint32 (magic 20240801,
version 7). As in llm.c's dev/data/fineweb.py, every document is preceded by the end-of-text
token, which separates documents in the concatenated stream. A document is a plain-text file (the
whole file), or one line of a JSON Lines file (*.jsonl, or gzip-compressed *.jsonl.gz; a file
named *.json or *.json.gz is read as JSON Lines too: one JSON object per line, the document's text
under --text-key, "text" by default, as the Hugging Face datasets' to_json and most web corpora
write them).

Usage:
  tokenize_shards.py --tokenizer model/tokenizer.json --out-dir data/tok --prefix train a.txt dir/
writes data/tok/train_000000.bin, train_000001.bin, ... (--shard-tokens tokens each, the last
shorter); a directory contributes its *.txt, *.jsonl and *.jsonl.gz files, sorted by name. Splits
are made by the caller: run it again with other inputs and --prefix val.

Memory: a JSON Lines file is read a batch of lines at a time, and so is a plain-text file split
into documents with --split-on (e.g. '<|endoftext|>'); otherwise a plain-text file is read and
tokenized whole (~0.5 KB per token while it is tokenized). Documents are tokenized in batches, in
parallel (the tokenizers package's threads; TOKENIZERS_PARALLELISM=false for one thread).

It never overwrites or deletes what it did not write: an --out-dir that already holds PREFIX_*.bin
shards is refused (a glob over them would mix two tokenizations), and a run that fails part-way
(an input that is not UTF-8, a full disk) or is stopped (Ctrl-C, SIGTERM, SIGHUP: one line, exit
status 128 + the signal's number) removes the shards it wrote, so nothing half-done is left for a
glob to pick up.
"""
import argparse
import codecs
import errno
import gzip
import json
import os
import re
import signal
import sys
import zlib
from pathlib import Path

import numpy as np

HEADER_INTS = 256
UINT16 = {"magic": 20240520, "version": 1, "dtype": np.dtype("<u2")}
UINT32 = {"magic": 20240801, "version": 7, "dtype": np.dtype("<u4")}


class Failure(Exception):
    """An error for the user: printed as "tokenize_shards: <message>", exit status 1."""


def fail(message):
    raise Failure(message)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(BaseException):
    """A stop signal: raised where the run is, so that it cleans up as after a failure; then one
    line, "tokenize_shards: stopped by SIGTERM (...)", exit status 128 + the signal's number."""

    def __init__(self, signum, removed=0):
        super().__init__(signum)
        self.signum, self.removed = signum, removed


class StopSignalsHeld:
    """A stop signal that arrives inside is raised at the block's end: a shard written and its
    entry in the run's list of shards are one step, so that the clean-up knows every shard. (A
    flag, not a signal mask: the tokenizers package's threads would take a masked signal.)"""

    held = False
    pending = None

    def __enter__(self):
        StopSignalsHeld.held = True

    def __exit__(self, *exc):
        StopSignalsHeld.held = False
        if StopSignalsHeld.pending is not None and exc[0] is None:
            raise Stopped(StopSignalsHeld.pending)


def on_stop_signal(signum, frame):
    for s in STOP_SIGNALS:  # a second signal must not cut the clean-up short
        signal.signal(s, signal.SIG_IGN)
    if StopSignalsHeld.held:
        StopSignalsHeld.pending = signum
        return
    raise Stopped(signum)


DIR_PATTERNS = ("*.txt", "*.jsonl", "*.jsonl.gz")


def is_jsonl(path):
    """JSON Lines by name: *.jsonl, and *.json as `datasets`' to_json writes it (JSON Lines too;
    a JSON array is refused at its first line), each also gzip-compressed."""
    return path.name.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz"))


def input_files(inputs):
    """Each input as given; a directory as its *.txt, *.jsonl and *.jsonl.gz files, sorted. A file
    reached twice (named twice, or named and inside a named directory) is an error: its documents
    would be trained on twice."""
    files = []
    seen = {}
    for name in inputs:
        path = Path(name)
        if path.is_dir():
            found = sorted({p for pattern in DIR_PATTERNS for p in path.glob(pattern)
                            if p.is_file()})
            if not found:
                json_files = sorted(p.name for p in path.glob("*.json*") if is_jsonl(p))
                hint = (f" (its {', '.join(json_files[:3])}{' ...' if len(json_files) > 3 else ''} "
                        f"{'is' if len(json_files) == 1 else 'are'} not read from a directory, "
                        f"where *.json is often metadata: name a JSON Lines file on the command "
                        f"line to read it)") if json_files else ""
                fail(f"{path}: no {', '.join(DIR_PATTERNS)} file in this directory{hint}")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            fail(f"{path}: no such file or directory")
    for path in files:
        key = path.resolve()
        if key in seen:
            fail(f"{path}: given twice (also as {seen[key]}); its documents would be tokenized twice: "
                 f"name each file or directory once")
        seen[key] = path
    return files


# eos_tokens of chat-tuned tokenizers that end a turn, not a document, and the token the same
# vocabulary separates pretraining documents with (SmolLM2's and Qwen's <|im_end|> and
# <|endoftext|>; Llama 3 Instruct's <|eot_id|> and <|end_of_text|>).
CHAT_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
DOCUMENT_END = ("<|endoftext|>", "<|end_of_text|>")


def eos_id(tokenizer, tokenizer_path, explicit, explicit_token=None):
    """The separator and where it came from: --eos-id or --eos-token; else eos_token of the
    tokenizer_config.json beside tokenizer.json, unless that ends a chat turn and the vocabulary
    has a document-end token (then that one); else the id of <|endoftext|>."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if explicit is not None and explicit_token is not None:
        fail("--eos-id and --eos-token both name the separator; pass one")
    if explicit is not None:
        if not 0 <= explicit < vocab:
            fail(f"--eos-id {explicit}: outside the vocabulary [0, {vocab})")
        return explicit, "--eos-id"
    if explicit_token is not None:
        token_id = tokenizer.token_to_id(explicit_token)
        if token_id is None:
            fail(f"--eos-token {explicit_token!r}: not a token of {tokenizer_path}")
        return token_id, "--eos-token"
    config_path = Path(tokenizer_path).parent / "tokenizer_config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            fail(f"{config_path}: cannot read: {e}")
        if not isinstance(config, dict):
            fail(f"{config_path}: expected a JSON object, found {type(config).__name__}")
        eos = config.get("eos_token")
        if isinstance(eos, dict):  # an AddedToken: {"content": "</s>", ...}
            eos = eos.get("content")
        if isinstance(eos, str):
            token_id = tokenizer.token_to_id(eos)
            if token_id is None:
                fail(f"{config_path}: eos_token {eos!r} is not in {tokenizer_path}")
            if eos in CHAT_END_OF_TURN:
                for name in DOCUMENT_END:
                    if tokenizer.token_to_id(name) is not None:
                        return tokenizer.token_to_id(name), (
                            f"{config_path.name}'s eos_token {eos!r} ends a chat turn, not a "
                            f"document: the vocabulary's {name!r} instead (--eos-token to choose)")
            return token_id, f"{config_path.name}'s eos_token"
    token_id = tokenizer.token_to_id("<|endoftext|>")
    if token_id is None:
        fail(f"{tokenizer_path}: no eos_token in {config_path} and no <|endoftext|> token; "
             "pass --eos-id or --eos-token")
    return token_id, "the vocabulary's '<|endoftext|>'"


# Documents per tokenizer call, and the text they may hold: encode_batch runs a batch's documents
# on the tokenizers package's threads; the bound keeps a batch's text and ids in memory small.
BATCH_DOCUMENTS = 1024
BATCH_CHARS = 32 << 20


READ_BLOCK = 1 << 20  # bytes read at a time from a text file split into documents


def text_documents(path, split=None):
    """A plain-text file as one document: its bytes as they are (read_text's universal newlines
    would turn \r\n and \r into \n, other tokens than the file's); a leading byte-order mark
    is not text, and an empty file is no document (as a blank JSON Lines line: it gave a shard
    of the separator alone). With `split`, the file is read a block at a time and every piece
    between two occurrences of `split` is a document, without the whitespace around it; empty
    pieces are no documents."""
    if split is None:
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except (OSError, UnicodeDecodeError) as e:
            fail(f"{path}: cannot read as UTF-8: {e}")
        if text:
            yield text
        return
    decoder = codecs.getincrementaldecoder("utf-8-sig")()
    parts, tail, offset = [], "", 0  # the document so far: parts, then a tail that may hold
    # the start of a separator (or, after one, the text read past it)
    seen = False

    def finish(text):
        return text.strip() or None

    try:
        with open(path, "rb") as f:
            while True:
                block = f.read(READ_BLOCK)
                try:
                    text = tail + decoder.decode(block, final=not block)
                except UnicodeDecodeError as e:
                    fail(f"{path}: cannot read as UTF-8 (near byte {offset + e.start}): {e}")
                offset += len(block)
                pieces = text.split(split)
                if len(pieces) == 1:  # no separator: all but a possible separator's start is kept
                    keep = max(len(text) - (len(split) - 1), 0)
                    parts.append(text[:keep])
                    tail = text[keep:]
                else:
                    seen = True
                    for document in ["".join(parts) + pieces[0], *pieces[1:-1]]:
                        if (document := finish(document)) is not None:
                            yield document
                    parts, tail = [], pieces[-1]
                if not block:
                    break
    except OSError as e:
        fail(f"{path}: cannot read: {e}")
    if not seen:
        crlf = " (lines that end with \\r\\n are separated by '\\r\\n\\r\\n')" \
            if "\n" in split and "\r" not in split else ""
        print(f"tokenize_shards: warning: {path}: no {split!r} in this file: it is one document"
              f"{crlf}", file=sys.stderr)
    if (document := finish("".join(parts) + tail)) is not None:
        yield document


def separator_text(arg):
    """--split-on's text with the escapes \\n, \\r, \\t and \\\\ read as the characters."""
    out, i = [], 0
    escapes = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\"}
    while i < len(arg):
        if arg[i] == "\\" and i + 1 < len(arg) and arg[i + 1] in escapes:
            out.append(escapes[arg[i + 1]])
            i += 2
        else:
            out.append(arg[i])
            i += 1
    return "".join(out)


def describe(value):
    """A JSON value as an error shows it: its type and a short excerpt."""
    kind = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}[type(value)]
    text = json.dumps(value, ensure_ascii=False)
    return f"{kind}, {text[:60]}{'...' if len(text) > 60 else ''}"


def jsonl_documents(path, key):
    """The documents of a JSON Lines file: the string under `key` of each line's object, in order.
    Blank lines are skipped; anything else that is not such an object is an error naming the
    file and line."""
    gz = path.name.endswith(".gz")
    opener = gzip.open if gz else open
    damaged = " (or the .gz file is damaged)" if gz else ""
    line_no, first = 0, True
    try:
        with opener(path, "rb") as f:
            for line_no, line in enumerate(f, start=1):
                if line_no == 1 and line.startswith(b"\xef\xbb\xbf"):  # a byte-order mark
                    line = line[3:]
                if not line.strip():
                    continue
                try:
                    text = line.decode("utf-8")
                except UnicodeDecodeError as e:
                    fail(f"{path}:{line_no}: not UTF-8: {e}{damaged}")
                try:
                    record = json.loads(text)
                except ValueError as e:
                    if first and text.lstrip().startswith("["):
                        fail(f"{path}:{line_no}: a JSON array, not JSON Lines (one JSON object per "
                             f"line); write it as JSON Lines, e.g. datasets' to_json(..., "
                             f"lines=True) or jq -c '.[]'")
                    fail(f"{path}:{line_no}: not a JSON value: {e} (a JSON Lines file holds one "
                         f"JSON object per line){damaged}")
                first = False
                if not isinstance(record, dict):
                    fail(f"{path}:{line_no}: expected a JSON object with the document's text under "
                         f"{key!r}; found {describe(record)}")
                if key not in record:
                    keys = ", ".join(repr(k) for k in list(record)[:8])
                    fail(f"{path}:{line_no}: no key {key!r} in this line's object (its keys: "
                         f"{keys or 'none'}); name the text's key with --text-key")
                text = record[key]
                if not isinstance(text, str):
                    fail(f"{path}:{line_no}: {key!r} must be a string (the document's text); "
                         f"found {describe(text)}")
                try:  # a JSON escape of a lone surrogate half (\\ud800) is no character
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    fail(f"{path}:{line_no}: the text holds {text[e.start]!r} (character "
                         f"{e.start}), half of a UTF-16 surrogate pair, which is not a Unicode "
                         f"character: repair or drop this line")
                yield text
    except (OSError, EOFError, zlib.error) as e:
        where = f"{path}:{line_no + 1}" if line_no else f"{path}"
        fail(f"{where}: cannot read: {e}{damaged}")


def documents(files, key, split=None):
    """Every document of every input file, in order."""
    for path in files:
        yield from jsonl_documents(path, key) if is_jsonl(path) else text_documents(path, split)


def batches(docs):
    """Documents grouped for the tokenizer: at most BATCH_DOCUMENTS, and BATCH_CHARS characters
    of text unless one document alone is longer."""
    batch, size = [], 0
    for doc in docs:
        if batch and (len(batch) == BATCH_DOCUMENTS or size + len(doc) > BATCH_CHARS):
            yield batch
            batch, size = [], 0
        batch.append(doc)
        size += len(doc)
    if batch:
        yield batch


def write_shard(path, tokens, fmt):
    """One llm.c shard, atomically: a temporary file beside `path`, then rename."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = fmt["magic"], fmt["version"], len(tokens)
    limit = np.iinfo(fmt["dtype"]).max
    if len(tokens) and (tokens.min() < 0 or tokens.max() > limit):
        fail(f"{path}: a token id outside [0, {limit}] for {fmt['dtype'].name} tokens")
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(header.tobytes())
            f.write(np.asarray(tokens, dtype=fmt["dtype"]).tobytes())
            f.flush()
            os.fsync(f.fileno())
        # Never over another file: a shard of a second run writing the same names meanwhile.
        try:
            os.link(tmp, path)
            tmp.unlink()
        except OSError as e:  # a filesystem without hard links: checked, then renamed
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP) or path.exists():
                raise
            os.replace(tmp, path)
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        fail(f"{path}: appeared while this run wrote it (another tokenize_shards run with the "
             f"same --out-dir and --prefix?); nothing of it was overwritten")
    except OSError as e:
        tmp.unlink(missing_ok=True)
        fail(f"{path}: cannot write: {e}")
    except BaseException:  # Ctrl-C while writing: no temporary left behind
        tmp.unlink(missing_ok=True)
        raise


def existing_shards(out_dir, prefix):
    """The files in out_dir named as this script names its shards for `prefix`."""
    pattern = re.compile(re.escape(prefix) + r"_\d{6}\.bin")
    return sorted(p.name for p in out_dir.iterdir() if pattern.fullmatch(p.name))


def main(argv=None):
    previous = {s: signal.signal(s, on_stop_signal) for s in STOP_SIGNALS}
    try:
        run(argv)
    except Failure as e:
        print(f"tokenize_shards: {e}", file=sys.stderr)
        sys.exit(1)
    except Stopped as e:
        removed = (f" (removed the {e.removed} shard{'s' if e.removed != 1 else ''} this run had "
                   "written)" if e.removed else "")
        try:
            print(f"tokenize_shards: stopped by {signal.Signals(e.signum).name}{removed}",
                  file=sys.stderr, flush=True)
        except OSError:  # SIGHUP: the terminal may be gone
            pass
        # Ended by the signal itself (the shell's status 128 + its number), so that a shell loop
        # over this script stops on Ctrl-C as it would for any other program.
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)
        sys.exit(128 + e.signum)  # (not reached)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def run(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+",
                        help="text files (a document each), JSON Lines files (*.jsonl, "
                             "*.json, also .gz: a document per line), or directories of *.txt, "
                             "*.jsonl and *.jsonl.gz files")
    parser.add_argument("--tokenizer", required=True,
                        help="a Hugging Face tokenizer.json, or the model directory that holds it")
    parser.add_argument("--out-dir", required=True, help="where the shards are written")
    parser.add_argument("--prefix", default="train", help="shard names: PREFIX_000000.bin, ...")
    parser.add_argument("--shard-tokens", type=int, default=10_000_000,
                        help="tokens per shard (default 10M)")
    parser.add_argument("--eos-id", type=int, default=None,
                        help="the document separator's id (default: the tokenizer's eos_token, "
                             "or <|endoftext|> where eos_token ends a chat turn)")
    parser.add_argument("--eos-token", default=None,
                        help="the document separator by its text, e.g. '<|endoftext|>'")
    parser.add_argument("--split-on", default=None, metavar="TEXT",
                        help="in text files, the text that separates documents, e.g. "
                             "'<|endoftext|>' (TinyStories) or '\\n\\n' (escapes \\n \\r \\t "
                             "\\\\); the file is then read a block at a time (default: a text "
                             "file is one document)")
    parser.add_argument("--text-key", default="text",
                        help="the key of a JSON Lines object that holds the document's text "
                             "(default: text)")
    args = parser.parse_args(argv)
    if not 0 < args.shard_tokens < 2**31:
        fail(f"--shard-tokens {args.shard_tokens}: expected 1 .. 2^31 - 1 (llm.c's limit)")
    if "/" in args.prefix:
        fail(f"--prefix {args.prefix!r}: expected a file-name prefix without a path (the shards go "
             "into --out-dir)")
    split = None if args.split_on is None else separator_text(args.split_on)
    if split == "":
        fail("--split-on '': expected the text that separates documents")

    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("the Python package 'tokenizers' is missing (pip install tokenizers)")
    if Path(args.tokenizer).is_dir():
        if not (Path(args.tokenizer) / "tokenizer.json").is_file():
            fail(f"--tokenizer {args.tokenizer}: a directory without tokenizer.json (expected a "
                 "Hugging Face tokenizer.json, or the model directory that holds one)")
        args.tokenizer = str(Path(args.tokenizer) / "tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(args.tokenizer)
    except Exception as e:  # tokenizers raises a bare Exception for unreadable files
        fail(f"{args.tokenizer}: cannot load: {e}")
    # Special tokens written in the text are text, as llm.c's encode_ordinary treats them.
    if hasattr(tokenizer, "encode_special_tokens"):
        tokenizer.encode_special_tokens = True
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    fmt = UINT16 if vocab <= 2**16 else UINT32
    eos, eos_source = eos_id(tokenizer, args.tokenizer, args.eos_id, args.eos_token)
    files = input_files(args.inputs)
    if split is not None and all(is_jsonl(p) for p in files):
        print("tokenize_shards: warning: --split-on applies to text files; these inputs are all "
              "JSON Lines (a document per line)", file=sys.stderr)

    out_dir = Path(os.path.normpath(args.out_dir))
    if out_dir.exists() and not out_dir.is_dir():
        fail(f"--out-dir {out_dir}: exists and is not a directory")
    created = []  # the levels of --out-dir this run creates, deepest first
    level = out_dir
    while not level.exists() and level != level.parent:
        created.append(level)
        level = level.parent
    shards, pending, pending_tokens, total, count = [], [], 0, 0, 0

    def flush(final):
        nonlocal pending, pending_tokens
        while pending_tokens >= args.shard_tokens or (final and pending_tokens > 0):
            stream = np.concatenate(pending)
            path = out_dir / f"{args.prefix}_{len(shards):06d}.bin"
            with StopSignalsHeld():
                write_shard(path, stream[: args.shard_tokens], fmt)
                shards.append(path)
            rest = stream[args.shard_tokens:]
            pending, pending_tokens = ([rest] if len(rest) else []), len(rest)

    try:  # from the first directory it creates: a failure or a stop removes what it made
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            fail(f"--out-dir {out_dir}: cannot create: {e}")
        old = existing_shards(out_dir, args.prefix)
        if old:
            fail(f"--out-dir {out_dir} already holds {len(old)} "
                 f"shard{'s' if len(old) != 1 else ''} named {args.prefix}_*.bin "
                 f"({', '.join(old[:3])}{' ...' if len(old) > 3 else ''}): a glob over them "
                 f"would mix two tokenizations; delete them, or choose another --out-dir or "
                 f"--prefix")
        for batch in batches(documents(files, args.text_key, split)):
            for encoding in tokenizer.encode_batch(batch, add_special_tokens=False):
                ids = encoding.ids
                document = np.empty(len(ids) + 1, dtype=np.int64)
                document[0] = eos
                document[1:] = ids
                pending.append(document)
                pending_tokens += len(document)
                total += len(document)
            count += len(batch)
            flush(final=False)
        flush(final=True)
        if not shards:
            names = ", ".join(str(p) for p in files[:3]) + (" ..." if len(files) > 3 else "")
            fail(f"no document in {names} (empty text files, or JSON Lines files of blank lines "
                 f"only?)")
    except BaseException as e:  # a failure, a stop: the shards written so far are not a dataset
        for sig in STOP_SIGNALS:  # the clean-up is not cut short: a stop signal now is ignored
            signal.signal(sig, signal.SIG_IGN)
        for shard in shards:
            shard.unlink(missing_ok=True)
        for level in created:  # and the directories it made for them, if nothing else is there
            try:
                level.rmdir()
            except OSError:
                break
        if shards and isinstance(e, Failure):
            raise Failure(f"{e} (removed the {len(shards)} shard{'s' if len(shards) != 1 else ''} "
                          f"this run had written)") from None
        if isinstance(e, Stopped):
            raise Stopped(e.signum, len(shards)) from None
        raise
    names = shards[0].name + (f" .. {shards[-1].name}" if len(shards) > 1 else "")
    print(f"tokenize_shards: {len(files)} file{'s' if len(files) != 1 else ''}, "
          f"{count:,} document{'s' if count != 1 else ''}, {total:,} tokens "
          f"(vocab {vocab}; separator {eos} {tokenizer.id_to_token(eos)!r}: {eos_source}) -> "
          f"{len(shards)} shard{'s' if len(shards) != 1 else ''} "
          f"{out_dir}/{names}, {fmt['dtype'].name} tokens")


if __name__ == "__main__":
    main()
