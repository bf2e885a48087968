"""Benchmarks measured as ratios (bytemtp.experiments.bench): when the spread of the pair ratios
says a time ratio is noise, and the results' JSON form, the one the `bench` commands have always
written, read back. The `bench` commands end to end are in test_cli.py and test_generate_cli.py."""

import dataclasses
import json

import pytest

from bytemtp.spread import Spread


def test_train_step_time_ratio_spread_says_when_it_is_noise():
    from bytemtp.experiments.step_bench import NOISY_SPREAD, noise_note

    quiet = Spread.of(sorted([1.02, 0.98, 1.0, 1.05, 1.01]), keep_runs=True)
    assert (quiet.low, quiet.mid, quiet.high) == (0.98, 1.01, 1.05)
    assert quiet.runs == (0.98, 1.0, 1.01, 1.02, 1.05)
    assert quiet.width == pytest.approx(0.07 / 1.01) and noise_note(quiet) is None
    busy = Spread.of([0.12, 1.0, 1.57], keep_runs=True)  # two runs on a busy machine gave these as the whole result
    assert busy.width > NOISY_SPREAD and "0.120 to 1.570" in noise_note(busy)
    assert "2 timed round(s)" in noise_note(Spread.of([1.0, 1.01], keep_runs=True))  # too few rounds to judge


def test_one_spread_type_makes_writes_and_reads_every_form():
    """A spread's centre is its constructor's (median, mean, or a figure of its own); its JSON form
    is the one the result names, nested or flat, and reads back."""
    rounds = Spread.of([3.0, 1.0, 2.0, 10.0], keep_runs=True)
    assert (rounds.mid, rounds.low, rounds.high, rounds.runs) == (2.5, 1.0, 10.0, (3.0, 1.0, 2.0, 10.0))
    assert Spread.of([3.0, 1.0]).runs == ()  # not kept unless asked
    assert Spread.mean_of([1.0, 2.0, 6.0]) == Spread(3.0, 1.0, 6.0)
    assert Spread.around(1.5, [2.0, 1.0]) == Spread(1.5, 1.0, 2.0)
    assert Spread.ratios([2.0, 6.0, 3.0], [1.0, 2.0, 2.0]) == Spread(2.0, 1.5, 3.0)
    assert Spread(1.52, 0.86, 2.11).format(unit="x") == "1.52x (0.86-2.11)"
    assert Spread(0.12, 0.11, 0.13).format("{:.2f}M") == "0.12M (0.11M-0.13M)"
    assert list(rounds.flat("speedup", runs=True)) == ["speedup", "speedup_min", "speedup_max", "speedup_runs"]
    assert Spread.from_flat(json.loads(json.dumps(rounds.flat("r", runs=True))), "r", runs=True) == rounds
    assert Spread.from_flat(rounds.flat("r"), "r") == Spread(2.5, 1.0, 10.0)
    assert rounds.to_dict("mean", runs="each") == {"mean": 2.5, "min": 1.0, "max": 10.0, "each": [3.0, 1.0, 2.0, 10.0]}
    assert Spread.from_dict(rounds.to_dict()) == Spread(2.5, 1.0, 10.0)


# --- the results' JSON: the form the commands have always written, read back --------------------

REPETITION = {"decoded": {"distinct_8grams": 0.5, "zstd_ratio": 2.5, "bytes": 300},
              "real": {"distinct_8grams": 0.9, "zstd_ratio": 1.5, "bytes": 300}, "zstd_ratio_over_real": 2.5 / 1.5}
CASE = {"batch_size": 1, "mode": "auto", "speedup": 1.5, "speedup_min": 1.2, "speedup_max": 1.8,
        "speedup_runs": [1.2, 1.8], "bytes_per_forward": 2.5, "pass_cost": 1.1, "plain_bytes_s": 400.0,
        "spec_bytes_s": 600.0, "identical": True, "heads_used": {"1": 3, "4": 10}, "shapes": {"chain-4": 10},
        "repetition": REPETITION, "host_transfers_per_pass": 1.0, "outside_step_share": 0.12}
EAGER = {"eager_plain_bytes_s": 300.0, "eager_speedup": 2.0, "compiled_plain_speedup": 1.33}
# `bench decode --json` as written before its result was typed: the top case's figures at the top level
DECODE = {"ckpt": "runs/demo", "device": "cpu", "dtype": "float32", "prompts": 2, "prompt_bytes": 128, "max_bytes": 150,
          "rounds": 2, "val_bpb": 2.1, "compile": "off", **{k: CASE[k] for k in (
              "speedup", "speedup_min", "speedup_max", "bytes_per_forward", "pass_cost", "identical",
              "plain_bytes_s", "spec_bytes_s", "repetition")},
          "compile_stats": None, "pass_costs_ms": {"1x1": 5.0}, "all_identical": False,
          "cases": [CASE, {**CASE, "mode": "chain-2", "identical": False, "heads_used": {"2": 7}},
                    {**CASE, "batch_size": 8, "heads_used": {}}]}
TRAIN_STEP = {"preset": "tiny", "device": "cpu", "batch_size": 2, "seq_len": 64, "steps": 3, "warmup": 1,
              "steps_per_sample": 4, "ntp_step_s": 0.1, "ntp_bytes_s": 1280.0, "ntp_params": 100, "mtp_step_s": 0.11,
              "mtp_bytes_s": 1163.6, "mtp_params": 120, "mtp_plain_step_s": 0.2, "mtp_plain_bytes_s": 640.0,
              "mtp_plain_params": 120, "ntp_peak_mb": 10.0, "mtp_peak_mb": 12.0, "mtp_plain_peak_mb": 30.0,
              "time_ratio": 0.11 / 0.1, "time_ratio_min": 1.0, "time_ratio_median": 1.1, "time_ratio_max": 1.2,
              "time_ratio_runs": [1.0, 1.1, 1.2], "time_ratio_spread": (1.2 - 1.0) / 1.1, "time_ratio_noisy": False,
              "time_ratio_note": None, "memory_ratio": 12.0 / 10.0, "plain_memory_ratio": 30.0 / 10.0,
              "compiled": True}
LOADER = {"shard": "c/train/shard-00000.zst", "decompressed_bytes": 1000, "compressed_bytes": 400, "seq_len": 64,
          "batch_size": 8, "batches": 3, "repeats": 1, "loader_s": 2.0, "zstd_s": 0.5, "loader_mb_s": 0.0005,
          "zstd_mb_s": 0.002, "ratio": 0.25, "pair_ratios": [0.25]}
VS = {"path": "same.parquet", "files": 1, "document_bytes": 1000, "s": 2.5, "mb_s": 0.0004, "ratio": 0.8,
      "pair_ratios": [0.8]}
LOAD = {"clients": 2, "wall_s": 1.5, "completions": 4, "bytes_out": 512, "bytes_per_s": 341.3, "ttfb_p50_s": 0.01,
        "ttfb_p95_s": 0.02, "mismatches": 0, "errors": 0}
SERVE = {"ckpt": "runs/demo", "device": "cpu", "prompts": 4, "max_bytes": 128, "rounds": 1, "draft": "auto+lookup",
         "max_batch": 16, "cases": {"1": {"runs": [LOAD], "bytes_per_s": 341.3, "ratio": 1.0, "ratio_min": 1.0,
                                          "ratio_max": 1.0, "ttfb_p50_s": 0.01, "ttfb_p95_s": 0.02, "mismatches": 0,
                                          "errors": 0}},
         "load": {**LOAD, "rss_mb_before": 500.0, "rss_mb_after": 510.5, "rss_mb_settled_min_max": [505.0, 510.5],
                  "rss_mb_samples": [[0.0, 500.0], [1.5, 510.5]], "engine_requests": 4, "engine_errors": 0},
         "mean_batch": 1.5, "bytes_per_row_pass": 1.8, "val_bpb": None}
# `bench serve --json` with the plain server's arm (now the default) and the step both servers ran
SERVE_VS_PLAIN = {**SERVE, "cases": {"1": {**SERVE["cases"]["1"], "plain_runs": [{**LOAD, "bytes_per_s": 170.0}],
                                           "plain_bytes_per_s": 170.0, "over_plain": 2.01, "over_plain_min": 2.01,
                                           "over_plain_max": 2.01, "plain_mismatches": 0, "plain_errors": 0}},
                  "compile": "off", "step": "eager"}
# `bench serve --load --malformed`: a mixed load, its answers by kind, the memory at a quarter
SERVE_MIXED = {**SERVE, "load": {**SERVE["load"], "malformed": 0.1, "malformed_sent": 2, "server_errors": 0,
                                 "malformed_by_kind": {"bad-json": {"400 invalid_request_error": 2}},
                                 "rss_mb_first_quarter": 505.0}}
PREP = {"input_files": 2, "input_bytes": 5000, "written_bytes": 9000, "rounds": 2,
        "arms": {"workers 1": {"workers": 1, "seconds": [2.0, 2.2], "mb_s": {"median": 0.0043, "min": 0.0041,
                                                                           "max": 0.0045}, "same_corpus": True},
                 "workers 2": {"workers": 2, "seconds": [1.1, 1.2], "mb_s": {"median": 0.0078, "min": 0.0075,
                                                                           "max": 0.0082}, "same_corpus": True,
                               "speedup": {"median": 1.82, "min": 1.81, "max": 1.83}}},
        "parts": {"parts": 3, "workers": 2, "part_seconds": [0.5, 0.5, 0.6], "merge_seconds": 0.1, "merge_mb_s": 0.09,
                  "same_documents": True, "same_order": False}}


def _sampling(decode: dict, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0) -> dict:
    """`bench decode --json` as written since runs may be sampled: how it decoded after `rounds`
    (and `all_identical` None when sampled: not expected)."""
    out = {}
    for key, value in decode.items():
        out[key] = value
        if key == "rounds":
            out.update(temperature=temperature, top_p=top_p, seed=seed)
    return {**out, "all_identical": None} if temperature > 0 else out


def _written(result) -> dict:
    """A result as a command writes it, then reads it: JSON text, keys in order."""
    return json.loads(json.dumps(result.to_json()))


def _compiled(decode: dict) -> dict:
    """`bench decode --json` on the compiled step: eager plain's figures after the repetition."""
    out = {}
    for key, value in decode.items():
        out[key] = value
        if key == "repetition":
            out.update(EAGER)
    return {**out, "compile": "on", "compile_stats": {"graphs": 3}, "cases": [{**c, **EAGER} for c in decode["cases"]]}


@pytest.mark.parametrize("data", [DECODE, _compiled(DECODE)])
def test_decode_speed_reads_back_from_the_json_bench_decode_wrote(data):
    from bytemtp.experiments.bench import DecodeSpeed

    res = DecodeSpeed.from_json(data)  # written before runs were sampled: greedy
    assert (res.temperature, res.top_p, res.seed, res.sampled) == (0.0, 1.0, 0, False)
    assert list(_written(res).items()) == list(_sampling(data).items())
    assert res.top.figures.mode == "auto" and res.top.batch_size == 1 and res.cases[0].figures.heads_used == {1: 3, 4: 10}
    assert res.all_identical is False and DecodeSpeed.from_json(_written(res)) == res
    chains = DecodeSpeed.from_json({**data, "cases": data["cases"][1:2]})
    assert chains.top.figures.mode == "chain-2"  # no auto: the first mode measured at the first batch size


@pytest.mark.parametrize("data", [_sampling(DECODE, 0.8, 0.95, 3), _sampling(_compiled(DECODE), 0.8, 0.95, 3)])
def test_a_sampled_decode_speed_round_trips_and_does_not_judge_identity(data):
    from bytemtp.experiments.bench import DecodeSpeed

    res = DecodeSpeed.from_json(data)
    assert (res.temperature, res.top_p, res.seed, res.sampled) == (0.8, 0.95, 3, True)
    assert list(_written(res).items()) == list(data.items()) and DecodeSpeed.from_json(_written(res)) == res
    # chain-2's outputs differ from plain's, as sampled draws do: no verdict, where greedy would fail
    assert not res.cases[1].figures.identical and res.all_identical is None
    # a draft confidence is written where it was set, and read back
    sure = dataclasses.replace(res, confidence=0.3)
    assert _written(sure)["confidence"] == 0.3 and DecodeSpeed.from_json(_written(sure)) == sure
    assert "confidence" not in _written(res)


def test_decode_table_shows_each_rows_repetition_and_no_identity_verdict_when_sampled():
    from bytemtp.experiments.bench import DecodeSpeed

    greedy = DecodeSpeed.from_json(DECODE)
    lines = greedy.cases_table().splitlines()
    assert "distinct 8-grams" in lines[0] and "zstd x (over real)" in lines[0]
    rows = lines[2:]
    assert "D2H/pass, outside step" in lines[0]
    assert len(rows) == 3 and all(row.split()[-5:] == ["0.50", "2.50x", "(1.67)", "1.00,", "12%"] for row in rows), rows
    assert [" yes " in r or " NO " in r for r in rows] == [True] * 3 and " NO " in rows[1]
    assert greedy.real_continuation_line() == ("real continuation (300 bytes, cut to the decoded lengths): "
                                              "distinct 8-grams 0.90, zstd ratio 1.50x")
    assert greedy.sampling_text == "greedy"
    sampled = DecodeSpeed.from_json(_sampling(DECODE, 0.8, 0.95))
    table = sampled.cases_table()
    assert table.count("n/a (sampled)") == 3 and " NO " not in table and " yes " not in table
    assert sampled.sampling_text == "sampled at temperature 0.8, top-p 0.95 (seed 0)"
    # rows that stopped apart (sampled: EOS in one mode, not another) cut the real text apart too
    other = {**REPETITION, "real": {"distinct_8grams": 0.8, "zstd_ratio": 1.75, "bytes": 250}}
    apart = DecodeSpeed.from_json({**DECODE, "cases": [DECODE["cases"][0], {**CASE, "repetition": other}]})
    assert apart.real_continuation_line().endswith("(250 to 300 bytes, cut to the decoded lengths): "
                                                  "distinct 8-grams 0.80 to 0.90, zstd ratio 1.50 to 1.75x")
    # prompts from a file: no real continuation, the decoded ratio alone
    alone = {"decoded": REPETITION["decoded"], "real": None, "zstd_ratio_over_real": None}
    from_file = DecodeSpeed.from_json({**DECODE, "cases": [{**CASE, "repetition": alone}]})
    assert from_file.cases_table().splitlines()[2].split()[-4:] == ["0.50", "2.50x", "1.00,", "12%"]
    assert from_file.real_continuation_line().startswith("no real continuation")


@pytest.mark.parametrize("data", [TRAIN_STEP, {**TRAIN_STEP, "time_ratio_noisy": True, "time_ratio_note": "noise"}])
def test_train_step_reads_back_from_the_flat_json_bench_train_step_wrote(data):
    from bytemtp.experiments.step_bench import TrainStepResult

    res = TrainStepResult.from_json(data)
    assert list(res.variants) == ["ntp", "mtp", "mtp_plain"] and res.variants["mtp"].peak_mb == 12.0
    assert res.time_ratio == data["time_ratio"] and res.time_ratio_noisy is data["time_ratio_noisy"]
    assert list(_written(res).items()) == list(data.items()) and TrainStepResult.from_json(_written(res)) == res
    gpu = dict(data)
    for name in ("ntp", "mtp", "mtp_plain"):  # on a GPU each variant's MFU follows its parameters
        items = list(gpu.items())
        at = [k for k, _ in items].index(f"{name}_params") + 1
        gpu = dict(items[:at] + [(f"{name}_mfu", 0.3)] + items[at:])
    assert list(_written(TrainStepResult.from_json(gpu)).items()) == list(gpu.items())


@pytest.mark.parametrize("data", [LOADER, {**LOADER, "vs": VS}])
def test_loader_throughput_reads_back_from_the_json_bench_loader_wrote(data):
    from bytemtp.experiments.loader_bench import LoaderThroughput

    res = LoaderThroughput.from_json(data)
    assert (res.vs is None) == ("vs" not in data)
    assert list(_written(res).items()) == list(data.items()) and LoaderThroughput.from_json(_written(res)) == res


@pytest.mark.parametrize("data", [SERVE, {k: v for k, v in SERVE.items() if k != "load"}, SERVE_VS_PLAIN,
                                  SERVE_MIXED])
def test_serve_speed_reads_back_from_the_json_bench_serve_wrote(data):
    from bytemtp.experiments.serve_bench import ServeSpeed

    res = ServeSpeed.from_json(data)
    assert list(res.cases) == [1] and res.cases[1].runs[0].bytes_out == 512
    assert list(_written(res).items()) == list(data.items()) and ServeSpeed.from_json(_written(res)) == res
    case = res.cases[1]
    if data is SERVE_VS_PLAIN:
        assert case.plain_runs[0].bytes_per_s == 170.0 and case.over_plain == Spread(2.01, 2.01, 2.01)
        assert case.plain_mismatches == 0
        assert (res.compile, res.step) == ("off", "eager")
    else:  # written before the plain arm: its figures, and the step, are None
        assert all(getattr(case, k) is None for k in ("plain_runs", "plain_bytes_per_s", "over_plain",
                                                      "plain_mismatches", "plain_errors"))
        assert res.compile is None and res.step is None


def test_all_benchmarks_reads_back_and_its_summary_is_the_parts_figures():
    from bytemtp.evaluation.evaluate import EvalResult
    from bytemtp.experiments.bench import AllBenchmarks

    ev = EvalResult(bytes=10, bpb=[2.0, 3.0], accuracy=[0.5, 0.4], acceptance={2: 0.3}, bytes_per_forward={2: 1.3},
                    agreement={2: 0.4}, agreed_bytes_per_forward={2: 1.4})
    summary = {"train_step.time_ratio": TRAIN_STEP["time_ratio"], "train_step.time_ratio_min": 1.0,
               "train_step.time_ratio_max": 1.2, "train_step.time_ratio_noisy": False,
               "train_step.memory_ratio": TRAIN_STEP["memory_ratio"], "loader.ratio": 0.25,
               "loader.loader_mb_s": 0.0005, "decode.speedup": 1.5, "decode.bytes_per_forward": 2.5,
               "decode.speedup_min": 1.2, "decode.pass_cost": 1.1, "decode.identical": False,
               "decode.distinct_8grams": 0.5, "decode.zstd_ratio": 2.5,
               "decode.zstd_ratio_over_real": REPETITION["zstd_ratio_over_real"], "eval.bpb_head1": 2.0,
               "eval.bytes_per_forward_2": 1.3}
    data = json.loads(json.dumps({"summary": summary, "train_step": TRAIN_STEP, "loader": LOADER, "decode": DECODE,
                                  "eval": ev.to_json()}))
    res = AllBenchmarks.from_json(data)
    assert res.summary == summary and list(_written(res).items()) == list({**data, "decode": _sampling(DECODE)}.items())


def test_prep_speed_reads_back_from_the_json_bench_prep_wrote():
    from bytemtp.experiments.prep_bench import PrepSpeed

    res = PrepSpeed.from_json(PREP)
    assert res.arms["workers 1"].speedup is None and res.arms["workers 2"].speedup == Spread(1.82, 1.81, 1.83)
    assert list(_written(res).items()) == list(PREP.items()) and PrepSpeed.from_json(_written(res)) == res
    alone = {k: v for k, v in PREP.items() if k != "parts"}
    assert PrepSpeed.from_json(alone).parts is None and _written(PrepSpeed.from_json(alone)) == alone


def test_bench_decode_and_bench_tokens_time_their_arms_with_one_function():
    """One function times decoding arms (interleaved rounds, a sampler per arm, the figures against
    plain): bench decode and bench tokens both call it, and neither interleaves decodes itself."""
    import inspect

    from bytemtp.experiments import bench, token_bench

    assert token_bench.time_arms is bench.time_arms
    for module in (bench, token_bench):
        body = inspect.getsource(module).replace(inspect.getsource(bench.time_arms), "").replace(
            inspect.getsource(bench.seeded_sampling), "")  # the one place that seeds an arm's sampling
        assert "interleaved_decodes(" not in body and "manual_seed(" not in body, module.__name__


def test_a_noisy_decode_figure_is_printed_with_its_note_and_read_back():
    """A speedup that its bytes per pass make impossible is kept and marked, never thrown away."""
    from bytemtp.experiments.bench import DecodeSpeed

    data = {**DECODE, "cases": [{**DECODE["cases"][0], "noise": "auto's speedup 1.71 at 1.00 bytes per pass is "
                                                                "impossible: the machine was busy"}, *DECODE["cases"][1:]]}
    res = DecodeSpeed.from_json(data)
    assert res.cases[0].figures.noise and DecodeSpeed.from_json(_written(res)) == res
    assert "NOISY, batch 1: auto's speedup 1.71" in res.table()
    assert "NOISY" not in DecodeSpeed.from_json(DECODE).table()
