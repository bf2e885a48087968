"""bytemtp.decoding.generation: what a generation call takes (prompts as bytes or str, and the
errors for what is neither), and decode statistics summed in one place and rendered as `generate`
prints and writes them."""

import dataclasses

import pytest
from doubles import generate_batch, generate_speculative, rare_eos_model

from bytemtp.decoding import decode
from bytemtp.decoding.drafting import Choice, DraftTree
from bytemtp.decoding.generation import DecodeStats, SpeculativeStats
from bytemtp.decoding.strategy import Draft


def test_the_python_api_takes_str_prompts_as_utf8():
    model = rare_eos_model()
    want = generate_batch(model, [b"def parse(", "é".encode()], max_bytes=12, draft=Draft(4))
    got = generate_batch(model, ["def parse(", "é"], max_bytes=12, draft=Draft(4), stop=())
    assert [g.output for g in got] == [w.output for w in want]
    assert decode.generate(model, "def parse(", max_bytes=12).output == want[0].output
    assert generate_speculative(model, "é", max_bytes=12, draft=Draft(4)).output == want[1].output
    with pytest.raises(TypeError, match=r"for one prompt pass \[prompt\]"):
        generate_batch(model, "def parse(", max_bytes=4)
    with pytest.raises(TypeError, match="a prompt is bytes or str, not int"):
        generate_batch(model, [7], max_bytes=4)
    with pytest.raises(ValueError, match=r"^heads=9 is not allowed") as error:
        generate_batch(model, ["x"], max_bytes=4, draft=Draft(9))
    assert "--" not in str(error.value)  # library errors name arguments, not the CLI's flags


def test_total_adds_plain_and_speculative_statistics():
    plain = DecodeStats(bytes_out=5, forward_passes=5, wall_s=0.5, stopped_by="eos")
    a = SpeculativeStats(bytes_out=6, forward_passes=2, wall_s=0.25, drafted=[2, 1], accepted=[2, 0],
                         heads_used={4: 2}, shapes={"chain-4": 2}, slides=1)
    b = SpeculativeStats(bytes_out=3, forward_passes=1, drafted=[1, 1, 1], accepted=[1, 1, 0],
                         heads_used={2: 1, 4: 1}, shapes={"tree-4": 1, "chain-4": 1})
    got = SpeculativeStats.total([a, plain, b])
    assert (got.bytes_out, got.forward_passes, got.wall_s, got.slides) == (14, 8, 0.75, 1)
    assert got.drafted == [3, 2, 1] and got.accepted == [3, 1, 0]
    assert list(got.heads_used.items()) == [(4, 3), (2, 1)]  # in the order first seen
    assert list(got.shapes.items()) == [("chain-4", 3), ("tree-4", 1)]
    assert got.stopped_by == "" and got.bytes_per_forward == 14 / 8
    assert SpeculativeStats.total([]).bytes_per_forward == 0.0


def test_statistics_render_what_generate_prints_and_writes():
    plain = DecodeStats(bytes_out=30, forward_passes=30, wall_s=0.25, stopped_by="max_bytes")
    assert plain.line() == "30 bytes in 30 forward passes (1.00 bytes/pass), 0.25 s, 120 bytes/s; stopped by max_bytes"
    assert plain.to_json() == {"bytes": 30, "forward_passes": 30, "bytes_per_forward": 1.0, "wall_s": 0.25,
                               "stopped_by": "max_bytes"}
    spec = SpeculativeStats(bytes_out=300, forward_passes=100, drafted=[10, 8, 0], accepted=[7, 3, 0],
                            heads_used={4: 60, 2: 40}, shapes={"chain 4": 60, "chain 2": 40}, slides=2,
                            lookup_passes=5, lookup_accepted=30)
    # acceptance and heads only where drafts were offered, prompt lookup only where it drafted
    assert list(spec.to_json())[5:] == ["acceptance", "heads_used", "lookup_passes", "lookup_bytes"]
    assert spec.to_json()["heads_used"] == {"2": 40, "4": 60}
    assert list(SpeculativeStats(bytes_out=1, forward_passes=1).to_json()) == list(plain.to_json())
    summary = spec.draft_summary(None).splitlines()
    assert summary == ["heads run: 4 (60%), 2 (40%); drafts: chain 4 (60%), chain 2 (40%)",
                       "draft acceptance by depth: d1 0.70 d2 0.38",
                       "prompt lookup drafted in 5 passes (5%) and gave 30 bytes (10%)",
                       "the window slid 2 times"]
    plan = Choice(heads=4, tree=DraftTree.chain(3), bytes_per_pass=2.5, speedup=1.75)
    assert spec.draft_summary(plan).splitlines()[2] == (f"last plan: 4 heads, {DraftTree.chain(3).describe()}, "
                                                        "expected 2.50 bytes/pass and 1.75x plain")
    assert "last plan" not in spec.draft_summary(dataclasses.replace(plan, speedup=0.0))  # no plan expected one
