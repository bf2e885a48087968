"""The OpenAI completions protocol over bytes: what a request may hold, checked field by field
(`parse_completion`), and the bodies that go back (`choice_body`, `error_body`, `logprobs_body`).

Tokens are bytes: a prompt is a string (its UTF-8 bytes) or a list of ids 0..255, one a byte;
`max_tokens` and `usage` count bytes. An id list may begin with 257 (EOS), the document start
that the server puts before every prompt anyway: a client that tokenizes with `/tokenize` and
sends the end-of-text id first (as lm-evaluation-harness does for an empty context) scores the
same text as one that does not. A token's text in `logprobs` is its character for ids below 128,
`bytes:\\xNN` for the others (as OpenAI writes the bytes of a partial character) and the special
names (`<eos>`) for the special ids.

Unknown fields are refused (400, naming the field), so that a misspelt option is never silently
ignored; fields of the OpenAI API that change nothing here (`user`, any string, zero penalties,
`best_of` equal to `n`) are accepted. Streamed text is held back while its bytes may still become
a stop string or end inside a UTF-8 character (`StreamText`), so no client ever sees a stop string
or a broken character.

Numbers must be finite (Python's JSON reads `NaN`, `Infinity` and `1e309`: each is refused, by
the field's name); a temperature below `Sampling.GREEDY_BELOW` decodes greedily, as 0 does
(`Sampling`'s rule, which every command shares). What one request may ask for is bounded: `MAX_N` completions per prompt
and `MAX_CHOICES` in all, `MAX_STOPS` stop strings of `MAX_STOP_BYTES` bytes each (each is
checked after every byte, on the decoding thread), a seed within what a generator takes (64 bits).

Who may ask: with API keys set, a request carries one as `Authorization: Bearer KEY`
(`authorized` compares it with every key in constant time); `read_api_keys` reads a key file.
"""

from __future__ import annotations

import dataclasses
import hmac
import math
import pathlib
from typing import Any

from bytemtp.decoding.sampling import SEED_RANGE, Sampling
from bytemtp.vocab import EOS, SPECIAL_NAMES, TextStream

MAX_N = 16  # completions a request may ask for per prompt
MAX_CHOICES = 1024  # completions a request may ask for in all (prompts x n)
MAX_LOGPROBS = 20  # likeliest ids a request may ask for per position
MAX_STOPS = 16  # stop strings a request may give (OpenAI allows 4; lm-eval sends its stops and EOS's name)
MAX_STOP_BYTES = 256  # bytes of one stop string


class ApiError(Exception):
    """A request the server refuses: the HTTP status, an OpenAI-style error type and the field."""

    def __init__(self, status: int, message: str, *, param: str | None = None, kind: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.kind = kind or {400: "invalid_request_error", 401: "invalid_request_error", 404: "not_found_error",
                             413: "invalid_request_error", 429: "rate_limit_error",
                             503: "server_overloaded"}.get(status, "server_error")


def error_body(status: int, message: str, *, kind: str, param: str | None = None,
               code: int | str | None = None) -> dict:
    """An OpenAI-style error: its `code` is the HTTP status unless named (`invalid_api_key`)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": status if code is None else code}}


@dataclasses.dataclass(frozen=True)
class Completion:
    """A checked completions request: its prompts as bytes (and whether each began with EOS)."""

    prompts: list[bytes]
    leading_eos: list[bool]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[bytes, ...] = ()
    seed: int | None = None
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    echo: bool = False
    logprobs: int | None = None


_IGNORED = {"presence_penalty": 0, "frequency_penalty": 0, "suffix": None, "logit_bias": None}


def parse_completion(body: Any, *, model_name: str, max_prompt_bytes: int) -> Completion:
    """A completions request body (parsed JSON) as a `Completion`; ApiError naming the bad field."""
    if not isinstance(body, dict):
        raise ApiError(400, f"the request body is a JSON {type(body).__name__}, not an object")
    known = {f.name for f in dataclasses.fields(Completion)} - {"prompts", "leading_eos", "include_usage"}
    known |= {"prompt", "model", "stream_options", "best_of", "user", *_IGNORED}
    for key in body:
        if key not in known:
            raise ApiError(400, f"unknown field {key!r}", param=key)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise ApiError(400, f"model is a string, not {_shown(model)}", param="model")
    if body.get("user") is not None and not isinstance(body["user"], str):  # an end user's id: accepted, unused
        raise ApiError(400, f"user is a string, not {_shown(body['user'])}", param="user")
    if model is not None and model != model_name:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {model_name!r}", param="model")
    for key, neutral in _IGNORED.items():
        if body.get(key) not in (None, neutral, {}, ""):
            raise ApiError(400, f"{key}={body[key]!r} is not supported (only {neutral!r})", param=key)
    if "prompt" not in body:
        raise ApiError(400, "the field 'prompt' is required", param="prompt")
    prompts, leading = _prompts(body["prompt"])
    for p in prompts:
        if len(p) > max_prompt_bytes:
            raise ApiError(413, f"a prompt of {len(p)} bytes is past this server's limit of {max_prompt_bytes} bytes",
                           param="prompt")
    n = _integer(body, "n", 1, lo=1, hi=MAX_N)
    if len(prompts) * n > MAX_CHOICES:
        raise ApiError(400, f"a request may ask for {MAX_CHOICES} completions at most (prompts x n); this one asks "
                            f"for {len(prompts)} x {n}: send its prompts in several requests", param="prompt")
    best_of = body.get("best_of")
    if best_of is not None and best_of != n:
        raise ApiError(400, f"best_of={best_of!r} is not supported (only equal to n)", param="best_of")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise ApiError(400, "stream_options may hold only include_usage", param="stream_options")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        logprobs = _integer(body, "logprobs", 0, lo=0, hi=MAX_LOGPROBS)
    top_k = _integer(body, "top_k", 0, lo=-1)
    temperature = _number(body, "temperature", 1.0, lo=0.0)
    return Completion(
        prompts=prompts, leading_eos=leading,
        max_tokens=_integer(body, "max_tokens", 16, lo=0),
        temperature=Sampling.effective_temperature(temperature),
        top_p=_number(body, "top_p", 1.0, lo=0.0, lo_open=True, hi=1.0),
        top_k=max(0, top_k),  # -1 (vLLM's "all") is 0 here
        stop=_stop(body.get("stop")),
        seed=None if body.get("seed") is None else _integer(body, "seed", 0, lo=SEED_RANGE[0], hi=SEED_RANGE[1]),
        n=n, stream=_flag(body, "stream"), include_usage=_flag(stream_options, "include_usage"),
        echo=_flag(body, "echo"), logprobs=logprobs)


def _prompts(value: Any) -> tuple[list[bytes], list[bool]]:
    """A prompt, or a list of them: strings (UTF-8) or lists of byte ids."""
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ApiError(400, "prompt is a string, a list of byte ids (0..255), or a non-empty list of either",
                       param="prompt")
    prompts, leading = [], []
    for item in value:
        if isinstance(item, str):
            prompts.append(item.encode("utf-8", "surrogatepass"))
            leading.append(False)
        elif _is_ids(item):
            lead = bool(item) and item[0] == EOS
            ids = item[1:] if lead else item
            bad = next((i for i in ids if not 0 <= i < 256), None)
            if bad is not None:
                raise ApiError(400, f"prompt holds the id {bad}; ids are bytes (0..255), and {EOS} (EOS) only first",
                               param="prompt")
            prompts.append(bytes(ids))
            leading.append(lead)
        else:
            raise ApiError(400, f"prompt holds a {type(item).__name__}; expected strings or lists of byte ids",
                           param="prompt")
    return prompts, leading


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in value) \
        and (not value or isinstance(value[0], int))


def _integer(body: dict, key: str, default: int, *, lo: int | None = None, hi: int | None = None) -> int:
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{key} is an integer, not {value!r}", param=key)
    if lo is not None and value < lo or hi is not None and value > hi:
        span = f">= {lo}" if hi is None else f"in {lo}..{hi}"
        raise ApiError(400, f"{key}={value} is not allowed; expected {span}", param=key)
    return value


def _number(body: dict, key: str, default: float, *, lo: float, lo_open: bool = False, hi: float | None = None) -> float:
    """A finite number within its bounds (NaN, the infinities and integers past a float refused)."""
    value = body.get(key, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ApiError(400, f"{key} is a number, not {_shown(value)}", param=key)
    try:
        number = float(value)
    except OverflowError:  # an integer past the largest float
        number = math.inf
    if not math.isfinite(number) or number < lo or lo_open and number == lo or hi is not None and number > hi:
        bound = f"> {lo}" if lo_open else f">= {lo}"
        raise ApiError(400, f"{key}={_shown(value)} is not allowed; expected a finite number {bound}"
                            + (f" and <= {hi}" if hi else ""), param=key)
    return number


def _shown(value: Any) -> str:
    """A value as an error message quotes it: its repr, cut to 40 characters."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _flag(body: dict, key: str) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{key} is true or false, not {value!r}", param=key)
    return value


def _stop(value: Any) -> tuple[bytes, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise ApiError(400, "stop is a string or a list of strings", param="stop")
    if len(value) > MAX_STOPS:
        raise ApiError(400, f"stop holds {len(value)} strings; {MAX_STOPS} at most are allowed", param="stop")
    stops = tuple(s.encode("utf-8", "surrogatepass") for s in value if s)
    longest = max(stops, key=len, default=b"")
    if len(longest) > MAX_STOP_BYTES:
        raise ApiError(400, f"a stop string of {len(longest)} bytes is past the limit of {MAX_STOP_BYTES} bytes",
                       param="stop")
    return stops


# --- who may ask ----------------------------------------------------------------------------------

def check_api_key(key: str, *, source: str) -> str:
    """An API key as given (ValueError naming `source` unless it is printable ASCII without spaces,
    which is what an Authorization header carries unchanged)."""
    if not key or not all(33 <= ord(c) < 127 for c in key):
        raise ValueError(f"{source}: an API key is printable ASCII without spaces, and not empty")
    return key


def read_api_keys(path) -> list[str]:
    """The API keys of a file, one a line (blank lines and lines starting with # skipped); a
    ValueError naming the file when it is missing, unreadable, not text or holds no key."""
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise ValueError(f"the API key file {path} cannot be read: {reason}") from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(check_api_key(line, source=f"{path}:{number}"))
    if not keys:
        raise ValueError(f"the API key file {path} holds no key (one a line; blank lines and # comments are skipped)")
    return keys


def authorized(header: str | None, keys: tuple[str, ...]) -> bool:
    """Whether an Authorization header carries one of the keys as `Bearer KEY`: compared with every
    key in constant time (`hmac.compare_digest`), so neither the time nor which key tells anything."""
    scheme, _, token = (header or "").strip().partition(" ")
    given = token.strip().encode("utf-8", "surrogatepass")
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(given, key.encode())
    return ok and scheme.lower() == "bearer"


# --- what goes back -------------------------------------------------------------------------------

def token_text(i: int) -> str:
    """How a byte id is written in `logprobs` (see the module docstring)."""
    if i in SPECIAL_NAMES:
        return SPECIAL_NAMES[i]
    return chr(i) if i < 128 else f"bytes:\\x{i:02x}"


def text_offsets(data: bytes, start: int = 0) -> list[int]:
    """The character offset of each byte in the text that `data` decodes to (after `start`
    characters): a byte of a character split over several bytes gets the character's offset."""
    stream, out, at = TextStream(), [], start
    for byte in data:
        out.append(at)
        at += len(stream.feed(bytes([byte])))
    return out


def logprobs_body(ids: list[int], values: list[float | None], top: list[list[tuple[int, float]]] | None,
                  *, offset_start: int = 0, text: bytes = b"") -> dict:
    """The `logprobs` object of a choice: tokens, their log-probabilities, the likeliest ids
    at each position (None where there are none: the leading EOS) and the text offsets."""
    offsets = text_offsets(text, offset_start)
    if len(offsets) < len(ids):  # a leading EOS has no text: it sits at the start
        offsets = [offset_start] * (len(ids) - len(offsets)) + offsets
    return {"tokens": [token_text(i) for i in ids], "token_logprobs": values,
            "top_logprobs": None if top is None else [None if t is None else {token_text(i): v for i, v in t}
                                                      for t in top],
            "text_offset": offsets}


def finish_reason(stopped_by: str) -> str:
    return {"max_bytes": "length", "eos": "stop", "stop": "stop"}.get(stopped_by, stopped_by or "stop")


def trim_stop(data: bytes, stop: tuple[bytes, ...], stopped_by: str) -> bytes:
    """The output without the stop string that ended it (OpenAI returns text before the stop)."""
    if stopped_by == "stop":
        for s in stop:
            if data.endswith(s):
                return data[:-len(s)]
    return data


class StreamText:
    """Text of a streamed choice, released as it becomes final: bytes that may still be the start
    of a stop string (or are one: decoding ends there, and `finish` drops it) wait, and so do the
    bytes of an unfinished UTF-8 character."""

    def __init__(self, stop: tuple[bytes, ...]):
        self.stop, self.held, self.text = stop, bytearray(), TextStream()

    def push(self, piece: bytes) -> str:
        self.held += piece
        keep = max((k for s in self.stop for k in range(min(len(s), len(self.held)), 0, -1)
                    if self.held.endswith(s[:k])), default=0)
        out, self.held = bytes(self.held[:len(self.held) - keep]), self.held[len(self.held) - keep:]
        return self.text.feed(out)

    def finish(self, stopped_by: str) -> str:
        rest = trim_stop(bytes(self.held), self.stop, stopped_by)
        self.held = bytearray()
        return self.text.feed(rest) + self.text.finish()
