"""The lm-evaluation-harness model (bytemtp.interop.harness), held against the model's own scores and plain
greedy decoding, through lm-eval's simple_evaluate on local tasks, and through `bytemtp lm-eval`."""

import json
import os
import sys

import pytest
import torch
from click.testing import CliRunner
from doubles import lm_eval_tasks

from bytemtp import config_io
from bytemtp.decoding.decode import generate
from bytemtp.evaluation.likelihood import loglikelihoods
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import save_checkpoint
from bytemtp_cli.main import main

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # tasks read local JSON only
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_without_lm_eval_the_error_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "lm_eval", None)
    for name in [m for m in sys.modules if m.startswith("lm_eval.")]:  # imported by another test of this process
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "bytemtp.interop.harness", raising=False)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'bytemtp\[harness\]'"):
        import bytemtp.interop.harness  # noqa: F401
    result = CliRunner().invoke(main, ["lm-eval", "--model", "bytemtp", "--tasks", "x"])
    assert result.exit_code == 1 and "bytemtp[harness]" in result.output and "Traceback" not in result.output



@pytest.fixture(scope="module")
def harness_run(tmp_path_factory):
    """A tiny 4-head checkpoint, and a task folder with a multiple-choice and a generate_until task
    over one local JSON file. (lm-eval is imported here, not at collection: it takes seconds, and
    the tests that need it are slow ones.)"""
    pytest.importorskip("lm_eval")
    root = tmp_path_factory.mktemp("harness")
    cfg = config_io.apply_overrides(config_io.tiny(), ["model.n_future=4"])
    model = ByteMTP(cfg.model)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    save_checkpoint(root / "run", step=0, model=model, config=cfg, train_state={})
    docs = [{"q": f"{a} + {b} =", "choices": [str(a + b), str(a + b + 1), str(a * b + 2)], "gold": (a + b) % 3}
            for a in range(4) for b in range(3)]
    lm_eval_tasks(root, docs, until=["\n", "="], max_gen_toks=12)
    return root, model, docs


def _evaluate(root, tasks, **kw):
    import lm_eval
    from lm_eval.tasks import TaskManager

    import bytemtp.interop.harness  # noqa: F401  (registers the model)

    manager = TaskManager(include_path=str(root / "tasks"), include_defaults=False)
    return lm_eval.simple_evaluate(model="bytemtp", model_args=f"ckpt={root / 'run'},device=cpu,dtype=float32,batch_size=8",
                                   tasks=tasks, task_manager=manager, log_samples=True, **kw)


@pytest.mark.slow
def test_multiple_choice_through_simple_evaluate_is_the_models_own_scores(harness_run):
    root, model, docs = harness_run
    first = _evaluate(root, ["tiny_mc"])
    samples = first["samples"]["tiny_mc"]
    assert len(samples) == len(docs)
    right = 0
    for s in samples:
        pairs = [tuple(a) for a in s["arguments"]]  # (context, " " + choice) for each choice
        want = loglikelihoods(model, [(c.encode(), x.encode()) for c, x in pairs])
        got = [tuple(r[0]) for r in s["resps"]]
        assert [lp for lp, _ in got] == pytest.approx([lp for lp, _ in want], rel=1e-5)
        assert [g for _, g in got] == [g for _, g in want]
        right += max(range(len(want)), key=lambda i: want[i][0]) == s["doc"]["gold"]
    acc = first["results"]["tiny_mc"]["acc,none"]
    assert acc == pytest.approx(right / len(docs))
    assert _evaluate(root, ["tiny_mc"])["results"]["tiny_mc"]["acc,none"] == acc  # the same twice


@pytest.mark.slow
def test_generate_until_through_simple_evaluate_is_plain_greedy_decoding(harness_run):
    root, model, docs = harness_run
    res = _evaluate(root, ["tiny_gen"])
    for s in res["samples"]["tiny_gen"]:
        context, gen_kwargs = s["arguments"][0]
        want = generate(model, context, max_bytes=12, stop=(b"\n", b"=")).output.decode("utf-8", "replace")
        want = want.split("\n")[0].split("=")[0]
        assert s["resps"][0][0] == want


def _requests(*args):
    from lm_eval.api.instance import Instance

    return [Instance(request_type="generate_until", doc={}, arguments=a, idx=0) for a in args]


@pytest.mark.slow
def test_generation_settings_sampling_and_limits(harness_run):
    from bytemtp.interop.harness import ByteMTPLM

    root, model, _ = harness_run
    # a seed repeats a sample (under any draft: each byte is drawn by its position)
    args = f"ckpt={root / 'run'},device=cpu,batch_size=2,seed=7,draft=chain-3"
    lm = ByteMTPLM.create_from_arg_string(args)
    prompts = ["x = ", "def f(", "import "]
    greedy = lm.generate_until(_requests(*[(p, {"until": [], "max_gen_toks": 5}) for p in prompts]), disable_tqdm=True)
    assert greedy == [generate(model, p, max_bytes=5).output.decode("utf-8", "replace") for p in prompts]
    sampled = [(p, {"do_sample": True, "temperature": 1.0, "max_gen_toks": 20}) for p in prompts]
    a = lm.generate_until(_requests(*sampled), disable_tqdm=True)
    again = ByteMTPLM.create_from_arg_string(args)
    assert again.generate_until(_requests(*sampled), disable_tqdm=True) == a  # seeded
    assert a != [generate(model, p, max_bytes=20).output.decode("utf-8", "replace") for p in prompts]
    with pytest.raises(ValueError, match="num_beams"):
        lm.generate_until(_requests(("x", {"num_beams": 2})), disable_tqdm=True)


@pytest.mark.slow
def test_top_k_and_top_p_reach_the_decoder(harness_run, monkeypatch):
    """top_k=1, or a top_p below any byte's probability, leaves sampling one choice at any
    temperature: greedy's. And the sampling rule handed to the decoder carries what was asked."""
    from bytemtp.interop.harness import ByteMTPLM

    root, model, _ = harness_run
    lm = ByteMTPLM.create_from_arg_string(f"ckpt={root / 'run'},device=cpu,batch_size=2,seed=7")
    prompts = ["x = ", "def f(", "import "]
    greedy = [generate(model, p, max_bytes=20).output.decode("utf-8", "replace") for p in prompts]
    for truncation in ({"top_k": 1}, {"top_p": 1e-6}):
        kw = {"do_sample": True, "temperature": 2.0, "max_gen_toks": 20, **truncation}
        assert lm.generate_until(_requests(*[(p, kw) for p in prompts]), disable_tqdm=True) == greedy, truncation
    handed = []
    decode_rows = lm._decoder.generate

    def spy(prompts, *, sampling, **kw):
        handed.append(sampling)
        return decode_rows(prompts, sampling=sampling, **kw)

    monkeypatch.setattr(lm._decoder, "generate", spy)
    kw = {"do_sample": True, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "max_gen_toks": 3}
    lm.generate_until(_requests(("x", kw), ("y", {**kw, "top_k": None, "top_p": None})), disable_tqdm=True)
    assert [(s.temperature, s.top_k, s.top_p) for s in handed] == [(0.7, 5, 0.9), (0.7, 0, 1.0)]
    assert all(s.generator is lm.generator for s in handed)


@pytest.mark.slow
def test_model_args_win_over_lm_evals_defaults_and_errors_are_one_line(harness_run, tmp_path):
    from bytemtp.interop.harness import ByteMTPLM

    root, _, _ = harness_run
    lm = ByteMTPLM.create_from_arg_string(f"ckpt={root / 'run'},batch_size=8",
                                          {"batch_size": 1, "device": "cpu", "max_batch_size": None})
    assert lm.batch_size == 8 and lm.device.type == "cpu" and lm.max_length == 64
    with pytest.raises(ValueError, match="unknown model_args colour"):
        ByteMTPLM.create_from_arg_string(f"ckpt={root / 'run'},colour=red")
    with pytest.raises(ValueError, match="needs ckpt"):
        ByteMTPLM.create_from_arg_string("device=cpu")
    with pytest.raises(ValueError, match="batch_size"):
        ByteMTPLM.create_from_arg_string(f"ckpt={root / 'run'},batch_size=0")
    result = CliRunner().invoke(main, ["lm-eval", "--model", "bytemtp", "--model_args", f"ckpt={tmp_path / 'none'}",
                                       "--tasks", "tiny_mc", "--include_path", str(root / "tasks")])
    assert result.exit_code == 1 and "does not exist" in result.output and "Traceback" not in result.output


@pytest.mark.slow
def test_lm_eval_command_runs_a_local_task_end_to_end(harness_run, tmp_path):
    """`bytemtp lm-eval`, as a user types it, in a new process; its results file holds the accuracy
    that simple_evaluate reports."""
    import subprocess

    root, _, _ = harness_run
    out = subprocess.run([sys.executable, "-m", "bytemtp_cli", "lm-eval", "--model", "bytemtp", "--model_args",
                          f"ckpt={root / 'run'},device=cpu,batch_size=8", "--include_path", str(root / "tasks"),
                          "--tasks", "tiny_mc", "--output_path", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "TQDM_DISABLE": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "tiny_mc" in out.stdout and "acc" in out.stdout
    results = json.loads(next((tmp_path / "out").rglob("results*.json")).read_text())
    assert results["results"]["tiny_mc"]["acc,none"] == _evaluate(root, ["tiny_mc"])["results"]["tiny_mc"]["acc,none"]
