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


def test_results_render_what_eval_and_tune_heads_print():
    assert RESULT.table().splitlines() == [
        "head  bits/byte  accuracy  2..k right  bytes/pass  2..k agree with h1  bytes/pass (agreed)",
        "----  ---------  --------  ----------  ----------  ------------------  -------------------",
        "h1    2.500      0.500     -           -           -                   -",
        "h2    3.000      0.400     0.400       1.40        0.500               1.50",
        "h3    3.500      0.300     0.200       1.60        0.250               1.75"]
    assert (HeldOutDecoding(prompts=4, max_bytes=150, bytes_per_forward={"chain-all": 1.234, "tree-all": 1.5}).line()
            == "decoded: 4 held-out prompts, 150 greedy bytes each; bytes per pass: chain-all 1.23, tree-all 1.50")
    base = dict(split="val", bytes=1234, bpb=[1.0, 2.0], agreement={2: 0.5}, agreed_bytes_per_forward={2: 1.5})
    after = DraftReport(**base, decoded_bytes_per_forward={"tree-all": 1.75, "chain-all": 1.5}, prompts=4,
                        max_bytes=150)
    before = DraftReport(**{**base, "agreement": {2: 0.25}}, decoded_bytes_per_forward={"tree-all": 1.25,
                                                                                        "chain-all": 1.0})
    # the tune's source is a row above where it is left; the decoded drafts' columns sorted by name
    assert after.table(before).splitlines() == [
        "1,234 bytes of the val split; decoded: 4 held-out prompts, 150 bytes each, greedy",
        "heads   h1 bits/byte  2..2 agree  agreed bytes/pass (2)  chain-all bytes/pass  tree-all bytes/pass",
        "------  ------------  ----------  ---------------------  --------------------  -------------------",
        "before  1.0000        0.250       1.50                   1.00                  1.25",
        "after   1.0000        0.500       1.50                   1.50                  1.75"]
    assert after.table().splitlines()[3].startswith("after ")
