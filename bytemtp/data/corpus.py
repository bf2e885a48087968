"""Corpora: finding the files a corpus is made of, and decompressing and parsing them.

The prepared-shard format (writer, reader, index, manifest, checks) lives in `bytemtp.data.shards`,
and the policy of preparing a corpus (dedup, split, bad records) in `bytemtp.data.prep`. This module
reads any corpus, and reads prepared shards through `shards.Shard`; `CorpusError` comes from
`bytemtp.data.shards` (the lowest of the three) and is the same class here.

Finding. `corpus_files` turns a spec (paths, directories, globs, prepared corpora, lists of them) into
a sorted list of files. A prepared corpus is opened here, and only here: its split's files are
checked against the manifest's record (`shards.check_split`: sizes and index digests, no
decompression), so a replaced shard is refused before it is read, and a split that holds no
document is named as empty (with the way to get one) rather than reported as a missing corpus.

Reading. `*.jsonl`, `*.jsonl.zst` and `*.jsonl.gz` files hold one JSON object a line, the document
in a text field; a prepared shard holds the documents its index lists; any other file is one raw
document. The suffix decides the compression (`.zst`, `.gz`, else none). Bad JSONL lines are skipped
and counted by reason, never dropped silently.

Strict zstd. python-zstandard's streaming readers return what they have when a file ends mid-frame,
so zstd files are decoded here frame by frame with `decompressobj`, whose `eof` marks a frame's end
and `unused_data` the next frame's start. A file that ends inside a frame is truncated; a zstd error
(bad magic, corrupt block, checksum mismatch, trailing garbage) is corruption; both raise
`CorpusError` with the file and the frame's byte offset. Frames are streamed, not buffered, since
external files are often one multi-gigabyte frame: a frame's lines are yielded as they decode and a
checksum mismatch surfaces at the frame's end, after them (the run still stops). Prepared shards use
frames of about 1 MiB, so at most that much precedes the error.

Resume positions (`Pos`): (compressed offset of a zstd frame start, decompressed bytes to skip from
there), or (0, byte offset) in plain and gzip files. Resuming costs at most one frame of decompression
in a prepared shard, but the whole prefix in a single-frame external file or any gzip file.
"""
from __future__ import annotations

import fnmatch
import glob
import gzip
import json
import os
import pathlib
import queue
import threading
import zlib
from collections.abc import Iterator

import simdjson
import zstandard

from bytemtp.data.shards import MANIFEST, CorpusError, Shard, check_split, corpus_dir, has_index, read_manifest

SKIP_REASONS = ("empty_line", "invalid_utf8", "invalid_json", "not_object", "missing_field", "not_string")
CHUNK = 1 << 20  # bytes read from a file at a time
MAX_WINDOW = 1 << 31  # the largest zstd window read: 2 GiB, what `zstd --long=31` writes
_REDO = "re-download or re-create the file"

Pos = tuple[int, int]


# --- finding files --------------------------------------------------------------------------------


def _walk(directory: pathlib.Path) -> list[pathlib.Path]:
    """Every regular, non-hidden file below directory, sorted by relative path."""
    found = []
    for root, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        found += [pathlib.Path(root, f) for f in files if not f.startswith(".")]
    return sorted((p for p in found if p.is_file()), key=lambda p: p.relative_to(directory).parts)


def _expand(path: pathlib.Path, split: str | None) -> list[pathlib.Path]:
    corpus = corpus_dir(path)
    if not (corpus / MANIFEST).is_file():
        return [path] if path.is_file() else _walk(path)
    splits = read_manifest(corpus)["splits"]
    files = []
    for name in (list(splits) if split is None else [split]):
        if name not in splits or not (corpus / name).is_dir():
            raise CorpusError(f"prepared corpus {corpus} has no split {name!r} (no directory {corpus / name}); "
                              f"choose one of {', '.join(splits)}")
        found = _walk(corpus / name)
        check_split(corpus, name, splits[name], found)
        if split is not None and not found:
            raise CorpusError(_empty_split(corpus, name, splits))
        files += found
    return files


def _empty_split(corpus: pathlib.Path, name: str, splits: dict) -> str:
    others = " or ".join(f"--split {s}" for s in [*(s for s in splits if s != name), "all"])
    total = sum(s.get("documents", 0) for s in splits.values())
    fraction = "a larger" if name == "val" else "a smaller"
    return (f"the {name} split of the prepared corpus {corpus} is empty (prep put none of its {total:,} "
            f"documents there); read another split ({others}), or prepare the corpus again with {fraction} "
            f"--val-fraction or more documents")


def spec_items(spec) -> list:
    """The items of a corpus spec: its paths, directories and globs, as a list."""
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    if not items:
        raise CorpusError("no corpus given; name a file, directory, glob or prepared corpus")
    return items


def corpus_files(spec, *, split: str | None = "train") -> list[pathlib.Path]:
    """The files a corpus spec names, de-duplicated, in a deterministic order.

    Each item of `spec` (a path, or a list of them) is one of: a prepared corpus directory or its
    manifest (the files of its `split`, or of every split if split is None), another directory
    (every non-hidden file below it), a glob pattern (its sorted matches, directories expanded),
    or a file.
    """
    result, seen = [], set()
    for item in spec_items(spec):
        text = os.fspath(item)
        if os.path.exists(text):
            paths = _expand(pathlib.Path(text), split)
        elif any(c in text for c in "*?["):
            matches = sorted(glob.glob(text, recursive=True))
            if not matches:
                raise CorpusError(f"no file matches the pattern {text}; check the path")
            paths = [f for m in matches for f in _expand(pathlib.Path(m), split)]
        else:
            raise CorpusError(f"{text} does not exist; check the path")
        for path in paths:
            if (key := os.path.realpath(path)) not in seen:
                seen.add(key)
                result.append(path)
    if not result:
        raise CorpusError(f"no files found in {', '.join(os.fspath(i) for i in spec_items(spec))}; "
                          f"point at a directory or pattern that holds corpus files")
    return result


def select_files(files: list[pathlib.Path], *, include=(), exclude=()) -> list[pathlib.Path]:
    """The files that match an include pattern (all if none is given) and no exclude pattern.

    A glob pattern matches a file when it matches its path or any trailing part of it, so `*.py`
    matches by name and `site-packages/*` everything below a directory of that name.
    """
    def matches(path: pathlib.Path, patterns) -> bool:
        parts = pathlib.Path(path).parts
        return any(fnmatch.fnmatchcase("/".join(parts[i:]), p) for p in patterns for i in range(len(parts)))

    kept = [f for f in files if (not include or matches(f, include)) and not matches(f, exclude)]
    if not kept:
        raise CorpusError(f"no file is left of {len(files)} after include {list(include)} and exclude "
                          f"{list(exclude)}; loosen the patterns")
    return kept


def file_kind(path) -> str:
    """'jsonl' for *.jsonl, *.jsonl.zst, *.jsonl.gz; 'shard' for a *.zst file that ends with a
    prepared shard's index; 'raw' (one document per file) for anything else."""
    name = pathlib.Path(path).name.lower()
    if name.endswith((".jsonl", ".jsonl.zst", ".jsonl.gz")):
        return "jsonl"
    return "shard" if name.endswith(".zst") and has_index(path) else "raw"


# --- decompression --------------------------------------------------------------------------------
#
# A piece generator yields (a, b, data) where data starts at Pos (a, b): for zstd, the frame's start
# offset and the offset into that frame's output; for plain and gzip files, (0, offset). Its last
# item is (a, b, None), the Pos of the end of the file.


def _open(path: pathlib.Path):
    try:
        return open(path, "rb")
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}; check the path") from None


def _moved(path: pathlib.Path, start: Pos) -> CorpusError:
    return CorpusError(f"resume position {start} does not fit {path}; the file changed since it was saved")


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


def _skip(pieces, skip: int, path: pathlib.Path, start: Pos):
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


def _pieces(f, path: pathlib.Path, start: Pos):
    offset, skip = start
    name = path.name.lower()
    zst = name.endswith(".zst")
    if offset < 0 or skip < 0 or (offset and not zst):
        raise _moved(path, start)
    if not zst and not name.endswith(".gz"):
        return _plain_pieces(f, path, skip)
    pieces = _zstd_pieces(f, path, offset) if zst else _gzip_pieces(f, path)
    return _prefetched(_skip(pieces, skip, path, start) if skip else pieces)


def iter_lines(path, *, start: Pos = (0, 0)) -> Iterator[tuple[bytes, Pos]]:
    """Each line of a (compressed) file without its b"\\n", with the Pos where the next line starts.

    For zstd files that Pos is (start offset of the frame holding the next line's first byte,
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
                end = (a, b)
                break
            i, n = 0, len(data)
            while i < n:
                if line is not None:
                    yield line, (a, b + i)
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


def iter_documents(path, *, field: str = "text", counts: dict[str, int] | None = None) -> Iterator[bytes]:
    """Every document of one file: a raw file is one (its exact bytes, even if empty), a prepared
    shard holds those its index lists, a JSONL file one a line; skips add to counts[reason]."""
    kind = file_kind(path)
    if kind == "raw":
        yield read_raw(path)
        return
    if kind == "shard":
        with Shard(path) as shard:
            yield from shard.documents()
        return
    for line, _ in iter_lines(path):
        doc = parse_record(line, field)
        if type(doc) is bytes:
            yield doc
        elif counts is not None:
            counts[doc] = counts.get(doc, 0) + 1


# --- description ----------------------------------------------------------------------------------


def describe(path, *, field: str = "text") -> dict:
    """What `bytemtp corpus-info` shows: for a prepared corpus its manifest and per-split figures;
    for any other spec the documents, bytes, file bytes and skipped records found by reading it."""
    ratio = lambda n, c: round(n / c, 3) if c else None  # noqa: E731
    if not isinstance(path, (list, tuple)) and (corpus_dir(path) / MANIFEST).is_file():
        manifest = read_manifest(path)
        splits = {name: {key: s[key] for key in ("documents", "bytes", "compressed_bytes")}
                  | {"ratio": ratio(s["bytes"], s["compressed_bytes"])} for name, s in manifest["splits"].items()}
        return {"path": str(corpus_dir(path)), "prepared": True, "manifest": manifest, "splits": splits}
    files = corpus_files(path, split=None)
    counts, documents, nbytes = {}, 0, 0
    for file in files:
        for doc in iter_documents(file, field=field, counts=counts):
            documents, nbytes = documents + 1, nbytes + len(doc)
    compressed = sum(file.stat().st_size for file in files)
    return {"path": ", ".join(os.fspath(i) for i in spec_items(path)), "prepared": False,
            "files": len(files), "documents": documents, "bytes": nbytes, "compressed_bytes": compressed,
            "ratio": ratio(nbytes, compressed), "skipped": {r: counts.get(r, 0) for r in SKIP_REASONS}}
