"""bytemtp.evaluation.humaneval_records: each record's JSON form is what `eval-task humaneval
--json` has always written, key for key and in order."""

import json

from bytemtp.decoding.generation import Generation, SpeculativeStats
from bytemtp.evaluation.execution import Outcome
from bytemtp.evaluation.humaneval_records import (Checked, CheckResult, Completion, DecodingSummary, Execution,
                                                  HumanEvalRun, Settings, SpeedComparison, TaskResult)
from bytemtp.spread import Spread

SAMPLED = Completion(completion="1", stopped_by="stop", slid=False, bytes=3, forward_passes=2)


def test_a_checked_completion_keeps_how_it_was_decoded():
    checked = Checked.of(SAMPLED, Outcome("passed"))
    assert checked.passed and list(checked.to_json().items()) == [
        ("completion", "1"), ("stopped_by", "stop"), ("slid", False), ("bytes", 3), ("forward_passes", 2),
        ("verdict", "passed"), ("detail", "")]
    assert Checked.of("2", Outcome("failed", "AssertionError:")).to_json() == \
        {"completion": "2", "verdict": "failed", "detail": "AssertionError:"}


def test_decoding_summary_sums_the_generations():
    gens = [Generation(b"ab", SpeculativeStats(bytes_out=2, forward_passes=1, drafted=[1], accepted=[1],
                                               heads_used={4: 1}, slides=1)),
            Generation(b"c", SpeculativeStats(bytes_out=1, forward_passes=1, drafted=[1, 1], accepted=[0, 0],
                                              heads_used={2: 1}))]
    got = DecodingSummary.of(gens, 0.5).to_json()
    assert list(got.items()) == [
        ("bytes", 3), ("forward_passes", 2), ("bytes_per_forward", 1.5), ("drafted", [2, 1]), ("accepted", [1, 0]),
        ("acceptance", [0.5, 0.0]), ("heads_used", {"2": 1, "4": 1}), ("slides", 1), ("wall_s", 0.5),
        ("bytes_per_s", 6.0)]
    assert DecodingSummary.of([], 0.0).bytes_per_s == 0.0


def test_a_run_writes_the_form_it_always_had():
    task = TaskResult(task_id="toy/one", n=1, passed=1, completions=[Checked.of(SAMPLED, Outcome("passed"))])
    check = CheckResult(pass_at_k={"pass@1": 1.0}, shares={"passed": 1.0}, problems=1, completions=1, missing=[],
                        execution=Execution(sandbox="guard", timeout=3.0, memory_mb=1024, wall_s=0.1), tasks=[task])
    assert list(task.to_json()) == ["task_id", "n", "passed", "completions"]  # prompt_fits only from a run
    settings = Settings(samples=1, temperature=0.0, top_p=1.0, top_k=0, seed=0, batch_size=16, max_bytes=512,
                        heads="auto", seq_len=64, n_future=8, stop=["\ndef"], compile="off")
    decoding = DecodingSummary(bytes=3, forward_passes=2, drafted=[], accepted=[], heads_used={}, slides=0, wall_s=0.1)
    comparison = SpeedComparison(plain_s=0.2, speculative_s=0.1, speedup=Spread(2.0, 1.5, 2.5), batches=1,
                                 identical=True, note="")
    run = HumanEvalRun(settings=settings, check=check, decoding=decoding, comparison=comparison, slid=0,
                       compile_stats=None)
    got = json.loads(json.dumps(run.to_json()))
    assert list(got) == ["settings", "pass_at_k", "shares", "problems", "completions", "missing", "execution",
                         "tasks", "decoding", "comparison", "slid", "compile_stats"]
    assert list(got["settings"]) == ["samples", "temperature", "top_p", "top_k", "seed", "batch_size", "max_bytes",
                                     "heads", "seq_len", "n_future", "stop", "compile"]
    assert got["execution"] == {"sandbox": "guard", "timeout": 3.0, "memory_mb": 1024, "wall_s": 0.1, "caveat": ""}
    assert list(got["comparison"]) == ["plain_s", "speculative_s", "speedup", "speedup_min", "speedup_max",
                                       "batches", "identical", "note"]
    assert (got["comparison"]["speedup"], got["comparison"]["speedup_min"], got["comparison"]["speedup_max"]) == (
        2.0, 1.5, 2.5)
    assert "comparison" not in HumanEvalRun(settings=settings, check=check, decoding=decoding, comparison=None,
                                            slid=0, compile_stats=None).to_json()
