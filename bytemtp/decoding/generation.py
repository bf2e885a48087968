"""What a generation call takes and gives: prompts as bytes (from str, or a JSONL file of text
or base64), the bytes generated with the rules that end them (EOS, stop strings, max_bytes), and
the statistics of the decoding (bytes, forward passes, drafts offered and accepted), summed over
many decodes in one place (`SpeculativeStats.total`). The statistics render what `generate` prints
of them and writes as JSON (`line`, `draft_summary`, `to_json`)."""

from __future__ import annotations

import base64
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from bytemtp.vocab import EOS

if TYPE_CHECKING:
    from bytemtp.decoding.drafting import Choice


@dataclass
class DecodeStats:
    bytes_out: int = 0
    forward_passes: int = 0
    wall_s: float = 0.0
    stopped_by: str = ""  # eos, stop, max_bytes, interrupted

    @property
    def bytes_per_forward(self) -> float:
        return self.bytes_out / max(1, self.forward_passes)

    def line(self) -> str:
        """Bytes, passes, bytes per pass, seconds, speed and why decoding stopped, in one line."""
        return (f"{self.bytes_out} bytes in {self.forward_passes} forward passes ({self.bytes_per_forward:.2f} "
                f"bytes/pass), {self.wall_s:.2f} s, {self.bytes_out / max(self.wall_s, 1e-9):,.0f} bytes/s; "
                f"stopped by {self.stopped_by}")

    def to_json(self) -> dict:
        """What `generate` writes of a decode's statistics (rounded)."""
        return {"bytes": self.bytes_out, "forward_passes": self.forward_passes,
                "bytes_per_forward": round(self.bytes_per_forward, 3), "wall_s": round(self.wall_s, 4),
                "stopped_by": self.stopped_by}


@dataclass
class Generation:
    output: bytes
    stats: DecodeStats = field(default_factory=DecodeStats)


def as_bytes(prompt: bytes | str) -> bytes:
    """A prompt as bytes: bytes-like as they are, str as UTF-8 (lone surrogates kept as such)."""
    if isinstance(prompt, str):
        return prompt.encode("utf-8", "surrogatepass")
    if isinstance(prompt, (bytes, bytearray, memoryview)):
        return bytes(prompt)
    raise TypeError(f"a prompt is bytes or str, not {type(prompt).__name__}")


def as_prompt_list(prompts) -> list[bytes]:
    """prompts (a list of bytes or str) as a list of bytes; one bare prompt is a mistake, not a
    list of one-byte prompts."""
    if isinstance(prompts, (str, bytes, bytearray, memoryview)):
        raise TypeError("prompts is a list of prompts; for one prompt pass [prompt]")
    return [as_bytes(p) for p in prompts]


@dataclass
class SpeculativeStats(DecodeStats):
    drafted: list[int] = field(default_factory=list)  # per draft depth 1..k-1: passes that offered it
    accepted: list[int] = field(default_factory=list)  # ... and passes whose output used it
    heads_used: dict = field(default_factory=dict)  # heads run in a pass -> passes
    shapes: dict = field(default_factory=dict)  # draft shape (DraftTree.describe) -> passes
    slides: int = 0  # times the window slid
    lookup_passes: int = 0  # passes that drafted prompt-lookup bytes
    lookup_accepted: int = 0  # ... and the lookup bytes they output
    host_reads: int = 0  # device-to-host transfers of the passes the row took part in (`picks.Picks.read`)
    step_s: float = 0.0  # seconds of those passes in the step itself (the compiled call, or the eager model)

    @property
    def acceptance(self) -> list[float]:
        """Acceptance rate at each draft position (head 2, 3, ..., k)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted)]

    def count(self, depth: int, *, used: bool) -> None:
        while len(self.drafted) < depth:
            self.drafted.append(0)
            self.accepted.append(0)
        self.drafted[depth - 1] += 1
        self.accepted[depth - 1] += used

    def to_json(self) -> dict:
        """`DecodeStats.to_json`, and where drafts were offered the acceptance per depth and the
        heads run, where prompt lookup drafted its passes and bytes."""
        out = super().to_json()
        if self.drafted:
            out["acceptance"] = [round(r, 4) for r in self.acceptance]
            out["heads_used"] = {str(k): n for k, n in sorted(self.heads_used.items())}
        if self.lookup_passes:
            out["lookup_passes"], out["lookup_bytes"] = self.lookup_passes, self.lookup_accepted
        return out

    def draft_summary(self, last_choice: Choice | None) -> str:
        """What the decoder chose: heads per pass, the commonest draft shapes, acceptance per depth,
        and its last plan (`last_choice`, the decoder's; where it expected a speedup), prompt
        lookup's share and the window's slides where there were any."""
        total = max(1, sum(self.heads_used.values()))
        heads = ", ".join(f"{k} ({100 * n / total:.0f}%)" for k, n in
                          sorted(self.heads_used.items(), key=lambda kv: -kv[1]))
        shapes = ", ".join(f"{s} ({100 * n / total:.0f}%)" for s, n in
                           sorted(self.shapes.items(), key=lambda kv: -kv[1])[:3])
        rates = " ".join(f"d{j + 1} {r:.2f}" for j, r in enumerate(self.acceptance) if self.drafted[j])
        lines = [f"heads run: {heads}; drafts: {shapes}", f"draft acceptance by depth: {rates or 'none drafted'}"]
        if last_choice is not None and last_choice.speedup:
            lines.append(f"last plan: {last_choice.heads} heads, {last_choice.tree.describe()}, expected "
                         f"{last_choice.bytes_per_pass:.2f} bytes/pass and {last_choice.speedup:.2f}x plain")
        if self.lookup_passes:
            passes, accepted = self.lookup_passes, self.lookup_accepted
            lines.append(f"prompt lookup drafted in {passes} passes ({100 * passes / total:.0f}%) "
                         f"and gave {accepted} bytes ({100 * accepted / max(1, self.bytes_out):.0f}%)")
        if self.slides:
            lines.append(f"the window slid {self.slides} times")
        return "\n".join(lines)

    @classmethod
    def total(cls, stats: Iterable[DecodeStats]) -> SpeculativeStats:
        """The statistics of many decodes (plain ones too) summed: bytes, passes, seconds and
        slides and lookup passes and bytes added, drafts counted per depth, heads run and draft
        shapes counted in the order first seen; stopped_by is left empty (each decode stopped for
        its own reason)."""
        out = cls()
        for st in stats:
            out.bytes_out += st.bytes_out
            out.forward_passes += st.forward_passes
            out.wall_s += st.wall_s
            for total, part in ((out.drafted, getattr(st, "drafted", ())), (out.accepted, getattr(st, "accepted", ()))):
                total.extend([0] * (len(part) - len(total)))
                for i, v in enumerate(part):
                    total[i] += v
            for total, part in ((out.heads_used, getattr(st, "heads_used", {})), (out.shapes, getattr(st, "shapes", {}))):
                for key, n in part.items():
                    total[key] = total.get(key, 0) + n
            out.slides += getattr(st, "slides", 0)
            out.lookup_passes += getattr(st, "lookup_passes", 0)
            out.lookup_accepted += getattr(st, "lookup_accepted", 0)
            out.host_reads += getattr(st, "host_reads", 0)
            out.step_s += getattr(st, "step_s", 0.0)
        return out


class Output:
    """The bytes generated so far and the rules that end generation (EOS, stop strings, max_bytes).

    `data` holds the ids generated; for the bytes (`pieces` None) they are the text itself. A model
    over BPE tokens (the baseline of `bench tokens`) gives the bytes of each id in `pieces`: its
    text is then the ids' bytes joined, and stop strings and max_bytes count in that text (a stop
    string that ends inside a token cuts the text after it; the last token may pass max_bytes)."""

    def __init__(self, stats: DecodeStats, *, max_bytes: int, stop: tuple[bytes, ...],
                 on_bytes: Callable[[bytes], None] | None, pieces: list[bytes] | None = None):
        self.data, self.stats, self.max_bytes = bytearray() if pieces is None else [], stats, max_bytes
        self.text = self.data if pieces is None else bytearray()
        self.stop, self.on_bytes, self.pieces = stop, on_bytes, pieces

    def bytes_left(self) -> int:
        """Bytes still allowed (an upper bound on the ids still allowed)."""
        return self.max_bytes - len(self.text)

    def emit(self, byte: int) -> bool:
        """Append one generated id; True when generation must stop."""
        if byte == EOS:
            self.stats.stopped_by = "eos"
            return True
        self.data.append(byte)
        if self.pieces is not None:
            return self._emit_piece(self.pieces[byte])
        if self.on_bytes is not None:
            self.on_bytes(bytes([byte]))
        return self._ends(stopped=any(s and self.data.endswith(s) for s in self.stop))

    def _emit_piece(self, piece: bytes) -> bool:
        """A token's bytes: appended, streamed and checked against the stop strings and max_bytes."""
        before = len(self.text)
        self.text += piece
        cut = None  # where the earliest stop string that the new bytes complete ends
        for s in self.stop:
            at = self.text.find(s, max(0, before - len(s) + 1)) if s else -1
            if at >= 0 and (cut is None or at + len(s) < cut):
                cut = at + len(s)
        if cut is not None:
            del self.text[cut:]
        if self.on_bytes is not None and len(self.text) > before:
            self.on_bytes(bytes(self.text[before:]))
        return self._ends(stopped=cut is not None)

    def _ends(self, *, stopped: bool) -> bool:
        """Whether generation ends after the text so far: a stop string completed, or max_bytes reached."""
        if stopped:
            self.stats.stopped_by = "stop"
        elif len(self.text) >= self.max_bytes:
            self.stats.stopped_by = "max_bytes"
        else:
            return False
        return True

    def result(self, t0: float) -> Generation:
        self.stats.bytes_out = len(self.text)
        self.stats.wall_s = time.perf_counter() - t0
        return Generation(bytes(self.text), self.stats)


def load_prompts(path, field: str = "prompt") -> list[bytes]:
    """Prompts from a JSONL file, one object a line: the prompt text in `field`, or its exact bytes
    base64-encoded in `field`_b64 (for prompts that are not UTF-8); blank lines are skipped. A bad
    line is an error naming the file and the line."""
    b64 = f"{field}_b64"
    expected = f'expected {{"{field}": "text"}} or {{"{b64}": "base64 of the bytes"}} on each line'
    prompts = []
    with open(path, "rb") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{number} is not JSON ({e}); {expected}") from None
            if not isinstance(record, dict) or (field in record) == (b64 in record):
                raise ValueError(f"{path}:{number} has {'both' if isinstance(record, dict) and field in record else 'neither'} "
                                 f"of the fields {field!r} and {b64!r}; {expected}")
            value = record.get(field, record.get(b64))
            if not isinstance(value, str):
                raise ValueError(f"{path}:{number}: {field if field in record else b64!r} is a "
                                 f"{type(value).__name__}, not a string; {expected}")
            if field in record:
                prompts.append(value.encode("utf-8", "surrogatepass"))
                continue
            try:
                prompts.append(base64.b64decode(value, validate=True))
            except ValueError:
                raise ValueError(f"{path}:{number}: {b64!r} is not valid base64; {expected}") from None
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts
