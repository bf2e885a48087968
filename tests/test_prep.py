"""Preparing a corpus (bytemtp.data.prep): the round trip with its counts, a stable split that ignores
file order, the split by val inputs and by the tail of each document's bytes (nanoGPT's cut), an
empty split named with the fix, no half corpus and no litter on any error or signal, and refused
outputs and inputs."""

import collections
import hashlib
import os
import pathlib
import random
import re
import string
import signal
import subprocess
import sys
import time

import pytest
from corpora import make_sources, read_back

from bytemtp.data import intake as intake_lib
from bytemtp.data.corpus import corpus_files, describe, iter_documents
from bytemtp.data.prep import prepare
from bytemtp.data.readers import SKIP_REASONS
from bytemtp.data.shards import CorpusError, read_manifest
from bytemtp.data.integrity import verify


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
    assert first["split"] == {"method": "hash", "val_fraction": 0.3}
    default = prepare(sources, tmp_path / "default", max_bad_fraction=0.1)
    assert default["split"] == {"method": "hash", "val_fraction": 0.01}  # the default split is unchanged


# --- the split by val inputs and by byte tail -----------------------------------------------------


def _joined(corpus, split):
    return b"".join(d for f in corpus_files(corpus, split=split) for d in iter_documents(f))


def test_val_tail_cuts_one_document_where_nanogpt_does(tmp_path):
    n = 1_115_394  # Tiny Shakespeare's length: nanoGPT trains on data[:int(n * 0.9)], validates on the rest
    data = "".join(random.Random(0).choices(string.printable, k=n)).encode()
    (tmp_path / "book.txt").write_bytes(data)
    manifest = prepare([tmp_path / "book.txt"], tmp_path / "out", val_tail=0.1, level=1)
    train, val = _joined(tmp_path / "out", "train"), _joined(tmp_path / "out", "val")
    assert len(train) == int(n * 0.9) == 1_003_854 and train + val == data  # no byte lost or repeated
    assert train == data[:int(n * 0.9)] and val == data[int(n * 0.9):]
    assert read_back(tmp_path / "out", "train") == {train: 1} and read_back(tmp_path / "out", "val") == {val: 1}
    assert [manifest["splits"][s]["bytes"] for s in ("train", "val")] == [len(train), len(val)]
    assert manifest["split"] == {"method": "tail", "val_tail": 0.1}
    assert describe(tmp_path / "out")["manifest"]["split"] == manifest["split"]
    verify(tmp_path / "out")


def test_val_tail_splits_every_document_and_keeps_empty_ones(tmp_path):
    docs = {"a.txt": b"0123456789" * 7, "b.txt": b"x", "c.txt": b"", "d.txt": b"\x00\xff" * 50, "e.txt": b"x"}
    (tmp_path / "src").mkdir()
    for name, doc in docs.items():
        (tmp_path / "src" / name).write_bytes(doc)
    manifest = prepare([tmp_path / "src"], tmp_path / "out", val_tail=0.25)
    cut = {name: int(len(doc) * 0.75) for name, doc in docs.items()}
    assert read_back(tmp_path / "out", "train") == {docs["a.txt"][:cut["a.txt"]]: 1, b"": 1,
                                                    docs["d.txt"][:cut["d.txt"]]: 1}
    assert read_back(tmp_path / "out", "val") == {docs["a.txt"][cut["a.txt"]:]: 1, b"x": 1,
                                                  docs["d.txt"][cut["d.txt"]:]: 1}
    assert manifest["duplicates"] == 1  # e.txt is b.txt's copy: deduplicated before the cut
    assert sum(s["bytes"] for s in manifest["splits"].values()) == sum(len(d) for d in docs.values()) - 1


def test_val_inputs_go_to_val_whole_and_the_rest_to_train(tmp_path):
    sources, expected = make_sources(tmp_path)
    held = tmp_path / "held"
    (held / "deep").mkdir(parents=True)
    (held / "one.txt").write_bytes(b"a held-out document")
    (held / "deep" / "two.txt").write_bytes(b"alpha text\n")  # also a train input's text: it stays in val
    (tmp_path / "three.txt").write_bytes(b"another held-out one")
    manifest = prepare(sources, tmp_path / "out", val=[held, tmp_path / "three.txt"], max_bad_fraction=0.1)
    val = {b"a held-out document": 1, b"alpha text\n": 1, b"another held-out one": 1}
    assert read_back(tmp_path / "out", "val") == val
    assert read_back(tmp_path / "out", "train") == expected - collections.Counter([b"alpha text\n"])  # no hash split
    assert manifest["split"] == {"method": "inputs", "val_inputs": [str(held), str(tmp_path / "three.txt")],
                                 "val_files": 3}
    assert manifest["duplicates"] == 4 and manifest["input_files"] == 10
    verify(tmp_path / "out")


def test_a_split_given_twice_or_a_bad_val_input_is_refused(tmp_path):
    sources, _ = make_sources(tmp_path)
    (tmp_path / "val.txt").write_text("held out")
    refused = {
        "--val-fraction and --val choose the val split in different ways; give one of them":
            dict(val_fraction=0.01, val=[tmp_path / "val.txt"]),
        "--val and --val-tail choose": dict(val=[tmp_path / "val.txt"], val_tail=0.1),
        "--val-fraction and --val-tail choose": dict(val_fraction=0.2, val_tail=0.1),
        "--val-tail 1.0 is not allowed; expected a fraction of each document's bytes strictly between 0 and 1":
            dict(val_tail=1.0),
        "--val-tail 0 is not allowed": dict(val_tail=0),
        f"--val: {tmp_path / 'missing.txt'} does not exist; check the path": dict(val=[tmp_path / "missing.txt"]),
        f"--val: no file matches the pattern {tmp_path}/\\*.md": dict(val=[f"{tmp_path}/*.md"]),
        f"{tmp_path / 'texts' / 'a.txt'} is both an input and a --val input; give it once \\(a folder given as "
        "input keeps it for train unless you --exclude it\\)": dict(val=[tmp_path / "texts" / "a.txt"]),
    }
    for message, split in refused.items():
        with pytest.raises(ValueError, match=message):
            prepare(sources, tmp_path / "out", max_bad_fraction=0.1, **split)
    (tmp_path / "empty.jsonl").write_bytes(b"{broken\n")
    with pytest.raises(CorpusError, match=f"the val inputs {tmp_path / 'empty.jsonl'} hold no document \\(bad "
                                          r"records skipped in all inputs: invalid_json 2, not_string 1\); check them"):
        prepare(sources, tmp_path / "out", val=[tmp_path / "empty.jsonl"], max_bad_fraction=1.0)
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "v.txt").write_text("held out")
    with pytest.raises(CorpusError, match=r"no document went to train: every input is a val input or a copy of "
                                          r"one \(1 documents in val\); give inputs besides the val ones"):
        prepare([tmp_path / "copy"], tmp_path / "out", val=[tmp_path / "val.txt"])
    (tmp_path / "byte.txt").write_bytes(b"x")  # int(1 * 0.9) == 0: its one byte goes to val
    with pytest.raises(CorpusError, match=r"no byte went to train: at val_tail=0.1 every document is too short"):
        prepare([tmp_path / "byte.txt"], tmp_path / "out", val_tail=0.1)
    assert not (tmp_path / "out").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_empty_split_is_named_with_the_fix(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"{i}.txt").write_text(f"document {i}")
    notes = []
    prepare([src], tmp_path / "out", val_fraction=0.001, say=notes.append)
    assert len(notes) == 1 and "\n" not in notes[0]
    assert notes[0].startswith(f"warning: the val split of {tmp_path / 'out'} is empty")
    assert "a val fraction of 0.001 of 5 documents" in notes[0]
    assert "larger `bytemtp prep --val-fraction` (e.g. 0.5)" in notes[0] and "`bytemtp eval --split train`" in notes[0]
    with pytest.raises(CorpusError, match=rf"the val split of the prepared corpus {re.escape(str(tmp_path / 'out'))} "
                                          r"is empty \(prep "
                                          r"put none of its 5 documents there\); read another split \(train "
                                          r"or all files\), or prepare the corpus again with a larger "
                                          r"`bytemtp prep --val-fraction` or more documents"):
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
    real, seen = intake_lib.iter_documents, []

    def failing(path, **kw):
        for doc in real(path, **kw):
            seen.append(doc)
            if len(seen) == 40:
                assert (tmp_path / f".out.tmp-{os.getpid()}" / "train").is_dir()  # it is midway
                raise error
            yield doc

    monkeypatch.setattr(intake_lib, "iter_documents", failing)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP)}
    with pytest.raises(type(error)):
        prepare(sources, tmp_path / "out", max_bad_fraction=0.1, frame_bytes=64, threads=2)
    assert len(seen) == 40 and not (tmp_path / "out").exists() and _litter(tmp_path) == []
    assert {s: signal.getsignal(s) for s in handlers} == handlers  # prep's own handlers are gone


_SLOW_PREP = """
import sys, time
from bytemtp.data import intake, prep
real = intake.iter_documents
def slow(path, **kw):
    for doc in real(path, **kw):
        time.sleep(0.02)
        yield doc
intake.iter_documents = slow
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


def test_prepare_refuses_an_empty_train_split(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.txt").write_bytes(b"one")
    with pytest.raises(CorpusError, match="none to train; lower the validation fraction"):
        prepare([tmp_path / "src"], tmp_path / "out", val_fraction=1.0)
    assert not (tmp_path / "out").exists()
