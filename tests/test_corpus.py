"""Corpus reading on real files built in tmp_path (bytemtp.data.corpus): strict zstd, resume
positions, bad-record accounting, file discovery, long zstd windows. Writing shards is in
test_shards.py, preparing a corpus in test_prep.py."""

import gzip
import io
import json

import pytest
import zstandard
from corpora import CCTX, TEXTS, cut, frames_of, jsonl, write_compressed, zst_frames
from hypothesis import given, settings
from hypothesis import strategies as st

from bytemtp.data.compression import decompressed_size, iter_lines, read_raw
from bytemtp.data.corpus import corpus_files, iter_documents, select_files
from bytemtp.data.readers import JSONL_SKIP_REASONS, _parse_slowly, file_kind, parse_record
from bytemtp.data.shards import CorpusError


def lines_of(path, start=(0, 0)):
    return [line for line, _ in iter_lines(path, start=start)]


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
    assert set(cases.values()) == set(JSONL_SKIP_REASONS)


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
    assert counts == {reason: 1 for reason in JSONL_SKIP_REASONS}
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
