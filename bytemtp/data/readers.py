"""Corpus file formats, one reader class each behind one interface, chosen by one dispatch.

A corpus file is a prepared shard (`ShardFile`: a `*.zst` that ends with a shard index), a JSONL
file in any compression (`JsonlFile`: `*.jsonl`, `*.jsonl.zst`, `*.jsonl.gz`, one JSON object a line,
the document in a text field), a table (`bytemtp.data.columnar`: `ParquetFile` for `*.parquet`,
`ArrowFile` for `*.arrow`, the document in a text column) or one raw document (`RawFile`: any other
file, its exact bytes in any compression). `reader_for` picks the first class of `READERS` that
claims a file; a new format is one new class there. Every reader offers the same three things:

- `documents(counts=)`: every document of the file in order, for prep, evaluation and corpus-info;
  bad JSONL lines and null table rows are skipped and counted by reason (`SKIP_REASONS`), never
  dropped silently.
- `position(saved)`: its typed resume position from the pair saved in the loader's state dict (every
  position is a NamedTuple of two ints, so `list(pos)` is the saved form, and (0, 0) is a file's
  start in every format): `StreamPos` (`bytemtp.data.compression`: a zstd frame's start and bytes
  into it) for JSONL, `ShardPos` (a frame and the reader's bytes of it already handed out) for
  prepared shards, `TablePos` (a row group and rows of it consumed) for tables, `RawPos` (whether
  the document was handed out) for raw files.
- `share(pos, record=, share=)`: one loader reader's `Share` of the file from a position on, as
  `Step`s (`bytemtp.data.steps`: the position and record number after the step, and what it hands
  out). Records are numbered across the corpus; reader g of G takes those numbered g mod G. JSONL
  and raw files number a record at a time and parse only the reader's own; a table numbers its rows
  and packs the reader's whole documents by array operations; a prepared shard numbers its
  documents from `record` (the shard's first) and takes the fast path: its index gives every
  boundary, so whole frames are decoded as numpy arrays (in threads, `share.ahead` frames ahead),
  the reader's bytes selected and EOS placed by vectorised operations, and frames holding nothing
  of the reader's are never read. The trade-off: a raw file is read whole, and every reader
  decompresses and splits a JSONL file (or decodes a table's row groups) to find its own records;
  only prepared shards skip what is not the reader's.
"""
from __future__ import annotations

import collections
import json
import pathlib
import threading
from collections.abc import Iterator
from typing import ClassVar, NamedTuple

import numpy as np
import simdjson

from bytemtp.data.columnar import TABLE_SKIP_REASONS, ArrowFile, ParquetFile
from bytemtp.data.compression import StreamPos, iter_lines, read_raw
from bytemtp.data.shards import CorpusError, Shard, has_index
from bytemtp.data.steps import Share, Step, reader_threads, whole

JSONL_SKIP_REASONS = ("empty_line", "invalid_utf8", "invalid_json", "not_object", "missing_field", "not_string")
SKIP_REASONS = JSONL_SKIP_REASONS + TABLE_SKIP_REASONS  # every reason a record is skipped, in every format


# --- JSONL records --------------------------------------------------------------------------------


_parsers = threading.local()  # a simdjson parser is not reentrant: one per thread


def parse_record(line: bytes, field: str = "text") -> bytes | str:
    """The document of one JSONL line as UTF-8 bytes, or the reason (one of SKIP_REASONS) to skip it.

    simdjson parses (about 1.5 times as fast as orjson and 3 times as fast as json on text-heavy
    lines). A line it rejects, or an object with a repeated key (simdjson keeps the first, json
    the last), goes through json, the reference, which names the reason or accepts what only json
    accepts (NaN). simdjson admits neither invalid UTF-8 nor lone surrogates.
    """
    if line.endswith(b"\r"):
        line = line[:-1]
    parser = getattr(_parsers, "parser", None)
    if parser is None:
        parser = _parsers.parser = simdjson.Parser()
    try:
        record = parser.parse(line)
    except (ValueError, RuntimeError):  # UnicodeDecodeError is a ValueError; RuntimeError: too deep
        return _parse_slowly(line, field)
    try:  # the proxy must be gone before the parser's next parse
        if type(record) is not simdjson.Object:
            return "not_object"
        doc = record.get(field)
        if len(record) > 1 and len(record) != len(set(record.keys())):
            return _parse_slowly(line, field)
        if type(doc) is str:
            return doc.encode("utf-8")
        return "missing_field" if field not in record else "not_string"
    finally:
        del record


def _parse_slowly(line: bytes, field: str) -> bytes | str:
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8"
    try:
        record = json.loads(text.removeprefix("\ufeff"))  # as simdjson, accept a byte order mark
    except (ValueError, RecursionError):
        return "invalid_json" if text.strip() else "empty_line"
    if type(record) is not dict:
        return "not_object"
    if field not in record:
        return "missing_field"
    doc = record[field]
    if type(doc) is not str:
        return "not_string"
    # A lone surrogate escape such as "\ud800" becomes its 3-byte WTF-8 form (b"\xed\xa0\x80"):
    # the record is kept, its code units as they were written.
    return doc.encode("utf-8", "surrogatepass")



# --- positions ------------------------------------------------------------------------------------


class ShardPos(NamedTuple):
    """A position in a prepared shard, saved as [frame, handed]."""

    frame: int  # the frame the next piece comes from
    handed: int  # the reader's bytes of that frame already handed out


class RawPos(NamedTuple):
    """A position in a raw file (one document), saved as [0, taken]."""

    start: int  # always 0: the document is read whole, from the file's start
    taken: int  # 1 once the document was handed out


# --- the readers ----------------------------------------------------------------------------------


class JsonlFile:
    """One JSON object a line, the document in `field`; any compression."""

    kind: ClassVar[str] = "jsonl"

    def __init__(self, path, *, field: str = "text"):
        self.path, self.field = pathlib.Path(path), field

    @staticmethod
    def claims(path: pathlib.Path) -> bool:
        return path.name.lower().endswith((".jsonl", ".jsonl.zst", ".jsonl.gz"))

    def documents(self, *, counts: dict[str, int] | None = None) -> Iterator[bytes]:
        for line, _ in iter_lines(self.path):
            doc = parse_record(line, self.field)
            if type(doc) is bytes:
                yield doc
            elif counts is not None:
                counts[doc] = counts.get(doc, 0) + 1

    def position(self, saved) -> StreamPos:
        return StreamPos(*saved)

    def share(self, pos: StreamPos, *, record: int, share: Share) -> Iterator[Step]:
        after = pos  # where the next line starts
        for line, after in iter_lines(self.path, start=pos):
            record += 1
            if not share.mine(record - 1):
                continue
            doc = parse_record(line, self.field)
            if type(doc) is bytes:
                yield whole(after, record, doc, lines=1)
            else:
                yield Step(after, record, lines=1, skipped=doc)
        yield Step(after, record)


class RawFile:
    """Any other file: one document, its exact bytes (even if empty), in any compression."""

    kind: ClassVar[str] = "raw"

    def __init__(self, path, *, field: str = "text"):
        self.path = pathlib.Path(path)

    @staticmethod
    def claims(path: pathlib.Path) -> bool:
        return True

    def documents(self, *, counts: dict[str, int] | None = None) -> Iterator[bytes]:
        yield read_raw(self.path)

    def position(self, saved) -> RawPos:
        return RawPos(0, int(tuple(saved) != (0, 0)))

    def share(self, pos: RawPos, *, record: int, share: Share) -> Iterator[Step]:
        if pos.taken:  # taken before the position was saved: a resume moves on to the next file
            return
        if share.mine(record):
            yield whole(RawPos(0, 1), record + 1, read_raw(self.path))
        else:
            yield Step(RawPos(0, 1), record + 1)


class ShardFile:
    """A prepared (format 2) shard: the documents its index lists, read frame by frame."""

    kind: ClassVar[str] = "shard"

    def __init__(self, path, *, field: str = "text"):
        self.path = pathlib.Path(path)

    @staticmethod
    def claims(path: pathlib.Path) -> bool:
        return path.name.lower().endswith(".zst") and has_index(path)

    def documents(self, *, counts: dict[str, int] | None = None) -> Iterator[bytes]:
        with Shard(self.path) as shard:
            yield from shard.documents()

    def position(self, saved) -> ShardPos:
        return ShardPos(*saved)

    def share(self, pos: ShardPos, *, record: int, share: Share) -> Iterator[Step]:
        """The reader's pieces, at most share.chunk bytes each; `record` stays the shard's first
        record number until the shard is done."""
        start, skip = pos
        if share.undigested and pos != (0, 0):  # such a position was taken in a JSONL corpus
            raise CorpusError(f"this position was saved in a corpus of JSONL shards, but {self.path} is a "
                              "prepared shard of format 2 (the corpus was prepared again); resume with the "
                              "corpus the run trained on, or start a new run")
        reader = ShardShare(self.path, first=record, reader=share.reader, n_readers=share.n_readers)
        moved = CorpusError(f"resume position {tuple(pos)} does not fit {self.path}; the file changed since "
                            "it was saved")
        if start > reader.shard.n_frames or skip < 0:
            reader.close()
            raise moved
        frames = reader.frames[np.searchsorted(reader.frames, start):].tolist()
        pool, pending = reader_threads("frames", 2), collections.deque()  # zstd releases the GIL
        try:
            for i, f in enumerate(frames):
                while len(pending) < share.ahead and i + len(pending) < len(frames):
                    pending.append(pool.submit(reader.frame, frames[i + len(pending)]))
                data, at, docs = pending.popleft().result()
                offset = skip if f == start else 0
                if offset > len(data):
                    raise moved
                # a frame is counted once, when it starts; piece [p, q) takes the EOS after offsets
                # in (p, q], and those at 0 if p == 0
                counted = (docs, len(data)) if offset == 0 else (0, 0)
                for p in range(offset, max(len(data), 1), share.chunk):
                    q = min(p + share.chunk, len(data))
                    lo = int(np.searchsorted(at, p, side="right")) if p else 0
                    hi = int(np.searchsorted(at, q, side="right"))
                    after = ShardPos(f, q) if q < len(data) else ShardPos(f + 1, 0)
                    yield Step(after, record, (data[p:q], at[lo:hi] - p), *counted)
                    counted = (0, 0)
                pos = ShardPos(f + 1, 0)
        finally:
            for future in pending:
                future.cancel()
            for future in pending:
                if not future.cancelled():
                    future.exception()  # wait: the frame reads the file closed next
            reader.close()
        yield Step(pos, record + reader.shard.n_docs)


class ShardShare:
    """One reader's ids from a prepared shard, frame by frame, with vectorised packing.

    Document j of the shard is the reader's when (first + j) % n_readers == reader, where first is
    the stream's record number at the shard's start. A frame's ids are the reader's bytes in it,
    each document's EOS placed in the frame where the document ends (frame 0 for empty documents at
    the start). Frames without any of the reader's bytes or EOS are never read.
    """

    def __init__(self, path: pathlib.Path, *, first: int, reader: int, n_readers: int):
        self.shard = Shard(path)
        s = self.shard
        keep = None if n_readers == 1 else (first + np.arange(s.n_docs)) % n_readers == reader
        self.keep = keep
        eos_frame = np.searchsorted(s.frame_ends, s.doc_ends, side="left")
        self.eos_bounds = np.searchsorted(eos_frame, np.arange(s.n_frames + 1), side="left")
        frame_starts = s.frame_ends - s.content
        self.first_doc = np.searchsorted(s.doc_ends, frame_starts, side="right")  # first doc with bytes in it
        if keep is None:
            self.frames = np.arange(s.n_frames)
        else:  # frames holding a byte or an EOS of one of this reader's documents
            mine_cum = np.concatenate(([0], np.cumsum(keep)))
            last = np.minimum(self.eos_bounds[1:] + 1, s.n_docs)  # the doc running past the frame's end, if any
            lo = np.minimum(self.first_doc, self.eos_bounds[:-1])
            self.frames = np.flatnonzero(mine_cum[last] > mine_cum[lo])

    def frame(self, f: int) -> tuple[np.ndarray, np.ndarray, int]:
        """Frame f for this reader: its bytes, the offsets in them after which an EOS follows (one
        for each of the reader's documents that end in the frame), and how many documents end there."""
        s = self.shard
        data = s.frames([f])[0]
        fs = int(s.frame_ends[f] - s.content[f])
        a, b = int(self.eos_bounds[f]), int(self.eos_bounds[f + 1])
        if self.keep is None:
            return data, s.doc_ends[a:b] - fs, b - a
        c = int(self.first_doc[f])
        d = min(b + 1, s.n_docs) if b < s.n_docs and s.doc_starts[b] < fs + len(data) else b
        c = min(c, d)
        lo = np.maximum(s.doc_starts[c:d], fs) - fs
        seg = np.minimum(s.doc_ends[c:d], fs + len(data)) - fs - lo  # bytes of each doc in the frame
        keep = self.keep[c:d]
        before = np.concatenate(([0], np.cumsum(seg * keep)))  # kept bytes before each doc's end
        ends = np.arange(a, b)[self.keep[a:b]]
        return data[np.repeat(keep, seg)], before[np.clip(ends - c + 1, 0, len(seg))], len(ends)

    def close(self) -> None:
        self.shard.close()


READERS = (JsonlFile, ShardFile, ParquetFile, ArrowFile, RawFile)  # the first that claims a file reads it


def reader_for(path, *, field: str = "text") -> JsonlFile | ShardFile | ParquetFile | ArrowFile | RawFile:
    """The reader of one corpus file: the first class of READERS that claims it."""
    path = pathlib.Path(path)
    return next(cls for cls in READERS if cls.claims(path))(path, field=field)


def file_kind(path) -> str:
    """'jsonl' for *.jsonl, *.jsonl.zst, *.jsonl.gz; 'shard' for a *.zst file that ends with a
    prepared shard's index; 'parquet' and 'arrow' for *.parquet and *.arrow; 'raw' (one document
    per file) for anything else."""
    return reader_for(path).kind
