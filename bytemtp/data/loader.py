"""Streaming loader: documents from a corpus, packed into byte windows, shuffled, batched, resumable.

The pipeline is a chain of two small stages, each with a plain-dict state that rebuilds it at
the same position:

- `DocumentStream` (`bytemtp.data.stream`) walks the corpus files in an order shuffled every epoch from the seed (the
  same order in every reader) and numbers the records it meets (documents of prepared shards, JSONL
  lines, table rows, whole raw files) in that order. Reader g of G (g = rank x workers + worker) keeps the
  records whose number is g mod G, so one epoch hands every record to exactly one reader whatever
  the number of files, ranks and workers, and the readers' shares differ by one record at most. It
  hands out ids: each document's bytes followed by EOS. Each file is read by its format's reader
  (`bytemtp.data.readers`: one class per format, chosen once per file), which hands out the
  reader's share of it and owns the typed position within it: prepared (format 2) shards take the
  fast path, with no per-document Python work (whole frames decoded as numpy arrays, frames holding
  nothing of the reader's never read); other files are read a document at a time: every reader
  decompresses and splits them, but parses only its own lines. The stream's position is (epoch,
  file, the file reader's position saved as a pair, record number). A resumed stream seeks
  straight there and never re-reads the corpus from the start; the position carries a digest of
  the files' names and sizes, so it is refused in a corpus that changed.
- `WindowPacker` cuts the id stream into windows of
  seq_len + n_future ids with a stride of seq_len (consecutive windows overlap by n_future ids, so
  every id is an input exactly once and every target of every head is seen), shuffles them, and
  stacks them into (B, seq_len + n_future) int32 batches (half the bytes of int64; embeddings take
  int32, the loss widens its targets). The shuffle is by segments of the stream: `shuffle_buffer`
  windows (16,384 by default: 4 MiB of text at seq_len 256), or the rest of an epoch, are read and
  handed out in one random order, so a batch mixes windows from megabytes apart and a one-document
  corpus the size of Tiny Shakespeare is shuffled whole every epoch (a shuffle within blocks of 256
  neighbouring windows cost 0.06 nats there against one over all windows). A segment holds windows
  of the unshuffled tiling and passes what follows its last one (fewer ids than a window) on to the
  next, so every id is still an input once an epoch and no window joins two segments. The
  trade-offs: about 2.5 x shuffle_buffer x seq_len bytes of memory a reader, a pause to read each
  segment (milliseconds on a prepared shard), no mixing across segments. The state stays small:
  where the segment started and how many of its windows went out (a resume reads it again).

`ByteLoader` runs one such chain in the training process, or one per torch DataLoader worker:
workers are read in strict round robin, each batch carries its worker's state, and the loader's
state lists every worker's state with the worker due next, so a resumed loader (even with the
worker order rotated) yields exactly the batches an uninterrupted one would have.

Bad records (JSONL lines, null table rows) are skipped and counted by reason; a reader stops with
CorpusError once more than `max_bad_fraction` of its records (after the first 1,000, or at an
epoch's end) are bad.
"""

from __future__ import annotations

import base64
import functools
from typing import Iterator

import numpy as np
import torch

from bytemtp.config import DataConfig, ModelConfig
from bytemtp.data.corpus import corpus_files
from bytemtp.data.stream import DocumentStream
from bytemtp.data.tokenized import TokenStream
from bytemtp.vocab import load_vocabulary
from bytemtp.vocab import EOS

STATE_VERSION = 2  # 2: segment shuffle (1: block shuffle, its pending windows in the state)


def _version_error(state: dict) -> str:
    return (f"loader state version {state.get('version')!r} is not {STATE_VERSION}: it was saved by another "
            "version of the loader (version 1 shuffled in blocks), whose position does not carry over "
            "exactly; resume with the bytemtp that saved it, or start a new run")


def _pack_ids(ids: np.ndarray) -> str:
    return base64.b64encode(ids.astype("<u2").tobytes()).decode("ascii")


def _unpack_ids(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<u2").astype(np.uint16)


_FEW_BOUNDARIES = 256  # up to this many EOS in a piece, slice copies beat a boolean scatter


def write_ids(out: np.ndarray, data: np.ndarray, at: np.ndarray) -> int:
    """Write uint8 `data` as uint16 ids into the start of `out`, with EOS before each (sorted)
    offset in `at`; return how many ids were written (len(data) + len(at)). uint16 `data` are
    ids already (a BPE's, EOS included) and are copied as they are.

    What np.insert does, without allocating: with few boundaries (long documents) the runs between
    them are copied as slices, a bounded loop per piece; with many (short documents) one boolean
    scatter places every byte at once. Both cost well under a millisecond for a 1 MiB frame.
    """
    if data.dtype == np.uint16:  # ids already, EOS included (`tokenized.TokenStream`)
        out[:len(data)] = data
        return len(data)
    n = len(data) + len(at)
    slots = at + np.arange(len(at))
    if len(at) <= _FEW_BOUNDARIES:
        prev = 0
        for i, end in enumerate(at.tolist()):
            out[prev + i:end + i] = data[prev:end]
            prev = end
        out[prev + len(at):n] = data[prev:]
    else:
        fill = np.ones(n, dtype=bool)
        fill[slots] = False
        out[:n][fill] = data
    out[slots] = EOS
    return n


class WindowPacker:
    """Packs a document stream into shuffled (B, window) batches; resumable with the stream.

    The packed stream is held as uint16 ids (every id is below 2**16; half the memory traffic of
    int32) in one buffer that is reused, not reallocated (fresh memory costs page faults that
    would outweigh the copying), and windows are cut from it in bulk with numpy, as strided views.

    The shuffle is by segments (the module docstring says why): the packer reads `shuffle_buffer`
    windows' worth of ids, or to the end of the epoch if that holds a whole window (else on into
    the next epoch), cuts every whole window of it as a strided view and draws one permutation of
    them. Windows are gathered in that order GATHER at a time (rounded up to whole batches) and
    widened to int32 once a gather; batches are views of it, and a batch that a segment cannot fill
    takes the first windows of the next. What follows the last whole window (at least n_future ids,
    fewer than a window) starts the next segment. The state keeps where the segment started and
    how many of its windows went out; a resumed packer reads the segment again and skips them. A
    buffer of 1 keeps the packing order (the state then holds the uncut tail).
    """

    GATHER = 256  # windows gathered and widened at a time

    def __init__(self, docs: DocumentStream, *, window: int, stride: int, batch_size: int,
                 shuffle_buffer: int = 16384, seed: int = 0):
        assert 1 <= stride <= window, (stride, window)
        self.docs, self.window, self.stride = docs, window, stride
        self.batch_size = batch_size
        self.shuffled = shuffle_buffer > 1
        self.segment_ids = (shuffle_buffer - 1) * stride + window  # the ids of shuffle_buffer windows
        self.tail = np.zeros(0, dtype=np.uint16)  # ids from `offset` on are not yet cut
        self.offset = 0
        self._buf = np.zeros(0, dtype=np.uint16)  # where the tail is packed
        self.rng = np.random.Generator(np.random.PCG64([seed, docs.reader]))  # a stream per reader
        self.segment: dict | None = None  # where the current segment started
        self._rows = self._order = None  # the segment's windows (strided views) and their order
        # windows are gathered in the segment's order GATHER at a time (rounded up to whole
        # batches) and widened to int32 once a gather; batches are views of it
        self.gather = batch_size * -(-self.GATHER // batch_size)
        self._ready = np.zeros((0, window), dtype=np.int32)  # the last gather: rows from _at on are due
        self._at = 0
        self._gathered = 0  # windows of the order gathered so far
        self.batches = 0
        self._pieces: Iterator[tuple[np.ndarray, np.ndarray]] | None = None  # the current epoch's

    def _read(self, need: int, *, to_epoch_end: bool = False) -> None:
        """Pack pieces until the uncut tail holds `need` ids; with `to_epoch_end`, stop earlier at
        the end of an epoch if the tail then holds a whole window."""
        if self.offset + need <= len(self.tail):
            return
        rest = self.tail[self.offset:]
        buf, have = self._buf, len(rest)
        if len(buf) < need:
            buf = np.empty(max(need + need // 4, 2 * len(buf)), dtype=np.uint16)
        buf[:have] = rest  # numpy copies overlapping ranges correctly
        while have < need:
            if self._pieces is None:
                self._pieces = self.docs.epoch_pieces()
            piece = next(self._pieces, None)
            if piece is None:  # the epoch is over: the stream stands at the next one's start
                self._pieces = None
                if to_epoch_end and have >= self.window:
                    break
                continue
            data, at = piece
            if have + len(data) + len(at) > len(buf):  # a piece longer than the room left
                buf = np.concatenate((buf[:have], np.empty(len(data) + len(at) + len(buf), np.uint16)))
            have += write_ids(buf[have:], data, at)
        self._buf, self.tail, self.offset = buf, buf[:have], 0

    def _cut(self, n: int) -> np.ndarray:
        """The next n windows (n, window) of the tail: a strided view, valid until the next read."""
        rows = np.ndarray((n, self.window), dtype=np.uint16, buffer=self.tail, offset=self.offset * 2,
                          strides=(self.stride * 2, 2))
        self.offset += n * self.stride
        return rows

    def _start_segment(self, ids: int | None = None) -> None:
        """Read the next segment (`ids` of it, or to the epoch's end; by default shuffle_buffer
        windows' worth) and draw the order of its windows."""
        ids = ids or self.segment_ids
        self.segment = {"docs": self.docs.state_dict(), "tail": _pack_ids(self.tail[self.offset:]),
                        "rng": self.rng.bit_generator.state, "ids": ids}
        self._read(ids, to_epoch_end=True)
        self._rows = self._cut((len(self.tail) - self.offset - self.window) // self.stride + 1)
        self._order = self.rng.permutation(len(self._rows))
        self._gathered = 0

    def next_batch(self) -> torch.Tensor:
        """The next (B, window) int32 batch (a view of a gather's storage when shuffled)."""
        self.batches += 1
        if not self.shuffled:
            self._read((self.batch_size - 1) * self.stride + self.window)
            return torch.from_numpy(self._cut(self.batch_size).astype(np.int32))
        at, B = self._at, self.batch_size
        if at + B <= len(self._ready):  # the common case: a view of the last gather
            self._at = at + B
            return torch.from_numpy(self._ready[at:at + B])
        parts, due = [self._ready[at:]], B - (len(self._ready) - at)
        while due:  # the rest of this gather, then the next (of this segment or the next one)
            self._gather()
            self._at = min(due, len(self._ready))
            parts.append(self._ready[:self._at])
            due -= self._at
        parts = [part for part in parts if len(part)]
        return torch.from_numpy(parts[0] if len(parts) == 1 else np.concatenate(parts))

    def _gather(self) -> None:
        """Gather the next windows of the segment's order (starting the next segment once this
        one is handed out) and widen them to int32."""
        if self.segment is None or self._gathered == len(self._order):
            self._start_segment()
        picked = self._order[self._gathered:self._gathered + self.gather]
        # indexing, not np.take: take would first copy the whole strided segment to contiguous memory
        self._ready, self._gathered = self._rows[picked].astype(np.int32), self._gathered + len(picked)
        self._at = 0

    def warm(self) -> None:
        """Read (and, for a BPE baseline, encode) what the next batch needs now, without handing
        anything out: the batches that follow are the same."""
        if self.shuffled and self._at >= len(self._ready):
            self._gather()

    def _taken(self) -> int:
        """Windows of the current segment handed out."""
        return self._gathered - (len(self._ready) - self._at)

    def __iter__(self) -> Iterator[torch.Tensor]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> dict:
        segment = self.segment
        if segment is not None:
            taken = self._taken()
            # all of it went out: the next one starts from the live position
            segment = None if taken == len(self._order) else {**segment, "taken": taken}
        return {"version": STATE_VERSION, "docs": self.docs.state_dict(),
                "tail": _pack_ids(self.tail[self.offset:]), "rng": self.rng.bit_generator.state,
                "segment": segment, "batches": self.batches,
                "window": self.window, "stride": self.stride}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(_version_error(state))
        if (state["window"], state["stride"]) != (self.window, self.stride):
            raise ValueError(f"loader state was saved for windows of {state['window']} ids with stride "
                             f"{state['stride']}, not {self.window} and {self.stride}: seq_len or "
                             "n_future changed since the checkpoint")
        segment = state["segment"]
        if segment is not None and not self.shuffled:
            raise ValueError("the loader state was saved part-way through a shuffled segment; resume "
                             "with data.shuffle_buffer > 1 (any size: the segment is read as it was)")
        start = state if segment is None else segment
        self.docs.load_state_dict(start["docs"])
        self.tail, self.offset, self._pieces = _unpack_ids(start["tail"]), 0, None
        self.rng.bit_generator.state = start["rng"]
        self.segment, self.batches = None, state["batches"]
        self._ready, self._at = self._ready[:0], 0
        if segment is not None:  # read it again, then skip what went out
            self._start_segment(segment["ids"])  # its size as saved, whatever shuffle_buffer is now
            self._gathered = segment["taken"]
            assert self.docs.state_dict() == state["docs"], "the segment read again ended elsewhere"


class _WorkerStreams(torch.utils.data.IterableDataset):
    """What each DataLoader worker runs: its own packer, yielding (batch, state after it)."""

    def __init__(self, make_packer, states: list[dict | None], rotation: int):
        self.make_packer, self.states, self.rotation = make_packer, states, rotation

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        slot = (info.id + self.rotation) % info.num_workers
        packer = self.make_packer(slot)
        if self.states[slot] is not None:
            packer.load_state_dict(self.states[slot])
        while True:
            batch = packer.next_batch().clone()  # its own storage: a view would ship the whole gather
            yield slot, batch, packer.state_dict()


def _make_packer(files: list, cfg: DataConfig, slot: int, *, rank: int, world_size: int, n_local: int,
                 window: int, stride: int) -> WindowPacker:
    """The packer of one reader of the corpus: local slot `slot` of `rank`."""
    docs = DocumentStream(files, field=cfg.field, reader=rank * n_local + slot, n_readers=world_size * n_local,
                          seed=cfg.seed, max_bad_fraction=cfg.max_bad_fraction)
    if cfg.tokenizer:
        docs = TokenStream(docs, load_vocabulary(cfg.tokenizer))
    return WindowPacker(docs, window=window, stride=stride, batch_size=cfg.batch_size,
                        shuffle_buffer=cfg.shuffle_buffer, seed=cfg.seed)


class ByteLoader:
    """Batches (B, model.window) of this rank's share of a corpus, forever, resumable.

    With `num_workers` > 0 the packing runs in torch DataLoader worker processes, read in a
    fixed round robin so that the batch order does not depend on their timing.
    """

    def __init__(self, cfg: DataConfig, model: ModelConfig, *, rank: int = 0, world_size: int = 1,
                 split: str | None = "train"):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.files = corpus_files(cfg.path, split=split)
        self.window, self.stride = model.window, model.seq_len  # the model's window, seq_len apart
        self.n_local = max(1, cfg.num_workers)
        self.states: list[dict | None] = [None] * self.n_local
        self.next_slot = 0
        self._packer: WindowPacker | None = None
        self._iter = None
        # what the workers build their packers with: it holds no reference to this loader, so a
        # loader dropped mid-stream is freed at once and shuts its workers down cleanly (from a
        # reference cycle the garbage collector may tear the DataLoader's queues down first,
        # and each worker then waits out torch's 5 s join timeout)
        self._packers = functools.partial(_make_packer, self.files, cfg, rank=rank, world_size=world_size,
                                          n_local=self.n_local, window=self.window, stride=self.stride)

    def make_packer(self, slot: int) -> WindowPacker:
        return self._packers(slot)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return self

    def _live_packer(self) -> WindowPacker:
        if self._packer is None:
            self._packer = self.make_packer(0)
            if self.states[0] is not None:
                self._packer.load_state_dict(self.states[0])
        return self._packer

    def warm(self) -> None:
        """Read the first segment now (training calls it before its clock starts, so that reading
        and encoding the shuffle buffer is not counted as training time); in this process only."""
        if self.cfg.num_workers == 0:
            self._live_packer().warm()
            self.states[0] = None

    def __next__(self) -> torch.Tensor:
        if self.cfg.num_workers == 0:
            batch = self._live_packer().next_batch()
            self.states[0] = None  # the live packer holds the state
            return batch
        if self._iter is None:
            dataset = _WorkerStreams(self._packers, list(self.states), self.next_slot)
            self._iter = iter(torch.utils.data.DataLoader(
                dataset, batch_size=None, num_workers=self.cfg.num_workers,
                persistent_workers=False, multiprocessing_context=_mp_context()))
        slot, batch, state = next(self._iter)
        assert slot == self.next_slot, (slot, self.next_slot)
        self.states[slot] = state
        self.next_slot = (slot + 1) % self.n_local
        return batch

    def state_dict(self) -> dict:
        states = list(self.states)
        if self._packer is not None:
            states[0] = self._packer.state_dict()
        return {"version": STATE_VERSION, "rank": self.rank, "world_size": self.world_size,
                "workers": states, "next_worker": self.next_slot}

    def load_state_dict(self, state: dict) -> None:
        if state.get("version") != STATE_VERSION:
            raise ValueError(_version_error(state))
        if (state["world_size"], len(state["workers"])) != (self.world_size, self.n_local):
            raise ValueError(
                f"the loader state was saved with {state['world_size']} process(es) x "
                f"{len(state['workers'])} reader(s) each, but this run has {self.world_size} x "
                f"{self.n_local}; resume with the same number of processes and data.num_workers")
        self.states, self.next_slot = list(state["workers"]), state["next_worker"]
        self._packer, self._iter = None, None

    @property
    def epoch(self) -> int:
        """The epoch of the newest document this rank's readers have taken."""
        if self._packer is not None:
            return self._packer.docs.epoch
        return max((state["docs"]["epoch"] for state in self.states if state is not None), default=0)

    def stats(self) -> dict:
        """Documents, bytes, lines, skipped lines by reason and the epoch, over this rank's readers."""
        if self._packer is not None:
            docs = [self._packer.docs.state_dict()]
        else:
            docs = [state["docs"] for state in self.states if state is not None]
        return combine_stats([{**d["counts"], "epoch": d["epoch"]} for d in docs])


def combine_stats(parts: list[dict]) -> dict:
    """Reader (or rank) statistics as one: counts added, skipped lines added by reason, and the
    epoch of the furthest reader."""
    total = {"documents": 0, "bytes": 0, "lines": 0, "skipped": {}, "epoch": 0}
    for part in parts:
        for key in ("documents", "bytes", "lines"):
            total[key] += part[key]
        for reason, n in part["skipped"].items():
            total["skipped"][reason] = total["skipped"].get(reason, 0) + n
        total["epoch"] = max(total["epoch"], part["epoch"])
    return total


def _mp_context():
    # fork is fast and safe here (workers touch no CUDA); spawn where fork does not exist
    import multiprocessing

    return "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"

