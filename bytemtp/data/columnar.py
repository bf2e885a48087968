"""Columnar corpus files: Parquet (`ParquetFile`) and Arrow IPC (`ArrowFile`), one text column each.

The readers of `bytemtp.data.readers`' interface for tables, the formats that Hugging Face datasets
ship (FineWeb and most of the Hub are Parquet; `datasets` keeps its cache and `save_to_disk` folders
as Arrow IPC streams). The document of a row is its `field` column: a string column (string,
large_string, string_view) as its UTF-8 bytes, a binary one (binary, large_binary, binary_view)
byte for byte. Every row is a record, null rows included (as every JSONL line is): a null is skipped
and counted as "null".

A table is read a row group (Parquet) or record batch (Arrow) at a time, only the one column, and
never whole: the row group is the unit of compression, so it is the least a reader can decode. The
column's offsets and data buffers are taken as numpy arrays (`_column`), so neither prep nor the
loader touches a row in Python beyond slicing its bytes: `documents` slices each row's bytes out of
the group's one bytes object, and `share` selects the reader's rows and packs several whole
documents into a piece of about `share.chunk` bytes by array operations (a longer document goes
out whole, in a piece of its own). Pieces are cut greedily from where the share stands, so a resumed
share cuts them where the uninterrupted one did. The next row group is read in a thread while the
current one is handed out (pyarrow releases the GIL), so decompression overlaps the packing. The
trade-off: every reader decodes every row group (a row group has no index of what is whose), as
JSONL; only prepared shards skip what is not the reader's.

The position is `TablePos(group, row)`: the row group or batch the next row comes from and the rows
of it already consumed. A null row among the rows a piece covers is counted by a skip step yielded
before the piece, with the position before it: the loader saves its state only right after a piece,
so every skip it has counted lies before the position it saves.

pyarrow is an optional dependency (`pip install 'bytemtp[parquet]'`), imported when a table is
first read, so the readers' module (and the CLI) import without it.
"""
from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import ClassVar, NamedTuple

import numpy as np

from bytemtp.data.shards import CorpusError
from bytemtp.data.steps import Share, Step, reader_threads

TABLE_SKIP_REASONS = ("null",)  # a null in the text column
ARROW_FILE_MAGIC = b"ARROW1"  # the IPC file format starts with it; the stream format does not


class TablePos(NamedTuple):
    """A position in a Parquet or Arrow file, saved as [group, row]."""

    group: int  # the row group (Parquet) or record batch (Arrow) the next row comes from
    row: int  # rows of that group already consumed


def _pyarrow(path: pathlib.Path):
    try:
        import pyarrow
    except ImportError:
        raise CorpusError(f"reading {path} needs pyarrow: pip install 'bytemtp[parquet]'") from None
    return pyarrow


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _is_text(pa, t) -> bool:
    types = pa.types
    return (types.is_string(t) or types.is_large_string(t) or types.is_binary(t) or types.is_large_binary(t)
            or getattr(types, "is_string_view", lambda _: False)(t)
            or getattr(types, "is_binary_view", lambda _: False)(t)
            or (types.is_dictionary(t) and _is_text(pa, t.value_type)))


def _check_field(pa, schema, path: pathlib.Path, field: str) -> None:
    """A one-line CorpusError unless `field` is a text column of `schema`."""
    texts = [f.name for f in schema if _is_text(pa, f.type)]
    if field not in schema.names:
        have = (f"its text columns are {', '.join(map(repr, texts))}" if texts else
                f"it has no text column (its columns: {', '.join(map(repr, schema.names)) or 'none'})")
        raise CorpusError(f"{path} has no column {field!r}; {have}: choose one with --field "
                          "(data.field when training)")
    t = schema.field(field).type
    if not _is_text(pa, t):
        others = f" (its text columns: {', '.join(map(repr, texts))})" if texts else ""
        raise CorpusError(f"column {field!r} of {path} is of type {t}, not text (string or binary); choose a "
                          f"text column with --field (data.field when training){others}")


def _column(pa, chunks) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A text column's rows as (data, offsets, null): row i is data[offsets[i]:offsets[i + 1]]
    (int64 offsets, n + 1 of them), null a boolean per row (None when no row is null).

    The buffers are read as they lie (the array's own offset into them respected); view types and
    dictionaries are first turned into plain binary. Several chunks are joined (a copy)."""
    parts = []
    for arr in chunks:
        t = arr.type
        if pa.types.is_dictionary(t):
            arr = arr.dictionary_decode()
        if not (pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
                or pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)):  # a view type
            arr = arr.cast(pa.large_binary())
        wide = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
        _, offsets, data = arr.buffers()
        n = len(arr)
        off = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[arr.offset:arr.offset + n + 1] \
            if offsets is not None else np.zeros(n + 1, np.int64)
        data = np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8)
        null = arr.is_null().to_numpy(zero_copy_only=False) if arr.null_count else None
        parts.append((data, off.astype(np.int64), null, n))
    if len(parts) == 1:
        return parts[0][:3]
    n_all = sum(p[3] for p in parts)
    datas, offs, nulls, base = [], [np.zeros(1, np.int64)], [], 0
    for data, off, null, n in parts:
        datas.append(data[off[0]:off[-1]])
        offs.append(off[1:] - off[0] + base)
        base += int(off[-1] - off[0])
        nulls.append(np.zeros(n, bool) if null is None else null)
    null = np.concatenate(nulls) if any(p[2] is not None for p in parts) else None
    off = np.concatenate(offs)
    assert len(off) == n_all + 1
    return np.concatenate(datas) if datas else np.zeros(0, np.uint8), off, null


class _TableFile:
    """What Parquet and Arrow files share: a text column read group by group (`_groups`, the format's)."""

    kind: ClassVar[str]
    suffix: ClassVar[str]
    unit: ClassVar[str]  # what a group is called in messages

    def __init__(self, path, *, field: str = "text"):
        self.path, self.field = pathlib.Path(path), field

    @classmethod
    def claims(cls, path: pathlib.Path) -> bool:
        return path.name.lower().endswith(cls.suffix)

    def position(self, saved) -> TablePos:
        return TablePos(*saved)

    def _groups(self, start: int) -> Iterator[tuple[int, Callable[[], list]]]:
        """For each group from `start` on, its index and a thunk that reads its column's chunks;
        raises the position's CorpusError when the file has fewer than `start` groups."""
        raise NotImplementedError

    def _damaged(self, group: int, error: BaseException) -> CorpusError:
        return CorpusError(f"{self.path}: {self.unit} {group} cannot be read, the file is damaged or cut short "
                           f"({_first_line(error)}); fetch or write it again")

    def _moved(self, pos) -> CorpusError:
        return CorpusError(f"resume position {tuple(pos)} does not fit {self.path}; the file changed since it "
                           "was saved")

    def _read(self, group: int, thunk) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        pa = _pyarrow(self.path)
        try:
            chunks = thunk()
        except (OSError, pa.ArrowException) as e:  # ArrowInvalid, and IOError for a cut file
            raise self._damaged(group, e) from None
        return _column(pa, chunks)

    def documents(self, *, counts: dict[str, int] | None = None) -> Iterator[bytes]:
        for g, thunk in self._groups(0):
            data, off, null = self._read(g, thunk)
            lo, hi = int(off[0]), int(off[-1])
            raw, bounds = data[lo:hi].tobytes(), (off - lo).tolist()
            if null is None:
                for a, b in zip(bounds, bounds[1:]):
                    yield raw[a:b]
                continue
            for a, b, is_null in zip(bounds, bounds[1:], null.tolist()):
                if not is_null:
                    yield raw[a:b]
                elif counts is not None:
                    counts["null"] = counts.get("null", 0) + 1

    def share(self, pos: TablePos, *, record: int, share: Share) -> Iterator[Step]:
        """The reader's rows as pieces of whole documents; `record` numbers the row at `pos`."""
        pos = TablePos(*pos)
        groups = self._groups(pos.group)
        pending = None
        try:
            pending = self._next(groups)
            first = True
            while pending is not None:
                g, future = pending
                column = future.result()
                pending = self._next(groups) if share.ahead else None  # read ahead while this one goes out
                row = pos.row if first else 0
                n = len(column[1]) - 1
                if row < 0 or row > n:
                    raise self._moved(pos)
                first = False
                yield from _group_steps(g, column, row=row, record=record, share=share)
                record += n - row
                if not share.ahead:
                    pending = self._next(groups)
            if first and pos.row != 0:  # the position is past the last group's start
                raise self._moved(pos)
        finally:
            if pending is not None and not pending[1].cancel():
                pending[1].exception()  # wait: the thread may still read the file
        end = TablePos(pos.group, pos.row) if first else TablePos(g + 1, 0)
        yield Step(end, record)

    def _next(self, groups):
        item = next(groups, None)
        if item is None:
            return None
        g, thunk = item
        return g, reader_threads("tables", 1).submit(self._read, g, thunk)


def _group_steps(g: int, column, *, row: int, record: int, share: Share) -> Iterator[Step]:
    """One group's steps from `row` on, where row `row` is record number `record`.

    The reader's rows are those whose record number is its own; its valid ones are packed greedily,
    in order, into pieces of at most share.chunk bytes (one longer document makes a piece alone). A
    piece covers the reader's rows from the one after the previous piece's last up to its own last,
    and its step's position is the row after that (the next group's start after the last row); the
    null rows it covers are skipped first, by steps at the position before it."""
    data, off, null = column
    n = len(off) - 1
    own = np.arange(row + (share.reader - record) % share.n_readers, n, share.n_readers)  # rows
    if not len(own):
        return
    length = off[own + 1] - off[own]
    valid = np.ones(len(own), bool) if null is None else ~null[own]
    length = np.where(valid, length, 0)
    ends = np.cumsum(length)  # the reader's bytes up to each of its rows' ends
    contiguous = share.n_readers == 1 and null is None  # the reader's bytes are one run of the data
    a, before, last_pos, last_record = 0, 0, TablePos(g, row), record
    while a < len(own):
        b = max(int(np.searchsorted(ends, before + share.chunk, side="right")), a + 1)
        rows = own[a:b]
        for _ in range(int(b - a - valid[a:b].sum())):
            yield Step(last_pos, last_record, lines=1, skipped="null")
        after = int(rows[-1]) + 1
        last_pos = TablePos(g, after) if after < n else TablePos(g + 1, 0)
        last_record = record + after - row
        docs = int(valid[a:b].sum())
        if docs:
            lo, hi = int(off[rows[0]]), int(off[rows[-1] + 1])
            if contiguous:
                piece = data[lo:hi]
            else:  # every row in [rows[0], rows[-1]], its bytes kept when it is the reader's and not null
                keep = np.zeros(int(rows[-1] - rows[0]) + 1, bool)
                keep[rows - rows[0]] = valid[a:b]
                piece = data[lo:hi][np.repeat(keep, np.diff(off[rows[0]:rows[-1] + 2]))]
            at = ends[a:b][valid[a:b]] - before
            yield Step(last_pos, last_record, (piece, at), documents=docs, nbytes=int(ends[b - 1] - before),
                       lines=docs)
        a, before = b, int(ends[b - 1])


class ParquetFile(_TableFile):
    """A Parquet file: a text column, read a row group at a time."""

    kind: ClassVar[str] = "parquet"
    suffix: ClassVar[str] = ".parquet"
    unit: ClassVar[str] = "row group"

    def _groups(self, start: int):
        pa = _pyarrow(self.path)
        import pyarrow.parquet as pq

        try:
            try:  # page checksums, where the writer stored them, catch a damaged page (pyarrow >= 15)
                table = pq.ParquetFile(self.path, page_checksum_verification=True)
            except TypeError:
                table = pq.ParquetFile(self.path)
        except (OSError, pa.ArrowException) as e:
            raise CorpusError(f"{self.path} is not a readable Parquet file, damaged or cut short "
                              f"({_first_line(e)}); fetch or write it again") from None
        _check_field(pa, table.schema_arrow, self.path, self.field)
        n = table.metadata.num_row_groups
        if start > n:
            raise self._moved((start, 0))

        def reader(g):
            return lambda: table.read_row_group(g, columns=[self.field], use_threads=False).column(0).chunks

        return ((g, reader(g)) for g in range(start, n))


class ArrowFile(_TableFile):
    """An Arrow IPC file, in the stream format (what Hugging Face `datasets` writes to its cache and
    `save_to_disk` folders) or the file format (its magic tells them apart): a text column, read a
    record batch at a time from a memory map (zero-copy: a batch costs only its column's pages)."""

    kind: ClassVar[str] = "arrow"
    suffix: ClassVar[str] = ".arrow"
    unit: ClassVar[str] = "record batch"

    def _groups(self, start: int):
        pa = _pyarrow(self.path)
        try:
            with open(self.path, "rb") as f:
                is_file = f.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC
            source = pa.memory_map(str(self.path))
            reader = pa.ipc.open_file(source) if is_file else pa.ipc.open_stream(source)
        except (OSError, pa.ArrowException) as e:
            raise CorpusError(f"{self.path} is not a readable Arrow IPC file, damaged or cut short "
                              f"({_first_line(e)}); fetch or write it again") from None
        _check_field(pa, reader.schema, self.path, self.field)
        index = reader.schema.get_field_index(self.field)
        if is_file:
            n = reader.num_record_batches
            if start > n:
                raise self._moved((start, 0))
            return ((g, lambda g=g: [reader.get_batch(g).column(index)]) for g in range(start, n))
        return self._stream(reader, source, index, start)

    def _stream(self, reader, source, index: int, start: int):
        """A stream's batches from `start` on: those before it are read past (their messages only:
        the memory map copies nothing). A stream must end with its end-of-stream marker: pyarrow
        takes the file's end for the stream's, so a writer killed between two batches would leave a
        file that reads cleanly without the rows it never wrote. The reader reads exactly a
        message at a time, so where the marker is read the source's position moves past it (8
        bytes, 0xFFFFFFFF then a zero length; 4 zero bytes before Arrow 0.15) and where the file
        simply ends it does not."""
        g, end = 0, source.tell()
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                if source.tell() == end:
                    raise CorpusError(f"{self.path} ends without the Arrow end-of-stream marker after {g} record "
                                      f"batch(es): the writer was cut off? The rows it had still to write are "
                                      f"missing; write the file again (or wait until its writer has closed it)")
                break
            except Exception as e:  # noqa: BLE001 - pyarrow's errors for a damaged message vary
                error = self._damaged(g, e)
                yield g, lambda error=error: _raise(error)
                return
            end = source.tell()
            if g >= start:
                yield g, lambda batch=batch: [batch.column(index)]
            g += 1
        if g < start:
            raise self._moved((start, 0))


def _raise(error: BaseException):
    raise error
