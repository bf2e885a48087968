"""The held-out bits/byte beside `bench decode`'s speed figures: one measurement with `bytemtp eval`'s
(the same bytes, the same figure, labelled with them), taken before any decoding, and not needed
for the decoding figures: with --prompts FILE a run whose corpus is not on this machine still gets
every figure, its bits/byte not measured."""

import dataclasses
import json
import random

import pytest
import torch
from click.testing import CliRunner

from bytemtp.config_io import tiny
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import save_checkpoint
from bytemtp_cli.main import main

pytestmark = pytest.mark.usefixtures("one_thread")


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def one_ms(monkeypatch):
    """Every timed decode takes 1 ms: an untrained model's speedup, timed on a busy machine, could
    pass for impossible (above its bytes per pass) and stop the benchmark."""
    from bytemtp.decoding import speed

    monkeypatch.setattr(speed, "timed_generate", lambda decoder, prompts, **kwargs: (
        decoder.generate(prompts, **kwargs), 1e-3))


@pytest.fixture
def run_dir(tmp_path):
    """A tiny untrained model's run over a corpus of its own (the tests move it away), whose val
    split holds more than bench decode's former 10 batches, and text that differs along it."""
    from bytemtp.data.prep import prepare

    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(0)
    for i in range(60):  # plain words, then runs of one byte, then noise: the bytes along the split differ
        kind = i % 3
        text = (" ".join(rng.choice(["alpha", "beta", "gamma"]) for _ in range(80)) if kind == 0
                else chr(97 + i % 26) * 400 if kind == 1 else "".join(chr(rng.randrange(33, 127)) for _ in range(400)))
        (src / f"d{i:02d}.txt").write_text(f"doc {i}\n{text}\n")
    prepare([src], tmp_path / "corpus", val_fraction=0.5)
    cfg = tiny()
    cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, path=str(tmp_path / "corpus")))
    model = ByteMTP(cfg.model)
    model.init_weights(generator=torch.Generator().manual_seed(3))
    save_checkpoint(tmp_path / "run", step=1, model=model, config=cfg, train_state={})
    return tmp_path / "run"


DECODE = ("--n-prompts", 2, "--prompt-bytes", 8, "--max-bytes", 16, "--batch-sizes", "1,2", "--draft", "auto,chain-2",
          "--rounds", 1, "--device", "cpu", "--compile", "off")


def test_bench_decode_reports_the_bits_per_byte_that_eval_does_on_the_same_bytes(run_dir, tmp_path, one_ms):
    res = run("eval", "--ckpt", run_dir, "--device", "cpu", "--json", tmp_path / "eval.json")
    assert res.exit_code == 0, res.output
    ev = json.loads((tmp_path / "eval.json").read_text())
    assert f"{ev['bytes']:,} bytes of {run_dir.parent / 'corpus'} (val)" in res.stdout  # eval names its bytes
    assert ev["bytes"] > 10 * 8 * 64  # more than bench decode's former 10 batches: other bytes, another figure
    res = run("bench", "decode", "--ckpt", run_dir, *DECODE, "--json", tmp_path / "decode.json")
    assert res.exit_code == 0, res.output
    dec = json.loads((tmp_path / "decode.json").read_text())
    assert dec["val_bpb"] == pytest.approx(ev["bpb"][0], abs=1e-9)
    assert (dec["val_split"], dec["val_bytes"]) == ("val", ev["bytes"]) and "val_note" not in dec
    assert (f"model held-out bits/byte {ev['bpb'][0]:.3f} (head 1 on {ev['bytes']:,} bytes of the val split, "
            "as `bytemtp eval`)") in res.stdout
    # --eval-batches N scores what `eval --batches N` scores
    res = run("bench", "decode", "--ckpt", run_dir, *DECODE, "--eval-batches", 2, "--json", tmp_path / "two.json")
    ev2 = json.loads(run("eval", "--ckpt", run_dir, "--batches", 2, "--json", "-").stdout)
    two = json.loads((tmp_path / "two.json").read_text())
    assert two["val_bytes"] == ev2["bytes"] == 2 * 8 * 64 and two["val_bpb"] == pytest.approx(ev2["bpb"][0], abs=1e-9)
    res = run("bench", "decode", "--ckpt", run_dir, *DECODE, "--eval-batches", 0, "--json", tmp_path / "none.json")
    none = json.loads((tmp_path / "none.json").read_text())
    assert none["val_bpb"] is None and "val_bytes" not in none and "bits/byte" not in res.stdout


def test_bench_decode_with_prompts_of_its_own_needs_no_corpus(run_dir, tmp_path, one_ms):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def f(x):"}\n{"prompt": "import os"}\n')
    corpus = run_dir.parent / "corpus"
    corpus.rename(tmp_path / "elsewhere")  # a run copied to another machine without its corpus
    out = tmp_path / "decode.json"
    res = run("bench", "decode", "--ckpt", run_dir, "--prompts", prompts, *DECODE, "--json", out)
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert data["val_bpb"] is None and "val_bytes" not in data and str(corpus) in data["val_note"]
    every = [(b, m) for b in (1, 2) for m in ("auto", "chain-2")]
    assert [(c["batch_size"], c["mode"]) for c in data["cases"]] == every
    # an untrained model's drafts never pay: auto tries them (a re-warm, a pass that emits nothing) and keeps plain
    assert all(c["plain_bytes_s"] > 0 and c["bytes_per_forward"] >= 0.9 for c in data["cases"])
    notes = [line for line in res.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and str(corpus) in notes[0] and "not measured" in notes[0]
    assert "model val bits/byte not measured (corpus absent)" in res.stdout and "Traceback" not in res.output
    # the default prompts come from the corpus: without it, one line before any decoding
    res = run("bench", "decode", "--ckpt", run_dir, *DECODE)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == (
        f"Error: the run's corpus, where the default prompts come from, is not here: {corpus} does not exist; "
        "check the path, or give prompts of your own (--prompts FILE)")


def test_bench_decode_measures_the_bits_per_byte_before_it_decodes(run_dir, monkeypatch):
    import bytemtp.experiments.bench as bench
    from bytemtp.data.shards import CorpusError

    def unreadable(*args, **kwargs):
        raise CorpusError("shard-00000.zst is truncated at offset 12; prepare the corpus again")

    def never(*args, **kwargs):
        raise AssertionError("decoded before the bits/byte was measured")

    monkeypatch.setattr(bench, "evaluate", unreadable)
    monkeypatch.setattr(bench, "interleaved_decodes", never)
    res = run("bench", "decode", "--ckpt", run_dir, *DECODE)
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == ("Error: shard-00000.zst is truncated at offset 12; "
                                                   "prepare the corpus again")
