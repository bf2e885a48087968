"""prep on many cores and across machines: `--workers N` writes the corpus one process writes, byte
for byte; a killed worker, a worker's error and Ctrl-C leave nothing; `--part I/N` jobs joined by
`--merge` hold each split's documents of one prep of the same inputs, and a merge refuses parts
that do not belong together."""

import json
import os
import pathlib
import signal
import time

import pytest
from click.testing import CliRunner
from corpora import jsonl, make_sources, read_back, write_compressed

from bytemtp.data import intake
from bytemtp.data import merge as merge_module
from bytemtp.data.merge import merge
from bytemtp.data.prep import prepare
from bytemtp.data.shards import CorpusError, read_manifest
from bytemtp.data.integrity import verify
from bytemtp_cli.main import main

SPLITS = {"hash": dict(val_fraction=0.3), "tail": dict(val_tail=0.25), "inputs": "val"}


def _sources(tmp_path):
    """make_sources plus JSONL files whose records repeat across files (so across workers and parts)."""
    sources, _ = make_sources(tmp_path)
    more = tmp_path / "more"
    more.mkdir()
    for i in range(5):
        texts = [f"file {i} doc {j} " * (j % 7 + 1) for j in range(40)] + [f"shared across files {j}" for j in range(10)]
        write_compressed(more / f"m{i}.jsonl.zst", jsonl(texts))
    (tmp_path / "held.txt").write_text("shared across files 3")  # a val input that a train record repeats
    return [*sources, more]


def _split(method, tmp_path):
    return {"val": [tmp_path / "held.txt"]} if method == "inputs" else SPLITS[method]


def _tree(root: pathlib.Path) -> dict:
    """Every file below root with its bytes; the manifest without its time."""
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    manifest = json.loads(files.pop("manifest.json"))
    manifest.pop("created")
    return files | {"manifest.json": manifest}


def _children() -> list[int]:
    """This process's worker processes (multiprocessing spawns them with spawn_main)."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"PPid:\t{os.getpid()}\n" in (entry / "status").read_text() \
                    and b"spawn_main" in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@pytest.mark.parametrize("method", list(SPLITS))
def test_workers_write_the_corpus_one_process_writes_byte_for_byte(tmp_path, monkeypatch, method):
    monkeypatch.setattr(intake, "BATCH_BYTES", 300)  # many batches a file
    sources, split = _sources(tmp_path), _split(method, tmp_path)
    prepare(sources, tmp_path / "one", readers=0, threads=0, frame_bytes=512, max_bad_fraction=0.1, **split)
    prepare(sources, tmp_path / "three", readers=3, threads=2, frame_bytes=512, max_bad_fraction=0.1, **split)
    one, three = _tree(tmp_path / "one"), _tree(tmp_path / "three")
    assert one == three and sum(name.endswith(".zst") for name in one) == 2
    assert one["manifest.json"]["duplicates"] > 10  # copies in files read by different workers were found
    assert _children() == []


def test_a_killed_worker_leaves_no_output_and_says_so(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_text("small first file")
    (src / "b.txt").write_text("big second file " * 100_000)  # more than a pipe holds: its worker waits
    killed = []

    def kill_the_workers(done, docs):
        if not killed:
            for pid in _children():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            while set(killed) & set(_children()):
                time.sleep(0.01)

    with pytest.raises(CorpusError, match=r"prep's reading process \d+ was killed by signal 9 while reading "
                                          r".*nothing was written"):
        prepare([src], tmp_path / "out", readers=2, progress=kill_the_workers)
    assert killed and not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["src"]  # no temporary folder left


def test_ctrl_c_and_a_workers_error_leave_nothing(tmp_path):
    sources = _sources(tmp_path)

    def interrupt(done, docs):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        prepare(sources, tmp_path / "out", readers=2, progress=interrupt, max_bad_fraction=0.1)
    assert _children() == [] and sorted(p.name for p in tmp_path.iterdir()) == ["held.txt", "more", "records.jsonl.zst",
                                                                                 "texts"]
    (tmp_path / "more" / "m3.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd not a frame")
    with pytest.raises(CorpusError) as one:
        prepare(sources, tmp_path / "out", max_bad_fraction=0.1)
    with pytest.raises(CorpusError) as two:
        prepare(sources, tmp_path / "out", readers=2, max_bad_fraction=0.1)
    assert str(one.value) == str(two.value) and "m3.jsonl.zst" in str(two.value)
    assert not (tmp_path / "out").exists() and _children() == []


# five preps each, four of them with reader processes: the quick suite keeps the split by inputs
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m != "inputs" else m for m in SPLITS])
def test_parts_merged_hold_each_splits_documents_of_one_prep(tmp_path, method):
    sources, split = _sources(tmp_path), _split(method, tmp_path)
    whole = prepare(sources, tmp_path / "whole", frame_bytes=256, max_bad_fraction=0.1, **split)
    parts = [tmp_path / f"part{i}" for i in range(4)]
    for i, part in enumerate(parts):
        prepare(sources, part, part=intake.Part(i, 4), readers=2, frame_bytes=256, max_bad_fraction=0.1, **split)
    if method != "tail":  # (a tail split's pieces of two documents may be equal)
        held = [read_back(p) for p in parts]
        assert all(not (a & b) for i, a in enumerate(held) for b in held[i + 1:])  # no document in two parts
    merged = merge(parts[::-1], tmp_path / "merged")  # in any order given
    for name in ("train", "val"):
        assert read_back(tmp_path / "merged", name) == read_back(tmp_path / "whole", name), name
        for key in ("documents", "bytes", "set_sha256"):
            assert merged["splits"][name][key] == whole["splits"][name][key], (name, key)
    for key in ("duplicates", "skipped", "records", "split", "input_files"):
        assert merged[key] == whole[key], key
    assert verify(tmp_path / "merged")["documents"] == whole["splits"]["train"]["documents"] + whole["splits"]["val"]["documents"]


def test_a_merge_refuses_parts_that_do_not_belong_together(tmp_path):
    sources = _sources(tmp_path)
    kw = dict(val_fraction=0.3, max_bad_fraction=0.1)
    parts = [tmp_path / f"p{i}" for i in range(3)]
    for i, part in enumerate(parts):
        prepare(sources, part, part=intake.Part(i, 3), **kw)
    prepare(sources, tmp_path / "whole", **kw)
    prepare(sources, tmp_path / "other", part=intake.Part(1, 3), val_fraction=0.2, max_bad_fraction=0.1)
    prepare(sources[:1], tmp_path / "fewer", part=intake.Part(2, 3), **kw)
    cases = [([parts[0], parts[1]], r"parts 2/3 are missing"),
             ([parts[0], parts[1], parts[1], parts[2]], r"part 1/3 is given twice"),
             ([parts[0], tmp_path / "other", parts[2]], r"differ in split"),
             ([parts[0], parts[1], tmp_path / "fewer"], r"is a part of another prep"),
             ([tmp_path / "whole", parts[1]], r"is a whole corpus, not a part")]
    for given, message in cases:
        with pytest.raises(CorpusError, match=message):
            merge(given, tmp_path / "out")
    with pytest.raises(CorpusError, match="is one of the parts"):
        merge(parts, parts[0])
    shard = parts[1] / "train" / read_manifest(parts[1])["splits"]["train"]["shards"][0]
    data = bytearray(shard.read_bytes())
    data[20] ^= 1  # inside the first frame: it no longer decodes, or not to its bytes
    shard.write_bytes(bytes(data))
    with pytest.raises(CorpusError, match=str(parts[1])):
        merge(parts, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_merge_refuses_a_part_whose_inputs_changed_in_place_between_the_jobs(tmp_path):
    sources = _sources(tmp_path)
    kw = dict(val_fraction=0.3, max_bad_fraction=0.1)
    prepare(sources, tmp_path / "p0", part=intake.Part(0, 2), **kw)
    edited = tmp_path / "texts" / "a.txt"
    before = edited.read_bytes()
    edited.write_bytes(before.replace(b"alpha", b"omega"))  # the same name and size, other bytes
    assert len(edited.read_bytes()) == len(before)
    prepare(sources, tmp_path / "p1", part=intake.Part(1, 2), **kw)
    with pytest.raises(CorpusError, match=rf"^{tmp_path / 'p1'} and {tmp_path / 'p0'} read different documents "
                                          rf"from the input {edited} .*prepare every part again from the same files"):
        merge([tmp_path / "p0", tmp_path / "p1"], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    edited.write_bytes(before)
    prepare(sources, tmp_path / "p1-again", part=intake.Part(1, 2), **kw)
    merge([tmp_path / "p0", tmp_path / "p1-again"], tmp_path / "out")  # the same inputs again: they merge
    manifest = json.loads((tmp_path / "p0" / "manifest.json").read_text())  # a part that recorded no contents
    del manifest["part"]["contents"]
    (tmp_path / "p0" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CorpusError, match=rf"^{tmp_path / 'p0'} was prepared by a bytemtp that did not record"):
        merge([tmp_path / "p0", tmp_path / "p1-again"], tmp_path / "out2")


def test_a_merge_names_a_shard_missing_from_a_part_in_one_line(tmp_path):
    sources = [str(s) for s in _sources(tmp_path)]
    for i in range(2):
        prepare(sources, tmp_path / f"p{i}", part=intake.Part(i, 2), val_fraction=0.3, max_bad_fraction=0.1)
    shard = read_manifest(tmp_path / "p1")["splits"]["train"]["shards"][0]
    (tmp_path / "p1" / "train" / shard).unlink()
    res = CliRunner().invoke(main, ["prep", "--merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "--out",
                                    str(tmp_path / "m")])
    assert isinstance(res.exception, SystemExit) and res.exit_code == 1 and res.stdout == ""  # no traceback
    [line] = res.stderr.strip().splitlines()
    assert line.startswith(f"Error: {tmp_path / 'p1' / 'train'} lacks {shard}, which its manifest lists"), line
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.tmp-*"))
    with pytest.raises(CorpusError, match=rf"cannot copy {tmp_path / 'gone'} into the merged corpus"):
        merge_module._place(tmp_path / "gone", tmp_path / "there")  # a shard gone after the check


def test_the_cli_prepares_parts_merges_them_and_refuses_what_does_not_fit(tmp_path):
    sources = [str(s) for s in _sources(tmp_path)]
    for i in range(2):
        res = CliRunner().invoke(main, ["prep", *sources, "--out", str(tmp_path / f"p{i}"), "--part", f"{i}/2",
                                        "--workers", "2", "--max-bad-fraction", "0.1"])
        assert res.exit_code == 0, res.output
        assert f"part {i}/2: join the 2 parts with `bytemtp prep --merge" in res.stdout
    res = CliRunner().invoke(main, ["prep", "--merge", str(tmp_path / "p0"), str(tmp_path / "p1"), "--out",
                                    str(tmp_path / "m")])
    assert res.exit_code == 0 and "from 2 parts" in res.stdout, res.output
    for args, message in ((["--merge", str(tmp_path / "p0"), "--field", "body"], "--field cannot be given"),
                          ([sources[0], "--part", "2/2"], "Invalid value for --part: is not I/N"),
                          ([sources[0], "--part", "x"], "Invalid value for --part: is not I/N"),
                          (["--merge", str(tmp_path / "p0")], "parts 1/2 are missing")):
        res = CliRunner().invoke(main, ["prep", *args, "--out", str(tmp_path / "bad")])
        assert res.exit_code != 0 and "Traceback" not in res.output
        *_, line = res.stderr.strip().splitlines()
        assert message in line, res.output


def test_bench_prep_times_the_variants_and_checks_their_corpora(tmp_path):
    more = _sources(tmp_path)[-1]  # JSONL files without bad records
    res = CliRunner().invoke(main, ["bench", "prep", str(more), "--workers", "1,2", "--rounds", "2", "--parts", "3",
                                    "--vs", str(more / "m0.jsonl.zst"), "--json", str(tmp_path / "res.json")])
    assert res.exit_code == 0, res.output
    got = json.loads((tmp_path / "res.json").read_text())
    assert list(got["arms"]) == ["workers 1", "workers 2", "vs"]
    assert got["arms"]["workers 2"]["same_corpus"] and not got["arms"]["vs"]["same_corpus"]
    assert len(got["arms"]["workers 2"]["seconds"]) == 2 and got["arms"]["workers 2"]["speedup"]["median"] > 0
    assert got["parts"]["same_documents"] and len(got["parts"]["part_seconds"]) == 3
    assert "the same documents, split and set digests as one prep: yes" in res.stdout
