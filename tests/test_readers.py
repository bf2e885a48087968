"""The corpus file formats behind one interface: the dispatch, every reader's typed position
through the loader's saved form, and a share resumed at every position yields exactly the rest."""

import gzip
import importlib.util
import json
import random

import numpy as np
import pytest
import zstandard

from corpora import write_table

from bytemtp.data.columnar import ArrowFile, ParquetFile, TablePos
from bytemtp.data.compression import StreamPos
from bytemtp.data.readers import READERS, JsonlFile, RawFile, RawPos, ShardFile, ShardPos, file_kind, reader_for
from bytemtp.data.steps import Share
from bytemtp.data.shards import CorpusError, ShardWriter
from bytemtp.vocab import EOS

CCTX = zstandard.ZstdCompressor(level=3, write_checksum=True)
HAVE_PYARROW = importlib.util.find_spec("pyarrow") is not None


def _docs(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [f"doc {i} ".encode() + bytes(rng.choice(b"ab \n") for _ in range(rng.randint(0, 60))) for i in range(n)]


def _jsonl(docs: list[bytes]) -> bytes:
    return b"".join(json.dumps({"text": d.decode()}).encode() + b"\n" for d in docs) + b"not json\n"


def _files(tmp_path) -> dict:
    """One file of each format and compression, with the documents each holds."""
    docs = _docs(40)
    data = _jsonl(docs[:20])
    third = len(data) // 3
    (tmp_path / "a.jsonl.zst").write_bytes(b"".join(CCTX.compress(p) for p in (data[:third], data[third:2 * third],
                                                                                data[2 * third:])))
    (tmp_path / "b.jsonl.gz").write_bytes(gzip.compress(_jsonl(docs[20:26])))
    (tmp_path / "c.jsonl").write_bytes(_jsonl(docs[26:30]))
    (tmp_path / "d.txt").write_bytes(docs[30])
    (tmp_path / "e.zst").write_bytes(CCTX.compress(docs[31]))
    with ShardWriter(tmp_path / "w", frame_bytes=32) as w:
        for doc in docs[32:]:
            w.write(doc)
    (tmp_path / "w" / w.shards[0]).rename(tmp_path / "f.zst")
    files = {"a.jsonl.zst": docs[:20], "b.jsonl.gz": docs[20:26], "c.jsonl": docs[26:30], "d.txt": [docs[30]],
             "e.zst": [docs[31]], "f.zst": docs[32:]}
    if HAVE_PYARROW:  # tables: more documents, row groups of uneven sizes
        more = _docs(30, seed=1)
        write_table(tmp_path / "g.parquet", more[:17], groups=[5, 0, 12], column_type="binary")
        write_table(tmp_path / "h.arrow", more[17:], groups=[1, 9, 3], column_type="binary")
        files |= {"g.parquet": more[:17], "h.arrow": more[17:]}
    return files


KINDS = {"a.jsonl.zst": (JsonlFile, StreamPos), "b.jsonl.gz": (JsonlFile, StreamPos), "c.jsonl": (JsonlFile, StreamPos),
         "d.txt": (RawFile, RawPos), "e.zst": (RawFile, RawPos), "f.zst": (ShardFile, ShardPos),
         "g.parquet": (ParquetFile, TablePos), "h.arrow": (ArrowFile, TablePos)}


def _ids(steps) -> np.ndarray:
    pieces = [np.insert(s.piece[0].astype(np.uint16), s.piece[1], EOS) for s in steps if s.piece is not None]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.uint16)


def test_one_dispatch_picks_each_format_and_reads_its_documents(tmp_path):
    files = _files(tmp_path)
    assert READERS[-1] is RawFile  # claims every file: the fallback
    for name, docs in files.items():
        reader = reader_for(tmp_path / name)
        cls, pos_type = KINDS[name]
        assert type(reader) is cls and file_kind(tmp_path / name) == cls.kind
        counts = {}
        assert list(reader.documents(counts=counts)) == docs
        assert counts == ({"invalid_json": 1} if cls is JsonlFile else {})
        assert type(reader.position((0, 0))) is pos_type


@pytest.mark.parametrize("n_readers", [1, 2, 3])
def test_every_position_round_trips_and_resumes_the_rest_exactly(tmp_path, n_readers):
    files = _files(tmp_path)
    for name, docs in files.items():
        reader = reader_for(tmp_path / name)
        for me in range(n_readers):
            share = Share(me, n_readers, chunk=5, ahead=2)
            start = reader.position((0, 0))
            steps = list(reader.share(start, record=3, share=share))
            mine = [d for i, d in enumerate(docs) if (3 + i) % n_readers == me]
            assert [bytes(d) for d in _split(_ids(steps))] == mine, name
            assert sum(s.documents for s in steps) == len(mine), name
            records = len(docs) + (type(reader) is JsonlFile)  # each JSONL file ends with a bad line
            assert steps[-1].record == 3 + records, name
            for i, step in enumerate(steps):
                if step.piece is None:  # the loader saves its state only between pieces
                    continue
                saved = json.loads(json.dumps(list(step.pos)))  # the state dict holds it as JSON
                pos = reader.position(saved)
                assert pos == step.pos and type(pos) is type(step.pos), (name, i)
                rest = list(reader.share(pos, record=step.record, share=share))
                assert np.array_equal(_ids(rest), _ids(steps[i + 1:])), (name, i)
                assert _plain(rest) == _plain(steps[i + 1:]), (name, i)  # the same steps, counts, positions


def _plain(steps) -> list[tuple]:
    """Steps without their pieces' arrays, to compare as values."""
    return [s._replace(piece=None if s.piece is None else len(s.piece[0])) for s in steps]


def _split(ids: np.ndarray) -> list[np.ndarray]:
    ends = np.flatnonzero(ids == EOS)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [ids[a:b].astype(np.uint8).tobytes() for a, b in zip(starts, ends)]


def test_a_position_that_does_not_fit_names_the_file(tmp_path):
    _files(tmp_path)
    share = Share(0, 1, chunk=5, ahead=2)
    cases = [("f.zst", (10**6, 0)), ("c.jsonl", (3, 0)), ("a.jsonl.zst", (10**6, 0))]
    for name, saved in cases + [("g.parquet", (4, 0)), ("h.arrow", (9, 0))] * HAVE_PYARROW:
        reader = reader_for(tmp_path / name)
        with pytest.raises(CorpusError, match=rf"resume position \({saved[0]}, 0\) does not fit .*{name}; the file"):
            list(reader.share(reader.position(saved), record=0, share=share))
    shard = reader_for(tmp_path / "f.zst")
    with pytest.raises(CorpusError, match="saved in a corpus of JSONL shards"):
        list(shard.share(shard.position((0, 7)), record=0, share=Share(0, 1, chunk=5, ahead=2, undigested=True)))
