"""The prepared-shard format (bytemtp.data.shards): the writer's frames, index and shards, damaged
shards refused and never misread, the manifest's record checked when a corpus is opened, `verify`
naming the shard and the document, and format-1 corpora still read."""

import collections
import hashlib
import json
import random
import re
import shutil

import numpy as np
import pytest
from corpora import frames_of, jsonl, make_sources, read_back, write_compressed

from bytemtp.config import DataConfig, ModelConfig
from bytemtp.data import loader as L
from bytemtp.data.corpus import corpus_files, iter_documents
from bytemtp.data.prep import prepare
from bytemtp.data.readers import file_kind
from bytemtp.data.shards import CorpusError, Shard, ShardWriter, read_manifest
from bytemtp.data.integrity import verify

# --- writing --------------------------------------------------------------------------------------


def test_shard_writer_frames_index_and_shards(tmp_path):
    docs = [f"document {i} ".encode() * (i % 7 + 1) for i in range(200)] + [b"", b"\x00\xff" * 600]
    with ShardWriter(tmp_path / "w", frame_bytes=256, shard_bytes=4096) as w:
        for doc in docs:
            w.write(doc)
    shards = sorted((tmp_path / "w").iterdir())
    assert [p.name for p in shards] == w.shards and len(shards) > 2
    assert not list((tmp_path / "w").glob("*.tmp"))
    got, sha = [], hashlib.sha256()
    for path in shards:
        *frames, index = frames_of(path.read_bytes())  # zstd decoders skip the index frame: no content
        assert index == b""
        content = b"".join(frames)
        assert all(len(f) == 256 for f in frames[:-1]) and 0 < len(frames[-1]) <= 256
        with Shard(path) as shard:
            assert shard.n_frames == len(frames) and [len(f) for f in frames] == shard.content.tolist()
            assert [a.tobytes() for a in shard.frames(list(range(shard.n_frames)))] == frames
            assert shard.n_docs == len(shard.lengths) and int(shard.lengths.sum()) == len(content)
            shard_docs = list(shard.documents())
        assert b"".join(shard_docs) == content and file_kind(path) == "shard"
        assert len(content) >= 4096 or path == shards[-1]
        got += shard_docs
    assert got == docs
    for doc in docs:
        sha.update(len(doc).to_bytes(8, "little") + doc)
    assert w.summary()["sha256"] == sha.hexdigest()
    assert w.documents == len(docs) and w.bytes == sum(map(len, docs))
    assert w.compressed_bytes == sum(p.stat().st_size for p in shards)
    with ShardWriter(tmp_path / "threaded", frame_bytes=256, shard_bytes=4096, threads=2) as t:
        for doc in docs:
            t.write(doc)
    assert [p.read_bytes() for p in sorted((tmp_path / "threaded").iterdir())] == [p.read_bytes() for p in shards]
    with ShardWriter(tmp_path / "empty") as e:  # empty documents only: one empty frame
        e.write(b"")
        e.write(b"")
    assert list(iter_documents(tmp_path / "empty" / "shard-00000.zst")) == [b"", b""]


def test_a_damaged_shard_is_refused_never_misread(tmp_path):
    with ShardWriter(tmp_path / "w", frame_bytes=64) as w:
        for i in range(20):
            w.write(bytes([i]) * 50)
    path = tmp_path / "w" / "shard-00000.zst"
    good = path.read_bytes()
    with Shard(path) as shard:
        second_frame = int(shard.frame_offsets[1])
    damage = {
        "a flipped byte in a frame": good[:second_frame + 10] + bytes([good[second_frame + 10] ^ 0xFF])
        + good[second_frame + 11:],
        "a frame cut out": good[:second_frame] + good[second_frame + 20:],
        "an index that lies": good[:-40] + (10**6).to_bytes(8, "little") + good[-32:],
        "a cut trailer": good[:-20] + good[-8:],
    }
    for what, data in damage.items():
        path.write_bytes(data)
        with pytest.raises(CorpusError, match="shard-00000.zst (is corrupt|is damaged|is not a readable)"):
            list(iter_documents(path))
    path.write_bytes(good[:-3])  # no trailer: not a shard at all, so a raw document
    assert file_kind(path) == "raw"


def _without_records(root):
    """The corpus's manifest as bytemtp wrote it before it recorded shard sizes and index digests."""
    manifest = json.loads((root / "manifest.json").read_text())
    for split in manifest["splits"].values():
        del split["shard_files"]
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_verify_names_the_shard_and_the_document(tmp_path):
    sources, _ = make_sources(tmp_path)
    prepare(sources, tmp_path / "out", val_fraction=0.3, max_bad_fraction=0.1, frame_bytes=64)
    shard = tmp_path / "out" / "train" / "shard-00000.zst"
    original = shard.read_bytes()
    summary = verify(tmp_path / "out")
    assert summary["per_shard"] and summary["shards"] == 2 and summary["documents"] == sum(
        s["documents"] for s in read_manifest(tmp_path / "out")["splits"].values())
    with ShardWriter(tmp_path / "other") as w:  # a healthy shard, but not the one the manifest recorded
        for doc in iter_documents(shard):
            w.write(doc[::-1] + b"!")
    shard.write_bytes((tmp_path / "other" / "shard-00000.zst").read_bytes())
    with pytest.raises(CorpusError, match="train/shard-00000.zst is .* bytes but the manifest recorded"):
        verify(tmp_path / "out")
    shard.write_bytes(original)
    with Shard(shard) as s:
        third = int(s.frame_offsets[2])  # a byte inside the third frame: its documents are named
        first = int(np.searchsorted(s.doc_ends, int(s.frame_ends[1]), side="right"))
    shard.write_bytes(original[:third + 6] + bytes([original[third + 6] ^ 1]) + original[third + 7:])
    with pytest.raises(CorpusError, match=rf"is corrupt: the zstd frame at byte {third} .* holds documents? "
                                          rf"{first}\b.* starts at byte \d+ of the shard's content"):
        verify(tmp_path / "out")
    shard.write_bytes(original)
    verify(tmp_path / "out")
    (tmp_path / "out" / "val" / "extra.jsonl").write_bytes(b"")
    with pytest.raises(CorpusError, match="manifest lists"):
        verify(tmp_path / "out")


def _random_docs(seed: int, lengths) -> list[bytes]:
    rng = random.Random(seed)
    return [rng.randbytes(n) for n in lengths]


def test_verify_finds_rewritten_documents_that_the_load_check_cannot(tmp_path):
    """Random bytes compress to stored blocks: the same lengths give the same frame sizes, so a
    shard of other random documents has the recorded size and index; only its content differs."""
    lengths = [300, 5, 700, 0, 90]
    src = tmp_path / "src"
    src.mkdir()
    for i, doc in enumerate(_random_docs(0, lengths)):
        (src / f"{i}.bin").write_bytes(doc)
    prepare([src], tmp_path / "out", val_fraction=0.0, frame_bytes=256)
    shard = tmp_path / "out" / "train" / "shard-00000.zst"
    order = list(iter_documents(shard))
    with ShardWriter(tmp_path / "other", frame_bytes=256) as w:
        for doc in _random_docs(1, [len(d) for d in order]):
            w.write(doc)
    shard.write_bytes((tmp_path / "other" / "shard-00000.zst").read_bytes())
    assert corpus_files(tmp_path / "out") == [shard]  # size and index as recorded: the cheap check passes
    with pytest.raises(CorpusError, match="shard-00000.zst: its documents' sha256 is .* not the recorded"):
        verify(tmp_path / "out")
    _without_records(tmp_path / "out")  # an older manifest: the split's digest still catches it
    with pytest.raises(CorpusError, match="split train of .* has sha256"):
        verify(tmp_path / "out")


def test_a_replaced_shard_is_refused_when_the_corpus_is_opened(tmp_path):
    sources, _ = make_sources(tmp_path)
    prepare(sources, tmp_path / "out", val_fraction=0.3, max_bad_fraction=0.1)
    (tmp_path / "b").mkdir()
    for i in range(20):
        (tmp_path / "b" / f"{i}.txt").write_text(f"another corpus, document {i}\n" * (i + 1))
    prepare([tmp_path / "b"], tmp_path / "theirs", val_fraction=0.3)
    shard = tmp_path / "out" / "train" / "shard-00000.zst"
    original = shard.read_bytes()
    shard.write_bytes((tmp_path / "theirs" / "train" / "shard-00000.zst").read_bytes())  # well-formed, foreign
    with pytest.raises(CorpusError, match=r"train/shard-00000.zst is [\d,]+ bytes but the manifest recorded "
                                          r"[\d,]+, so the shard was replaced or cut after prep; re-run bytemtp "
                                          rf"prep to rebuild the corpus, or see what else differs with bytemtp "
                                          rf"verify {re.escape(str(tmp_path / 'out'))}$"):
        corpus_files(tmp_path / "out")
    with pytest.raises(CorpusError, match="shard-00000.zst is"):
        L.ByteLoader(DataConfig(path=str(tmp_path / "out")), ModelConfig(n_layers=2, seq_len=16, n_future=1))
    # the same bytes with two documents' lengths swapped in the index: Shard reads it, misaligned
    with Shard(tmp_path / "out" / "val" / "shard-00000.zst") as s:
        n, at = s.n_docs, -16 - 8 * s.n_docs  # the lengths end the index body, before the trailer
    val = tmp_path / "out" / "val" / "shard-00000.zst"
    data = bytearray(val.read_bytes())
    a, b = data[at:at + 8], data[at + 8:at + 16]
    assert n >= 2 and a != b
    data[at:at + 16] = b + a
    val.write_bytes(bytes(data))
    shard.write_bytes(original)
    assert corpus_files(tmp_path / "out") == [shard]  # train alone is intact
    with pytest.raises(CorpusError, match=r"val/shard-00000.zst has an index whose sha256 is \w+\.\.\., not the "
                                          r"recorded \w+\.\.\., so the shard was replaced after prep"):
        corpus_files(tmp_path / "out", split="val")
    val.write_bytes(val.read_bytes()[:-3])
    with pytest.raises(CorpusError, match="val/shard-00000.zst is .* bytes but the manifest recorded"):
        corpus_files(tmp_path / "out", split=None)
    (tmp_path / "out" / "train" / "notes.txt").write_text("a stray file would be read as a document")
    with pytest.raises(CorpusError, match=r"holds notes.txt, which its manifest does not list \(it would be read "
                                          r"as documents\); remove it"):
        corpus_files(tmp_path / "out")
    (tmp_path / "out" / "train" / "notes.txt").unlink()
    shard.unlink()
    with pytest.raises(CorpusError, match="lacks shard-00000.zst, which its manifest lists"):
        corpus_files(tmp_path / "out")


def test_a_manifest_without_the_record_loads_unchecked(tmp_path):
    """Corpora prepared before the record still load (no check is claimed: corpus-info and verify say so)."""
    sources, _ = make_sources(tmp_path)
    prepare(sources, tmp_path / "out", val_fraction=0.3, max_bad_fraction=0.1)
    _without_records(tmp_path / "out")
    (tmp_path / "out" / "train" / "shard-00000.zst").write_bytes(b"anything")
    assert [p.name for p in corpus_files(tmp_path / "out")] == ["shard-00000.zst"]
    (tmp_path / "out" / "train" / "shard-00000.zst").unlink()
    shutil.copy(tmp_path / "out" / "val" / "shard-00000.zst", tmp_path / "out" / "train")
    with pytest.raises(CorpusError, match="split train of .* has documents"):
        verify(tmp_path / "out")


def test_prepared_corpus_files_and_manifest_errors(tmp_path):
    sources, _ = make_sources(tmp_path)
    prepare(sources, tmp_path / "out", val_fraction=0.3, max_bad_fraction=0.1)
    train = corpus_files(tmp_path / "out")
    assert [p.parent.name for p in train] == ["train"]
    assert corpus_files(tmp_path / "out" / "manifest.json") == train
    assert [p.parent.name for p in corpus_files(tmp_path / "out", split=None)] == ["train", "val"]
    with pytest.raises(CorpusError, match="no split 'test'"):
        corpus_files(tmp_path / "out", split="test")
    (tmp_path / "out" / "manifest.json").write_text("{not json")
    with pytest.raises(CorpusError, match="manifest.json is not valid JSON"):
        corpus_files(tmp_path / "out")
    with pytest.raises(CorpusError, match="is not a prepared corpus"):
        read_manifest(tmp_path / "texts")


def test_a_format_1_corpus_is_still_read_as_jsonl(tmp_path):
    """Corpora prepared before format 2 hold JSONL shards; they are read as JSONL, so runs on them resume."""
    root = tmp_path / "old"
    for split, texts in (("train", ["one", "two\nlines", "three"]), ("val", ["four"])):
        (root / split).mkdir(parents=True)
        write_compressed(root / split / "shard-00000.jsonl.zst", jsonl(texts))
    content = (root / "train" / "shard-00000.jsonl.zst")
    manifest = {"format_version": 1, "splits": {
        "train": {"documents": 3, "bytes": 17, "shards": ["shard-00000.jsonl.zst"],
                  "compressed_bytes": content.stat().st_size,
                  "sha256": hashlib.sha256(jsonl(["one", "two\nlines", "three"])).hexdigest()},
        "val": {"documents": 1, "bytes": 4, "shards": ["shard-00000.jsonl.zst"],
                "compressed_bytes": (root / "val" / "shard-00000.jsonl.zst").stat().st_size,
                "sha256": hashlib.sha256(jsonl(["four"])).hexdigest()}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert read_back(root, "train") == collections.Counter([b"one", b"two\nlines", b"three"])
    with pytest.raises(CorpusError, match="format-1 corpus .* does not check; prepare its sources again"):
        verify(root)
    (root / "manifest.json").write_text(json.dumps({**manifest, "format_version": 3}))
    with pytest.raises(CorpusError, match="format_version 3 but this bytemtp reads 1 and 2; rebuild"):
        corpus_files(root)
