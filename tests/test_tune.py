"""`bytemtp tune-heads`: heads 2..n trained toward head 1 on a frozen trunk. The frozen parts stay
equal to the source's to the bit, the tuned run loads and resumes like any run, and what a user can
get wrong stops with one line."""

import json

import pytest
import torch
from click.testing import CliRunner

from bytemtp import config_io
from bytemtp.runtime.checkpoint import load_model
from bytemtp.training.train import train
from bytemtp_cli.main import main

# most tests tune the module's `source` run: on one test worker it is trained once
# every test tunes a trained run (make test runs them; make test-quick leaves them out)
pytestmark = [pytest.mark.xdist_group("tune-source"), pytest.mark.slow]


@pytest.fixture(scope="module")
def source(code_corpus, tmp_path_factory):
    """A tiny 4-head run, trained a few steps so that its heads disagree."""
    cfg = config_io.apply_overrides(config_io.tiny(), [f"data.path={code_corpus}", "model.n_future=4", "train.steps=30",
                                       "train.eval_batches=2", "data.batch_size=4", "train.lr=3e-3",
                                       "train.warmup_steps=5"])
    run = tmp_path_factory.mktemp("tune") / "source"
    train(cfg, run, show_progress=False, say=lambda m: None)
    return run


def _tune(args):
    res = CliRunner().invoke(main, ["tune-heads", *args])
    assert res.exit_code == 0, res.output
    return res


def _weights(path):
    model, cfg = load_model(path)
    return model, cfg


@pytest.mark.slow
def test_a_tune_trains_only_the_draft_heads_and_reports_before_and_after(source, tmp_path):
    report = tmp_path / "tune.json"
    res = _tune(["--ckpt", str(source), "--out", str(tmp_path / "tuned"), "--steps", "6", "--report-prompts", "2",
                 "--json", str(report)])
    before, cfg_before = _weights(source)
    after, cfg_after = _weights(tmp_path / "tuned")
    assert cfg_after.train.trainable == "draft-heads" and cfg_after.loss.teacher_weight == 1.0
    assert cfg_after.loss.draft_data_weight == 1.0 and cfg_after.model == cfg_before.model
    assert cfg_after.loss.rollout_bytes == cfg_before.model.seq_len // 2
    draft = {id(p) for m in after.draft_heads() for p in m.parameters()}
    state_before = before.state_dict()
    changed = []
    for (name, p) in after.named_parameters():
        if id(p) in draft:
            changed.append(not torch.equal(p, state_before[name]))
        else:
            assert torch.equal(p, state_before[name]), f"{name} is frozen but changed"
    assert changed and all(changed)
    data = json.loads(report.read_text())
    assert data["before"]["bpb"][0] == data["after"]["bpb"][0]  # head 1 unchanged: the same bits/byte
    assert all(a != b for a, b in zip(data["after"]["bpb"][1:], data["before"]["bpb"][1:]))  # heads 2..n trained
    assert set(data["after"]["decoded_bytes_per_forward"]) == {"chain-all", "tree-all"}
    for side in ("before", "after"):
        assert 1.0 <= data[side]["decoded_bytes_per_forward"]["chain-all"] <= 4.0
    assert "before" in res.output and "after" in res.output and "chain-all bytes/pass" in res.output


@pytest.mark.slow  # three tunes with rollouts
def test_a_tune_resumes_exactly(source, tmp_path, monkeypatch):
    """A tune stopped at step 3 by its own train.steps and resumed to 6 ends where an uninterrupted
    tune of 6 steps does (one schedule over 6 steps in both): the same checkpoints, weights and
    optimizer state, the same rollouts at every step. The resume restores its checkpoint, not
    train.init (the source is gone by then), into an optimizer over the draft heads alone."""
    import shutil

    from bytemtp.runtime.checkpoint import OPTIMIZER_FILE, list_checkpoints
    from bytemtp.training import train as train_lib

    rollouts, restored = [], []
    real_rollout, real_restore = train_lib.greedy_rollout, train_lib._Run.restore

    def rollout(model, ids, n):
        rollouts.append(real_rollout(model, ids, n))
        return rollouts[-1]

    def restore(run, ckpt):
        real_restore(run, ckpt)
        draft = {id(p) for m in run.model.draft_heads() for p in m.parameters()}
        optimized = [p for g in run.optimizer.param_groups for p in g["params"]]
        restored.append((ckpt.name, {id(p) for p in optimized} == draft and len(optimized) == len(draft),
                         all(p.requires_grad for p in run.optimizer.state)))

    monkeypatch.setattr(train_lib, "greedy_rollout", rollout)
    monkeypatch.setattr(train_lib._Run, "restore", restore)
    copy = tmp_path / "source"
    shutil.copytree(source, copy)
    common = ["--report-prompts", "0", "--set", "train.ckpt_every=3", "--set", "train.schedule_steps=6"]
    _tune(["--ckpt", str(copy), "--out", str(tmp_path / "once"), "--steps", "6", *common])
    once_rollouts, rollouts[:] = list(rollouts), []
    first = _tune(["--ckpt", str(copy), "--out", str(tmp_path / "twice"), "--set", "train.steps=3", *common])
    assert "stopped by steps at step 3" in first.output, first.output
    assert [p.name for p in list_checkpoints(tmp_path / "twice")] == ["step-00000003"]
    shutil.rmtree(copy)  # the resume needs its checkpoint alone, not the weights it started from
    second = _tune(["--resume", "--out", str(tmp_path / "twice"), "--steps", "6", "--report-prompts", "0"])
    assert f"resumed {tmp_path / 'twice'} from step-00000003: step 3" in second.output, second.output
    assert "starting from the weights" not in second.output
    assert restored == [("step-00000003", True, True)]
    names = ["step-00000003", "step-00000006"]
    assert [p.name for p in list_checkpoints(tmp_path / "once")] == names
    assert [p.name for p in list_checkpoints(tmp_path / "twice")] == names
    assert len(rollouts) == len(once_rollouts) == 6
    for step, (a, b) in enumerate(zip(once_rollouts, rollouts), 1):
        assert torch.equal(a, b), f"the rollout of step {step}"
    once, _ = _weights(tmp_path / "once")
    twice, _ = _weights(tmp_path / "twice")
    for (name, a), b in zip(once.state_dict().items(), twice.state_dict().values()):
        assert torch.equal(a, b), name
    optim = [torch.load(tmp_path / run / "checkpoints" / names[-1] / OPTIMIZER_FILE, weights_only=True)
             for run in ("once", "twice")]
    n_draft = sum(1 for m in once.draft_heads() for _ in m.parameters())
    assert len(optim[1]["state"]) == n_draft == sum(len(g["params"]) for g in optim[1]["param_groups"])
    assert optim[0]["param_groups"] == optim[1]["param_groups"]
    for i, state in optim[0]["state"].items():
        for key, value in state.items():
            assert torch.equal(value, optim[1]["state"][i][key]), (i, key)


def test_a_tune_with_a_shared_unembedding_keeps_head_1s_logits(code_corpus, tmp_path):
    """With model.unembed=shared the one unembedding is head 1's too: a tune leaves it frozen, so
    head 1's logits are the source's to the bit, while the draft heads' change."""
    from bytemtp.model.layout import build_layout

    cfg = config_io.apply_overrides(config_io.tiny(), [f"data.path={code_corpus}", "model.n_future=4", "model.unembed=shared",
                                       "train.steps=2", "data.batch_size=2", "train.eval_batches=1"])
    train(cfg, tmp_path / "source", show_progress=False, say=lambda m: None)
    _tune(["--ckpt", str(tmp_path / "source"), "--out", str(tmp_path / "tuned"), "--steps", "2",
           "--report-prompts", "0", "--set", "train.lr=1e-2"])
    (before, _), (after, _) = _weights(tmp_path / "source"), _weights(tmp_path / "tuned")
    assert len(after.unembed) == 1
    ids = torch.randint(0, 256, (2, cfg.model.seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = (m.eval().logits(ids, layout=build_layout(m, ids)) for m in (before, after))
    assert torch.equal(a[:, :, 0], b[:, :, 0]), "head 1's logits changed"
    assert all(not torch.equal(a[:, :, k], b[:, :, k]) for k in range(1, 4))


def test_a_tune_on_the_teacher_term_brings_the_draft_heads_toward_head_1(source, tmp_path):
    """The term it trains on falls, and with it the heads' disagreement with head 1: the sign,
    the shift and the detach of the teacher are right."""
    _tune(["--ckpt", str(source), "--out", str(tmp_path / "t"), "--steps", "30", "--report-prompts", "0",
           "--data-term", "0", "--rollout-bytes", "0", "--set", "train.lr=1e-2", "--set", "train.log_every=1"])
    lines = [json.loads(line) for line in (tmp_path / "t" / "metrics.jsonl").read_text().splitlines()]
    steps = [line for line in lines if "head_teacher_kl" in line]
    first, last = (sum(s["head_teacher_kl"][1:]) for s in (steps[0], steps[-1]))
    assert last < 0.5 * first, (first, last)


def test_a_tune_trains_on_a_corpus_whose_val_split_is_empty(tmp_path):
    """40 files prepared with the default --val-fraction leave the val split empty: the tune
    trains anyway and says in one line that it has no held-out text to report on."""
    src = tmp_path / "src"
    src.mkdir()
    for i in range(40):
        (src / f"m{i}.py").write_text(f"def f{i}(x):\n    return x * {i}\n" * 20)
    res = CliRunner().invoke(main, ["prep", str(src), "--out", str(tmp_path / "corpus")])
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    assert manifest["splits"]["val"]["documents"] == 0
    cfg = config_io.apply_overrides(config_io.tiny(), [f"data.path={tmp_path / 'corpus'}", "model.n_future=4", "train.steps=2",
                                       "data.batch_size=2"])
    train(cfg, tmp_path / "source", show_progress=False, say=lambda m: None)
    report = tmp_path / "tune.json"
    for prompts in ("16", "0"):
        out = tmp_path / f"tuned-{prompts}"
        res = _tune(["--ckpt", str(tmp_path / "source"), "--out", str(out), "--steps", "2", "--report-prompts",
                     prompts, "--json", str(report)])
        assert "stopped by steps at step 2" in res.output and load_model(out)[1].train.trainable == "draft-heads"
        assert "val split of" in res.output and "no report before and after the tune" in res.output, res.output
        assert "--split" not in res.output
        data = json.loads(report.read_text())
        assert data["before"] is None and data["after"] is None and data["tuned"].endswith("step-00000002")


@pytest.mark.parametrize("args, message", [
    (["--steps", "2"], "name the run to tune"),
    (["--ckpt", "{source}"], "no stop condition"),
    (["--ckpt", "{source}", "--steps", "2", "--set", "model.d_model=64"], "model.* cannot change"),
    (["--ckpt", "{source}", "--steps", "2", "--out", "{source}"], "the run being tuned"),
    (["--ckpt", "{source}", "--steps", "2", "--data-term", "0", "--set", "loss.teacher_weight=0"],
     "need a data term or a teacher term"),
    (["--resume", "--ckpt", "{source}", "--steps", "2"], "leave --ckpt out"),
])
def test_mistakes_stop_with_one_line(source, tmp_path, args, message):
    args = [a.format(source=source) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "out")]
    res = CliRunner().invoke(main, ["tune-heads", *args])
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output, res.output


def test_a_run_starts_from_weights_of_the_same_model_only(source, code_corpus, tmp_path):
    cfg = config_io.apply_overrides(config_io.tiny(), [f"data.path={code_corpus}", "model.n_future=4", "train.steps=1",
                                       f"train.init={source}", "data.batch_size=2", "train.eval_batches=1"])
    got = train(cfg, tmp_path / "a", show_progress=False, say=lambda m: None)
    assert got.step == 1
    other = config_io.apply_overrides(cfg, ["model.n_future=2"])
    res = CliRunner().invoke(main, ["train", "--preset", "tiny", "--data", str(code_corpus), "--out",
                                    str(tmp_path / "b"), "--steps", "1", "--set", "model.n_future=2",
                                    "--set", f"train.init={source}"])
    assert res.exit_code != 0 and "other settings" in res.output and "n_future=4" in res.output, res.output
    assert other.train.init == str(source)


def test_json_on_stdout_is_the_report_alone(source, tmp_path):
    res = _tune(["--ckpt", str(source), "--out", str(tmp_path / "j"), "--steps", "2", "--report-prompts", "0",
                 "--json", "-"])
    data = json.loads(res.stdout)
    assert data["source"].endswith("step-00000030") and data["tuned"].endswith("step-00000002")
    assert data["before"]["bpb"][0] == data["after"]["bpb"][0]


@pytest.fixture(scope="module")
def prose_source(tmp_path_factory):
    """A tiny 8-head run trained 150 steps on 80 files of this Python's standard library: varied
    enough text that its greedy continuations are not the corpus's."""
    import shutil
    import sysconfig
    from pathlib import Path

    from bytemtp.data.prep import prepare

    root = tmp_path_factory.mktemp("stdlib")
    (root / "src").mkdir()
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:80]:
        shutil.copy(path, root / "src" / path.name)
    prepare([root / "src"], root / "corpus", val_fraction=0.2)
    # windows in packing order: 150 steps of windows shuffled over the whole corpus leave this tiny
    # model's greedy text a run of one byte, which every draft matches (nothing left to tune)
    cfg = config_io.apply_overrides(config_io.tiny(), [f"data.path={root / 'corpus'}", "train.steps=150", "train.eval_batches=2",
                                       "data.batch_size=4", "train.lr=3e-3", "train.warmup_steps=5",
                                       "data.shuffle_buffer=1"])
    train(cfg, root / "run", show_progress=False, say=lambda m: None)
    return root / "run"


@pytest.mark.slow
def test_self_generated_targets_raise_the_bytes_per_pass_decoded(prose_source, tmp_path):
    """The whole tune, with and without self-generated targets, the same steps: decoded greedily
    from held-out prompts, the heads tuned on the model's own text keep more of their drafts (the
    outputs are the same: head 1 is frozen). Measured: 1.27 before, 1.27 on the corpus, 6.25."""
    got = {}
    for name, rollout in (("corpus", "0"), ("rollouts", "32")):
        report = tmp_path / f"{name}.json"
        _tune(["--ckpt", str(prose_source), "--out", str(tmp_path / name), "--steps", "40", "--report-prompts", "4",
               "--rollout-bytes", rollout, "--set", "train.lr=1e-2", "--json", str(report)])
        data = json.loads(report.read_text())
        got[name] = data["after"]["decoded_bytes_per_forward"]["chain-all"]
        got["before"] = data["before"]["decoded_bytes_per_forward"]["chain-all"]
    assert got["rollouts"] > 1.5 * max(got["before"], got["corpus"]), got


@pytest.mark.slow
@pytest.mark.parametrize("design", ["medusa", "hydra"])
def test_a_tune_with_draft_adds_draft_heads_and_trains_them_alone(source, tmp_path, design):
    """tune-heads --drafter adds draft heads (model.draft) to the source's weights, trains them alone
    (the training heads stay the source's), and the tuned run decodes with them; a resume keeps them."""
    from bytemtp.decoding.decode import Decoder, generate

    report = tmp_path / "tune.json"
    out = tmp_path / "tuned"
    res = _tune(["--ckpt", str(source), "--out", str(out), "--drafter", design, "--divergence", "tv",
                 "--steps", "4", "--report-prompts", "2", "--json", str(report)])
    before, cfg_before = _weights(source)
    after, cfg_after = _weights(out)
    assert cfg_after.model.draft == design and cfg_before.model.draft == "none"
    assert cfg_after.loss.teacher_divergence == "tv"
    state_before = before.state_dict()
    for name, p in after.state_dict().items():
        if not name.startswith("drafter."):
            assert torch.equal(p, state_before[name]), f"{name} changed"
    assert after.drafter.w_out.abs().sum() > 0  # the way out left zero: the draft heads trained
    data = json.loads(report.read_text())
    assert data["before"]["bpb"][0] == data["after"]["bpb"][0]
    assert "after" in res.output
    prompts = [b"def ", b"import"]
    assert [g.output for g in Decoder(after, compile="off").generate(prompts, max_bytes=40)] == \
        [generate(after, p, max_bytes=40).output for p in prompts]
    again = _tune(["--resume", "--out", str(out), "--steps", "6", "--report-prompts", "0"])
    assert "resumed" in again.output and _weights(out)[1].model.draft == design


def test_draft_heads_are_refused_outside_a_tune_with_one_line(tmp_path):
    res = CliRunner().invoke(main, ["train", "--preset", "tiny", "--out", str(tmp_path / "r"), "--steps", "1",
                                    "--set", "model.draft=medusa"])
    assert res.exit_code != 0 and "train.trainable=draft-heads" in res.output and "Traceback" not in res.output


def test_a_compiled_tune_stays_under_the_recompile_limit_without_a_warning(source, tmp_path):
    """tune-heads with compiled blocks (train.compile=on) runs its rollouts through them eagerly
    (`rollout`), so the blocks' graphs stay under dynamo's recompile limit: no ten-line warning, no
    block left uncompiled. A subprocess: dynamo writes its warnings to the stderr it found at import."""
    import subprocess
    import sys

    out = tmp_path / "tuned"
    res = subprocess.run([sys.executable, "-m", "bytemtp_cli", "tune-heads", "--ckpt", str(source), "--out", str(out),
                          "--steps", "2", "--report-prompts", "0", "--set", "train.compile=on",
                          "--set", "train.device=cpu"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "; compile on" in res.stdout
    assert "recompile" not in res.stdout + res.stderr, res.stderr[-3000:]
