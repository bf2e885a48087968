"""Corpus files the corpus, shard and prep tests share: zstd frames cut where a test says, JSONL
records, files compressed by their suffix, a folder of sources with bad records and duplicates,
and the documents a corpus reads back. Imported as a plain module (`from corpora import ...`)."""

import collections
import gzip
import json
import struct

import zstandard

from bytemtp.data.corpus import corpus_files, iter_documents

CCTX = zstandard.ZstdCompressor(level=3, write_checksum=True, write_content_size=True)
SKIPPABLE = struct.pack("<II", 0x184D2A50, 3) + b"abc"


def zst_frames(pieces, *, skippable_after=()):
    """Concatenate independently compressed frames, with a skippable frame after the given indices."""
    out = b""
    for i, piece in enumerate(pieces):
        out += CCTX.compress(piece)
        if i in skippable_after:
            out += SKIPPABLE
    return out


def cut(data: bytes, at) -> list[bytes]:
    at = [0, *at, len(data)]
    return [data[a:b] for a, b in zip(at, at[1:])]


def frames_of(blob: bytes) -> list[bytes]:
    """Decompressed content of each frame, walked independently of bytemtp.data.corpus."""
    out = []
    while blob:
        dobj = zstandard.ZstdDecompressor().decompressobj()
        out.append(dobj.decompress(blob))
        assert dobj.eof
        blob = dobj.unused_data
    return out


def jsonl(texts) -> bytes:
    return b"".join(json.dumps({"text": t}, ensure_ascii=False).encode() + b"\n" for t in texts)


def write_compressed(path, data: bytes):
    """Write data to path compressed by its suffix: several zstd frames cut mid-line, gzip, or plain."""
    name = str(path)
    if name.endswith(".zst"):
        third = len(data) // 3
        path.write_bytes(zst_frames(cut(data, [third, third + 1, 2 * third + 5] if data else []),
                                    skippable_after={0}))
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(data[: len(data) // 2]) + gzip.compress(data[len(data) // 2:]))
    else:
        path.write_bytes(data)


TEXTS = ["plain", "with\nnewline and \"quotes\"", "ünïcödé ☃ 𝄞", "line\u2028separator", "x" * 300, "",
         "tab\there"]


def make_sources(tmp_path):
    """A folder of text files and a .jsonl.zst with bad lines and duplicates; returns (sources, docs)."""
    texts = tmp_path / "texts"
    (texts / "sub").mkdir(parents=True)
    files = {"a.txt": "alpha text\n", "sub/b.py": "print('b')\n", "c.txt": "shared document", "empty.txt": ""}
    for name, text in files.items():
        (texts / name).write_text(text, encoding="utf-8")
    (texts / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))  # not UTF-8: kept as it is
    (texts / "bin.dat").write_bytes(b"\x00\xff\xfe binary \x80")
    records = [f"record {i} " + "é" * (i % 5) for i in range(60)] + TEXTS + ["shared document", "record 3 ééé"]
    lines = jsonl(records) + b'{"text": 1}\n{broken\n'
    write_compressed(tmp_path / "records.jsonl.zst", lines)
    expected = collections.Counter({t.encode() for t in set(records) | {"alpha text\n", "print('b')\n", ""}}
                                   | {"caf\xe9".encode("latin-1"), b"\x00\xff\xfe binary \x80"})
    return [texts, tmp_path / "records.jsonl.zst"], expected


def read_back(corpus, split=None):
    return collections.Counter(d for f in corpus_files(corpus, split=split) for d in iter_documents(f))


def write_table(path, docs, *, groups, column_type="string", fmt=None, compression="zstd"):
    """Documents (None for a null) as a one-column table "text" (plus an int column "n") in row
    groups (Parquet) or record batches (Arrow) of the given sizes; fmt "parquet", "stream" (Arrow
    IPC stream, as Hugging Face datasets writes) or "file" (Arrow IPC file), by default from the
    suffix (.arrow: stream). pyarrow is imported here: a test that calls this needs it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert sum(groups) == len(docs), (groups, len(docs))
    fmt = fmt or ("parquet" if str(path).endswith(".parquet") else "stream")
    t = getattr(pa, column_type)()
    schema = pa.schema([("text", t), ("n", pa.int64())])
    tables, at = [], 0
    for size in groups:
        part = docs[at:at + size]
        tables.append(pa.table({"text": pa.array(part, type=t), "n": pa.array(range(at, at + size), pa.int64())},
                               schema=schema))
        at += size
    if fmt == "parquet":
        with pq.ParquetWriter(path, schema, compression=compression, write_page_checksum=True) as writer:
            for table in tables:
                writer.write_table(table, row_group_size=max(1, len(table)))
        return
    with pa.OSFile(str(path), "wb") as sink:
        writer = (pa.ipc.new_stream if fmt == "stream" else pa.ipc.new_file)(sink, schema)
        for table in tables:
            writer.write_batch(pa.record_batch([table.column(0).combine_chunks(), table.column(1).combine_chunks()],
                                               schema=schema))
        writer.close()


def stream_cut_after_first_batch(path, docs, *, groups, legacy=False) -> bytes:
    """Write docs as an Arrow IPC stream (one string column "text") in batches of `groups` rows to
    path, closed; return the bytes the file held right after its first batch: what a writer killed
    there leaves (no end-of-stream marker). `legacy`: the format of Arrow before 0.15."""
    import pyarrow as pa

    schema = pa.schema([("text", pa.string())])
    cut, at = None, 0
    with open(path, "wb") as f:
        writer = pa.ipc.new_stream(f, schema, options=pa.ipc.IpcWriteOptions(use_legacy_format=legacy))
        for size in groups:
            writer.write_batch(pa.record_batch([pa.array(docs[at:at + size], pa.string())], schema=schema))
            at += size
            f.flush()
            cut = path.read_bytes() if cut is None else cut
        writer.close()
    return cut
