import collections
import json
import random

import numpy as np
import pytest
import torch
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from bytemtp.config import DataConfig, ModelConfig
from bytemtp.data import loader as L
from bytemtp.data import readers
from bytemtp.data.corpus import corpus_files
from bytemtp.data.prep import prepare
from bytemtp.data.shards import CorpusError, ShardWriter
from bytemtp.vocab import EOS


def _model(seq_len: int, n_future: int) -> ModelConfig:
    """A model config whose windows are seq_len + n_future ids, seq_len apart."""
    return ModelConfig(n_layers=n_future + 1, seq_len=seq_len, n_future=n_future)


def _docs(n: int, seed: int = 0) -> list[bytes]:
    rng = random.Random(seed)
    return [f"doc {i:04d} ".encode() + bytes(rng.choice(b"abcdefgh \n") for _ in range(rng.randint(0, 90)))
            for i in range(n)]


def _jsonl(docs: list[bytes]) -> bytes:
    return b"".join(json.dumps({"text": d.decode()}).encode() + b"\n" for d in docs)


def _write_zst_frames(path, data: bytes, n_frames: int) -> None:
    """Independent zstd frames cut at arbitrary points (lines may span frames)."""
    cctx = zstandard.ZstdCompressor(level=3, write_checksum=True)
    cuts = sorted(random.Random(len(data)).sample(range(1, len(data)), n_frames - 1))
    pieces = [data[a:b] for a, b in zip([0] + cuts, cuts + [len(data)])]
    path.write_bytes(b"".join(cctx.compress(p) for p in pieces))


def _binary_docs(n: int, seed: int = 1) -> list[bytes]:
    """Arbitrary bytes: NUL, 0xFF, invalid UTF-8, empty documents, documents longer than a frame."""
    rng = random.Random(seed)
    return [bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 7, 40, 150]))) + bytes([i])
            if i else b"" for i in range(n)]


def _write_shard(path, docs: list[bytes], frame_bytes: int) -> None:
    with ShardWriter(path.parent / "tmp-shard", frame_bytes=frame_bytes) as w:
        for doc in docs:
            w.write(doc)
    (path.parent / "tmp-shard" / w.shards[0]).rename(path)
    (path.parent / "tmp-shard").rmdir()


@pytest.fixture
def corpus(tmp_path):
    """Uneven files: three .jsonl.zst of 1-4 frames, one .jsonl, two raw text files, two prepared
    shards of binary documents (frames of 64 and 4096 bytes)."""
    docs = _docs(131) + _binary_docs(30)
    d = tmp_path / "corpus"
    d.mkdir()
    _write_zst_frames(d / "a.jsonl.zst", _jsonl(docs[:50]), 4)
    _write_zst_frames(d / "b.jsonl.zst", _jsonl(docs[50:57]), 1)
    _write_zst_frames(d / "c.jsonl.zst", _jsonl(docs[57:100]), 3)
    (d / "d.jsonl").write_bytes(_jsonl(docs[100:129]))
    (d / "e.txt").write_bytes(docs[129])
    (d / "f.txt").write_bytes(docs[130])
    _write_shard(d / "g.zst", docs[131:155], 64)
    _write_shard(d / "h.zst", docs[155:], 4096)
    return d, docs


def _split(ids: np.ndarray) -> list[bytes]:
    """Documents from ids that end with EOS."""
    ends = np.flatnonzero(ids == EOS)
    starts = np.concatenate(([0], ends[:-1] + 1))
    return [ids[a:b].astype(np.uint8).tobytes() for a, b in zip(starts, ends)]


def _ids(piece) -> np.ndarray:
    """A stream's piece (bytes, offsets followed by EOS) as ids, by np.insert (the reference)."""
    data, at = piece
    return np.insert(data.astype(np.uint16), at, EOS)


def _epoch_docs(files, reader, n_readers, epoch=0):
    stream = L.DocumentStream(files, reader=reader, n_readers=n_readers, seed=3)
    out = []
    for piece in stream:  # stream.epoch is the epoch of the piece just yielded
        if stream.epoch > epoch:
            return _split(np.concatenate(out)) if out else []
        if stream.epoch == epoch:
            out.append(_ids(piece))


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2, 3])
def test_every_document_exactly_once_across_ranks_and_workers(corpus, world, workers):
    d, docs = corpus
    files = corpus_files(str(d))
    seen = collections.Counter()
    shares = []
    for rank in range(world):
        loader = L.ByteLoader(DataConfig(path=str(d), num_workers=workers), _model(16, 4),
                              rank=rank, world_size=world)
        for slot in range(max(1, workers)):
            stream = loader.make_packer(slot).docs
            got = _epoch_docs(files, stream.reader, stream.n_readers)
            shares.append(len(got))
            seen.update(got)
    assert seen == collections.Counter(docs)
    assert max(shares) - min(shares) <= 1


def test_each_epoch_is_complete_in_a_new_file_order(corpus):
    d, docs = corpus
    files = corpus_files(str(d))
    stream = L.DocumentStream(files, seed=3)
    assert stream.order(0) != stream.order(1) or stream.order(1) != stream.order(2)
    for epoch in range(3):
        assert collections.Counter(_epoch_docs(files, 0, 1, epoch)) == collections.Counter(docs)


def test_windows_tile_the_stream_with_an_overlap_of_n_future(corpus):
    d, docs = corpus
    files = corpus_files(str(d))
    stream = L.DocumentStream(files, seed=3)
    packer = L.WindowPacker(stream, window=20, stride=16, batch_size=1, shuffle_buffer=1)
    ids = []
    for doc in _epoch_docs(files, 0, 1):
        ids += list(doc) + [EOS]
    for k in range(len(ids) // 16 - 1):
        window = packer.next_batch()[0].tolist()
        assert window == ids[16 * k:16 * k + 20]


def test_batches_shape_and_dtype(corpus):
    d, _ = corpus
    loader = L.ByteLoader(DataConfig(path=str(d), batch_size=3, shuffle_buffer=8), _model(16, 4))
    batch = next(loader)
    assert batch.shape == (3, 20) and batch.dtype == torch.int32
    assert int(batch.max()) <= EOS


def _take(loader, n):
    return [next(loader) for _ in range(n)]


@pytest.mark.parametrize("shuffle_buffer", [5, DataConfig.shuffle_buffer])  # segments of ~5, and whole epochs
@pytest.mark.parametrize("workers", [0, 2])
def test_resumed_loader_yields_the_same_batches(corpus, workers, shuffle_buffer):
    d, _ = corpus
    cfg = DataConfig(path=str(d), batch_size=4, shuffle_buffer=shuffle_buffer, num_workers=workers, seed=7)
    make = lambda: L.ByteLoader(cfg, _model(16, 4))  # noqa: E731
    first = make()
    _take(first, 9)
    state = json.loads(json.dumps(first.state_dict()))  # a checkpoint holds it as JSON
    expected = _take(first, 140)  # runs through the end of the first epoch
    assert first.stats()["epoch"] >= 1
    resumed = make()
    resumed.load_state_dict(state)
    got = _take(resumed, 140)
    for a, b in zip(expected, got):
        assert torch.equal(a, b)


def test_a_loader_resumes_exactly_from_every_batch(corpus):
    """Every position: inside a segment, at its end, and where a batch takes the rest of one
    segment and the start of the next (batches of 3 from segments of at least 7 windows)."""
    d, _ = corpus
    cfg = DataConfig(path=str(d), batch_size=3, shuffle_buffer=7, seed=2)
    first = L.ByteLoader(cfg, _model(16, 4))
    states, batches = [], []
    while first.epoch < 2:
        states.append(json.loads(json.dumps(first.state_dict())))
        batches.append(next(first))
    segments = [state["workers"][0]["segment"] for state in states[1:]]
    assert any(s is None for s in segments) and any(s and s["taken"] % 3 for s in segments)
    for i in range(1, len(states)):
        resumed = L.ByteLoader(cfg, _model(16, 4))
        resumed.load_state_dict(states[i])
        for k, batch in enumerate(batches[i:i + 12]):
            assert torch.equal(next(resumed), batch), (i, k)


def test_warming_a_loader_changes_no_batch_and_no_state(corpus):
    """Training warms the loader before its clock starts (the first segment read): every batch,
    and every state saved, is what an unwarmed loader gives, from the start and after a resume."""
    d, _ = corpus
    cfg = DataConfig(path=str(d), batch_size=3, shuffle_buffer=7, seed=2)
    plain = L.ByteLoader(cfg, _model(16, 4))
    expected = _take(plain, 20)
    state = json.loads(json.dumps(plain.state_dict()))
    after = _take(plain, 20)
    warmed = L.ByteLoader(cfg, _model(16, 4))
    warmed.warm()
    assert all(torch.equal(a, b) for a, b in zip(expected, _take(warmed, 20)))
    resumed = L.ByteLoader(cfg, _model(16, 4))
    resumed.load_state_dict(state)
    resumed.warm()
    assert json.loads(json.dumps(resumed.state_dict())) == state
    assert all(torch.equal(a, b) for a, b in zip(after, _take(resumed, 20)))


def _epoch_windows(files, *, reader, n_readers, epochs):
    """The unshuffled tiling's windows (20 ids, 16 apart), as tuples, grouped by the epoch of the
    stream that their last id comes from."""
    ids, ends = [], []
    for epoch in range(epochs + 1):
        ids += [i for doc in _epoch_docs(files, reader, n_readers, epoch) for i in [*doc, EOS]]
        ends.append(len(ids))
    windows = [[] for _ in range(epochs)]
    for k in range((len(ids) - 20) // 16 + 1):
        epoch = int(np.searchsorted(ends, 16 * k + 20))  # the first epoch that ends at or after its last id
        if epoch < epochs:
            windows[epoch].append(tuple(ids[16 * k:16 * k + 20]))
    return windows


@pytest.mark.parametrize("shuffle_buffer", [1, 50, DataConfig.shuffle_buffer])
@pytest.mark.parametrize("reader,n_readers", [(0, 1), (1, 2)])
def test_each_epoch_hands_out_every_window_once(corpus, shuffle_buffer, reader, n_readers):
    """The shuffle only reorders the unshuffled tiling (no window cut where segments join, so
    every id is an input once), and never across an epoch's end: of the windows handed out,
    the first ones are exactly those of epoch 0, each once, then those of epoch 1."""
    d, _ = corpus
    files = corpus_files(str(d))
    expected = _epoch_windows(files, reader=reader, n_readers=n_readers, epochs=2)
    packer = L.WindowPacker(L.DocumentStream(files, reader=reader, n_readers=n_readers, seed=3),
                            window=20, stride=16, batch_size=3, shuffle_buffer=shuffle_buffer, seed=3)
    got = []
    while len(got) < sum(map(len, expected)):
        got += [tuple(row) for row in packer.next_batch().tolist()]
    n0 = len(expected[0])
    assert collections.Counter(got[:n0]) == collections.Counter(expected[0])
    assert collections.Counter(got[n0:n0 + len(expected[1])]) == collections.Counter(expected[1])
    if shuffle_buffer > 1:
        assert got[:n0] != expected[0]  # and it did shuffle


def test_a_one_document_corpus_mixes_windows_from_across_it(tmp_path):
    """A single long document (as Tiny Shakespeare is) in a prepared shard of many frames: the
    windows of each batch come from all over it, not from neighbouring stretches (a shuffle by
    blocks of 256 windows keeps each batch within 256 x 16 bytes of its 64 KiB)."""
    size = 1 << 16
    doc = np.arange(size // 2, dtype=">u2").tobytes()  # every even offset spells itself
    _write_shard(tmp_path / "a.zst", [doc], 4096)
    loader = L.ByteLoader(DataConfig(path=str(tmp_path / "a.zst"), batch_size=8), _model(16, 4))
    spreads = []
    for _ in range(20):  # all within epoch 0 (4,096 windows): offsets are multiples of 16
        offsets = [2 * (w[0] * 256 + w[1]) for w in next(loader).tolist()]
        spreads.append(max(offsets) - min(offsets))
    assert min(spreads) > size / 4 and np.mean(spreads) > size / 2, spreads


def test_resume_seeks_to_its_position_mid_shard(corpus, monkeypatch):
    d, _ = corpus
    cfg = DataConfig(path=str(d), batch_size=2, shuffle_buffer=1, seed=1)
    first = L.ByteLoader(cfg, _model(16, 4))
    # stop inside a multi-frame zstd file
    while True:
        next(first)
        docs_state = first.state_dict()["workers"][0]["docs"]
        path = first.files[first.make_packer(0).docs.order(0)[docs_state["file_index"]]]
        if path.name == "a.jsonl.zst" and docs_state["pos"][0] > 0:
            break
    starts = []
    real = readers.iter_lines

    def spy(path, *, start=(0, 0)):
        starts.append((path.name, tuple(start)))
        return real(path, start=start)

    monkeypatch.setattr(readers, "iter_lines", spy)
    resumed = L.ByteLoader(cfg, _model(16, 4))
    resumed.load_state_dict(first.state_dict())
    while not starts:  # the first batches may come from the saved tail and buffer
        next(resumed)
    assert starts[0] == ("a.jsonl.zst", tuple(docs_state["pos"]))


def test_bad_lines_are_counted_and_abort_past_the_threshold(tmp_path):
    good = _jsonl(_docs(20))
    bad = b'not json\n{"text": 3}\n[1]\n{"other": "x"}\n\xff\xfe\n\n'
    (tmp_path / "x.jsonl").write_bytes(good + bad)
    stream = L.DocumentStream([tmp_path / "x.jsonl"], max_bad_fraction=0.5)
    for _ in zip(range(21), stream):  # all of epoch 0, then the first document of epoch 1
        pass
    counts = stream.counts
    assert stream.epoch == 1 and counts["documents"] == 21 and counts["lines"] == 27
    assert counts["documents"] + sum(counts["skipped"].values()) == counts["lines"]
    assert counts["skipped"] == {"invalid_json": 1, "not_string": 1, "not_object": 1,
                                 "missing_field": 1, "invalid_utf8": 1, "empty_line": 1}
    strict = L.DocumentStream([tmp_path / "x.jsonl"], max_bad_fraction=0.1)
    with pytest.raises(CorpusError, match=r"6 of 26 records are unusable .*max_bad_fraction=0.1"):
        list(zip(range(100), strict))


def test_clear_errors(tmp_path, corpus):
    with pytest.raises(CorpusError, match="does not exist"):
        L.ByteLoader(DataConfig(path=str(tmp_path / "nope")), _model(8, 2))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError):
        L.ByteLoader(DataConfig(path=str(tmp_path / "empty")), _model(8, 2))
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a.txt").write_bytes(b"just one document")
    loader = L.ByteLoader(DataConfig(path=str(tmp_path / "one")), _model(8, 2),
                          rank=1, world_size=2)
    with pytest.raises(CorpusError, match="fewer documents than readers"):
        next(loader)
    d, _ = corpus
    state = L.ByteLoader(DataConfig(path=str(d)), _model(16, 4)).state_dict()
    other = L.ByteLoader(DataConfig(path=str(d)), _model(16, 4), rank=0, world_size=2)
    with pytest.raises(ValueError, match="same number of processes"):
        other.load_state_dict(state)
    loader = L.ByteLoader(DataConfig(path=str(d)), _model(16, 4))
    next(loader)
    changed = L.ByteLoader(DataConfig(path=str(d)), _model(32, 4))
    changed.load_state_dict(loader.state_dict())
    with pytest.raises(ValueError, match="seq_len or n_future changed"):
        next(changed)
    ordered = L.ByteLoader(DataConfig(path=str(d), shuffle_buffer=1), _model(16, 4))
    ordered.load_state_dict(loader.state_dict())  # saved part-way through a segment
    with pytest.raises(ValueError, match="shuffle_buffer > 1"):
        next(ordered)


def test_stats_count_the_documents_and_bytes_handed_out(corpus):
    """After every batch the counts are those of the ids the stream has handed to the packer:
    the windows cut so far (they tile the stream, 16 apart) and the packer's uncut tail."""
    d, docs = corpus
    files = corpus_files(str(d))
    ids = np.array([i for doc in _epoch_docs(files, 0, 1) for i in [*doc, EOS]])  # epoch 0, in order (seed 3)
    jsonl = set(docs[:129])  # the documents of a, b, c and d: one line each
    loader = L.ByteLoader(DataConfig(path=str(d), batch_size=1, shuffle_buffer=1, seed=3), _model(16, 4))
    for n in range(1, len(ids) // 16 - 2):
        next(loader)
        tail = L._unpack_ids(loader.state_dict()["workers"][0]["tail"])
        handed = ids[:16 * n + len(tail)]
        assert np.array_equal(tail, handed[16 * n:])
        n_eos = int((handed == EOS).sum())
        assert loader.stats() == {"documents": n_eos, "bytes": len(handed) - n_eos,
                                  "lines": sum(doc in jsonl for doc in _split(handed)), "skipped": {},
                                  "epoch": 0}, n


@pytest.mark.parametrize("n_readers", [1, 3])
def test_a_shard_stream_resumes_exactly_from_every_position(tmp_path, monkeypatch, n_readers):
    """Positions inside prepared shards (frame, ids of it handed out) resume to the same ids."""
    monkeypatch.setattr(L.DocumentStream, "CHUNK", 7)  # pieces that end inside frames
    docs = _binary_docs(40, seed=5)
    _write_shard(tmp_path / "a.zst", docs[:25], 64)
    _write_shard(tmp_path / "b.zst", docs[25:], 100)
    files = [tmp_path / "a.zst", tmp_path / "b.zst"]
    stream = L.DocumentStream(files, reader=n_readers - 1, n_readers=n_readers, seed=2)
    states, pieces = [], []
    for piece in stream:
        states.append(json.loads(json.dumps(stream.state_dict())))
        pieces.append(_ids(piece))
        if stream.epoch == 2:
            break
    reference = np.concatenate(pieces)
    done = np.cumsum([len(p) for p in pieces])
    for i in sorted({*range(0, len(states) - 1, max(1, len(states) // 40)), len(states) - 2}):  # ~40 points
        resumed = L.DocumentStream(files, reader=n_readers - 1, n_readers=n_readers, seed=2)
        resumed.load_state_dict(states[i])
        got, want = [], reference[done[i]:]
        for piece in resumed:
            got.append(_ids(piece))
            if sum(map(len, got)) >= len(want):
                break
        assert np.array_equal(np.concatenate(got)[:len(want)], want), i
        # the same pieces, cut at the same places: the position and the counts end where the
        # uninterrupted stream's did (every piece holds at least one id)
        assert len(got) == len(pieces) - 1 - i, i
        assert resumed.state_dict() == states[-1], i


@pytest.mark.slow
@settings(max_examples=12, deadline=None)
@given(docs=st.lists(st.binary(max_size=300), min_size=1, max_size=40, unique=True),
       frame_bytes=st.sampled_from([16, 64, 1000]), n_readers=st.integers(1, 3))
def test_any_bytes_go_through_prep_and_the_loader_exactly_once(tmp_path_factory, docs, frame_bytes, n_readers):
    """Raw files of any bytes (NUL, 0xFF, invalid UTF-8, empty, longer than a frame) come back
    from a prepared corpus equal, each exactly once per epoch across the readers."""
    root = tmp_path_factory.mktemp("prep")
    (root / "src").mkdir()
    for i, doc in enumerate(docs):
        (root / "src" / f"{i:03d}.bin").write_bytes(doc)
    manifest = prepare([root / "src"], root / "out", val_fraction=0.0, frame_bytes=frame_bytes, threads=0)
    assert manifest["splits"]["train"]["documents"] == len(docs) and manifest["skipped"] == dict.fromkeys(
        manifest["skipped"], 0)
    files = corpus_files(root / "out")
    if len(docs) < n_readers:
        return
    seen = collections.Counter()
    for epoch in (0, 1):
        for reader in range(n_readers):
            seen.update(_epoch_docs(files, reader, n_readers, epoch))
    assert seen == collections.Counter({doc: 2 for doc in docs})


def test_a_position_saved_in_another_corpus_is_refused(corpus):
    d, _ = corpus
    loader = L.ByteLoader(DataConfig(path=str(d), batch_size=2), _model(16, 4))
    next(loader)
    state = loader.state_dict()
    (d / "e.txt").write_bytes(b"a document that changed its size")
    changed = L.ByteLoader(DataConfig(path=str(d), batch_size=2), _model(16, 4))
    changed.load_state_dict(state)
    with pytest.raises(CorpusError, match="the corpus changed since this position was saved"):
        next(changed)
    docs_state = dict(state["workers"][0]["docs"])
    del docs_state["files"]  # a stream position saved before fingerprints still loads
    old = L.DocumentStream(corpus_files(str(d)))
    old.load_state_dict(docs_state)
    next(iter(old))


def test_a_jsonl_position_is_never_read_in_a_shard_prepared_again(tmp_path):
    """A position from before format 2 (no files digest) in a corpus that is now a format-2 shard."""
    _write_shard(tmp_path / "shard-00000.zst", _binary_docs(30), 64)
    stream = L.DocumentStream([tmp_path / "shard-00000.zst"])
    state = {**stream.state_dict(), "pos": [0, 7]}
    del state["files"]
    stream.load_state_dict(state)
    with pytest.raises(CorpusError, match="saved in a corpus of JSONL shards"):
        next(iter(stream))


@pytest.mark.parametrize("n", [0, 1, 5, 3000])
@pytest.mark.parametrize("k", [0, 1, 3, 255, 256, 257, 2000])
def test_write_ids_equals_np_insert(n, k):
    """Both ways of placing EOS (slices for few boundaries, a scatter for many) against np.insert."""
    rng = np.random.default_rng(n * 1000 + k)
    data = rng.integers(0, 256, n).astype(np.uint8)
    at = np.sort(rng.integers(0, n + 1, k))
    out = np.full(n + k + 5, 7, dtype=np.uint16)
    assert L.write_ids(out, data, at) == n + k
    assert np.array_equal(out[:n + k], np.insert(data.astype(np.uint16), at, EOS))
    assert (out[n + k:] == 7).all()  # nothing written past the end


def test_a_loader_dropped_mid_stream_frees_its_workers_at_once(code_corpus):
    # Nothing but the loader may hold its DataLoader: from a reference cycle the garbage collector
    # can tear the DataLoader's queues down before it stops its workers, and each worker then
    # waits out torch's 5 s join timeout (at the end of every run and validation with workers).
    import gc
    import weakref

    loader = L.ByteLoader(DataConfig(path=str(code_corpus), batch_size=2, num_workers=2),
                          ModelConfig(n_layers=10, d_model=32, n_attn_heads=2, seq_len=64))
    next(loader)
    workers = weakref.ref(loader._iter)
    gc.disable()
    try:
        del loader
        assert workers() is None, "the loader is in a reference cycle: its workers outlive it"
    finally:
        gc.enable()
