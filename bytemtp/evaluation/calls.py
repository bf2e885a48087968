"""What crosses between a HumanEval candidate's process and its checker's: plain values, as JSON.

A tested program runs as two guarded processes (bytemtp.evaluation.execution): the candidate's
(the prompt and the model's completion) and the checker's (the prompt and the problem's tests,
trusted). The checker's `candidate` is a `Remote`: each call is one line "call [NONCE, ARGS, KWARGS]" to the
harness, which passes it to the candidate's process; there `serve` calls the function and answers
with one line, {"nonce": NONCE, "ok": value} or {"nonce": NONCE, "raised": detail}, which the
harness passes back. The nonce is drawn in the checker's process for each call, so an answer the
candidate wrote before the call (to queue a value its function does not return) answers nothing. Only plain values cross
(`encode_value`, `decode_value`): None, bool, int, float, complex, str, bytes, and lists, tuples,
sets and dicts of them. So the checker holds nothing the candidate made but such values, and the
verdict, which the checker alone gives, is written by a process the candidate's code never runs in.

The guard (guard.py) loads this file by its path in the child, so it imports only the standard
library, as the guard does.
"""

from __future__ import annotations

import json
import os

READY = b"ready\n"  # what a candidate's process says once its program has run, before the calls
ANSWER_BYTES = 64 << 20  # the longest line a checker takes from a candidate, and the harness passes on


def write_all(fd: int, data: bytes, *, _write=os.write) -> None:
    """All of `data` to descriptor `fd` (os.write may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[_write(fd, view):]


class NotAValue(TypeError):
    """What crossed between the candidate's process and the checker's is not a plain value."""


def encode_value(value) -> object:
    """A plain value (None, bool, int, float, complex, str, bytes, and lists, tuples, sets and dicts
    of them) as JSON data: what crosses between the candidate's process and the checker's, so that
    the checker holds nothing the candidate made but such values. Subclasses count as their base
    type (their own methods do not answer); anything else is a `NotAValue`."""
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return {"float": float.__repr__(value)}
    if isinstance(value, str):
        return {"str": str.__str__(value)}
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).decode("latin-1")}
    if isinstance(value, complex):
        return {"complex": [encode_value(value.real), encode_value(value.imag)]}
    if isinstance(value, list):
        return [encode_value(v) for v in list.__iter__(value)]
    for base in (tuple, set, frozenset):
        if isinstance(value, base):
            return {base.__name__: [encode_value(v) for v in base.__iter__(value)]}
    if isinstance(value, dict):
        return {"dict": [[encode_value(k), encode_value(v)] for k, v in dict.items(value)]}
    raise NotAValue(f"a {kind.__name__} is not a plain value (None, bool, int, float, complex, str, bytes, "
                    "or a list, tuple, set or dict of them)")


DECODERS = {"float": float, "str": str, "bytes": lambda s: s.encode("latin-1"), "complex": lambda p: complex(*p),
            "tuple": tuple, "set": set, "frozenset": frozenset, "dict": dict}


def decode_value(data) -> object:
    """The plain value `encode_value` made `data` from; a `NotAValue` for anything else (the data
    came from a candidate, which may send anything)."""
    if data is None or type(data) in (bool, int, str):
        return data
    if type(data) is list:
        return [decode_value(v) for v in data]
    if type(data) is dict and len(data) == 1:
        (tag, inner), = data.items()
        if tag in ("float", "str", "bytes") and type(inner) is str:
            try:
                return DECODERS[tag](inner)
            except ValueError:
                pass
        elif tag in DECODERS and type(inner) is list:
            parts = [decode_value(v) for v in inner]
            try:
                if tag == "complex":
                    if len(parts) == 2 and all(type(p) is float for p in parts):
                        return complex(*parts)
                elif tag == "dict":
                    if all(type(p) is list and len(p) == 2 for p in parts):
                        return dict(parts)
                else:
                    return DECODERS[tag](parts)
            except TypeError:  # an unhashable key or member
                pass
    raise NotAValue("the candidate answered with something that is not a plain value")


class CandidateError(Exception):
    """What the candidate's process said went wrong in a call, or that it could not be called: its
    message is the detail of the failed verdict."""


class Remote:
    """The checker's `candidate`: each call is one line "call [NONCE, ARGS, KWARGS]" to the harness,
    which hands it to the candidate's process and brings back its one-line answer ({"nonce": NONCE,
    "ok": value} or {"nonce": NONCE, "raised": detail}); the checker sees only the plain value
    decoded from an answer that names the call's nonce."""

    def __init__(self, requests: int, answers) -> None:
        self._requests, self._answers = requests, answers

    def __call__(self, *args, **kwargs):
        nonce = os.urandom(8).hex()  # the answer must name it: none written before the call counts
        line = json.dumps([nonce, encode_value(list(args)), encode_value(kwargs)], separators=(",", ":"))
        write_all(self._requests, b"call " + line.encode("utf-8", "surrogatepass") + b"\n")
        answer = self._answers.readline(ANSWER_BYTES)
        if not answer.endswith(b"\n"):
            raise CandidateError(f"the candidate answered with more than {ANSWER_BYTES} bytes"
                                 if len(answer) >= ANSWER_BYTES else "the candidate's process ended during a call")
        try:
            reply = json.loads(answer.decode("utf-8", "surrogatepass"))
        except (ValueError, RecursionError):
            raise CandidateError("the candidate answered with something that is not JSON") from None
        if type(reply) is not dict or reply.get("nonce") != nonce or len(reply) != 2:
            raise CandidateError("the candidate answered with something that is not an answer to the call")
        if type(reply.get("raised")) is str:
            raise CandidateError(reply["raised"])
        if "ok" not in reply:
            raise CandidateError("the candidate answered with something that is not an answer to the call")
        try:
            return decode_value(reply["ok"])
        except (NotAValue, RecursionError) as e:
            raise CandidateError(str(e)) from None


def serve(out: int, answers, function) -> None:
    """The candidate's loop: call `function` on each request line read from `answers` (a checker's
    "call" line, passed on by the harness) and write its answer to `out`, until the harness closes
    the stream."""
    import json
    while line := answers.readline():
        nonce = None
        try:
            nonce, *call = json.loads(line)
            args, kwargs = (decode_value(v) for v in call)
            reply = {"nonce": nonce, "ok": encode_value(function(*args, **kwargs))}
        except BaseException as e:
            reply = {"nonce": nonce, "raised": f"{type(e).__name__}: {e}"}
        try:
            data = json.dumps(reply, separators=(",", ":"))
        except (ValueError, RecursionError) as e:  # an int past the digits a str may take, a cycle
            data = json.dumps({"nonce": nonce, "raised": f"{type(e).__name__}: {e}"})
        write_all(out, data.encode("utf-8", "surrogatepass") + b"\n")
