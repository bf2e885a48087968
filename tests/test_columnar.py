"""Parquet and Arrow corpus files: documents as written (any bytes, nulls counted), every saved
position resumes exactly the rest for any share, a loader over tables and JSONL resumes exactly,
prep of a table equals prep of the same records as JSONL, Hugging Face `save_to_disk` folders, and
one-line errors naming the file (and row group)."""

import json
import random
import sys

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from corpora import jsonl, stream_cut_after_first_batch, write_table  # noqa: E402

from bytemtp.data import loader as L  # noqa: E402
from bytemtp.data.columnar import ArrowFile, ParquetFile, TablePos, _column  # noqa: E402
from bytemtp.data.corpus import corpus_files, describe  # noqa: E402
from bytemtp.data.prep import prepare  # noqa: E402
from bytemtp.data.readers import reader_for  # noqa: E402
from bytemtp.data.shards import CorpusError  # noqa: E402
from bytemtp.data.steps import Share  # noqa: E402
from bytemtp.vocab import EOS  # noqa: E402

FORMATS = {"parquet": "t.parquet", "stream": "t.arrow", "file": "t.arrow"}
GROUPS = [7, 0, 1, 23, 9]  # uneven row groups (batches), an empty one among them


def _texts(n: int, seed: int = 0) -> list[str | None]:
    rng = random.Random(seed)
    words = ["a", "hé", "✓ ok", "\x00", "", "line\n", "😀"]
    docs = ["".join(rng.choice(words) for _ in range(rng.randint(0, 12))) for _ in range(n)]
    for i in rng.sample(range(n), n // 6):
        docs[i] = None
    docs[3] = ""  # an empty document: kept, an EOS alone
    return docs


def _binary(n: int, seed: int = 1) -> list[bytes | None]:
    rng = random.Random(seed)
    docs = [bytes(rng.randrange(256) for _ in range(rng.randint(0, 40))) for _ in range(n)]
    docs[0], docs[1], docs[5] = b"\x00\xff\xfe", b"\xed\xa0\x80 invalid utf-8", None
    return docs


def _written(tmp_path, fmt: str, docs, *, column_type="string", groups=GROUPS):
    path = tmp_path / FORMATS[fmt]
    write_table(path, docs, groups=groups, column_type=column_type, fmt=fmt)
    return path


def _bytes(docs) -> list[bytes]:
    return [d if isinstance(d, bytes) else d.encode() for d in docs if d is not None]


def _ids(steps) -> np.ndarray:
    pieces = [np.insert(s.piece[0].astype(np.uint16), s.piece[1], EOS) for s in steps if s.piece is not None]
    return np.concatenate(pieces) if pieces else np.zeros(0, np.uint16)


def _split(ids: np.ndarray) -> list[bytes]:
    ends = np.flatnonzero(ids == EOS)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [ids[a:b].astype(np.uint8).tobytes() for a, b in zip(starts, ends)]


def _plain(steps) -> list[tuple]:
    return [s._replace(piece=None if s.piece is None else len(s.piece[0])) for s in steps]


TYPES = ["string", "large_string", "binary", "large_binary"] + [t for t in ("string_view", "binary_view")
                                                                 if hasattr(pa, t)]


# every format with every column type it can hold (Parquet stores view columns as plain ones)
CASES = [(f, t) for f in FORMATS for t in TYPES if not (f == "parquet" and t.endswith("view"))]


@pytest.mark.parametrize("fmt,column_type", CASES)
def test_documents_are_what_was_written_and_nulls_are_counted(tmp_path, fmt, column_type):
    docs = _binary(40) if "binary" in column_type else _texts(40)
    path = _written(tmp_path, fmt, docs, column_type=column_type)
    reader = reader_for(path)
    assert type(reader) is (ParquetFile if fmt == "parquet" else ArrowFile)
    counts = {}
    assert list(reader.documents(counts=counts)) == _bytes(docs)
    assert counts == {"null": docs.count(None)}
    assert describe(str(path))["skipped"]["null"] == docs.count(None)  # corpus-info shows them


def test_a_column_is_read_from_its_buffers_with_the_arrays_offset_and_nulls():
    """The fast path (offsets and data as numpy arrays) against the reference, to_pylist."""
    whole = pa.array(["ab", None, "", "cde", "f", None, "✓"] * 3)
    for arr in (whole, whole[4:], whole[5:9], whole.cast(pa.large_string())[2:], whole[:0]):
        for chunks in ([arr], [arr[:3], arr[3:]], [arr[:0], arr]):
            data, off, null = _column(pa, chunks)
            want = arr.to_pylist()
            got = [None if null is not None and null[i] else data[off[i]:off[i + 1]].tobytes().decode()
                   for i in range(len(off) - 1)]
            assert got == want


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n_readers", [1, 2, 3])
def test_every_position_round_trips_and_resumes_the_rest_exactly(tmp_path, fmt, n_readers):
    docs = _texts(sum(GROUPS))
    path = _written(tmp_path, fmt, docs)
    reader = reader_for(path)
    for me in range(n_readers):
        for chunk in (1, 9, 10**6):  # a document a piece, several, a whole group
            share = Share(me, n_readers, chunk=chunk, ahead=1)
            steps = list(reader.share(reader.position((0, 0)), record=4, share=share))
            mine = [d for i, d in enumerate(docs) if (4 + i) % n_readers == me]
            assert _split(_ids(steps)) == _bytes(mine)
            assert sum(s.documents for s in steps) == len(_bytes(mine))
            assert [s.skipped for s in steps if s.skipped] == ["null"] * mine.count(None)
            assert sum(s.lines for s in steps) == len(mine)  # every row of the reader's, null or not
            assert steps[-1].record == 4 + len(docs) and steps[-1].pos == (len(GROUPS), 0)
            for s in steps:
                if s.piece is not None and len(s.piece[1]) > 1:
                    assert len(s.piece[0]) <= chunk  # several documents only within the chunk
            for i, step in enumerate(steps):
                if step.piece is None:  # the loader saves its state only right after a piece
                    continue
                pos = reader.position(json.loads(json.dumps(list(step.pos))))
                assert pos == step.pos and type(pos) is TablePos
                rest = list(reader.share(pos, record=step.record, share=share))
                assert np.array_equal(_ids(rest), _ids(steps[i + 1:])), (me, chunk, i)
                assert _plain(rest) == _plain(steps[i + 1:]), (me, chunk, i)
                skipped = sum(s.skipped is not None for s in steps[:i + 1] + rest)
                assert skipped == mine.count(None)  # every null counted once across the resume


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_position_that_does_not_fit_names_the_file(tmp_path, fmt):
    path = _written(tmp_path, fmt, _texts(sum(GROUPS)))
    reader = reader_for(path)
    for saved in ((len(GROUPS) + 1, 0), (0, GROUPS[0] + 1), (len(GROUPS), 1)):
        with pytest.raises(CorpusError, match=rf"resume position \({saved[0]}, {saved[1]}\) does not fit .*t\.\w+; "
                                              "the file changed"):
            list(reader.share(reader.position(saved), record=0, share=Share(0, 1, chunk=5, ahead=1)))


@pytest.mark.parametrize("n_readers", [1, 3])
def test_a_stream_over_tables_and_jsonl_resumes_exactly_from_every_position(tmp_path, monkeypatch, n_readers):
    monkeypatch.setattr(L.DocumentStream, "CHUNK", 11)  # pieces of a few documents
    docs = _texts(90, seed=4)
    write_table(tmp_path / "a.parquet", docs[:40], groups=[13, 0, 27])
    (tmp_path / "b.jsonl").write_bytes(jsonl([d for d in docs[40:60] if d is not None]))
    write_table(tmp_path / "c.arrow", docs[60:], groups=[5, 25], fmt="stream")
    files = [tmp_path / n for n in ("a.parquet", "b.jsonl", "c.arrow")]
    stream = L.DocumentStream(files, reader=n_readers - 1, n_readers=n_readers, seed=2, max_bad_fraction=0.5)
    states, pieces = [], []
    for piece in stream:
        states.append(json.loads(json.dumps(stream.state_dict())))
        pieces.append(np.insert(piece[0].astype(np.uint16), piece[1], EOS))
        if stream.epoch == 2:
            break
    assert states[-1]["counts"]["skipped"]["null"] > 0
    reference, done = np.concatenate(pieces), np.cumsum([len(p) for p in pieces])
    for i in range(len(states) - 1):
        resumed = L.DocumentStream(files, reader=n_readers - 1, n_readers=n_readers, seed=2, max_bad_fraction=0.5)
        resumed.load_state_dict(states[i])
        got, want = [], reference[done[i]:]
        for piece in resumed:
            got.append(np.insert(piece[0].astype(np.uint16), piece[1], EOS))
            if sum(map(len, got)) >= len(want):
                break
        assert np.array_equal(np.concatenate(got)[:len(want)], want), i
        assert len(got) == len(pieces) - 1 - i, i
        assert resumed.state_dict() == states[-1], i  # the same position and counts, nulls included


def test_prep_of_a_table_equals_prep_of_the_same_records_as_jsonl(tmp_path):
    docs = [d for d in _texts(200, seed=7) if d is not None]
    write_table(tmp_path / "a.parquet", docs, groups=[50, 77, len(docs) - 127])
    (tmp_path / "a.jsonl").write_bytes(jsonl(docs))
    table = prepare([tmp_path / "a.parquet"], tmp_path / "from-parquet", val_fraction=0.2)
    lines = prepare([tmp_path / "a.jsonl"], tmp_path / "from-jsonl", val_fraction=0.2)
    for split in ("train", "val"):
        for key in ("documents", "bytes", "sha256"):
            assert table["splits"][split][key] == lines["splits"][split][key], (split, key)
    assert table["duplicates"] == lines["duplicates"] and table["skipped"] == lines["skipped"]
    write_table(tmp_path / "nulls.parquet", [*docs, None, None], groups=[len(docs) + 2])
    with_nulls = prepare([tmp_path / "nulls.parquet"], tmp_path / "with-nulls", val_fraction=0.2, max_bad_fraction=0.05)
    assert with_nulls["skipped"]["null"] == 2
    assert with_nulls["splits"]["train"]["sha256"] == lines["splits"]["train"]["sha256"]


# --- Hugging Face save_to_disk folders ------------------------------------------------------------


def test_a_saved_dataset_folder_is_its_arrow_files_in_order(tmp_path):
    """By hand: state.json's _data_files give the order (here not the sorted one); the folder's JSON
    files are no documents; a DatasetDict's splits come in its order."""
    ds = tmp_path / "dict" / "train"
    ds.mkdir(parents=True)
    write_table(ds / "data-00001-of-00002.arrow", ["one", "two"], groups=[2])
    write_table(ds / "data-00000-of-00002.arrow", ["three"], groups=[1])
    (ds / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00001-of-00002.arrow"},
                                                                {"filename": "data-00000-of-00002.arrow"}]}))
    (ds / "dataset_info.json").write_text("{}")
    test = tmp_path / "dict" / "test"
    test.mkdir()
    write_table(test / "data-00000-of-00001.arrow", ["four"], groups=[1])
    (test / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}]}))
    (tmp_path / "dict" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    assert corpus_files(str(ds)) == [ds / "data-00001-of-00002.arrow", ds / "data-00000-of-00002.arrow"]
    assert corpus_files(str(tmp_path / "dict")) == [*corpus_files(str(ds)), test / "data-00000-of-00001.arrow"]
    (ds / "data-00000-of-00002.arrow").unlink()
    with pytest.raises(CorpusError, match=r"data-00000-of-00002.arrow, listed in .*state.json, does not exist"):
        corpus_files(str(ds))


def test_a_dataset_saved_by_hugging_face_datasets_reads_in_its_order(tmp_path):
    datasets = pytest.importorskip("datasets")
    texts = [f"document {i} " * (i % 5) for i in range(60)]
    train = datasets.Dataset.from_dict({"text": texts, "id": list(range(60))})
    test = datasets.Dataset.from_dict({"text": ["held out", "also held out"], "id": [0, 1]})
    train.save_to_disk(str(tmp_path / "train-only"), num_shards=3)
    files = corpus_files(str(tmp_path / "train-only"))
    assert [f.suffix for f in files] == [".arrow"] * 3
    assert [d for f in files for d in reader_for(f).documents()] == [t.encode() for t in texts]
    datasets.DatasetDict({"validation": test, "train": train}).save_to_disk(str(tmp_path / "both"))
    docs = [d for f in corpus_files(str(tmp_path / "both")) for d in reader_for(f).documents()]
    assert docs == [b"held out", b"also held out", *(t.encode() for t in texts)]


# --- errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_missing_or_non_text_column_is_one_line_naming_the_file(tmp_path, fmt):
    path = _written(tmp_path, fmt, _texts(sum(GROUPS)))
    with pytest.raises(CorpusError, match=rf"^{path} has no column 'body'; its text columns are 'text': choose "
                                          "one with --field"):
        list(reader_for(path, field="body").documents())
    with pytest.raises(CorpusError, match=rf"^column 'n' of {path} is of type int64, not text .*--field"):
        list(reader_for(path, field="n").share(TablePos(0, 0), record=0, share=Share(0, 1, chunk=5, ahead=1)))


def test_a_damaged_or_cut_file_names_the_file_and_the_row_group(tmp_path):
    import pyarrow.parquet as pq

    docs = [f"word{i} " * 50 for i in range(60)]
    write_table(tmp_path / "a.parquet", docs, groups=[10, 0, 25, 25])
    data = bytearray((tmp_path / "a.parquet").read_bytes())
    (tmp_path / "cut.parquet").write_bytes(data[:len(data) // 2])
    with pytest.raises(CorpusError, match=r"cut\.parquet is not a readable Parquet file, damaged or cut short \("):
        list(reader_for(tmp_path / "cut.parquet").documents())
    column = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(2).column(0)
    at = column.dictionary_page_offset + 40  # inside the page: its checksum fails
    data[at:at + 8] = bytes(b ^ 0x5A for b in data[at:at + 8])
    (tmp_path / "bad.parquet").write_bytes(data)
    with pytest.raises(CorpusError, match=r"bad\.parquet: row group 2 cannot be read, the file is damaged"):
        list(reader_for(tmp_path / "bad.parquet").documents())
    write_table(tmp_path / "a.arrow", docs, groups=[10, 25, 25], fmt="stream")
    data = (tmp_path / "a.arrow").read_bytes()
    (tmp_path / "cut.arrow").write_bytes(data[:len(data) * 2 // 3])
    reader = reader_for(tmp_path / "cut.arrow")
    with pytest.raises(CorpusError, match=r"cut\.arrow: record batch 2 cannot be read, the file is damaged or cut"):
        list(reader.share(TablePos(0, 0), record=0, share=Share(0, 1, chunk=100, ahead=1)))


def test_without_pyarrow_reading_a_table_says_how_to_get_it(tmp_path, monkeypatch):
    write_table(tmp_path / "a.parquet", ["x"], groups=[1])
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    reader = reader_for(tmp_path / "a.parquet")  # the dispatch needs no pyarrow
    with pytest.raises(CorpusError, match=r"^reading .*a\.parquet needs pyarrow: pip install 'bytemtp\[parquet\]'$"):
        list(reader.documents())


def test_an_arrow_stream_cut_between_batches_is_refused_not_read_short(tmp_path):
    docs = [f"row {i} " * 20 for i in range(30)]
    whole = tmp_path / "whole.arrow"
    cut = stream_cut_after_first_batch(whole, docs, groups=[10, 10, 10])
    assert list(reader_for(whole).documents()) == _bytes(docs)  # closed: read whole
    (tmp_path / "cut.arrow").write_bytes(cut)
    message = (rf"^{tmp_path / 'cut.arrow'} ends without the Arrow end-of-stream marker after 1 record batch\(es\): "
               r"the writer was cut off\? .*write the file again")
    with pytest.raises(CorpusError, match=message):
        list(reader_for(tmp_path / "cut.arrow").documents())
    with pytest.raises(CorpusError, match=message):  # the loader's read, from the start and resumed
        list(reader_for(tmp_path / "cut.arrow").share(TablePos(0, 0), record=0, share=Share(0, 1, chunk=100, ahead=1)))
    with pytest.raises(CorpusError, match=message):
        list(reader_for(tmp_path / "cut.arrow").share(TablePos(1, 0), record=10, share=Share(0, 1, chunk=100, ahead=0)))
    with pytest.raises(CorpusError, match=message):
        prepare([tmp_path / "cut.arrow"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # a stream of the first Arrow versions ends with 4 zero bytes: closed too
    old = tmp_path / "old" / "legacy.arrow"
    old.parent.mkdir()
    stream_cut_after_first_batch(old, docs, groups=[15, 15], legacy=True)
    assert old.read_bytes()[-4:] == bytes(4) and list(reader_for(old).documents()) == _bytes(docs)
    # the file format ends with a footer and its magic: a cut one does not open
    write_table(tmp_path / "file.arrow", docs, groups=[10, 20], fmt="file")
    (tmp_path / "cut-file.arrow").write_bytes((tmp_path / "file.arrow").read_bytes()[:-40])
    with pytest.raises(CorpusError, match=r"cut-file\.arrow is not a readable Arrow IPC file, damaged or cut short"):
        list(reader_for(tmp_path / "cut-file.arrow").documents())
