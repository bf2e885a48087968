"""The prepared-shard format, whole: shards (writer and reader), their index, the manifest of a
prepared corpus, the document hash, and the checks of a prepared corpus against its manifest.

`bytemtp.data.compression` decompresses corpus files and `bytemtp.data.readers` reads their formats
(shards through `Shard`); `bytemtp.data.prep` decides what goes where (dedup, split, bad records)
and writes through `ShardWriter` and `write_manifest`. This module sits below them all, so
`CorpusError` is defined here.

Shards (format 2). A shard holds documents as raw bytes, back to back, cut into independent zstd
frames of exactly `frame_bytes` of content (the last may be shorter; documents span frames freely,
so nothing is too long or has the wrong bytes), followed by its index in one zstd skippable frame,
which `zstd -dc` ignores: `zstd -dc shard-00000.zst` prints the documents themselves. The index is
little-endian uint64s: the frame count m, the document count n, the compressed size of each frame,
the content size of each frame, the length of each document, then the payload's length in bytes and
the 8 bytes b"BMTPSHD2", so it is found from the file's end. Reading needs no parsing: the
boundaries come from the index, and a frame is read with one pread and decompressed in one call.
Format-1 corpora (JSONL shards) are still read, as JSONL, by `bytemtp.data.readers`.

The manifest (`manifest.json`) holds the format version, counts, licence and, per split, its shards
and the sha256 of its documents (each as its length in 8 little-endian bytes, then its bytes, in
shard order: `hash_document`), its `set_sha256` (the sum of its documents' sha256, which does not
depend on their order: `set_digest`), and `shard_files`: per shard its file size, the sha256 of its
index frame (the bytes from the skippable frame's magic to the end of the file) and the sha256 of its
documents. `shard_files` and `set_sha256` are optional on read: older corpora lack them.

Two checks, two prices. `check_split` runs whenever a prepared corpus is opened for reading
(`corpus.corpus_files`): a stat and one pread of the index per shard, and no decompression, so a
shard replaced by another (even a well-formed shard of another corpus) or cut short is refused
before anything is read; a shard whose frames were rewritten with the same sizes and index passes
it. `integrity.verify` decodes every frame and hashes every document (`bytemtp verify`): it names the shard
and, where a frame fails to decode, the documents in it. It cannot name one document whose bytes
changed in a frame that still decodes (the manifest keeps one digest per shard, not per document:
per-document digests would make a large corpus's manifest gigabytes); it names the shard.
A manifest written before the record (no `shard_files`) gets no load-time check, and `verify`
checks its splits' documents as a whole and says that the per-shard record is missing.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import pathlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zstandard

FORMAT_VERSION = 2
READABLE_FORMATS = (1, 2)  # format 1: JSONL shards, read as JSONL
MANIFEST = "manifest.json"
SHARD_MAGIC = b"BMTPSHD2"
SKIPPABLE_MAGIC = 0x184D2A5B  # one of zstd's skippable-frame magic numbers (0x184D2A50-5F)
TRAILER_BYTES = 16  # the payload length (uint64) and SHARD_MAGIC end every shard
_REPREP = "rebuild the corpus with bytemtp prep"
_frame_decoders = threading.local()  # a ZstdDecompressor is not safe to share between threads


class CorpusError(ValueError):
    """A corpus cannot be read or written; the one-line message names the file, the offset and the fix."""


def set_digest(total: int) -> str:
    """A split's `set_sha256` as the manifest holds it: the sum modulo 2**256 of the sha256 of each
    of its documents (`doc_value`), in hex. It does not depend on the documents' order, so a corpus
    merged from parts (`bytemtp prep --merge`) has the set digest of one prep of the same inputs."""
    return f"{total % (1 << 256):064x}"


def doc_value(digest: bytes) -> int:
    """A document's sha256 (of its bytes alone) as the number `set_digest` sums."""
    return int.from_bytes(digest, "big")


def hash_document(sha, doc: bytes) -> None:
    """Add one document to a sha256 as the manifest defines it: its length in 8 little-endian
    bytes, then its bytes (so the boundaries count, not just the content)."""
    sha.update(len(doc).to_bytes(8, "little"))
    sha.update(doc)


# --- the index ------------------------------------------------------------------------------------


def encode_index(compressed: list[int], content: list[int], lengths: list[int]) -> bytes:
    """A shard's index as the skippable zstd frame that ends the file (layout in the module doc)."""
    body = np.array([len(compressed), len(lengths), *compressed, *content, *lengths], dtype="<u8").tobytes()
    size = len(body) + TRAILER_BYTES
    if size >= 1 << 32:
        raise ValueError(f"a shard index of {size} bytes does not fit a skippable frame; use smaller shards")
    return (SKIPPABLE_MAGIC.to_bytes(4, "little") + size.to_bytes(4, "little") + body
            + size.to_bytes(8, "little") + SHARD_MAGIC)


def _index_frame(fd: int, size: int) -> tuple[int, bytes] | None:
    """(offset, bytes) of the index frame that ends a file of `size` bytes, or None if the file does
    not end with a well-formed one."""
    if size < 8 + TRAILER_BYTES or os.pread(fd, len(SHARD_MAGIC), size - 8) != SHARD_MAGIC:
        return None
    payload = int.from_bytes(os.pread(fd, 8, size - TRAILER_BYTES), "little")
    start = size - payload - 8
    if start < 0 or payload % 8:
        return None
    frame = os.pread(fd, payload + 8, start)
    if frame[:4] != SKIPPABLE_MAGIC.to_bytes(4, "little") or int.from_bytes(frame[4:8], "little") != payload:
        return None
    return start, frame


def has_index(path) -> bool:
    """Whether a file ends with a prepared shard's index magic."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < 8 + TRAILER_BYTES:
                return False
            f.seek(-len(SHARD_MAGIC), os.SEEK_END)
            return f.read() == SHARD_MAGIC
    except OSError:
        return False


def shard_record(path) -> dict:
    """What the manifest records of a shard file to check it cheaply: its size and the sha256 of its
    index frame ("index_sha256" None when it has none). One stat and one pread: nothing is decoded."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        index = _index_frame(f.fileno(), size)
    return {"size": size, "index_sha256": hashlib.sha256(index[1]).hexdigest() if index else None}


# --- writing --------------------------------------------------------------------------------------


class ShardWriter:
    """Writes documents into prepared shards shard-00000.zst, shard-00001.zst, ... in directory.

    Documents go back to back into frames of exactly frame_bytes of content (a document may span
    frames); each frame is compressed as one independent zstd frame with checksum and content size.
    A shard ends after the document that brings its content to shard_bytes or more, with its index.
    threads=0 compresses in the calling thread, n > 0 in n threads, and -1 in one thread per CPU
    core; frames are written in order, so the output is the same for every thread count. Each shard
    is written as `<name>.tmp`, then fsynced and renamed when complete.
    """

    def __init__(self, directory, *, level: int = 10, frame_bytes: int = 1 << 20,
                 shard_bytes: int = 256 << 20, threads: int = 0):
        for name, value, low, high in (("level", level, 1, zstandard.MAX_COMPRESSION_LEVEL),
                                       ("frame_bytes", frame_bytes, 1, None),
                                       ("shard_bytes", shard_bytes, 1, None), ("threads", threads, -1, None)):
            if not (isinstance(value, int) and low <= value <= (high or value)):
                raise ValueError(f"{name}={value!r} is not allowed; expected an integer in [{low}, {high or 'inf'}]")
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.level, self.frame_bytes, self.shard_bytes = level, frame_bytes, shard_bytes
        workers = (os.cpu_count() or 1) if threads == -1 else threads
        self._pool = ThreadPoolExecutor(workers) if workers else None
        self._max_inflight = 2 * workers
        self._inflight = collections.deque()  # (content bytes, compressed frame or its future)
        self._local = threading.local()  # one compressor per thread: they are not thread-safe
        self._buffer = bytearray()  # content not yet in a frame
        self._file = None
        self._frames: tuple[list[int], list[int]] = ([], [])  # the open shard's compressed, content sizes
        self._lengths: list[int] = []  # the open shard's document lengths
        self._shard_content, self._shard_size = 0, 0
        self._sha, self._shard_sha = hashlib.sha256(), hashlib.sha256()
        self._set = 0  # the sum of the documents' sha256 (set_digest)
        self.shards: list[str] = []
        self.records: dict[str, dict] = {}  # per finished shard: size, index_sha256, sha256
        self.documents = self.bytes = self.compressed_bytes = 0

    def write(self, doc: bytes, digest: bytes | None = None) -> None:
        """Add one document; `digest` is its sha256 where the caller has it already."""
        self._set += doc_value(digest or hashlib.sha256(doc).digest())
        self._buffer += doc
        self._lengths.append(len(doc))
        hash_document(self._sha, doc)
        hash_document(self._shard_sha, doc)
        self.documents += 1
        self.bytes += len(doc)
        while len(self._buffer) >= self.frame_bytes:
            self._end_frame(self.frame_bytes)
        self._shard_content += len(doc)
        if self._shard_content >= self.shard_bytes:
            self._end_shard()

    def _compress(self, frame: bytes) -> bytes:
        if not hasattr(self._local, "cctx"):
            self._local.cctx = zstandard.ZstdCompressor(level=self.level, write_checksum=True,
                                                        write_content_size=True)
        return self._local.cctx.compress(frame)

    def _end_frame(self, size: int) -> None:
        frame = bytes(self._buffer[:size])
        del self._buffer[:size]
        pending = self._compress(frame) if self._pool is None else self._pool.submit(self._compress, frame)
        self._inflight.append((len(frame), pending))
        while len(self._inflight) > self._max_inflight:
            self._write_frame()

    def _write_frame(self) -> None:
        n_content, pending = self._inflight.popleft()
        compressed = pending if self._pool is None else pending.result()
        if self._file is None:
            self.shards.append(f"shard-{len(self.shards):05d}.zst")
            self._file = open(self.directory / (self.shards[-1] + ".tmp"), "wb")
        self._file.write(compressed)
        self._frames[0].append(len(compressed))
        self._frames[1].append(n_content)
        self._shard_size += len(compressed)

    def _end_shard(self) -> None:
        if self._buffer or not (self._inflight or self._frames[0]):  # a shard has at least one frame
            self._end_frame(len(self._buffer))
        while self._inflight:
            self._write_frame()
        index = encode_index(*self._frames, self._lengths)
        self._file.write(index)
        self._shard_size += len(index)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        os.replace(self._file.name, self.directory / self.shards[-1])
        self.records[self.shards[-1]] = {"size": self._shard_size, "index_sha256": hashlib.sha256(index).hexdigest(),
                                         "sha256": self._shard_sha.hexdigest()}
        self.compressed_bytes += self._shard_size
        self._file, self._frames, self._lengths, self._shard_content, self._shard_size = None, ([], []), [], 0, 0
        self._shard_sha = hashlib.sha256()

    def summary(self) -> dict:
        """This split's manifest entry (see the module doc)."""
        return {"documents": self.documents, "bytes": self.bytes, "compressed_bytes": self.compressed_bytes,
                "shards": list(self.shards), "sha256": self._sha.hexdigest(),
                "set_sha256": set_digest(self._set),
                "shard_files": {name: dict(record) for name, record in self.records.items()}}

    def close(self) -> None:
        if self._lengths:
            self._end_shard()
        if self._pool is not None:
            self._pool.shutdown()
        fsync_dir(self.directory)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
        if self._file is not None:  # drop the unfinished shard; finished ones stay
            self._file.close()
            os.remove(self._file.name)


def fsync_dir(directory) -> None:
    """Make a directory's entries (files created or renamed in it) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- reading --------------------------------------------------------------------------------------


class Shard:
    """One prepared (format 2) shard: its index, and its frames decoded on demand.

    The index is checked against the file (the frame sizes must add up to where the index begins,
    the content sizes to the documents' lengths), so a damaged or foreign file is refused, never
    misread. `frames(indices)` reads and decompresses frames strictly (checksum and size), from any
    thread; a frame that fails names the documents it holds.
    """

    def __init__(self, path):
        self.path = pathlib.Path(path)
        try:
            f = open(self.path, "rb")
        except OSError as e:
            raise CorpusError(f"cannot read {self.path}: {e.strerror}; check the path") from None
        try:
            size = os.fstat(f.fileno()).st_size
            damaged = f"{self.path} is not a readable prepared shard"
            if size < 8 + TRAILER_BYTES or os.pread(f.fileno(), len(SHARD_MAGIC), size - 8) != SHARD_MAGIC:
                raise CorpusError(f"{damaged}: it does not end with a shard index; {_REPREP}")
            index = _index_frame(f.fileno(), size)
            if index is None:
                raise CorpusError(f"{damaged}: its index frame is damaged; {_REPREP}")
            start, frame = index
            words = np.frombuffer(frame, dtype="<u8", offset=8, count=(len(frame) - 8 - TRAILER_BYTES) // 8)
            m, n = (int(w) for w in words[:2]) if len(words) >= 2 else (-1, -1)
            if m < 1 or n < 0 or len(words) != 2 + 2 * m + n:
                raise CorpusError(f"{damaged}: its index does not describe {m} frames and {n} documents; "
                                  f"{_REPREP}")
            words = words.astype(np.int64)
            self.compressed, self.content = words[2:2 + m], words[2 + m:2 + 2 * m]
            self.lengths = words[2 + 2 * m:]
            if int(self.compressed.sum()) != start or int(self.content.sum()) != int(self.lengths.sum()):
                raise CorpusError(f"{damaged}: its frames do not add up to its index; {_REPREP}")
        except BaseException:
            f.close()
            raise
        self._file = f
        self.frame_offsets = np.concatenate(([0], np.cumsum(self.compressed)))
        self.frame_ends = np.cumsum(self.content)  # content offset where each frame ends
        self.doc_ends = np.cumsum(self.lengths)  # content offset where each document ends
        self.doc_starts = self.doc_ends - self.lengths
        self.n_frames, self.n_docs = m, n

    def frames(self, indices: list[int]) -> list[np.ndarray]:
        """The content of each frame in `indices` (uint8 arrays), checked against its checksum and
        the index; consecutive frames are read with one pread. Safe to call from any thread."""
        starts, ends = self.frame_offsets[indices], self.frame_offsets[np.asarray(indices, dtype=np.int64) + 1]
        fd, out = self._file.fileno(), []
        if len(indices) and indices[-1] - indices[0] == len(indices) - 1:
            data = memoryview(os.pread(fd, int(ends[-1] - starts[0]), int(starts[0])))
            views = [data[a - starts[0]:b - starts[0]] for a, b in zip(starts.tolist(), ends.tolist())]
        else:
            views = [os.pread(fd, b - a, a) for a, b in zip(starts.tolist(), ends.tolist())]
        dctx = getattr(_frame_decoders, "dctx", None) or _set_decoder()
        for f, view, start, end in zip(indices, views, starts.tolist(), ends.tolist()):
            try:
                content = dctx.decompress(view) if len(view) == end - start else None
            except zstandard.ZstdError as e:
                raise CorpusError(f"{self.path} is corrupt: the zstd frame at byte {start} fails to decode "
                                  f"({e}); {self._held_by(f)}; {_REPREP}") from None
            if content is None or len(content) != self.content[f]:
                raise CorpusError(f"{self.path} is damaged: the zstd frame at byte {start} does not hold the "
                                  f"{int(self.content[f])} bytes its index says; {self._held_by(f)}; {_REPREP}")
            out.append(np.frombuffer(content, dtype=np.uint8))
        return out

    def _held_by(self, f: int) -> str:
        """Which documents have bytes in frame f, for an error message."""
        lo, hi = int(self.frame_ends[f] - self.content[f]), int(self.frame_ends[f])
        first = min(int(np.searchsorted(self.doc_ends, lo, side="right")), self.n_docs - 1)
        last = max(first, min(int(np.searchsorted(self.doc_ends, hi - 1, side="right")), self.n_docs - 1))
        if first < 0:
            return "it holds no document"
        docs = f"document {first}" if first == last else f"documents {first} to {last}"
        return (f"it holds {docs} of {self.n_docs} (document {first} starts at byte {int(self.doc_starts[first])} "
                f"of the shard's content)")

    def documents(self) -> Iterator[bytes]:
        """Every document of the shard, in order."""
        buf, pos, frame = b"", 0, 0
        for length in self.lengths.tolist():
            if pos + length > len(buf):
                parts, have = [buf[pos:]], len(buf) - pos
                while have < length:
                    group = list(range(frame, min(frame + 8, self.n_frames)))
                    parts += [a.tobytes() for a in self.frames(group)]
                    frame, have = group[-1] + 1, have + int(self.content[group].sum())
                buf, pos = b"".join(parts), 0
            yield buf[pos:pos + length]
            pos += length

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> Shard:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _set_decoder() -> zstandard.ZstdDecompressor:
    _frame_decoders.dctx = zstandard.ZstdDecompressor()
    return _frame_decoders.dctx


# --- the manifest ---------------------------------------------------------------------------------


def corpus_dir(path) -> pathlib.Path:
    """The directory of a prepared corpus named by its directory or its manifest.json."""
    path = pathlib.Path(path)
    return path.parent if path.name == MANIFEST else path


def read_manifest(corpus) -> dict:
    """The manifest of a prepared corpus, given its directory or its manifest.json."""
    path = corpus_dir(corpus) / MANIFEST
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CorpusError(f"{path} does not exist, so {path.parent} is not a prepared corpus; "
                          f"build one with bytemtp prep") from None
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}; check the path") from None
    except ValueError as e:
        raise CorpusError(f"{path} is not valid JSON ({e}); {_REPREP}") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("splits"), dict):
        raise CorpusError(f"{path} is not a bytemtp corpus manifest (it has no splits); {_REPREP}")
    if manifest.get("format_version") not in READABLE_FORMATS:
        raise CorpusError(f"{path} has format_version {manifest.get('format_version')!r} but this bytemtp "
                          f"reads {' and '.join(map(str, READABLE_FORMATS))}; {_REPREP}")
    return manifest


def write_manifest(directory, manifest: dict) -> None:
    """Write a corpus's manifest.json into directory and fsync it."""
    with open(pathlib.Path(directory) / MANIFEST, "w", encoding="utf-8") as f:
        f.write(json.dumps(manifest, indent=2) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --- checks against the manifest ------------------------------------------------------------------


REDO_PREP = "re-run bytemtp prep to rebuild the corpus"


def _fix(root: pathlib.Path) -> str:
    return f"{REDO_PREP}, or see what else differs with bytemtp verify {root}"


def check_split(root, name: str, split: dict, files: list[pathlib.Path]) -> None:
    """Refuse a split whose files are not the shards its manifest recorded (the load-time check).

    `files` are the files found below root/name. Each must be a shard the manifest lists, each
    listed shard must be there, and each must have the recorded size and index digest. A manifest
    without `shard_files` (written before they were recorded) is not checked.
    """
    records = split.get("shard_files")
    if records is None:
        return
    root = pathlib.Path(root)
    found = {f.relative_to(root / name).as_posix(): f for f in files}
    if extra := sorted(set(found) - set(records)):
        raise CorpusError(f"{root / name} holds {', '.join(extra)}, which its manifest does not list (it would be "
                          f"read as documents); remove it, or {_fix(root)}")
    if missing := sorted(set(records) - set(found)):
        raise CorpusError(f"{root / name} lacks {', '.join(missing)}, which its manifest lists; {_fix(root)}")
    for shard, record in records.items():
        check_record(found[shard], record, _fix(root))


def check_record(path: pathlib.Path, record: dict, fix: str) -> None:
    try:
        got = shard_record(path)
    except OSError as e:
        raise CorpusError(f"cannot read {path}: {e.strerror}; check the path") from None
    if got["size"] != record["size"]:
        raise CorpusError(f"{path} is {got['size']:,} bytes but the manifest recorded {record['size']:,}, so the "
                          f"shard was replaced or cut after prep; {fix}")
    if got["index_sha256"] != record["index_sha256"]:
        what = ("does not end with a shard index" if got["index_sha256"] is None
                else f"has an index whose sha256 is {got['index_sha256'][:12]}..., not the recorded "
                     f"{record['index_sha256'][:12]}...")
        raise CorpusError(f"{path} {what}, so the shard was replaced after prep; {fix}")
