"""The corpus commands' user-facing lines: `bytemtp verify`, prep's note on an empty split, prep's
split by --val inputs and by --val-tail as prep and corpus-info show it (and its refusals), and
eval, bench and plot on a corpus whose val split is empty (one line, exit status 1, no traceback),
and verify of files that are not prepared (a Parquet file), with prep's one line for a bad --field."""

import dataclasses
import json

import pytest
from click.testing import CliRunner
from corpora import stream_cut_after_first_batch, write_table

from bytemtp import config_io
from bytemtp.data.prep import prepare
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import save_checkpoint
from bytemtp_cli.main import main


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _error_line(res) -> str:
    """The one line a failed command leaves: stdout is empty, the error ends stderr, no traceback."""
    assert res.exit_code == 1, res.output
    assert res.stdout == "" and "Traceback" not in res.output
    *_, line = res.stderr.strip().splitlines()
    assert line.startswith("Error: ")
    return line


def _texts(root, n, word="document"):
    root.mkdir(parents=True)
    for i in range(n):
        (root / f"{i}.txt").write_text(f"{word} {i}\n" * (i + 1))
    return root


def test_verify_says_ok_in_one_line_and_refuses_a_replaced_shard(tmp_path):
    prepare([_texts(tmp_path / "src", 30)], tmp_path / "out", val_fraction=0.2)
    res = run("verify", tmp_path / "out")
    assert res.exit_code == 0, res.output
    assert res.stdout.count("\n") == 1 and res.stdout.startswith(f"OK {tmp_path / 'out'}: 30 documents (")
    assert "in 2 shard(s) of 2 split(s) match the manifest's sha256\n" == res.stdout.split(") ", 1)[1]
    prepare([_texts(tmp_path / "theirs-src", 30, "other")], tmp_path / "theirs", val_fraction=0.2)
    shard = tmp_path / "out" / "train" / "shard-00000.zst"
    shard.write_bytes((tmp_path / "theirs" / "train" / "shard-00000.zst").read_bytes())
    line = _error_line(run("verify", tmp_path / "out"))
    assert str(shard) in line and "re-run bytemtp prep" in line
    line = _error_line(run("verify", tmp_path / "nothing"))
    assert "is not a prepared corpus" in line


def test_verify_says_when_the_manifest_predates_the_record(tmp_path):
    prepare([_texts(tmp_path / "src", 10)], tmp_path / "out", val_fraction=0.2)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    for split in manifest["splits"].values():
        del split["shard_files"]
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(manifest))
    res = run("verify", tmp_path / "out")
    assert res.exit_code == 0 and res.stdout.count("\n") == 1
    assert "predates per-shard records" in res.stdout and "prepare it again to record them" in res.stdout
    info = run("corpus-info", tmp_path / "out")
    assert "integrity: no per-shard record" in info.stdout


def test_verify_refuses_a_prepared_corpus_whose_manifest_is_gone(tmp_path):
    prepare([_texts(tmp_path / "src", 10)], tmp_path / "out", val_fraction=0.2)
    (tmp_path / "out" / "manifest.json").unlink()
    for given in (tmp_path / "out", tmp_path / "out" / "train", f"{tmp_path / 'out'}/*/*.zst"):
        line = _error_line(run("verify", given))
        assert line.startswith(f"Error: {tmp_path / 'out'} has no manifest.json but holds a prepared corpus's shards")
        assert "its record of the content is missing" in line and line.endswith("restore the manifest")
    res = run("verify", tmp_path / "src")  # files that were never prepared are read through their readers
    assert res.exit_code == 0 and res.stdout.startswith(f"OK {tmp_path / 'src'}: 10 documents"), res.output


def test_an_arrow_stream_cut_between_batches_is_one_line_from_prep_verify_and_corpus_info(tmp_path):
    pytest.importorskip("pyarrow")
    docs = [f"row {i} " * 20 for i in range(30)]
    cut = stream_cut_after_first_batch(tmp_path / "whole.arrow", docs, groups=[10, 10, 10])
    (tmp_path / "cut.arrow").write_bytes(cut)
    expected = (f"Error: {tmp_path / 'cut.arrow'} ends without the Arrow end-of-stream marker after 1 record "
                "batch(es): the writer was cut off?")
    for args in (("prep", tmp_path / "cut.arrow", "--out", tmp_path / "out"), ("verify", tmp_path / "cut.arrow"),
                 ("corpus-info", tmp_path / "cut.arrow")):
        assert _error_line(run(*args)).startswith(expected), args
    assert not (tmp_path / "out").exists()
    res = run("prep", tmp_path / "whole.arrow", "--out", tmp_path / "out", "--val-fraction", "0.2")
    assert res.exit_code == 0, res.output
    res = run("verify", tmp_path / "whole.arrow")
    assert res.exit_code == 0 and res.stdout.startswith(f"OK {tmp_path / 'whole.arrow'}: 30 documents"), res.output


def test_prep_warns_on_stderr_when_val_is_empty(tmp_path):
    src = _texts(tmp_path / "src", 4)
    res = run("prep", src, "--out", tmp_path / "out", "--val-fraction", "0.001")
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if "warning:" in line]
    assert len(warnings) == 1 and "the val split of" in warnings[0] and "--val-fraction" in warnings[0]
    assert "warning" not in res.stdout and "integrity: each shard's size and index sha256 recorded" in res.stdout
    res = run("prep", src, "--out", tmp_path / "with-val", "--val-fraction", "0.5")
    assert res.exit_code == 0 and "warning" not in res.output


def test_prep_splits_by_val_inputs_or_byte_tail_and_says_how(tmp_path):
    src = _texts(tmp_path / "src", 4)
    (tmp_path / "held.txt").write_text("held out\n")
    res = run("prep", src, "--val", tmp_path / "held.txt", "--val", src / "0.txt", "--out", tmp_path / "out")
    assert _error_line(res) == (f"Error: {src / '0.txt'} is both an input and a --val input; give it once (a "
                                "folder given as input keeps it for train unless you --exclude it)")
    res = run("prep", src, "--val", tmp_path / "held.txt", "--val", src / "0.txt", "--exclude", "0.txt",
              "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    line = f"split: val is 2 val input file(s) whole ({tmp_path / 'held.txt'}, {src / '0.txt'}), train every other input"
    assert line in res.stdout and line in run("corpus-info", tmp_path / "out").stdout
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [manifest["splits"][s]["documents"] for s in ("train", "val")] == [3, 2]
    res = run("prep", src / "3.txt", "--val-tail", "0.1", "--out", tmp_path / "tail")
    assert res.exit_code == 0, res.output
    line = "split: the last 0.1 of each document's bytes to val, the rest to train"
    assert line in res.stdout and line in run("corpus-info", tmp_path / "tail").stdout
    res = run("prep", src, "--out", tmp_path / "hash")
    assert res.exit_code == 0 and "split: by document hash, val fraction 0.01" in res.stdout


@pytest.mark.parametrize("args,message", [
    (["--val", "{held}", "--val-fraction", "0.01"], "--val-fraction and --val choose the val split in different "
                                                    "ways; give one of them"),
    (["--val", "{held}", "--val-tail", "0.1"], "--val and --val-tail choose the val split in different ways; give one "
                                                "of them"),
    (["--val-tail", "0.1", "--val-fraction", "0.2"], "--val-fraction and --val-tail choose the val split in "
                                                       "different ways; give one of them"),
    (["--val", "{tmp}/missing.txt"], "--val: {tmp}/missing.txt does not exist; check the path"),
])
def test_prep_refuses_a_split_given_twice_or_a_missing_val_input_in_one_line(tmp_path, args, message):
    src = _texts(tmp_path / "src", 2)
    (tmp_path / "held.txt").write_text("held out\n")
    args = [a.format(held=tmp_path / "held.txt", tmp=tmp_path) for a in args]
    assert _error_line(run("prep", src, "--out", tmp_path / "out", *args)) == "Error: " + message.format(tmp=tmp_path)
    assert not (tmp_path / "out").exists()


@pytest.fixture
def run_on_empty_val(tmp_path):
    """A run (metrics and a checkpoint of a tiny model) whose corpus has an empty val split."""
    corpus = tmp_path / "corpus"
    prepare([_texts(tmp_path / "src", 6)], corpus, val_fraction=0.0)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 5.0, "head_loss": [3.0, 3.0],
                                                       "bpb": 4.0}) + "\n")
    cfg = dataclasses.replace(config_io.tiny(), model=dataclasses.replace(config_io.tiny().model, n_future=2),
                              data=dataclasses.replace(config_io.tiny().data, path=str(corpus)))
    save_checkpoint(run_dir, step=1, model=ByteMTP(cfg.model), config=cfg, train_state={})
    return run_dir, corpus


@pytest.mark.parametrize("command,fix", [
    (["eval", "--ckpt", "{run}", "--device", "cpu"], "--split train or --split all"),
    (["bench", "decode", "--ckpt", "{run}", "--n-prompts", "1", "--device", "cpu", "--compile", "off"],
     "--prompts FILE"),
    (["plot", "{run}", "--eval-batches", "2", "--device", "cpu"], "--eval-batches 0"),
])
def test_an_empty_split_is_one_line_that_names_it_and_the_fix(run_on_empty_val, command, fix):
    """Each command names the empty split and a fix it has (only eval has --split)."""
    run_dir, corpus = run_on_empty_val
    line = _error_line(run(*[c.format(run=run_dir) for c in command]))
    assert f"the val split of the prepared corpus {corpus} is empty" in line
    assert fix in line and "larger `bytemtp prep --val-fraction`" in line
    assert "no files found" not in line
    assert ("read another split (--split" in line) == (command[0] == "eval")  # only eval has --split


def test_a_table_with_no_such_field_is_one_line_from_prep_and_verify_reads_tables(tmp_path):
    pytest.importorskip("pyarrow")
    write_table(tmp_path / "a.parquet", ["one", None, "three", ""], groups=[3, 1])
    line = _error_line(run("prep", tmp_path / "a.parquet", "--out", tmp_path / "out", "--field", "content"))
    assert line == (f"Error: {tmp_path / 'a.parquet'} has no column 'content'; its text columns are 'text': "
                    "choose one with --field (data.field when training)")
    assert not (tmp_path / "out").exists()
    res = run("verify", tmp_path / "a.parquet")
    assert res.exit_code == 0, res.output
    assert res.stdout == (f"OK {tmp_path / 'a.parquet'}: 3 documents (8 bytes) in 1 file(s) read through their "
                          "readers; skipped: null 1\n")
    (tmp_path / "cut.parquet").write_bytes((tmp_path / "a.parquet").read_bytes()[:-30])
    line = _error_line(run("verify", tmp_path / "cut.parquet"))
    assert line.startswith(f"Error: {tmp_path / 'cut.parquet'} is not a readable Parquet file")
    line = _error_line(run("verify", tmp_path / "a.parquet", "--field", "n"))
    assert "column 'n' of" in line and "is of type int64" in line
