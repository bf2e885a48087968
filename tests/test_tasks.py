"""The polynomial arithmetic task: answers held against an independent evaluator of the printed
expressions, the corpus and evaluation commands."""

import dataclasses
import json
import random
import re

import pytest
import torch
from click.testing import CliRunner

from bytemtp import config_io
from bytemtp.data.corpus import corpus_files, iter_documents
from bytemtp.decoding.generation import Generation
from bytemtp.evaluation import tasks as T
from bytemtp.evaluation.evaluate import task_accuracy
from bytemtp.model.layout import build_layout
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import save_checkpoint
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
    from bytemtp.decoding import decode

    test = T.test_set(5, range(1, 3))
    model = ByteMTP(dataclasses.replace(config_io.small().model, n_layers=10, d_model=32, n_attn_heads=2))
    answers = {p.prompt.encode(): p.answer.encode() for ps in test.values() for p in ps}

    def oracle(model, prompts, **kw):  # right on every other problem
        return [Generation(answers[p] if i % 2 == 0 else b"0") for i, p in enumerate(prompts)]

    monkeypatch.setattr(decode.Decoder, "generate", oracle)  # (decoder, prompts, ...)
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
    cfg = dataclasses.replace(config_io.small(), model=dataclasses.replace(config_io.small().model, n_layers=10, d_model=32,
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


# --- induction ------------------------------------------------------------------------------------

_SYL = "[bdfgklmnprstvz][aeiou]"
_NAME = re.compile(rf"\b([BDFGKLMNPRSTVZ][aeiou]{_SYL}) ([BDFGKLMNPRSTVZ][aeiou]{_SYL}(?:{_SYL})?)\b")


def _recount(text: str) -> list[tuple[str, str, int]]:
    """Later mentions found independently, by a pattern for the names: (prompt, answer, mention)."""
    seen, out = {}, []
    for m in _NAME.finditer(text):
        seen[m[0]] = seen.get(m[0], 0) + 1
        if seen[m[0]] > 1:
            out.append((text[:m.start(2)], m[2], seen[m[0]]))
    return out


def test_induction_mentions_match_an_independent_recount():
    rng = random.Random(5)
    for _ in range(300):
        text, mentions = T.story(rng)
        assert len(text.encode()) <= T.STORY_MAX and text.isascii()
        assert [(m.prompt, m.answer, m.mention) for m in mentions] == _recount(text)
        names = {m[0] for m in _NAME.finditer(text)}
        assert len({n.split()[0] for n in names}) == len(names) >= 2  # first parts differ in a story
        for m in mentions:  # solvable by copying: the full name is in the prompt
            assert text.startswith(m.prompt + m.answer) and m.prompt.endswith(" ")
            first = m.prompt.rsplit(" ", 2)[-2]
            assert f"{first} {m.answer}" in m.prompt


def test_induction_names_carry_no_learnable_pairing():
    # the same first part comes with many second parts across stories, so only the context tells
    pairs = {}
    for text in T.stories(3000, seed=0):
        for m in _NAME.finditer(text):
            pairs.setdefault(m[1], set()).add(m[2])
    repeated = [seconds for seconds in pairs.values() if len(seconds) > 1]
    assert len(pairs) > 1000 and len(repeated) > 100
    assert sum(len(s) for s in pairs.values()) / len(pairs) > 1.5


def test_induction_sets_are_fixed_by_their_seeds():
    assert T.stories(20, seed=1) == T.stories(20, seed=1) != T.stories(20, seed=2)
    test = T.induction_test_set(30)
    assert list(test) == ["2", "3", "4+"] and all(test.values())
    assert test == T.induction_test_set(30) != T.induction_test_set(30, seed=7)
    assert all(m.mention == 2 for m in test["2"]) and all(m.mention >= 4 for m in test["4+"])


def test_induction_accuracy_scores_the_second_part_only(monkeypatch):
    from bytemtp.decoding import decode

    test = T.induction_test_set(20)
    model = ByteMTP(dataclasses.replace(config_io.small().model, n_layers=10, d_model=32, n_attn_heads=2))

    def copier(model, prompts, *, max_bytes, **kw):  # induction by pattern: copy the name's second part
        outs = []
        for p in prompts:
            text = p.decode()
            first = text.rsplit(" ", 2)[-2]
            second = re.search(rf"\b{first} (\w+)", text)[1]
            outs.append(Generation((second + " went home.").encode()[:max_bytes]))
        return outs

    def guesser(model, prompts, *, max_bytes, **kw):  # a name's shape, no copying
        rng = random.Random(0)
        return [Generation(T.made_up_name(rng, 2).encode()) for _ in prompts]

    monkeypatch.setattr(decode.Decoder, "generate", copier)
    assert task_accuracy(model, test, batch_size=7, until_eos=False) == {"2": 1.0, "3": 1.0, "4+": 1.0}
    assert task_accuracy(model, test, batch_size=7) == {"2": 0.0, "3": 0.0, "4+": 0.0}  # EOS required
    monkeypatch.setattr(decode.Decoder, "generate", guesser)
    assert max(task_accuracy(model, test, until_eos=False).values()) < 0.05


@pytest.mark.slow
def test_induction_corpus_and_eval_commands(tmp_path):
    out = tmp_path / "induction"
    res = CliRunner().invoke(main, ["task-corpus", "induction", "--out", str(out), "--documents", "200"])
    assert res.exit_code == 0, res.output
    docs = [d.decode() for path in corpus_files(str(out), split=None) for d in iter_documents(path)]
    assert len(docs) == 200 and sorted(docs) == sorted(T.stories(200, seed=0))
    res = CliRunner().invoke(main, ["task-corpus", "induction", "--out", str(tmp_path / "x"), "--counts", "1-5"])
    assert res.exit_code != 0 and "--counts is for poly" in res.output

    def run(seq_len):
        cfg = dataclasses.replace(config_io.small(), model=dataclasses.replace(
            config_io.small().model, n_layers=10, d_model=32, n_attn_heads=2, n_future=2, seq_len=seq_len))
        save_checkpoint(tmp_path / f"run{seq_len}", step=1, model=ByteMTP(cfg.model), config=cfg, train_state={})
        return str(tmp_path / f"run{seq_len}")

    res = CliRunner().invoke(main, ["eval-task", "induction", "--ckpt", run(512), "--stories", "3",
                                    "--device", "cpu", "--json", str(tmp_path / "i.json")])
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "i.json").read_text())
    assert data["stories"] == 3 and set(data["accuracy"]) == {"2", "3", "4+"}
    assert sum(data["problems"].values()) == sum(len(v) for v in T.induction_test_set(3).values())
    assert "all" in res.output
    # a context shorter than the stories: decoding slides its window, scoring keeps the newest bytes
    res = CliRunner().invoke(main, ["eval-task", "induction", "--ckpt", run(64), "--stories", "3", "--device", "cpu"])
    assert res.exit_code == 0 and "slides its window" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["eval-task", "induction", "--ckpt", run(512), "--per-count", "3"])
    assert res.exit_code != 0 and "for poly" in res.output


@pytest.mark.parametrize("until_eos", [True, False])
def test_answer_scores_equal_a_problem_by_problem_count(until_eos):
    """Teacher-forced answer scores, batched with padding, against each problem scored alone."""
    import math

    from bytemtp.evaluation.evaluate import task_answer_scores
    from bytemtp.vocab import EOS

    model = ByteMTP(dataclasses.replace(config_io.small().model, n_layers=10, d_model=32, n_attn_heads=2,
                                        n_future=2, seq_len=512)).double().eval()
    test = {"poly": T.test_set(6, range(1, 3))[2], "induction": T.induction_test_set(2)["3"]}
    got = task_answer_scores(model, test, until_eos=until_eos, batch_size=4)
    for group, items in test.items():
        right = total = 0
        nats = 0.0
        for p in items:
            prompt, answer = list(p.prompt.encode()), list(p.answer.encode()) + ([EOS] if until_eos else [])
            seq = torch.tensor([[EOS, *prompt, *answer]])
            with torch.no_grad():
                logits = model.logits(seq, heads=1, layout=build_layout(model, seq))[0, :, 0]
            for j, target in enumerate(answer):
                row = logits[len(prompt) + j]
                right += int(row.argmax()) == target
                nats -= float(torch.log_softmax(row, -1)[target])
                total += 1
        assert got[group]["bytes"] == total == sum(len(p.answer) + until_eos for p in items)
        assert got[group]["byte_accuracy"] == right / total
        assert got[group]["bpb"] == pytest.approx(nats / math.log(2) / total, rel=1e-6)  # float32 logits


def test_eval_task_says_when_its_window_slides(tmp_path):
    """Poly decodes up to ANSWER_MAX_BYTES after the prompt: with a context one byte short of that
    the window slides (and the run says so), and one that fits runs without a note."""
    from bytemtp.evaluation.evaluate import ANSWER_MAX_BYTES, task_context

    test = T.test_set(5, range(10, 11))
    need = task_context(test)
    assert need == 1 + max(len(p.prompt) for p in test[10]) + ANSWER_MAX_BYTES
    assert task_context(test, until_eos=False) == 1 + max(len(p.prompt) + len(p.answer) for p in test[10])
    for seq_len, ok in ((need - 1, False), (need, True)):
        cfg = dataclasses.replace(config_io.small(), model=dataclasses.replace(
            config_io.small().model, n_layers=10, d_model=32, n_attn_heads=2, n_future=2, seq_len=seq_len))
        save_checkpoint(tmp_path / f"run{seq_len}", step=1, model=ByteMTP(cfg.model), config=cfg, train_state={})
        res = CliRunner().invoke(main, ["eval-task", "poly", "--ckpt", str(tmp_path / f"run{seq_len}"),
                                        "--per-count", "5", "--counts", "10", "--device", "cpu"])
        assert res.exit_code == 0, res.output
        assert "Traceback" not in res.output and ok != (f"needs up to {need} bytes of context" in res.output)


def test_write_corpus_is_the_task_corpus_command(tmp_path):
    from bytemtp.data.shards import read_manifest

    manifest = T.write_corpus("poly", tmp_path / "poly", documents=100, operations=(2, 2), seed=3)
    assert manifest == read_manifest(tmp_path / "poly")
    assert sum(s["documents"] for s in manifest["splits"].values()) + manifest["duplicates"] == 100
    assert "2 operations, seed 3" in manifest["source"]
    with pytest.raises(ValueError, match="operations are for poly"):
        T.write_corpus("induction", tmp_path / "ind", documents=10, operations=(1, 5))
    with pytest.raises(ValueError, match="task 'sums' does not exist"):
        T.write_corpus("sums", tmp_path / "sums")


def test_task_scores_weigh_each_group_by_its_problems():
    scores = T.TaskScores(task="poly", problems={1: 3, 2: 1, 11: 0}, accuracy={1: 1.0, 2: 0.0, 11: 0.0},
                          answer_scores={g: {"byte_accuracy": 0.5, "bpb": 1.25} for g in (1, 2, 11)})
    assert scores.overall == 0.75  # 3 of 4 problems; an empty group counts for nothing
    assert list(scores.to_json()) == ["problems", "accuracy", "overall", "answer_scores"]
    assert scores.table().splitlines() == [
        "operations  problems  exact match  answer byte acc  answer bits/byte",
        "----------  --------  -----------  ---------------  ----------------",
        "1           3         1.000        0.500            1.250",
        "2           1         0.000        0.500            1.250",
        "11          0         0.000        0.500            1.250",
        "all         4         0.750"]
    induction = dataclasses.replace(scores, task="induction")
    assert induction.table().startswith("mention ")
