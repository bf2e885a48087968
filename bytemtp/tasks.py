"""Synthetic tasks of the paper (Gloeckle et al. 2024, section 4.2): polynomial arithmetic.

Polynomials over F7[X]/(X^5): five coefficients modulo 7 (X^5 = 0). Expressions combine random
polynomials with unary negation, addition, multiplication and composition (A@B is A(B(X)): B
substituted into A's representative of degree below 5, then reduced; on the quotient ring that
is a ring map only where B has no constant term, and the task is defined on the
representatives); an expression with n operations applies n of them. The answer is computed
exactly.

The byte format, one problem a document:

    ((3x^2+1)*-(x+4))@(2x^3+x)=4x^4+2x^3+x^2+3

Every binary operation is in parentheses and negation prefixes a parenthesised operand, so the
expression reads one way only. A polynomial prints from the highest degree down, a coefficient
of 1 only for the constant, and the zero polynomial as 0. A model is asked the text up to and
including "=" and must continue with the answer; exact match counts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

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
    """The fixed evaluation set: `per_count` problems for each number of operations."""
    rng = random.Random(f"bytemtp-poly-test:{seed}")
    return {n: [problem(n, rng) for _ in range(per_count)] for n in counts}
