"""What a corpus file's reader hands the loader: its `Share` of the records and the `Step`s it takes.

These are the reader interface's two value types (and `whole`, the step of one whole document),
kept apart from the readers themselves so that every module of readers (`bytemtp.data.readers` for
shards, JSONL and raw files, `bytemtp.data.columnar` for Parquet and Arrow) imports them from one
place below both, and `readers.READERS` can list them all without a circular import; and
`reader_threads`, the threads both read ahead in.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


@dataclass(frozen=True)
class Share:
    """Which records one loader reader takes (record r is its own when r % n_readers == reader), and
    how it reads a file of many documents: pieces of at most about `chunk` bytes, `ahead` frames
    (or row groups) read ahead."""

    reader: int
    n_readers: int
    chunk: int
    ahead: int
    undigested: bool = False  # the position was saved before it carried the files' digest

    def mine(self, record: int) -> bool:
        return record % self.n_readers == self.reader


class Step(NamedTuple):
    """One step of a reader's share: the position and record number after it, and what it hands out:
    a piece (bytes, offsets in them after which an EOS follows) with the documents and bytes it adds to
    the counts, or a skipped record's reason. `lines` counts the reader's own records (JSONL lines,
    table rows) the step covers."""

    pos: tuple[int, int]
    record: int
    piece: tuple[np.ndarray, np.ndarray] | None = None
    documents: int = 0
    nbytes: int = 0
    lines: int = 0
    skipped: str | None = None


def whole(pos: tuple[int, int], record: int, doc: bytes, *, lines: int = 0) -> Step:
    """A step that hands out one whole document: its bytes, and an EOS after them."""
    piece = np.frombuffer(doc, dtype=np.uint8), np.array([len(doc)])
    return Step(pos, record, piece, documents=1, nbytes=len(doc), lines=lines)


_pools: dict[tuple[int, str], ThreadPoolExecutor] = {}


def reader_threads(name: str, threads: int) -> ThreadPoolExecutor:
    """This process's pool `name` of `threads` threads, which readers read ahead in (made per
    process: a pool does not survive a fork)."""
    key = (os.getpid(), name)
    if key not in _pools:
        _pools[key] = ThreadPoolExecutor(threads, thread_name_prefix=f"bytemtp-{name}")
    return _pools[key]
