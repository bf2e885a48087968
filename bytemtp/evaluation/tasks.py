"""The paper's synthetic tasks (Gloeckle et al. 2024, section 4): polynomial arithmetic (4.2) and
induction (4.1). Each gives training documents for a prepared corpus and a fixed test set of
problems, {group: [problem]}, where a problem is a prompt and the answer a model must continue it
with (`bytemtp.evaluation.evaluate.task_accuracy` scores them).

Polynomial arithmetic. Polynomials over F7[X]/(X^5): five coefficients modulo 7 (X^5 = 0).
Expressions combine random polynomials with unary negation, addition, multiplication and
composition (A@B is A(B(X)): B substituted into A's representative of degree below 5, then
reduced; on the quotient ring that is a ring map only where B has no constant term, and the task
is defined on the representatives); an expression with n operations applies n of them. The
answer is computed exactly. The byte format, one problem a document:

    ((3x^2+1)*-(x+4))@(2x^3+x)=4x^4+2x^3+x^2+3

Every binary operation is in parentheses and negation prefixes a parenthesised operand, so the
expression reads one way only. A polynomial prints from the highest degree down, a coefficient
of 1 only for the constant, and the zero polynomial as 0. A model is asked the text up to and
including "=" and must continue with the answer and end the document; exact match counts.
Groups: the number of operations.

Induction. Short children's stories, one a document, whose two or three characters carry
made-up two-part names drawn afresh for every story (syllables of a consonant and a vowel: first
parts of two syllables, second parts of two or three, about 350,000 of them), so that a name's
second part cannot be learnt, only copied from earlier in the story:

    Once upon a time, there was a little fox named Toka Rivelu. One day, Toka Rivelu met ...

A problem is a later mention of a character: the story up to that mention's first part and its
space; the answer is the second part (the bytes that follow are not scored). Groups: the
mention's number (2, 3, 4+). Stories are at most STORY_MAX bytes, so a context of 512 holds any
prompt of the test set.

A model's scores on a test set, per group, are a `TaskScores`: its JSON form (`to_json`) and the
table `eval-task poly|induction` prints (`table`).
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from dataclasses import dataclass

from bytemtp.data import prep
from bytemtp.tables import table

P, DEGREE = 7, 5  # coefficients modulo P; X^DEGREE = 0
OPS = ("neg", "add", "mul", "comp")
Poly = tuple[int, ...]  # coefficients of X^0 .. X^4


def add(a: Poly, b: Poly) -> Poly:
    return tuple((x + y) % P for x, y in zip(a, b))


def neg(a: Poly) -> Poly:
    return tuple(-x % P for x in a)


def mul(a: Poly, b: Poly) -> Poly:
    out = [0] * DEGREE
    for i, x in enumerate(a):
        for j, y in enumerate(b[:DEGREE - i]):
            out[i + j] = (out[i + j] + x * y) % P
    return tuple(out)


def comp(a: Poly, b: Poly) -> Poly:
    """a(b(X)) in F7[X]/(X^5), by Horner's rule."""
    out: Poly = (0,) * DEGREE
    for coef in reversed(a):
        out = add(mul(out, b), (coef,) + (0,) * (DEGREE - 1))
    return out


def show(a: Poly) -> str:
    terms = []
    for power in reversed(range(DEGREE)):
        c = a[power]
        if c == 0:
            continue
        coef = "" if c == 1 and power > 0 else str(c)
        terms.append(coef + ("" if power == 0 else "x" if power == 1 else f"x^{power}"))
    return "+".join(terms) or "0"


def random_poly(rng: random.Random) -> Poly:
    """A leaf: a degree from 0 to 4, uniform coefficients up to it, the leading one nonzero."""
    degree = rng.randrange(DEGREE)
    coefs = [rng.randrange(P) for _ in range(degree)] + [rng.randrange(1, P)]
    return tuple(coefs + [0] * (DEGREE - degree - 1))


@dataclass(frozen=True)
class Problem:
    expression: str
    answer: str
    operations: int

    @property
    def prompt(self) -> str:
        return self.expression + "="

    @property
    def text(self) -> str:
        return self.prompt + self.answer


def problem(operations: int, rng: random.Random) -> Problem:
    """An expression with `operations` operations over random polynomials, and its value."""
    value = random_poly(rng)
    text = f"({show(value)})"
    for _ in range(operations):
        op = rng.choice(OPS)
        if op == "neg":
            value, text = neg(value), f"-{text}"
            continue
        leaf = random_poly(rng)
        leaf_text = f"({show(leaf)})"
        symbol, fn = {"add": ("+", add), "mul": ("*", mul), "comp": ("@", comp)}[op]
        if rng.random() < 0.5:
            value, text = fn(value, leaf), f"({text}{symbol}{leaf_text})"
        else:
            value, text = fn(leaf, value), f"({leaf_text}{symbol}{text})"
    return Problem(text, show(value), operations)


def problems(n: int, *, operations: tuple[int, int], seed: int) -> list[Problem]:
    """n problems with a number of operations drawn uniformly from operations = (low, high)."""
    rng = random.Random(f"bytemtp-poly:{seed}")
    return [problem(rng.randint(*operations), rng) for _ in range(n)]


def test_set(per_count: int, counts: range, *, seed: int = 1_000_003) -> dict[int, list[Problem]]:
    """The fixed polynomial test set: `per_count` problems for each number of operations."""
    rng = random.Random(f"bytemtp-poly-test:{seed}")
    return {n: [problem(n, rng) for _ in range(per_count)] for n in counts}


# --- induction ------------------------------------------------------------------------------------

CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
STORY_MAX = 480  # bytes

_KINDS = ("fox", "rabbit", "bear", "cat", "dog", "owl", "mouse", "duck", "frog", "girl", "boy", "bird")
_ADJECTIVES = ("little", "happy", "small", "brave", "kind", "shy", "curious", "clever")
_PLACES = ("park", "forest", "garden", "river", "hill", "town", "beach", "farm")
_THINGS = ("ball", "kite", "red box", "shiny stone", "big leaf", "blue hat", "toy boat", "cake")
_PLAYS = ("play", "dance", "sing", "look for shells", "build a tower", "climb trees", "run", "paint")

_OPENINGS = (
    "Once upon a time, there was a {adj} {kind} named {A}.",
    "There was once a {adj} {kind} called {A}.",
    "{A} was a {adj} {kind} who lived near the {place}.",
)
_MEETINGS = (
    "One day, {A} met a {kind} named {B}.",
    "{A} had a friend, a {adj} {kind} called {B}.",
    "At the {place}, {A} saw a {kind}. Its name was {B}.",
)
_MIDDLES = (
    "{B} said, \"Hello, {A}! Let us {play}.\"",
    "{A} and {B} went to the {place} to {play}.",
    "{A} found a {thing} and showed it to {B}.",
    "{B} gave {A} a {thing}.",
    "{A} smiled at {B}.",
    "{A} asked {B} to help with the {thing}.",
    "{B} laughed and ran after {A}.",
    "{B} and {A} sat by the {place} and talked.",
)
_THIRD = "Then {C}, a {adj} {kind}, came by and wanted to {play} with {A}."
_ENDINGS = (
    "From that day on, {A} and {B} were best friends.",
    "In the evening, {A} said goodbye to {B} and went home.",
    "{A} and {B} were very happy.",
)


@dataclass(frozen=True)
class Mention:
    """A later mention of a character: the story up to it and the name's second part."""

    prompt: str
    answer: str
    mention: int  # 2 for the second time the character is named, and so on


def made_up_name(rng: random.Random, syllables: int) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables)).capitalize()


def story(rng: random.Random) -> tuple[str, list[Mention]]:
    """A story of at most STORY_MAX bytes and its scored mentions (each character's second and
    later), found where the names were put in, not by searching the text."""
    while True:
        text, mentions = _story_once(rng)
        if len(text.encode()) <= STORY_MAX:
            return text, mentions


def _story_once(rng: random.Random) -> tuple[str, list[Mention]]:
    n_chars = rng.choice((2, 2, 3))
    firsts: list[str] = []
    while len(firsts) < n_chars:
        first = made_up_name(rng, 2)
        if first not in firsts:
            firsts.append(first)
    names = {role: (first, made_up_name(rng, rng.choice((2, 3))))
             for role, first in zip("ABC", firsts)}
    sentences = [rng.choice(_OPENINGS), rng.choice(_MEETINGS)]
    middles = rng.sample(_MIDDLES, rng.randint(3, 5))
    if n_chars == 3:
        middles.insert(rng.randint(1, len(middles)), _THIRD)
        middles.append(rng.choice(("{C} waved to {A} and {B}.", "{B} gave {C} a {thing}.")))
    sentences += middles + [rng.choice(_ENDINGS)]

    text, mentions, seen = "", [], {}
    for sentence in sentences:
        text += " " if text else ""
        rest = sentence
        while rest:
            head, brace, rest = rest.partition("{")
            text += head
            if not brace:
                break
            key, _, rest = rest.partition("}")
            if key in names:
                first, second = names[key]
                seen[key] = seen.get(key, 0) + 1
                text += first + " "
                if seen[key] > 1:
                    mentions.append(Mention(text, second, seen[key]))
                text += second
            else:
                text += rng.choice({"adj": _ADJECTIVES, "kind": _KINDS, "place": _PLACES,
                                    "thing": _THINGS, "play": _PLAYS}[key])
    return text, mentions


def stories(n: int, *, seed: int) -> list[str]:
    """n training stories."""
    rng = random.Random(f"bytemtp-induction:{seed}")
    return [story(rng)[0] for _ in range(n)]


def induction_test_set(n_stories: int, *, seed: int = 1_000_003) -> dict[str, list[Mention]]:
    """The fixed induction test set: the later mentions of `n_stories` stories, by mention number
    (2, 3, 4+)."""
    rng = random.Random(f"bytemtp-induction-test:{seed}")
    groups: dict[str, list[Mention]] = {"2": [], "3": [], "4+": []}
    for _ in range(n_stories):
        for m in story(rng)[1]:
            groups[str(m.mention) if m.mention < 4 else "4+"].append(m)
    return groups


TASK_DOCUMENTS = {"poly": 200_000, "induction": 100_000}  # training documents a task corpus has by default


def write_corpus(task: str, out: str | os.PathLike, *, documents: int | None = None,
                 operations: tuple[int, int] | None = None, seed: int = 0) -> dict:
    """Write a task's training documents (poly: problems with operations = (low, high), default
    (1, 5); induction: stories) as a prepared corpus with 1% of them in val; its manifest."""
    if task not in TASK_DOCUMENTS:
        raise ValueError(f"task {task!r} does not exist; choose one of {', '.join(TASK_DOCUMENTS)}")
    documents = documents or TASK_DOCUMENTS[task]
    if task == "poly":
        low, high = operations or (1, 5)
        texts = (p.text for p in problems(documents, operations=(low, high), seed=seed))
        counts = str(low) if low == high else f"{low}-{high}"
        source = f"polynomial arithmetic over F7[X]/(X^5), {counts} operations, seed {seed}"
    else:
        if operations is not None:
            raise ValueError("operations are for poly; induction stories have none")
        texts = iter(stories(documents, seed=seed))
        source = f"induction stories with made-up two-part names, seed {seed}"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{task}.jsonl")
        with open(path, "w") as f:
            for text in texts:
                f.write(json.dumps({"text": text}) + "\n")
        return prep.prepare([path], out, val_fraction=0.01, licence="generated (CC0)", source_name=source)


def fixed_test_set(task: str, *, per_count: int = 2000, counts: range = range(1, 11),
                   n_stories: int = 200) -> tuple[dict, bool]:
    """A task's fixed test set and whether its answers end with EOS (poly: per_count problems
    for each number of operations in counts; induction: the later mentions of n_stories stories)."""
    if task == "poly":
        return test_set(per_count, counts), True
    return induction_test_set(n_stories), False


GROUPS = {"poly": "operations", "induction": "mention"}  # what a group of each task's test set is


@dataclass(frozen=True)
class TaskScores:
    """A model's scores on a task's fixed test set (`fixed_test_set`), per group: greedy exact
    match (`evaluate.task_accuracy`) and the teacher-forced scores of the answers
    (`evaluate.task_answer_scores`). Its JSON form is `to_json`."""
    task: str  # poly or induction
    problems: dict  # group: problems in it
    accuracy: dict  # group: greedy exact match
    answer_scores: dict  # group: {"byte_accuracy", "bpb"} of the next-byte head on the answers' bytes

    @property
    def overall(self) -> float:
        """Exact match over every problem (each group weighed by its problems)."""
        return sum(self.accuracy[g] * n for g, n in self.problems.items() if n) / sum(self.problems.values())

    def to_json(self) -> dict:
        return {"problems": self.problems, "accuracy": self.accuracy, "overall": self.overall,
                "answer_scores": self.answer_scores}

    def table(self) -> str:
        """Per group and over all: problems, exact match, and the answers' byte accuracy and bits/byte."""
        scores = self.answer_scores
        rows = [(g, n, f"{self.accuracy[g]:.3f}", f"{scores[g]['byte_accuracy']:.3f}", f"{scores[g]['bpb']:.3f}")
                for g, n in self.problems.items()]
        rows.append(("all", sum(self.problems.values()), f"{self.overall:.3f}", "", ""))
        return table(rows, (GROUPS[self.task], "problems", "exact match", "answer byte acc", "answer bits/byte"))
