"""The typed results of bytemtp.evaluation.evaluate: their JSON form is the one `bytemtp eval
--json`, `bytemtp tune --json` and `bench` have always written, key for key and in order."""

import json

from bytemtp.evaluation.evaluate import DraftReport, EvalResult, HeldOutDecoding

RESULT = EvalResult(bytes=120, bpb=[2.5, 3.0, 3.5], accuracy=[0.5, 0.4, 0.3], acceptance={2: 0.4, 3: 0.2},
                    bytes_per_forward={2: 1.4, 3: 1.6}, agreement={2: 0.5, 3: 0.25},
                    agreed_bytes_per_forward={2: 1.5, 3: 1.75})


def test_eval_result_json_is_the_form_eval_writes_and_reads_back():
    want = {"bytes": 120, "bpb": [2.5, 3.0, 3.5], "accuracy": [0.5, 0.4, 0.3], "acceptance": {2: 0.4, 3: 0.2},
            "bytes_per_forward": {2: 1.4, 3: 1.6}, "agreement": {2: 0.5, 3: 0.25},
            "agreed_bytes_per_forward": {2: 1.5, 3: 1.75}}
    assert list(RESULT.to_json().items()) == list(want.items())
    written = json.loads(json.dumps({"ckpt": "run", **RESULT.to_json()}))  # as eval --json writes it
    assert EvalResult.from_json(written) == RESULT


def test_a_profile_alone_reads_back_for_plot():
    got = EvalResult.from_json({"acceptance": {"2": 0.5}, "bytes_per_forward": {"2": 1.5}})
    assert got.acceptance == {2: 0.5} and got.bytes_per_forward == {2: 1.5} and got.bpb == []


def test_draft_report_json_has_prompts_only_when_it_decoded():
    base = dict(split="val", bytes=10, bpb=[1.0, 2.0], agreement={2: 0.5}, agreed_bytes_per_forward={2: 1.5})
    plain = DraftReport(**base, decoded_bytes_per_forward={})
    assert list(plain.to_json()) == ["split", "bytes", "bpb", "agreement", "agreed_bytes_per_forward",
                                     "decoded_bytes_per_forward"]
    decoded = DraftReport(**base, decoded_bytes_per_forward={"chain-all": 1.2}, prompts=4, max_bytes=150)
    assert list(decoded.to_json().items())[-3:] == [("decoded_bytes_per_forward", {"chain-all": 1.2}),
                                                    ("prompts", 4), ("max_bytes", 150)]
    assert list(HeldOutDecoding(prompts=4, max_bytes=150, bytes_per_forward={"tree-all": 1.3}).to_json().items()) \
        == [("prompts", 4), ("max_bytes", 150), ("bytes_per_forward", {"tree-all": 1.3})]
