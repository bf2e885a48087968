"""What crosses between a HumanEval candidate's process and its checker's (bytemtp.evaluation.calls):
plain values both ways, and nothing else from the candidate's side. The two processes end to end
are in test_execution.py and test_sandbox.py."""

import io
import json
import math
import os

import pytest

from bytemtp.evaluation import calls
from bytemtp.evaluation.calls import CandidateError, NotAValue, Remote, decode_value, encode_value

VALUES = [None, True, False, 0, -7, 10 ** 40, 2.5, -0.0, math.inf, "text", "a\udc80", b"\x00\xff", 1 + 2j,
          [1, [2.0, "x"]], (1, (2,)), (), {1, 2}, frozenset({3}), {"a": 1, (1, 2): [3], 4: None}]


def _through_json(value):
    return decode_value(json.loads(json.dumps(encode_value(value))))


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_a_plain_value_crosses_whole_and_keeps_its_type(value):
    got = _through_json(value)
    assert got == value and type(got) is type(value)
    if isinstance(value, (list, tuple)):
        assert [type(v) for v in got] == [type(v) for v in value]


def test_nan_crosses_as_nan():
    assert math.isnan(_through_json(float("nan")))


def test_a_subclass_crosses_as_its_base_so_its_own_methods_never_reach_the_checker():
    class Any(int):
        def __eq__(self, other):
            return True
        __hash__ = int.__hash__

    class Loud(str):
        def __str__(self):
            return "something else"

    got = _through_json([Any(2), Loud("quiet")])
    assert got == [2, "quiet"] and [type(v) for v in got] == [int, str]
    assert got[0] != 1


@pytest.mark.parametrize("value", [object(), len, iter([1]), (x for x in ()), {1: object()}, [print]],
                         ids=["object", "function", "iterator", "generator", "dict of an object", "list of a function"])
def test_anything_else_is_not_a_value(value):
    with pytest.raises(NotAValue):
        encode_value(value)


@pytest.mark.parametrize("data", [{"float": 1.5}, {"float": "one"}, {"tuple": "ab"}, {"code": []}, {"a": 1, "b": 2},
                                  {"complex": [1, 2]}, {"dict": [[[1], 2]]}, {"set": [[1]]}, {"dict": [[1]]}, 1.5],
                         ids=repr)
def test_data_a_candidate_made_up_is_refused(data):
    with pytest.raises(NotAValue):
        decode_value(data)


class _Answers:
    """The harness's side of a Remote's calls: the answer a test gives, with the call's nonce where
    it says NONCE."""

    def __init__(self, sent: int, answer: bytes):
        self.sent, self.answer = sent, answer

    def readline(self, limit: int = -1) -> bytes:
        nonce = json.loads(os.read(self.sent, 100000)[len(b"call "):])[0]
        return self.answer.replace(b"NONCE", nonce.encode())


def _remote(answer: bytes) -> Remote:
    read_end, write_end = os.pipe()
    return Remote(write_end, _Answers(read_end, answer))


@pytest.mark.parametrize("answer, said", [
    (b'{"nonce": "NONCE", "raised": "ZeroDivisionError: division by zero"}\n', "ZeroDivisionError: division by zero"),
    (b"", "the candidate's process ended during a call"),
    (b'{"nonce": "NONCE", "ok": 1}', "the candidate's process ended during a call"),  # no newline: cut short
    (b"not json\n", "the candidate answered with something that is not JSON"),
    (b'{"nonce": "NONCE", "ok": 1, "raised": "x"}\n', "the candidate answered with something that is not an answer to the call"),
    (b'{"ok": 1}\n', "the candidate answered with something that is not an answer to the call"),  # written ahead
    (b'{"nonce": "0123", "ok": 1}\n', "the candidate answered with something that is not an answer to the call"),
    (b'{"nonce": "NONCE", "ok": {"code": "x"}}\n', "the candidate answered with something that is not a plain value"),
])
def test_a_remote_call_fails_with_the_candidates_words_or_what_went_wrong(answer, said):
    with pytest.raises(CandidateError) as e:
        _remote(answer)(1, key=(2,))
    assert str(e.value) == said


def test_a_remote_call_sends_its_nonce_and_arguments_and_returns_the_value_answered():
    read_end, write_end = os.pipe()
    sent = []

    class Answers:
        def readline(self, limit=-1):
            sent.append(os.read(read_end, 1000))
            nonce = json.loads(sent[-1][len(b"call "):])[0]
            return b'{"nonce": "%s", "ok": [1, {"tuple": [2, {"float": "0.5"}]}]}\n' % nonce.encode()

    remote = Remote(write_end, Answers())
    assert remote(1, key=(2,)) == [1, (2, 0.5)] and remote() == [1, (2, 0.5)]
    calls = [json.loads(line[len(b"call "):]) for line in sent]
    assert calls[0][1:] == [[1], {"dict": [["key", {"tuple": [2]}]]}] and calls[0][0] != calls[1][0]


def test_serve_answers_each_call_and_says_what_went_wrong():
    read_end, write_end = os.pipe()
    requests = io.BytesIO(b'["a", [3, 4], {"dict": []}]\n["b", [1, 0], {"dict": []}]\n["c", [[1]], {"dict": []}]\n')
    calls.serve(write_end, requests, lambda a, b=1: a / b if not isinstance(a, list) else object())
    os.close(write_end)
    lines = os.read(read_end, 10000).splitlines()
    assert [json.loads(line) for line in lines] == [
        {"nonce": "a", "ok": {"float": "0.75"}}, {"nonce": "b", "raised": "ZeroDivisionError: division by zero"},
        {"nonce": "c", "raised": "NotAValue: a object is not a plain value (None, bool, int, float, complex, str, "
                                 "bytes, or a list, tuple, set or dict of them)"}]
