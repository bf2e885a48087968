"""`bytemtp eval-task humaneval` end to end on tiny checkpoints, as a user runs it."""

import json
import time

import pytest
from click.testing import CliRunner
from doubles import TOY, bigram_model, tiny_model

from bytemtp.config_io import tiny
from bytemtp.evaluation import execution, guard
from bytemtp.evaluation.guard import PASSED
from bytemtp.runtime.checkpoint import save_checkpoint
from bytemtp_cli.main import main


def run(*args, allow: bool = True):
    """The command as a user types it; `allow` adds --allow-unsandboxed-execution (bubblewrap where
    it works, else the guard alone), which the tests of the isolation itself leave out."""
    flags = ["--allow-unsandboxed-execution"] if allow else []
    return CliRunner().invoke(main, ["eval-task", "humaneval", *map(str, args), *flags])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A scripted tiny model that writes "1" after a prompt ending in a space (so toy/one passes
    and toy/add fails), a randomly initialised one, and a file of the two toy problems."""
    root = tmp_path_factory.mktemp("he")
    save_checkpoint(root / "bigram", step=1, model=bigram_model(), config=tiny(), train_state={})
    model = tiny_model(0)
    save_checkpoint(root / "random", step=1, model=model, config=tiny(), train_state={})
    problems = root / "toy.jsonl"
    problems.write_text("".join(json.dumps({"task_id": p.task_id, "prompt": p.prompt, "test": p.test,
                                            "entry_point": p.entry_point}) + "\n" for p in TOY))
    return root


def test_a_scripted_model_scores_what_its_completions_earn(runs, one_thread, tmp_path):
    out = tmp_path / "run.json"
    res = run("--ckpt", runs / "bigram", "--problems", runs / "toy.jsonl", "--device", "cpu", "--compare",
              "--json", out)
    assert res.exit_code == 0, res.output
    assert "2 problems of" in res.output and "pass@1" in res.output and "0.5000" in res.output
    assert "outputs identical: yes" in res.output and "every prompt fits" in res.output
    data = json.loads(out.read_text())
    assert data["pass_at_k"] == {"pass@1": 0.5}
    assert data["shares"] == {"passed": 0.5, "failed": 0.5, "timed out": 0.0, "did not parse": 0.0}
    got = {t["task_id"]: t["completions"] for t in data["tasks"]}
    assert [(c["completion"], c["verdict"], c["stopped_by"]) for c in got["toy/one"]] == [("1", "passed", "stop")]
    assert [(c["completion"], c["verdict"]) for c in got["toy/add"]] == [("1", "failed")]
    assert "AssertionError" in got["toy/add"][0]["detail"]
    assert data["comparison"]["identical"] is True and data["comparison"]["batches"] == 1
    assert data["decoding"]["bytes"] == 6 and data["slid"] == 0
    assert data["problems_file"] == str(runs / "toy.jsonl") and data["settings"]["max_bytes"] == 512


@pytest.mark.slow
def test_sampled_runs_report_pass_at_k_up_to_the_samples(runs, one_thread, tmp_path):
    out = tmp_path / "s.json"
    args = ("--ckpt", runs / "random", "--problems", runs / "toy.jsonl", "--samples", 10, "--temperature", 0.8,
            "--seed", 3, "--max-bytes", 12, "--batch-size", 8, "--device", "cpu")
    res = run(*args, "--json", out)
    assert res.exit_code == 0, res.output
    assert "pass@10" in res.output and "not measured" in res.output
    data = json.loads(out.read_text())
    assert set(data["pass_at_k"]) == {"pass@1", "pass@10"} and data["completions"] == 20
    assert [t["n"] for t in data["tasks"]] == [10, 10] and data["settings"]["heads"] == 8
    assert sum(data["shares"].values()) == pytest.approx(1.0)
    again = run(*args, "--json", tmp_path / "again.json")  # a seed repeats the samples
    assert again.exit_code == 0, again.output
    same = json.loads((tmp_path / "again.json").read_text())
    assert [c["completion"] for t in same["tasks"] for c in t["completions"]] == \
           [c["completion"] for t in data["tasks"] for c in t["completions"]]


@pytest.mark.slow
def test_the_bundled_problems_with_a_few_bytes_each(runs, one_thread, tmp_path):
    out = tmp_path / "b.json"
    res = run("--ckpt", runs / "random", "--max-bytes", 2, "--device", "cpu", "--json", out)
    assert res.exit_code == 0, res.output
    assert "164 problems of HumanEval" in res.output
    # every HumanEval prompt is longer than the tiny model's 64 bytes of context: the run says so
    assert "164 of 164 prompts are longer than the model's 64 bytes" in res.output
    data = json.loads(out.read_text())
    assert len(data["tasks"]) == 164 and data["pass_at_k"] == {"pass@1": 0.0}
    assert all(not t["prompt_fits"] and t["completions"][0]["slid"] for t in data["tasks"])
    assert all(t["completions"][0]["verdict"] in execution.VERDICTS for t in data["tasks"])


@pytest.mark.parametrize("args, message", [
    (("--problems", "{tmp}/missing.jsonl"), "missing.jsonl cannot be read"),
    (("--problems", "{tmp}/bad.jsonl"), "bad.jsonl:1 misses the field 'test'"),
    (("--heads", 9), "more than the model's 8 heads"),
    (("--compare", "--temperature", 0.5), "--compare times greedy decoding"),
])
def test_user_errors_are_one_line_before_the_model_loads(runs, tmp_path, monkeypatch, args, message):
    import bytemtp.runtime.checkpoint

    def never(*a, **kw):
        raise AssertionError("the model was loaded before the arguments were checked")

    monkeypatch.setattr(bytemtp.runtime.checkpoint, "load_model", never)
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": "a", "prompt": "", "entry_point": "f"}) + "\n")
    res = run("--ckpt", runs / "bigram", *[str(a).format(tmp=tmp_path) for a in args])
    assert res.exit_code in (1, 2) and "Traceback" not in res.output and message in res.output
    assert [line for line in res.output.splitlines() if line.startswith("Error:")] == \
           [line for line in res.output.splitlines() if message in line]


def test_bad_numbers_are_refused_by_name(runs):
    for args, name in ((("--samples", 0), "--samples"), (("--top-p", 0), "--top-p"), (("--timeout", 0), "--timeout"),
                       (("--memory-mb", 8), "--memory-mb")):
        res = run("--ckpt", runs / "bigram", *args)
        assert res.exit_code == 2 and name in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("args, message", [
    ((), "install it with apt install bubblewrap, or dnf install bubblewrap"),
    ((), "--allow-unsandboxed-execution"),
    (("--sandbox", "bwrap"), "sandbox bwrap: bubblewrap (bwrap) is not installed; install it with apt"),
    (("--sandbox", "bwrap", "--allow-unsandboxed-execution"), "sandbox bwrap: bubblewrap (bwrap) is not installed"),
    (("--sandbox", "guard"), "sandbox guard runs programs with the guard alone, which is not a security boundary"),
])
def test_without_bubblewrap_nothing_runs_unless_the_command_allows_it(runs, monkeypatch, args, message):
    import bytemtp.runtime.checkpoint

    def never(*a, **kw):
        raise AssertionError("the model was loaded before the isolation was settled")

    monkeypatch.setattr(bytemtp.runtime.checkpoint, "load_model", never)
    monkeypatch.setattr(execution, "bwrap_problem", lambda: execution.NOT_INSTALLED)
    res = run("--ckpt", runs / "bigram", "--problems", runs / "toy.jsonl", *args, allow=False)
    assert res.exit_code == 1 and "Traceback" not in res.output and message in res.output
    assert [line for line in res.output.splitlines() if line.startswith("Error:")] == res.output.splitlines()


def test_the_guard_alone_runs_when_the_command_allows_it_and_the_report_says_so(runs, one_thread, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(execution, "bwrap_problem", lambda: execution.NOT_INSTALLED)
    for args in (("--sandbox", "guard"), ()):  # asked for, or auto without bubblewrap
        out = tmp_path / "g.json"
        res = run("--ckpt", runs / "bigram", "--problems", runs / "toy.jsonl", "--device", "cpu", *args,
                  "--json", out)
        assert res.exit_code == 0, res.output
        notes = [line for line in res.output.splitlines() if line.startswith("note: programs run with the guard alone")]
        assert len(notes) == 1 and "isolation: the guard alone, as you" in res.output
        data = json.loads(out.read_text())
        assert data["execution"]["sandbox"] == "guard" and data["pass_at_k"] == {"pass@1": 0.5}
        assert data["execution"]["caveat"] == guard.LIMITS and guard.LIMITS in notes[0]


@pytest.mark.bwrap
def test_programs_run_under_bubblewrap_by_default_and_the_report_says_so(runs, one_thread, tmp_path):
    for args in ((), ("--sandbox", "bwrap")):
        out = tmp_path / "b.json"
        res = run("--ckpt", runs / "bigram", "--problems", runs / "toy.jsonl", "--device", "cpu", *args,
                  "--json", out, allow=False)
        assert res.exit_code == 0, res.output
        assert "isolation: bubblewrap" in res.output and "guard alone" not in res.output
        data = json.loads(out.read_text())
        assert data["execution"]["sandbox"] == "bwrap" and data["pass_at_k"] == {"pass@1": 0.5}
        assert data["execution"]["caveat"] == ""


def test_ctrl_c_stops_with_status_130_and_writes_nothing(runs, tmp_path, monkeypatch):
    from bytemtp.evaluation import humaneval

    def interrupted(*a, progress, **kw):
        progress("decode", 0, 2)
        raise KeyboardInterrupt

    monkeypatch.setattr(humaneval, "run_humaneval", interrupted)
    res = run("--ckpt", runs / "bigram", "--problems", runs / "toy.jsonl", "--device", "cpu",
              "--json", tmp_path / "o.json")
    assert res.exit_code == 130 and "interrupted during decode; nothing written" in res.output
    assert not (tmp_path / "o.json").exists()


def test_an_interrupted_execution_drops_the_programs_not_started(monkeypatch):
    started = []

    def slow(source, **kw):
        started.append(source)
        time.sleep(0.2)
        return execution.Outcome(PASSED)

    def progress(done, total):
        if done:
            raise KeyboardInterrupt

    monkeypatch.setattr(execution, "run_program", slow)
    with pytest.raises(KeyboardInterrupt):
        execution.run_programs([f"x = {i}" for i in range(8)], workers=1, progress=progress,
                               isolation=execution.Isolation(execution.Sandbox.GUARD, allow_unsandboxed=True))
    assert len(started) <= 2
