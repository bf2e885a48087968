"""`bytemtp eval`: per-head bits per byte and accuracy, and the acceptance profile, held against
slow references: the training loop's validation (which is this evaluation) and a position-by-position recount."""

import dataclasses
import itertools
import json
import math
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from doubles import tiny_model

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.config import DataConfig
from bytemtp.data.loader import ByteLoader
from bytemtp.data.shards import CorpusError
from bytemtp.evaluation.evaluate import evaluate
from bytemtp.model.layout import build_layout
from bytemtp.model.loss import IGNORE, future_targets
from bytemtp.runtime.checkpoint import load_model, save_checkpoint
from bytemtp.training.train import train
from bytemtp.vocab import EOS
from bytemtp_cli.main import main


def _model(head_type="transformer", seed=2):
    return tiny_model(seed, head_type=head_type, n_future=4).eval()


@pytest.mark.parametrize("head_type", ["transformer", "causal"])
def test_training_validation_is_this_evaluation(code_corpus, tmp_path, head_type):
    """The val bits per byte a run records are evaluate's on its final weights."""
    cfg = config_io.apply_overrides(config_io.tiny(), [f"data.path={code_corpus}", f"model.head_type={head_type}",
                                       "model.n_future=4", "train.steps=2", "train.eval_batches=3",
                                       "data.batch_size=2"])
    result = train(cfg, tmp_path / "run", show_progress=False, say=lambda m: None)
    model, _ = load_model(result.checkpoint)
    got = evaluate(model, str(code_corpus), batches=3, batch_size=2)
    assert result.val_bpb == got.bpb


def _recount(model, corpus, batches, batch_size):
    """Acceptance by hand: position by position over the same batches."""
    K, T = model.config.n_future, model.config.seq_len
    loader = ByteLoader(DataConfig(path=str(corpus), batch_size=batch_size, shuffle_buffer=1), model.config,
                        split="val")
    accepted, positions = [0] * (K + 1), [0] * (K + 1)
    agreed, paired = [0] * (K + 1), [0] * (K + 1)
    for _ in range(batches):
        batch = next(loader)
        if loader.epoch > 0:
            break
        targets = future_targets(batch, n_future=K, mask_after_eos=True)
        with torch.no_grad():
            picks = model.logits(batch[:, :T], layout=build_layout(model, batch[:, :T])).argmax(-1)
        for b in range(batch.shape[0]):
            for t in range(T):
                for k in range(2, K + 1):
                    if all(targets[b, t, j] != IGNORE for j in range(k)):
                        positions[k] += 1
                        accepted[k] += all(picks[b, t, j] == targets[b, t, j] for j in range(1, k))
                        if t + k - 1 < T:  # head j's byte is head 1's next byte at t + j - 1
                            paired[k] += 1
                            agreed[k] += all(picks[b, t, j] == picks[b, t + j, 0] for j in range(1, k))
    return ({k: accepted[k] / positions[k] for k in range(2, K + 1)},
            {k: agreed[k] / paired[k] for k in range(2, K + 1)})


def test_acceptance_profile_equals_a_position_by_position_count(code_corpus):
    model = _model()
    got = evaluate(model, str(code_corpus), batches=2, batch_size=2)
    want, agreement = _recount(model, code_corpus, 2, 2)
    assert got.acceptance.keys() == want.keys() == got.agreement.keys()
    for k in want:
        assert got.acceptance[k] == pytest.approx(want[k], abs=1e-12), k
        assert got.agreement[k] == pytest.approx(agreement[k], abs=1e-12), k
        assert got.agreed_bytes_per_forward[k] == pytest.approx(1 + sum(agreement[j] for j in range(2, k + 1)))
    rates = [got.acceptance[k] for k in sorted(got.acceptance)]
    assert rates == sorted(rates, reverse=True)  # more heads all right: never more often
    for k in got.bytes_per_forward:
        assert got.bytes_per_forward[k] == pytest.approx(1 + sum(got.acceptance[j] for j in range(2, k + 1)))


@pytest.mark.slow
def test_a_model_trained_to_copy_gets_drafts_right(code_corpus):
    """A trained model's heads must be right more often than an untrained one's: the profile
    measures the model, not the data alone."""
    from bytemtp.training.step import forward_backward

    model = _model(seed=5).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    loader = ByteLoader(DataConfig(path=str(code_corpus), batch_size=8), model.config)
    before = evaluate(model.eval(), str(code_corpus), batches=4, batch_size=4)
    model.train()
    for _ in range(60):
        forward_backward(model, next(loader), loss_cfg=C.LossConfig())
        optimizer.step()
        optimizer.zero_grad()
    after = evaluate(model.eval(), str(code_corpus), batches=4, batch_size=4)
    assert after.bpb[0] < before.bpb[0]
    assert after.acceptance[2] > before.acceptance[2]


@pytest.mark.slow
def test_eval_command(code_corpus, tmp_path):
    model = _model()
    cfg = dataclasses.replace(config_io.tiny(), model=model.config,
                              data=dataclasses.replace(config_io.tiny().data, path=str(code_corpus)))
    save_checkpoint(tmp_path / "run", step=1, model=model, config=cfg, train_state={})
    out = tmp_path / "eval.json"
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(tmp_path / "run"), "--batches", "3", "--batch-size", "2",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "2..k right" in res.output and "2..k agree with h1" in res.output and "h4" in res.output
    data = json.loads(out.read_text())
    assert len(data["bpb"]) == len(data["accuracy"]) == 4 and data["bytes"] > 0
    assert set(data["acceptance"]) == set(data["agreement"]) == {"2", "3", "4"}
    row = next(line.split() for line in res.output.splitlines() if line.split()[:1] == ["h4"])
    assert row[-2:] == [f"{data['agreement']['4']:.3f}", f"{data['agreed_bytes_per_forward']['4']:.2f}"]
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(tmp_path / "run"), "--batches", "1", "--decode-prompts", "2",
                                    "--json", str(out)])
    assert res.exit_code == 0, res.output
    decoded = json.loads(out.read_text())["decoded"]
    assert decoded["prompts"] == 2 and set(decoded["bytes_per_forward"]) == {"chain-all", "tree-all"}
    assert "bytes per pass: chain-all" in res.output
    assert all(1.0 <= b <= 4.0 for b in decoded["bytes_per_forward"].values())
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(tmp_path / "run"), "--data", str(tmp_path / "none")])
    assert res.exit_code != 0 and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(tmp_path / "run"), "--split", "all", "--batches", "2"])
    assert res.exit_code == 0, res.output


@pytest.mark.distributed
@pytest.mark.xdist_group("processes")  # with the other multi-process tests (test_distributed)
def test_eval_under_torchrun_adds_the_ranks(code_corpus, tmp_path):
    model = _model()
    cfg = dataclasses.replace(config_io.tiny(), model=model.config,
                              data=dataclasses.replace(config_io.tiny().data, path=str(code_corpus)))
    save_checkpoint(tmp_path / "run", step=1, model=model, config=cfg, train_state={})
    one = evaluate(model, str(code_corpus), batches=1000, batch_size=2)
    out = tmp_path / "eval.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           "-m", "bytemtp_cli", "eval", "--ckpt", str(tmp_path / "run"), "--batches", "1000",
                           "--batch-size", "2", "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads(out.read_text())
    # the two ranks pack their halves of the documents into windows of their own: the same bytes
    # up to the partial windows at the ends
    assert two["bytes"] == pytest.approx(one.bytes, rel=0.1)
    assert two["bpb"][0] == pytest.approx(one.bpb[0], rel=0.02)


def test_a_corpus_without_splits_says_so(code_corpus, tmp_path):
    # `eval --data FOLDER --split val` on a folder never prepared gave the numbers of every file,
    # the same for val, train and all, each labelled "(val)"
    folder = tmp_path / "folder"
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text(f"def g{i}(y):\n    return y - {i}\n" * 20)
    model = _model()
    with pytest.raises(CorpusError, match="has no splits.*split=None"):
        evaluate(model, str(folder), split="val", batches=1, batch_size=2)
    cfg = dataclasses.replace(config_io.tiny(), model=model.config,
                              data=dataclasses.replace(config_io.tiny().data, path=str(code_corpus)))
    save_checkpoint(tmp_path / "run", step=1, model=model, config=cfg, train_state={})
    base = ["eval", "--ckpt", str(tmp_path / "run"), "--data", str(folder), "--batches", "1", "--batch-size", "2"]
    for split in ("val", "train"):
        res = CliRunner().invoke(main, [*base, "--split", split])
        assert res.exit_code != 0 and "Traceback" not in res.output
        errors = res.stderr.strip().splitlines()
        assert len(errors) == 1 and "has no splits" in errors[0] and "--split all" in errors[0], res.stderr
    for args, label in (([], "(all)"), (["--split", "all"], "(all)")):  # without --split: every file, said so
        res = CliRunner().invoke(main, [*base, *args])
        assert res.exit_code == 0, res.output
        assert f"of {folder} {label}" in res.stdout
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(tmp_path / "run"), "--batches", "1", "--batch-size", "2"])
    assert res.exit_code == 0 and "(val)" in res.stdout  # a prepared corpus: its val split


def test_a_document_masked_model_scores_each_document_as_if_alone(tmp_path):
    """Head 1's bits per byte of a doc-masked model on windows of short documents are the nats of
    each document of each window run alone (a document from its EOS, the first one from the
    window's start), summed and divided by the bytes scored."""
    for i in range(40):
        (tmp_path / f"r{i:02d}.txt").write_text(f"{i}: {'ab' * (i % 5)}")  # 3..12 bytes
    model = tiny_model(2, n_future=4, doc_mask=True).eval()
    got = evaluate(model, str(tmp_path), split=None, batches=2, batch_size=2)
    T = model.config.seq_len
    loader = ByteLoader(DataConfig(path=str(tmp_path), batch_size=2, shuffle_buffer=1), model.config, split=None)
    nats = count = 0
    for _ in range(2):
        window = next(loader)
        targets_BT = future_targets(window, n_future=4, mask_after_eos=True)[:, :, 0]
        for b in range(len(window)):
            ids_T = window[b, :T]
            cuts = [0] + [t for t in range(1, T) if ids_T[t] == EOS] + [T]
            assert len(cuts) > 4  # several documents a window
            for start, end in itertools.pairwise(cuts):
                alone = ids_T[None, start:end]
                with torch.no_grad():
                    logits = model.logits(alone, heads=1, layout=build_layout(model, alone))[0, :, 0]
                nats += float(torch.nn.functional.cross_entropy(logits, targets_BT[b, start:end], reduction="sum"))
                count += end - start
    assert got.bytes == count
    assert got.bpb[0] == pytest.approx(nats / count / math.log(2), rel=1e-5)
