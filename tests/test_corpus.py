"""Corpus reading and writing on real files built in tmp_path: strict zstd, resume positions,
bad-record accounting, file discovery, and the prepare -> read round trip."""

import collections
import gzip
import hashlib
import io
import json
import os
import pathlib
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from bytemtp.config import DataConfig, ModelConfig
from bytemtp.data import loader as L
from bytemtp.data import prep as prep_lib
from bytemtp.data.compression import decompressed_size, iter_lines, read_raw
from bytemtp.data.corpus import corpus_files, describe, iter_documents, select_files
from bytemtp.data.readers import SKIP_REASONS, _parse_slowly, file_kind, parse_record
from bytemtp.data.prep import prepare
from bytemtp.data.shards import CorpusError, Shard, ShardWriter, read_manifest, verify

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


def lines_of(path, start=(0, 0)):
    return [line for line, _ in iter_lines(path, start=start)]


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


# --- reading lines and resuming -------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl", ".jsonl.gz"])
def test_every_line_is_read_and_every_position_resumes_the_rest(tmp_path, suffix):
    data = jsonl(TEXTS) + b"\n\nlast line without newline"
    path = tmp_path / f"data{suffix}"
    write_compressed(path, data)
    got = list(iter_lines(path))
    assert [line for line, _ in got] == data.split(b"\n")
    assert lines_of(path, (0, 0)) == data.split(b"\n")
    for i, (_, pos) in enumerate(got):
        assert lines_of(path, pos) == [line for line, _ in got[i + 1:]], (i, pos)


def test_zstd_position_names_the_frame_holding_the_next_line(tmp_path):
    pieces = [b"ab\n", b"cd", b"\nef\ngh\n"]  # one frame ends right after a newline, one mid-line
    sizes = [len(CCTX.compress(p)) for p in pieces]
    path = tmp_path / "f.jsonl.zst"
    path.write_bytes(zst_frames(pieces))
    second, third, end = sizes[0], sizes[0] + sizes[1], sum(sizes)
    assert list(iter_lines(path)) == [
        (b"ab", (second, 0)), (b"cd", (third, 1)), (b"ef", (third, 4)), (b"gh", (end, 0))]


@settings(max_examples=40, deadline=None)
@given(texts=st.lists(st.text(alphabet="ab\nc", max_size=6), max_size=8),
       cuts=st.lists(st.integers(0, 60), max_size=5), final_newline=st.booleans())
def test_lines_and_resume_hold_for_any_frame_cuts(tmp_path_factory, texts, cuts, final_newline):
    data = "\n".join(texts).encode() + (b"\n" if final_newline and texts else b"")
    path = tmp_path_factory.mktemp("h") / "f.jsonl.zst"
    path.write_bytes(zst_frames(cut(data, sorted(c for c in set(cuts) if c < len(data)))))
    expected = data.split(b"\n")
    if expected[-1] == b"":
        expected.pop()
    got = list(iter_lines(path))
    assert [line for line, _ in got] == expected
    for i, (_, pos) in enumerate(got):
        assert lines_of(path, pos) == expected[i + 1:]


@pytest.mark.parametrize("suffix", [".jsonl.zst", ".jsonl", ".jsonl.gz"])
def test_line_edge_cases(tmp_path, suffix):
    cases = {b"": [], b"\n": [b""], b"a\n": [b"a"], b"a": [b"a"], b"a\n\nb\n": [b"a", b"", b"b"], b"a\r\n": [b"a\r"]}
    for data, expected in cases.items():
        path = tmp_path / f"f{suffix}"
        write_compressed(path, data)
        assert lines_of(path) == expected, data


# --- strict zstd: truncation and corruption -------------------------------------------------------


def test_truncation_at_every_offset_is_an_error_unless_at_a_frame_boundary(tmp_path):
    pieces = [jsonl(TEXTS[:2]), jsonl(TEXTS[2:4]), jsonl(TEXTS[4:])]
    blob = zst_frames(pieces)
    boundaries = {0}
    for piece in pieces:
        boundaries.add(max(boundaries) + len(CCTX.compress(piece)))
    path = tmp_path / "cut.jsonl.zst"
    for n in range(len(blob)):
        path.write_bytes(blob[:n])
        if n in boundaries:
            kept = b"".join(frames_of(blob[:n]))
            assert lines_of(path) == kept.split(b"\n")[:-1]
            continue
        with pytest.raises(CorpusError, match="truncated|corrupt") as err:
            lines_of(path)
        assert str(path) in str(err.value)
    path.write_bytes(blob[:-2])
    last = sorted(boundaries)[-2]
    with pytest.raises(CorpusError, match=f"truncated.*frame at byte {last}.*{len(blob) - 2} bytes"):
        read_raw(path)


def test_a_flipped_byte_never_decodes_silently(tmp_path):
    pieces = [jsonl(TEXTS[:3]), jsonl(TEXTS[3:])]
    blob = zst_frames(pieces)
    reference = (b"".join(pieces)).split(b"\n")[:-1]
    path = tmp_path / "flip.jsonl.zst"
    errors = 0
    for i in range(len(blob)):
        damaged = bytearray(blob)
        damaged[i] ^= 0xFF
        path.write_bytes(bytes(damaged))
        try:
            got = lines_of(path)
        except CorpusError as e:
            assert str(path) in str(e) and ("corrupt" in str(e) or "truncated" in str(e))
            errors += 1
            continue
        assert got == reference, f"byte {i} flipped decodes to different content without an error"
    assert errors >= len(blob) - 4  # only bits the format ignores may flip harmlessly


def test_trailing_garbage_names_its_offset_and_skippable_frames_are_fine(tmp_path):
    blob = zst_frames([b"a\n", b"b\n"], skippable_after={0, 1})
    path = tmp_path / "g.jsonl.zst"
    path.write_bytes(blob)
    assert lines_of(path) == [b"a", b"b"]
    path.write_bytes(blob + b"not a zstd frame")
    with pytest.raises(CorpusError, match=f"corrupt: the zstd frame at byte {len(blob)}"):
        lines_of(path)


def test_read_raw_reads_every_frame_and_format(tmp_path):
    data = bytes(range(256)) * 50
    for name in ("r.zst", "r.txt.gz", "r.bin"):
        write_compressed(tmp_path / name, data)
        assert read_raw(tmp_path / name) == data
        assert decompressed_size(tmp_path / name) == len(data)
        assert list(iter_documents(tmp_path / name)) == [data]
    for name in ("e.zst", "e.gz", "e.txt", "e.jsonl.zst"):
        (tmp_path / name).write_bytes(b"")
        assert read_raw(tmp_path / name) == b""
        assert list(iter_documents(tmp_path / name)) == ([] if name.endswith(".jsonl.zst") else [b""])
    (tmp_path / "t.gz").write_bytes(gzip.compress(data)[:-10])
    with pytest.raises(CorpusError, match="t.gz is truncated"):
        read_raw(tmp_path / "t.gz")


# --- records --------------------------------------------------------------------------------------


def test_parse_record_reasons():
    assert parse_record(b'{"text": "h\\u00e9"}') == "hé".encode()
    assert parse_record(b'{"text": "a"}\r') == b"a"
    assert parse_record(b'{"body": "a"}', "body") == b"a"
    assert parse_record(b'\xef\xbb\xbf{"text": "a"}') == b"a"  # a byte order mark is not the record's
    cases = {b"": "empty_line", b"  \t\r": "empty_line", b'{"text": "\xff"}': "invalid_utf8",
             b"{nope": "invalid_json", b"[1, 2]": "not_object",
             b'"text"': "not_object", b'{"other": "a"}': "missing_field", b'{"text": 3}': "not_string",
             b'{"text": null}': "not_string"}
    for line, reason in cases.items():
        assert parse_record(line) == reason, line
    # a lone surrogate escape is kept as its WTF-8 bytes, not dropped
    assert parse_record(b'{"text": "a\\ud800b"}') == b"a\xed\xa0\x80b"
    assert set(cases.values()) == set(SKIP_REASONS)


def test_parse_record_edge_cases_match_the_json_reference():
    lines = [b'{"text": "a", "text": "b"}', b'{"text": NaN}', b'{"text": "x", "n": Infinity}',
             b'{"text": "a", "big": 123456789012345678901234567890}', b'{"text": "x"} junk',
             b'{"text": "raw\ttab"}', b'{"text": "escaped\\ttab"}',
             b"[" * 5000 + b"]" * 5000, b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b', "text": "x"}',
             b'{"text": "\\ud83d\\ude00 \\u0000 \\/"}', b'{"text": "\xed\xa0\x80"}',
             b'\xef\xbb\xbf{"text": "after a byte order mark"}', b"\xef\xbb\xbf"]
    for line in lines:
        assert parse_record(line) == _parse_slowly(line, "text"), line


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=300, deadline=None)
@given(record=st.dictionaries(st.sampled_from(["text", "meta", "t"]) | st.text(max_size=4), json_values,
                              max_size=4),
       ascii_only=st.booleans(), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                 max_size=2))
def test_parse_record_matches_the_json_reference(record, ascii_only, flips):
    """The simdjson fast path returns what the json reference returns, for valid lines and for
    lines with bytes overwritten (broken JSON, broken UTF-8, lone surrogates from text())."""
    line = bytearray(json.dumps(record, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass"))
    for at, value in flips:
        line[at % len(line)] = value
    line = bytes(line).replace(b"\n", b" ")
    assert parse_record(line) == _parse_slowly(line, "text")


def test_bad_lines_are_skipped_and_counted_so_nothing_is_lost(tmp_path):
    bad = [b"", b"{bad json", b'{"text": "\xfe"}', b"7", b'{"no": "text"}', b'{"text": ["a"]}']
    data = jsonl(["one", "two"]) + b"\n".join(bad) + b"\n" + jsonl(["three"])
    path = tmp_path / "mixed.jsonl.zst"
    write_compressed(path, data)
    counts = {}
    docs = list(iter_documents(path, counts=counts))
    assert docs == [b"one", b"two", b"three"]
    assert counts == {reason: 1 for reason in SKIP_REASONS}
    assert len(docs) + sum(counts.values()) == len(lines_of(path))


# --- finding files --------------------------------------------------------------------------------


def test_corpus_files_expands_directories_globs_and_lists(tmp_path):
    for name in ("b/2.txt", "b/1.txt", "a.jsonl", ".hidden/x.txt", "b/.secret", "c.jsonl.zst"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    rel = lambda paths: [p.relative_to(tmp_path).as_posix() for p in paths]  # noqa: E731
    assert rel(corpus_files(tmp_path)) == ["a.jsonl", "b/1.txt", "b/2.txt", "c.jsonl.zst"]
    assert rel(corpus_files(str(tmp_path / "*.jsonl*"))) == ["a.jsonl", "c.jsonl.zst"]
    assert rel(corpus_files([tmp_path / "b", str(tmp_path / "b" / "*"), tmp_path / "a.jsonl"])) == \
        ["b/1.txt", "b/2.txt", "a.jsonl"]
    with pytest.raises(CorpusError, match="missing.txt does not exist"):
        corpus_files(tmp_path / "missing.txt")
    with pytest.raises(CorpusError, match="no file matches"):
        corpus_files(str(tmp_path / "*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no files found in .*empty"):
        corpus_files(tmp_path / "empty")


def test_select_files_matches_names_and_trailing_paths(tmp_path):
    files = [tmp_path / p for p in ("lib/a.py", "lib/site-packages/x/b.py", "lib/c.txt", "lib/test/d.py")]
    rel = lambda paths: [p.relative_to(tmp_path).as_posix() for p in paths]  # noqa: E731
    assert rel(select_files(files, include=["*.py"], exclude=["site-packages/*"])) == ["lib/a.py", "lib/test/d.py"]
    assert rel(select_files(files, exclude=["test/*", "*.txt"])) == ["lib/a.py", "lib/site-packages/x/b.py"]
    assert select_files(files) == files
    with pytest.raises(CorpusError, match="no file is left of 4"):
        select_files(files, include=["*.rs"])


def test_file_kind():
    for name in ("a.jsonl", "a.jsonl.zst", "A.JSONL.GZ"):
        assert file_kind(name) == "jsonl"
    for name in ("a.zst", "a.txt", "a.py", "a.txt.zst", "a.json"):
        assert file_kind(name) == "raw"


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


def test_prepare_round_trip_counts_and_verify(tmp_path):
    sources, expected = make_sources(tmp_path)
    calls = []
    manifest = prepare(sources, tmp_path / "out", val_fraction=0.3, source_name="test", licence="CC0",
                       max_bad_fraction=0.1, progress=lambda b, d: calls.append((b, d)))
    assert read_back(tmp_path / "out") == expected
    assert manifest == read_manifest(tmp_path / "out") == read_manifest(tmp_path / "out" / "manifest.json")
    splits = manifest["splits"]
    assert splits["train"]["documents"] + splits["val"]["documents"] == sum(expected.values())
    assert splits["val"]["documents"] > 0 and splits["train"]["documents"] > 0
    assert sum(s["bytes"] for s in splits.values()) == sum(len(d) for d in expected)
    assert manifest["duplicates"] == 3 and manifest["input_files"] == 7 and manifest["format_version"] == 2
    assert manifest["skipped"] == dict.fromkeys(SKIP_REASONS, 0) | {"not_string": 1, "invalid_json": 1}
    assert (manifest["source"], manifest["licence"]) == ("test", "CC0")
    assert len(calls) >= 7 and calls[-1][1] == sum(expected.values()) + 3
    on_disk = sum(p.stat().st_size for p in corpus_files(sources, split=None))
    assert calls[-1][0] == on_disk and [b for b, _ in calls] == sorted(b for b, _ in calls)
    for name, split in splits.items():
        assert sum(read_back(tmp_path / "out", name).values()) == split["documents"]
    verify(tmp_path / "out")
    info = describe(tmp_path / "out")
    assert info["prepared"] and info["splits"]["val"]["documents"] == splits["val"]["documents"]
    plain = describe(sources)
    assert plain["documents"] == sum(expected.values()) + 3 and plain["skipped"]["invalid_json"] == 1
    assert sum(plain["skipped"].values()) == sum(manifest["skipped"].values())  # prep and corpus-info agree


def test_prepare_is_stable_and_the_split_ignores_file_order(tmp_path):
    sources, expected = make_sources(tmp_path)
    first = prepare(sources, tmp_path / "one", val_fraction=0.3, max_bad_fraction=0.1)
    second = prepare(sources, tmp_path / "two", val_fraction=0.3, max_bad_fraction=0.1)
    assert {**first, "created": None} == {**second, "created": None}
    prepare(sources[::-1], tmp_path / "rev", val_fraction=0.3, max_bad_fraction=0.1)
    for split in ("train", "val"):
        assert read_back(tmp_path / "one", split) == read_back(tmp_path / "rev", split)
    val = read_back(tmp_path / "one", "val")
    for doc in expected:
        in_val = int.from_bytes(hashlib.sha256(doc).digest()[:8], "big") / 2**64 < 0.3
        assert (doc in val) == in_val


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


def test_an_empty_split_is_named_with_the_fix(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.txt").write_text(f"document {i}")
    notes = []
    prepare([src], tmp_path / "out", val_fraction=0.001, say=notes.append)
    assert len(notes) == 1 and "\n" not in notes[0]
    assert notes[0].startswith(f"warning: the val split of {tmp_path / 'out'} is empty")
    assert "--val-fraction 0.001 of 5 documents" in notes[0] and "larger --val-fraction (e.g. 0.5)" in notes[0]
    with pytest.raises(CorpusError, match=rf"the val split of the prepared corpus {re.escape(str(tmp_path / 'out'))} "
                                          r"is empty \(prep "
                                          r"put none of its 5 documents there\); read another split \(--split train "
                                          r"or --split all\), or prepare the corpus again with a larger "
                                          r"--val-fraction or more documents"):
        corpus_files(tmp_path / "out", split="val")
    assert len(corpus_files(tmp_path / "out", split=None)) == 1  # the corpus itself is fine
    assert verify(tmp_path / "out")["documents"] == 5
    notes.clear()
    prepare([src], tmp_path / "with-val", val_fraction=0.5, say=notes.append)
    assert notes == []


# --- no litter ------------------------------------------------------------------------------------


def _litter(tmp_path):
    return sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("error", [RuntimeError("midway"), KeyboardInterrupt()])
def test_a_prep_that_fails_midway_leaves_nothing(tmp_path, monkeypatch, error):
    sources, _ = make_sources(tmp_path)
    real, seen = prep_lib.iter_documents, []

    def failing(path, **kw):
        for doc in real(path, **kw):
            seen.append(doc)
            if len(seen) == 40:
                assert (tmp_path / f".out.tmp-{os.getpid()}" / "train").is_dir()  # it is midway
                raise error
            yield doc

    monkeypatch.setattr(prep_lib, "iter_documents", failing)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(type(error)):
        prepare(sources, tmp_path / "out", max_bad_fraction=0.1, frame_bytes=64, threads=2)
    assert len(seen) == 40 and not (tmp_path / "out").exists() and _litter(tmp_path) == []
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # prep's own handlers are gone


_SLOW_PREP = """
import sys, time
from bytemtp.data import prep
real = prep.iter_documents
def slow(path, **kw):
    for doc in real(path, **kw):
        time.sleep(0.02)
        yield doc
prep.iter_documents = slow
prep.prepare([sys.argv[1]], sys.argv[2])
"""


def test_a_prep_stopped_by_sigterm_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(500):
        (src / f"{i}.txt").write_text(f"document {i}\n" * 50)
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_PREP, str(src), str(tmp_path / "out")],
                            env=dict(os.environ, PYTHONPATH=str(pathlib.Path(__file__).parent.parent)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tmp = tmp_path / f".out.tmp-{proc.pid}"
    deadline = time.monotonic() + 30
    while not (tmp / "train").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp / "train").is_dir(), proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, err.decode()  # the default SIGTERM, after the cleanup
    assert _litter(tmp_path) == [] and not (tmp_path / "out").exists()


def test_the_next_prep_removes_stale_temporary_folders_and_names_live_ones(tmp_path):
    sources, _ = make_sources(tmp_path)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid in (int(gone.stdout), live.pid):
            (tmp_path / f".out.tmp-{pid}" / "train").mkdir(parents=True)
            (tmp_path / f".out.tmp-{pid}" / "train" / "shard-00000.zst.tmp").write_bytes(b"half a shard")
        (tmp_path / ".out.tmp-1" / "train").mkdir(parents=True)  # a running pid (1 always runs) on another host
        (tmp_path / ".out.tmp-1" / ".prep-host").write_text("elsewhere\n")
        (tmp_path / ".other.tmp-99999999").mkdir()  # another output's: not this prep's business
        notes = []
        prepare(sources, tmp_path / "out", max_bad_fraction=0.1, val_fraction=0.3, say=notes.append)
        assert _litter(tmp_path) == [".other.tmp-99999999", ".out.tmp-1", f".out.tmp-{live.pid}"]
        assert len(notes) == 1 and "\n" not in notes[0]
        assert f".out.tmp-{live.pid} (process {live.pid} is running)" in notes[0]
        assert ".out.tmp-1 (made on host elsewhere)" in notes[0] and "remove them by hand" in notes[0]
        assert not (tmp_path / "out" / ".prep-host").exists() and verify(tmp_path / "out")["per_shard"]
    finally:
        live.kill()
        live.wait()


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


def test_prepare_refuses_bad_output_and_bad_input(tmp_path):
    sources, _ = make_sources(tmp_path)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(CorpusError, match="already exists and is not empty; remove it or choose another --out"):
        prepare(sources, tmp_path / "full")
    with pytest.raises(CorpusError, match=r"2 of \d+ records are bad .*invalid_json 1"):
        prepare([tmp_path / "records.jsonl.zst"], tmp_path / "strict", max_bad_fraction=0.01)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    with pytest.raises(CorpusError, match="no documents"):
        prepare([tmp_path / "empty.jsonl"], tmp_path / "none")
    assert not (tmp_path / "strict").exists() and not (tmp_path / "none").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary directory left
    (tmp_path / "ready").mkdir()  # an existing empty directory is fine
    assert prepare(sources, tmp_path / "ready", max_bad_fraction=0.1)["input_files"] == 7


# --- zstd windows and older corpora ---------------------------------------------------------------


def _long_window_frame(data: bytes, window_log: int) -> bytes:
    """A frame as `zstd --long=N` writes it for a stream of unknown size: it declares a 2**N window."""
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=window_log, enable_ldm=True)
    out = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(out, closefd=False) as w:
        w.write(data)
    return out.getvalue()


def test_long_windows_up_to_2_gib_are_read_and_larger_ones_named(tmp_path):
    data = b"a healthy long-window file\n" * 100
    for log in (30, 31):
        blob = _long_window_frame(data, log)
        assert zstandard.get_frame_parameters(blob).window_size == 2**log
        (tmp_path / f"w{log}.zst").write_bytes(blob)
        assert read_raw(tmp_path / f"w{log}.zst") == data
    # the window descriptor of a 2**31 frame, raised to 2**32 (exponent 22): beyond what is read
    blob = bytearray(_long_window_frame(data, 31))
    assert blob[5] >> 3 == 21
    blob[5] = 22 << 3
    (tmp_path / "huge.zst").write_bytes(bytes(blob))
    with pytest.raises(CorpusError, match=r"huge.zst: the zstd frame at byte 0 declares a window of 4 GiB, "
                                          r"more than the 2 GiB"):
        read_raw(tmp_path / "huge.zst")


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


def test_prepare_refuses_an_empty_train_split(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"one")
    with pytest.raises(CorpusError, match="none to train; lower the validation fraction"):
        prepare([tmp_path / "src"], tmp_path / "out", val_fraction=1.0)
    assert not (tmp_path / "out").exists()
