"""Characters in, tokens out: the user's corpus (a UTF-8 file or a folder of them) or the synthetic
Markov source, tokenised once into a memory-mapped token file, and the endless window stream.

Cache layout (one folder per corpus, named by the SHA-256 of the text as tokenised):

    <cache-dir>/<sha256>/tokens.bin    the token ids, uint8 (<= 256 characters) or uint16/int32
    <cache-dir>/<sha256>/vocab.json    the sorted characters, dtype, count, the token file's SHA-256

It is built in a temporary folder and renamed into place under a lock (`.<sha256>.lock`), so two
processes never build it twice and nobody reads half of it; a folder that fails its own checks
is rebuilt. Bad input (an empty file, bytes that are not UTF-8, a corpus too short to hold two
blocks) is refused in one line before anything is written.

The validation split is the last `val_frac` of the tokens by position (random chunks would leak
the text around them into training).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from trainers.errors import UsageError
from trainers.gpt.markov import MarkovSource
from trainers.runtime.config import check_folder_writable
from trainers.runtime.files import atomic_write_json, full_disk_named, sha256_file
from trainers.runtime.lock import FolderLock

TOKENIZER = "chars-v1"  # part of the cache key: a change of tokenisation never reuses old token files
SYNTHETIC = "synthetic"  # `--data synthetic`: the Markov source (a file of that name: `--data ./synthetic`)
LOCK_WAIT_S = 3600.0


@dataclass
class Corpus:
    tokens: np.ndarray  # every token, in order (a read-only memory map for a cached corpus)
    vocab: list[str]  # token id -> character, sorted
    fingerprint: str  # SHA-256 of the text as tokenised
    source: dict  # what it came from (path, files, bytes, characters; or the Markov parameters)
    floor: dict | None = None  # the synthetic source's exact entropy (nats per character)
    skipped: list[str] = field(default_factory=list)  # empty files of a folder

    @property
    def utf8_bytes(self) -> np.ndarray:
        """Bytes of each token in UTF-8 (bits per byte = nats / ln 2 x chars / bytes)."""
        return np.array([len(c.encode()) for c in self.vocab], dtype=np.int64)

    def split(self, val_frac: float) -> tuple[np.ndarray, np.ndarray]:
        n_val = int(round(len(self.tokens) * val_frac))
        return self.tokens[: len(self.tokens) - n_val], self.tokens[len(self.tokens) - n_val:]


# ---- reading -----------------------------------------------------------------------------------
def _check_utf8(data: bytes, name: str) -> None:
    if data.isascii():
        return
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise UsageError(f"--data {name} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                         f"(line {line}, column {column}); convert it, e.g. `iconv -f latin1 -t utf-8`") from None


def text_files(path: Path) -> list[Path]:
    """The file itself, or every regular file under the folder (hidden ones skipped), sorted by path."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise UsageError(f"--data {path} does not exist; give a UTF-8 text file, a folder of them, or {SYNTHETIC}")
    files = sorted(p for p in path.rglob("*") if p.is_file()
                   and not any(part.startswith(".") for part in p.relative_to(path).parts))
    if not files:
        raise UsageError(f"--data {path} is a folder without files; put the corpus's .txt files in it")
    return files


def read_corpus(path: Path) -> tuple[bytes, list[Path], list[str]]:
    """The corpus's bytes (a folder's files joined in path order, a newline added between files that
    lack one), the files read, and the empty files skipped. Checks UTF-8 file by file."""
    files = text_files(path)
    parts, skipped = [], []
    for f in files:
        try:
            data = f.read_bytes()
        except OSError as exc:
            raise UsageError(f"--data {f} cannot be read ({exc.strerror})") from None
        if not data:
            if len(files) == 1:
                raise UsageError(f"--data {f} is empty; give a file with text in it")
            skipped.append(str(f))
            continue
        _check_utf8(data, str(f))
        parts.append(data)
    if not parts:
        raise UsageError(f"--data {path}: every file in it is empty")
    joined = [p if p.endswith(b"\n") else p + b"\n" for p in parts[:-1]] + parts[-1:]  # files end their lines
    return b"".join(joined), files, skipped


def character_codes(data: bytes) -> np.ndarray:
    """Each character's code point (bytes for ASCII text): what tokenise ranks, and the planner counts."""
    if data.isascii():
        return np.frombuffer(data, dtype=np.uint8)
    return np.frombuffer(data.decode("utf-8").encode("utf-32-le"), dtype=np.uint32)


def tokenise(data: bytes) -> tuple[np.ndarray, list[str]]:
    """Token ids (the rank of each character among the sorted characters seen) and the vocabulary."""
    codes = character_codes(data)
    present = np.flatnonzero(np.bincount(codes))
    dtype = np.uint8 if len(present) <= 256 else np.uint16 if len(present) <= 65536 else np.int32
    table = np.zeros(int(present[-1]) + 1, dtype=dtype)
    table[present] = np.arange(len(present), dtype=dtype)
    return table[codes], [chr(int(c)) for c in present]


def fingerprint(data: bytes) -> str:
    return hashlib.sha256(TOKENIZER.encode() + b"\0" + data).hexdigest()


def check_length(n_tokens: int, seq_len: int, val_frac: float, where: str) -> None:
    """Training and validation must each hold a block of seq_len + 1 tokens."""
    n_val = int(round(n_tokens * val_frac))
    need = seq_len + 1
    if n_val < need or n_tokens - n_val < need:
        least = int(np.ceil(need / min(val_frac, 1 - val_frac)))
        raise UsageError(f"{where} holds {n_tokens:,} characters: too short for two blocks of --seq-len {seq_len} "
                         f"(validation is the last {val_frac:g}; need at least {least:,}); use more text, a smaller "
                         f"--seq-len or a larger --val-frac")


# ---- the cache ---------------------------------------------------------------------------------
def _load_cached(folder: Path) -> tuple[np.ndarray, list[str]] | None:
    """The cached tokens and vocabulary when the folder passes its own checks; None otherwise."""
    try:
        info = json.loads((folder / "vocab.json").read_text())
        path = folder / "tokens.bin"
        dtype = np.dtype(info["dtype"])
        if path.stat().st_size != info["n_tokens"] * dtype.itemsize or sha256_file(path) != info["sha256"]:
            return None
        tokens = np.memmap(path, dtype=dtype, mode="r") if info["n_tokens"] else np.zeros(0, dtype)
        return tokens, list(info["chars"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cache(folder: Path, tokens: np.ndarray, vocab: list[str], source: dict) -> None:
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".building", dir=folder.parent))
    try:
        with full_disk_named(folder):  # a full volume: one line naming it, not numpy's traceback
            tokens.tofile(staging / "tokens.bin")
            with open(staging / "tokens.bin", "rb+") as f:
                os.fsync(f.fileno())
            atomic_write_json(staging / "vocab.json", {"chars": vocab, "dtype": tokens.dtype.name,
                                                       "n_tokens": int(len(tokens)), "tokenizer": TOKENIZER,
                                                       "sha256": sha256_file(staging / "tokens.bin"),
                                                       "source": source})
            if folder.exists():  # failed its checks: replaced whole
                shutil.rmtree(folder)
            os.replace(staging, folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _locked(cache_dir: Path, key: str, log) -> FolderLock:
    """The lock of one cache entry; waits (polling) while another process builds the same corpus."""
    lock = FolderLock(cache_dir, "--cache-dir", lock_name=f".{key}.lock")
    deadline = time.monotonic() + LOCK_WAIT_S
    said = False
    while True:
        try:
            return lock.acquire()
        except UsageError:
            if time.monotonic() > deadline:
                raise
            if not said:
                log(f"another process is tokenising this corpus into {cache_dir}; waiting for it")
                said = True
            time.sleep(0.5)


def load_corpus(data: str, cache_dir: str, seq_len: int, val_frac: float, synthetic: MarkovSource,
                synthetic_chars: int, log=print, check_vocab_of=None) -> Corpus:
    """The corpus behind `--data`, tokenised (from the cache when it is there). Every check that can
    refuse it runs before the cache is written: `check_vocab_of(vocab)` too (a resume's vocabulary)."""
    check_vocab_of = check_vocab_of or (lambda _vocab: None)
    if data == SYNTHETIC:
        text = synthetic.generate(synthetic_chars).encode()
        tokens, vocab = tokenise(text)
        check_length(len(tokens), seq_len, val_frac, f"--data {SYNTHETIC} (--synthetic-chars {synthetic_chars})")
        check_vocab_of(vocab)
        floor = {"entropy_rate_nats": synthetic.entropy_rate(), "window_floor_nats": synthetic.window_floor(seq_len),
                 "seq_len": seq_len}
        source = {"kind": SYNTHETIC, "markov": {"alphabet_size": synthetic.alphabet_size, "order": synthetic.order,
                                                "concentration": synthetic.concentration, "seed": synthetic.seed},
                  "characters": len(tokens), "bytes": len(text)}
        return Corpus(tokens, vocab, fingerprint(text), source, floor)

    path = Path(data)
    raw, files, skipped = read_corpus(path)
    key = fingerprint(raw)
    source = {"kind": "files", "path": str(path.resolve()), "files": len(files), "bytes": len(raw)}
    folder = Path(cache_dir) / key
    cached = _load_cached(folder)
    if cached is None:
        tokens, vocab = tokenise(raw)
        check_length(len(tokens), seq_len, val_frac, f"--data {path}")
        check_vocab_of(vocab)
        check_folder_writable(Path(cache_dir), "--cache-dir")
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        lock = _locked(Path(cache_dir), key, log)
        try:
            for leftover in Path(cache_dir).glob(f".{key}.*.building"):  # a builder killed mid-way (we hold its lock)
                shutil.rmtree(leftover, ignore_errors=True)
            cached = _load_cached(folder)  # built by another process while we waited
            if cached is None:
                t0 = time.perf_counter()
                _write_cache(folder, tokens, vocab, source)
                log(f"tokenised {len(tokens):,} characters ({len(vocab)} distinct) into {folder} in "
                    f"{time.perf_counter() - t0:.1f} s")
                cached = _load_cached(folder)
        finally:
            lock.release()
        if cached is None:
            raise UsageError(f"--cache-dir {cache_dir}: the token file just written fails its checks (disk full?)")
    tokens, vocab = cached
    check_length(len(tokens), seq_len, val_frac, f"--data {path}")
    check_vocab_of(vocab)
    source["characters"] = int(len(tokens))
    return Corpus(tokens, vocab, key, source, None, skipped)


def check_vocab(saved: list[str], now: list[str], run_dir: Path) -> None:
    """A resume must read characters as the run did: a vocabulary that differs is refused."""
    if saved == now:
        return
    added = sorted(set(now) - set(saved))
    removed = sorted(set(saved) - set(now))
    parts = [f"{len(saved)} characters saved, {len(now)} now"]
    if added:
        parts.append(f"new: {''.join(added)!r}")
    if removed:
        parts.append(f"gone: {''.join(removed)!r}")
    raise UsageError(f"--run-dir {run_dir} was trained with another vocabulary ({'; '.join(parts)}); resume with "
                     f"the corpus it started with, or use a new --run-dir")


# ---- the stream --------------------------------------------------------------------------------
class WindowStream:
    """An endless stream of training windows, each rank its own, as a value the loop advances.

    A window is seq_len + 1 consecutive tokens (inputs and the next-token targets). Pass p cuts the
    training tokens into windows at an offset (0 for the first pass, then drawn per pass, so later
    passes see other boundaries), shuffles them with a seed of (seed, p), and deals each step's
    global batch out in contiguous blocks of `per_rank` windows: rank r takes block r. Within one
    pass no window is read twice, by any rank; the few windows that do not fill a last step are left
    out of that pass. A pure function of (tokens, seq_len, world, seed, pass), so a rank's position
    is just (pass, step in pass)."""

    def __init__(self, n_tokens: int, seq_len: int, world: int, rank: int, per_rank: int, seed: int,
                 device: torch.device | str = "cpu", pass_index: int = 0, step_in_pass: int = 0):
        self.n_tokens, self.seq_len, self.world, self.rank = n_tokens, seq_len, world, rank
        self.per_rank, self.seed, self.device = per_rank, seed, torch.device(device)
        self.pass_index, self.step_in_pass = pass_index, step_in_pass
        self._plan()
        if step_in_pass > self.steps_per_pass:
            raise ValueError(f"step {step_in_pass} is past the end of pass {pass_index}")

    @staticmethod
    def steps_in_pass(n_tokens: int, seq_len: int, global_windows: int, offset: int) -> int:
        return max((n_tokens - 1 - offset) // seq_len, 0) // global_windows

    def _plan(self) -> None:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.pass_index)
        offset = int(torch.randint(self.seq_len, (1,), generator=g)) if self.pass_index > 0 else 0
        n_windows = (self.n_tokens - 1 - offset) // self.seq_len
        per_step = self.world * self.per_rank
        self.steps_per_pass = n_windows // per_step
        if self.steps_per_pass < 1:
            raise UsageError(f"the training split ({self.n_tokens:,} tokens) holds {n_windows} windows of "
                             f"--seq-len {self.seq_len}; one step needs {per_step}: use a smaller --batch-tokens "
                             f"or --seq-len, fewer ranks, or more text")
        order = torch.randperm(n_windows, generator=g)[: self.steps_per_pass * per_step]
        mine = order.view(self.steps_per_pass, self.world, self.per_rank)[:, self.rank]
        self.offset = offset
        self.starts = (offset + mine * self.seq_len).to(self.device)  # [steps, per_rank] token offsets

    def batch(self) -> torch.Tensor:
        """This rank's window starts for the current step, [per_rank] on the device."""
        return self.starts[self.step_in_pass]

    def advance(self) -> bool:
        """Move past the current step; True when that step ended a pass."""
        self.step_in_pass += 1
        if self.step_in_pass < self.steps_per_pass:
            return False
        self.pass_index, self.step_in_pass = self.pass_index + 1, 0
        self._plan()
        return True

    def position(self) -> dict:
        return {"pass": self.pass_index, "step_in_pass": self.step_in_pass,
                "windows_read_in_pass": self.step_in_pass * self.per_rank, "rank": self.rank, "world": self.world}

    @staticmethod
    def start(position: dict | None, position_rank0: dict | None) -> dict:
        """Where to continue: this rank's own position; after a change of world size the next pass
        (the windows of the interrupted one are dealt differently now, so it is not finished)."""
        if position:
            return {"pass_index": position["pass"], "step_in_pass": position["step_in_pass"]}
        if position_rank0:
            return {"pass_index": position_rank0["pass"] + 1, "step_in_pass": 0}
        return {}


def windows(tokens: torch.Tensor, starts: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets [len(starts), seq_len] gathered on the tokens' device."""
    idx = starts[:, None] + torch.arange(seq_len + 1, device=starts.device)
    w = tokens[idx].long()
    return w[:, :-1], w[:, 1:]


def device_tokens(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """The token array on the device (it fits: one byte per character for <= 256 characters)."""
    arr = np.ascontiguousarray(array)
    if arr.dtype == np.uint16:
        arr = arr.astype(np.int32)  # torch indexes uint16 poorly
    return torch.from_numpy(np.array(arr, copy=True)).to(device)


def markov_source(cfg) -> MarkovSource:
    """The synthetic source a config describes (`--data synthetic`), with its exact entropy."""
    return MarkovSource(cfg.markov_alphabet, cfg.markov_order, cfg.markov_concentration, cfg.data_seed)


def default_prompt(vocab: list[str]) -> str:
    """What sampling starts from when no prompt is given: a newline, else the first character."""
    return "\n" if "\n" in vocab else vocab[0]
