"""Compressed corpus files as bytes and lines: strict zstd frame by frame, gzip, and plain files.

The suffix decides the compression (`.zst`, `.gz`, else none). `iter_lines` splits a file's content
into lines with the position where the next line starts, `read_raw` returns it whole; the formats that
are read from such files (JSONL, raw documents) are `bytemtp.data.readers`'s.

Strict zstd. python-zstandard's streaming readers return what they have when a file ends mid-frame,
so zstd files are decoded here frame by frame with `decompressobj`, whose `eof` marks a frame's end
and `unused_data` the next frame's start. A file that ends inside a frame is truncated; a zstd error
(bad magic, corrupt block, checksum mismatch, trailing garbage) is corruption; both raise
`CorpusError` with the file and the frame's byte offset. Frames are streamed, not buffered, since
external files are often one multi-gigabyte frame: a frame's lines are yielded as they decode and a
checksum mismatch surfaces at the frame's end, after them (the run still stops). Prepared shards use
frames of about 1 MiB, so at most that much precedes the error.

Resume positions (`StreamPos`): the compressed offset where decoding starts (a zstd frame's start;
0 in plain and gzip files, which are one stream) and the decompressed bytes to skip from there.
Resuming costs at most one frame of decompression in a multi-frame zstd file, but the whole prefix
in a single-frame external file or any gzip file; a plain file seeks.
"""
from __future__ import annotations

import gzip
import os
import pathlib
import queue
import threading
import zlib
from collections.abc import Iterator
from typing import NamedTuple

import zstandard

from bytemtp.data.shards import CorpusError

CHUNK = 1 << 20  # bytes read from a file at a time
MAX_WINDOW = 1 << 31  # the largest zstd window read: 2 GiB, what `zstd --long=31` writes
_REDO = "re-download or re-create the file"


class StreamPos(NamedTuple):
    """A position in a compressed file's content, saved as [frame, skip]."""

    frame: int  # compressed offset of the zstd frame where decoding starts (0 in plain and gzip files)
    skip: int  # decompressed bytes from there to the position


# A piece generator yields (a, b, data) where data starts at StreamPos(a, b): for zstd, the frame's
# start offset and the offset into that frame's output; for plain and gzip files, (0, offset). Its
# last item is (a, b, None), the position of the end of the file.


def _open(path: pathlib.Path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}; check the path") from None


def _moved(path: pathlib.Path, start: tuple[int, int]) -> CorpusError:
    return CorpusError(f"resume position {tuple(start)} does not fit {path}; the file changed since it was saved")


def _zstd_pieces(f, path: pathlib.Path, offset: int):
    size = os.fstat(f.fileno()).st_size
    if offset > size:
        raise _moved(path, (offset, 0))
    f.seek(offset)
    dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    buf, used, buf_start = b"", 0, offset  # bytes read, how many were fed, file offset of buf[0]
    dobj, frame_start, produced, step = None, offset, 0, 1 << 16
    while True:
        if used == len(buf):
            buf_start, buf, used = buf_start + len(buf), f.read(CHUNK), 0
            if not buf:
                break
        if dobj is None:
            dobj, frame_start, produced = dctx.decompressobj(), buf_start + used, 0
        # At a frame's end `unused_data` copies the rest of what was fed, so feed about twice the
        # last frame's size, not the whole buffer: many tiny frames then stay linear in time.
        fed = memoryview(buf)[used:used + step]
        try:
            out = dobj.decompress(fed)
        except zstandard.ZstdError as e:
            raise _zstd_error(e, path, frame_start, fed) from None
        used += len(fed) - (len(dobj.unused_data) if dobj.eof else 0)
        if dobj.eof:
            step, dobj = min(CHUNK, max(1 << 16, 2 * (buf_start + used - frame_start))), None
        if out:
            yield frame_start, produced, out
            produced += len(out)
    if dobj is not None:
        raise CorpusError(f"{path} is truncated: the zstd frame at byte {frame_start} is cut off by the "
                          f"end of the file at {size} bytes; {_REDO}")
    yield size, 0, None


def _zstd_error(error: zstandard.ZstdError, path: pathlib.Path, frame_start: int, data) -> CorpusError:
    """What a zstd error means for the user: a window past the limit or a memory shortage is not
    corruption."""
    text = str(error)
    if "memory" in text.lower() or "window" in text.lower():
        window = _declared_window(bytes(data[:6]))
        if window > MAX_WINDOW:
            return CorpusError(f"{path}: the zstd frame at byte {frame_start} declares a window of "
                               f"{window / 2**30:g} GiB, more than the {MAX_WINDOW >> 30} GiB this reader "
                               f"allows (zstd --long=31); recompress it with a smaller window")
        return CorpusError(f"{path}: not enough memory to decode the zstd frame at byte {frame_start} "
                           f"(window {window / 2**20:g} MiB; {text}); free memory or recompress it with "
                           f"a smaller window")
    return CorpusError(f"{path} is corrupt: the zstd frame at byte {frame_start} fails to decode "
                       f"({text}); {_REDO}")


def _declared_window(header: bytes) -> int:
    """The window a zstd frame header declares (RFC 8878 3.1.1.1.2), or 0 if it declares none."""
    if len(header) < 6 or header[:4] != b"\x28\xb5\x2f\xfd" or header[4] & 0x20:  # single segment: no window
        return 0
    exponent, mantissa = header[5] >> 3, header[5] & 7
    base = 1 << (10 + exponent)
    return base + base // 8 * mantissa


def _gzip_pieces(f, path: pathlib.Path):
    pos = 0
    with gzip.GzipFile(fileobj=f) as gz:  # closing it leaves f open
        while True:
            try:
                data = gz.read(CHUNK)
            except (EOFError, OSError, zlib.error) as e:
                raise CorpusError(f"{path} is {'truncated' if isinstance(e, EOFError) else 'corrupt'}: gzip "
                                  f"fails after {pos} decompressed bytes ({e}); {_REDO}") from None
            if not data:
                break
            yield 0, pos, data
            pos += len(data)
    yield 0, pos, None


def _plain_pieces(f, path: pathlib.Path, offset: int):
    if offset > os.fstat(f.fileno()).st_size:
        raise _moved(path, (0, offset))
    f.seek(offset)
    while data := f.read(CHUNK):
        yield 0, offset, data
        offset += len(data)
    yield 0, offset, None


def _skip(pieces, skip: int, path: pathlib.Path, start: tuple[int, int]):
    """Drop the first `skip` bytes of output (a gzip file, or the start of a zstd frame)."""
    for a, b, data in pieces:
        if data is None and skip:
            raise _moved(path, start)
        if data is not None and skip:
            if skip >= len(data):
                skip -= len(data)
                continue
            b, data, skip = b + skip, data[skip:], 0
        yield a, b, data


def _prefetched(pieces: Iterator, depth: int = 4) -> Iterator:
    """Run a decompressing generator in a thread, `depth` pieces ahead of the consumer.

    zstd and zlib release the GIL while they decompress, so decompression overlaps the caller's
    parsing and packing. Errors surface in the consumer in order; closing the consumer stops the
    thread before the file is closed.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in pieces:
                while not stop.is_set():
                    try:
                        q.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
        except BaseException as e:  # handed to the consumer, which raises it
            q.put((None, e))
            return
        q.put((None, None))

    thread = threading.Thread(target=produce, name="bytemtp-decompress", daemon=True)
    thread.start()
    try:
        while True:
            item, error = q.get()
            if error is not None:
                raise error
            if item is None:
                return
            yield item
    finally:
        stop.set()
        while thread.is_alive():
            try:
                q.get_nowait()
            except queue.Empty:
                thread.join(timeout=0.05)


def _pieces(f, path: pathlib.Path, start: tuple[int, int]):
    offset, skip = start
    name = path.name.lower()
    zst = name.endswith(".zst")
    if offset < 0 or skip < 0 or (offset and not zst):
        raise _moved(path, start)
    if not zst and not name.endswith(".gz"):
        return _plain_pieces(f, path, skip)
    pieces = _zstd_pieces(f, path, offset) if zst else _gzip_pieces(f, path)
    return _prefetched(_skip(pieces, skip, path, start) if skip else pieces)


def iter_lines(path, *, start: tuple[int, int] = StreamPos(0, 0)) -> Iterator[tuple[bytes, StreamPos]]:
    """Each line of a (compressed) file without its b"\\n", with the position where the next line starts.

    For zstd files that position is (start offset of the frame holding the next line's first byte,
    decompressed bytes from that frame's start to it); after the last line it is (file size, 0).
    `iter_lines(path, start=pos)` yields exactly the lines after the one `pos` came with.
    Lines may span frames. Interior blank lines are yielded as b""; a final "\\n" adds no line.
    """
    path = pathlib.Path(path)
    with _open(path) as f:
        # A line is yielded only once the next line's first byte arrives: only then is it known
        # which frame that byte lies in.
        line, partial = None, []
        for a, b, data in _pieces(f, path, start):
            if data is None:
                end = StreamPos(a, b)
                break
            i, n = 0, len(data)
            while i < n:
                if line is not None:
                    yield line, StreamPos(a, b + i)
                    line = None
                j = data.find(b"\n", i)
                if j < 0:
                    partial.append(data[i:])
                    break
                line = b"".join(partial) + data[i:j] if partial else data[i:j]
                partial, i = [], j + 1
        if line is not None or partial:
            yield line if line is not None else b"".join(partial), end


def read_raw(path) -> bytes:
    """The whole decompressed content of a file (strict multi-frame zstd, gzip, or plain bytes)."""
    path = pathlib.Path(path)
    with _open(path) as f:
        return b"".join(data for _, _, data in _pieces(f, path, (0, 0)) if data is not None)


def decompressed_size(path) -> int:
    """The size of a file's decompressed content, found by streaming it as strictly as read_raw reads."""
    path = pathlib.Path(path)
    with _open(path) as f:
        return sum(len(data) for _, _, data in _pieces(f, path, (0, 0)) if data is not None)

