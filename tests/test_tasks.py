"""The polynomial arithmetic task: answers held against an independent evaluator of the printed
expressions, the corpus and evaluation commands."""

import dataclasses
import json
import random
import re

import pytest
import torch
from click.testing import CliRunner

from bytemtp import config as C
from bytemtp import tasks as T
from bytemtp.checkpoint import save_checkpoint
from bytemtp.corpus import iter_documents, corpus_files
from bytemtp.evaluate import task_accuracy
from bytemtp.model import ByteMTP
from bytemtp_cli.main import main


# --- an independent reference: parse the text, compute with dicts of power -> coefficient ---------

def _poly(text: str) -> dict:
    out = {}
    for term in text.split("+"):
        m = re.fullmatch(r"(\d*)(x(?:\^(\d))?)?", term)
        assert m and term, term
        coef = int(m[1]) if m[1] else 1
        power = (int(m[3]) if m[3] else 1) if m[2] else 0
        out[power] = (out.get(power, 0) + coef) % 7
    return {p: c for p, c in out.items() if c}


def _mul(a: dict, b: dict) -> dict:
    out = {}
    for i, x in a.items():
        for j, y in b.items():
            if i + j < 5:
                out[i + j] = (out.get(i + j, 0) + x * y) % 7
    return {p: c for p, c in out.items() if c}


def _add(a: dict, b: dict) -> dict:
    out = {p: (a.get(p, 0) + b.get(p, 0)) % 7 for p in set(a) | set(b)}
    return {p: c for p, c in out.items() if c}


def _compose(a: dict, b: dict) -> dict:
    out, power = {}, {0: 1}
    for k in range(5):  # sum of a_k * b^k
        if a.get(k):
            out = _add(out, {p: c * a[k] % 7 for p, c in power.items()})
        power = _mul(power, b)
    return out


def _evaluate(text: str) -> dict:
    pos = 0

    def operand():
        nonlocal pos
        if text[pos] == "-":
            pos += 1
            return {p: -c % 7 for p, c in operand().items()}
        assert text[pos] == "("
        pos += 1
        if text[pos] in "(-":
            left = operand()
            op = text[pos]
            pos += 1
            right = operand()
            assert text[pos] == ")"
            pos += 1
            return {"+": _add, "*": _mul, "@": _compose}[op](left, right)
        end = text.index(")", pos)
        value = _poly(text[pos:end])
        pos = end + 1
        return value

    value = operand()
    assert pos == len(text)
    return value


def _show(a: dict) -> str:
    return T.show(tuple(a.get(p, 0) for p in range(5)))


@pytest.mark.parametrize("operations", range(1, 11))
def test_answers_equal_an_independent_evaluation(operations):
    rng = random.Random(operations)
    for _ in range(200):
        p = T.problem(operations, rng)
        assert p.text == f"{p.expression}={p.answer}"
        assert _show(_evaluate(p.expression)) == p.answer, p.expression
        assert p.expression.count("-") + sum(p.expression.count(s) for s in "+*@") >= operations


def test_ring_laws_and_printing():
    rng = random.Random(0)
    x = (0, 1, 0, 0, 0)
    for _ in range(100):
        a, b, c = (T.random_poly(rng) for _ in range(3))
        assert T.mul(a, b) == T.mul(b, a) and T.add(a, T.neg(a)) == (0,) * 5
        assert T.mul(a, T.add(b, c)) == T.add(T.mul(a, b), T.mul(a, c))
        c0 = (0,) + c[1:]  # substitution is a ring map when the inner polynomial has no constant term
        assert T.comp(T.mul(a, b), c0) == T.mul(T.comp(a, c0), T.comp(b, c0))
        assert T.comp(T.add(a, b), c) == T.add(T.comp(a, c), T.comp(b, c))
        assert T.comp(a, x) == a and T.comp(x, a) == a
    assert T.show((0,) * 5) == "0" and T.show((1, 1, 0, 0, 3)) == "3x^4+x+1" and T.show((0, 1, 0, 0, 0)) == "x"
    assert T.mul((0, 0, 1, 0, 0), (0, 0, 0, 1, 0)) == (0,) * 5  # x^5 = 0


def test_sets_are_fixed_by_their_seeds():
    assert T.problems(50, operations=(1, 5), seed=3) == T.problems(50, operations=(1, 5), seed=3)
    assert T.problems(50, operations=(1, 5), seed=3) != T.problems(50, operations=(1, 5), seed=4)
    assert {p.operations for p in T.problems(500, operations=(1, 5), seed=0)} == {1, 2, 3, 4, 5}
    test = T.test_set(10, range(6, 11))
    assert list(test) == [6, 7, 8, 9, 10] and all(p.operations == n for n, ps in test.items() for p in ps)
    assert test == T.test_set(10, range(6, 11))


def test_task_accuracy_counts_exact_matches(monkeypatch):
    from bytemtp import decode

    test = T.test_set(5, range(1, 3))
    model = ByteMTP(dataclasses.replace(C.small().model, n_layers=10, d_model=32, n_attn_heads=2))
    answers = {p.prompt.encode(): p.answer.encode() for ps in test.values() for p in ps}

    def oracle(model, prompts, **kw):  # right on every other problem
        return [decode.Generation(answers[p] if i % 2 == 0 else b"0") for i, p in enumerate(prompts)]

    monkeypatch.setattr(decode, "generate_batch", oracle)
    assert task_accuracy(model, test, batch_size=2) == {1: 0.6, 2: 0.6}


def test_task_corpus_and_eval_task_commands(tmp_path):
    out = tmp_path / "poly"
    res = CliRunner().invoke(main, ["task-corpus", "poly", "--out", str(out), "--documents", "300"])
    assert res.exit_code == 0, res.output
    docs = [d.decode() for path in corpus_files(str(out), split=None) for d in iter_documents(path)]
    assert 250 < len(docs) <= 300 and all("=" in d for d in docs)
    for doc in docs[:50]:
        expression, answer = doc.split("=")
        assert _show(_evaluate(expression)) == answer
    cfg = dataclasses.replace(C.small(), model=dataclasses.replace(C.small().model, n_layers=10, d_model=32,
                                                                   n_attn_heads=2, n_future=4))
    model = ByteMTP(cfg.model)
    save_checkpoint(tmp_path / "run", step=1, model=model, config=cfg, train_state={})
    res = CliRunner().invoke(main, ["eval-task", "poly", "--ckpt", str(tmp_path / "run"), "--per-count", "4",
                                    "--counts", "1-2", "--device", "cpu", "--json", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "t.json").read_text())
    assert set(data["accuracy"]) == {"1", "2"} and all(0 <= a <= 1 for a in data["accuracy"].values())
    res = CliRunner().invoke(main, ["eval-task", "poly", "--ckpt", str(tmp_path / "run"), "--counts", "x"])
    assert res.exit_code != 0 and "--counts" in res.output
