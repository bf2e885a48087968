"""The BPE baseline of `bench tokens`: the vocabulary, the token loader, a token model's checkpoint
that generates and evaluates, bits per byte on the same bytes for both vocabularies, and the
benchmark itself on a tiny corpus."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from train_runs import tiny_cfg

import bytemtp.training.train as train_lib
from bytemtp.config import DataConfig, ModelConfig
from bytemtp.data.corpus import corpus_files, iter_documents
from bytemtp.data.loader import ByteLoader
from bytemtp.data.stream import DocumentStream
from bytemtp.decoding.decode import Decoder, generate
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.generation import Output, DecodeStats
from bytemtp.evaluation.evaluate import evaluate
from bytemtp.evaluation.likelihood import score_texts
from bytemtp.experiments.step_bench import StepCheck, check_steps
from bytemtp.experiments.token_results import ArmFigures, TokenBench
from bytemtp.model.model import ByteMTP
from bytemtp.runtime.checkpoint import CheckpointError, load_model
from bytemtp.vocab import BYTES, EOS, FIRST_MERGE, TokenizerError, emitted, load_vocabulary, train_bpe
from bytemtp_cli.main import main


def train_docs(corpus) -> list[bytes]:
    return [d for f in corpus_files(str(corpus), split="train") for d in iter_documents(f)]


@pytest.fixture(scope="module")
def bpe(corpus_dir, tmp_path_factory):
    return train_bpe(train_docs(corpus_dir), vocab_size=320, path=tmp_path_factory.mktemp("bpe") / "tokenizer.json")


def test_bpe_keeps_the_byte_ids_and_round_trips_any_bytes(bpe):
    assert bpe.size == 320 and not bpe.is_bytes
    odd = b"\x00\xff\xfe the quick \xc3\x28 brown\n\n    fox \xe2\x82\xac" * 3
    ids = bpe.encode(odd)
    assert bpe.decode(ids) == odd
    assert all(i < 256 or FIRST_MERGE <= i < bpe.size for i in ids)
    words = bpe.encode(b" the quick brown fox")
    assert len(words) < len(b" the quick brown fox") and max(words) >= FIRST_MERGE  # merges were learnt
    assert bpe.pieces[ord("a")] == b"a" and bpe.lengths[EOS] == 1 and bpe.lengths[256] == 0
    assert [bpe.lengths[i] for i in words] == [len(bpe.pieces[i]) for i in words]
    assert load_vocabulary(bpe.path).pieces == bpe.pieces  # the file is all a checkpoint keeps


def test_bad_tokenizers_give_one_line(tmp_path):
    with pytest.raises(TokenizerError, match="no such tokenizer file"):
        load_vocabulary(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="is not a tokenizers JSON file"):
        load_vocabulary(tmp_path / "bad.json")
    with pytest.raises(TokenizerError, match="leaves no room for merges"):
        train_bpe([b"abc"], vocab_size=264, path=tmp_path / "t.json")


def test_config_ties_the_vocabulary_size_to_a_tokenizer(corpus_dir, bpe):
    with pytest.raises(ValueError, match="model.vocab_size=260 is not allowed"):
        ModelConfig(vocab_size=260)
    with pytest.raises(ValueError, match="needs the BPE's tokenizer.json in data.tokenizer"):
        tiny_cfg(corpus_dir, "model.vocab_size=320")
    cfg = tiny_cfg(corpus_dir, "model.vocab_size=400", f"data.tokenizer={bpe.path}", "train.steps=1")
    with pytest.raises(TokenizerError, match="set model.vocab_size=320"):
        train_lib.train(cfg, corpus_dir.parent / "mismatch", show_progress=False, say=lambda m: None)


def test_the_token_loader_hands_out_every_document_encoded_and_resumes_exactly(corpus_dir, bpe, monkeypatch):
    monkeypatch.setattr(DocumentStream, "CHUNK", 97)  # documents arrive cut into pieces: BPE must see them whole
    model = ModelConfig(n_layers=3, d_model=16, n_attn_heads=2, n_future=2, seq_len=16, vocab_size=bpe.size)
    cfg = DataConfig(path=str(corpus_dir), batch_size=3, shuffle_buffer=1, tokenizer=bpe.path)
    loader = ByteLoader(cfg, model)
    stream = []
    for _ in range(40):
        batch = next(loader)
        stream += batch[:, :16].flatten().tolist()  # stride seq_len: each id an input once, in order
    docs = train_docs(corpus_dir)
    expected = [i for d in (bpe.encode(doc) + [EOS] for doc in docs) for i in d]
    assert stream == expected[:len(stream)]

    shuffled = DataConfig(path=str(corpus_dir), batch_size=3, shuffle_buffer=8, tokenizer=bpe.path)
    whole = ByteLoader(shuffled, model)
    first = [next(whole) for _ in range(7)]
    state = whole.state_dict()
    rest = [next(whole) for _ in range(30)]
    resumed = ByteLoader(shuffled, model)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert all(torch.equal(a, next(resumed)) for a in rest) and first


def uniform(cfg: ModelConfig) -> ByteMTP:
    """A model whose every logit is 0: each of its table's ids has probability 1/rows."""
    model = ByteMTP(cfg)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for u in model.unembed:
            u.weight.zero_()
    return model.eval()


def test_bits_per_byte_of_both_vocabularies_divide_by_the_same_bytes(bpe):
    text = [b"the quick brown fox jumps over the lazy dog " * 9, b"\x00\xffodd bytes"]
    n_bytes = sum(len(t) + 1 for t in text)  # each document's bytes and its EOS
    small = dict(n_layers=2, d_model=16, n_attn_heads=2, n_future=1, seq_len=32)
    byte_model = uniform(ModelConfig(**small))
    score = score_texts(byte_model, text)
    assert score.bytes == score.ids == n_bytes
    assert score.bits_per_byte == pytest.approx(math.log2(264), rel=1e-6)
    token_model = uniform(ModelConfig(**small, vocab_size=bpe.size))
    token_model.vocab = bpe
    tokens = sum(len(bpe.encode(t)) + 1 for t in text)
    score = score_texts(token_model, text)
    assert score.bytes == n_bytes and score.ids == tokens < n_bytes
    assert score.bits_per_byte == pytest.approx(tokens * math.log2(320) / n_bytes, rel=1e-6)


def test_evaluate_divides_a_token_models_nats_by_the_bytes_of_its_targets(corpus_dir, bpe):
    model = uniform(ModelConfig(n_layers=3, d_model=16, n_attn_heads=2, n_future=2, seq_len=16, vocab_size=bpe.size))
    model.vocab = bpe
    res = evaluate(model, str(corpus_dir), split="val", batches=3, batch_size=2)
    loader = ByteLoader(DataConfig(path=str(corpus_dir), batch_size=2, shuffle_buffer=1, tokenizer=bpe.path),
                        model.config, split="val")
    targets = torch.cat([next(loader)[:, 1:17] for _ in range(3)])
    n_bytes = int(torch.tensor(bpe.lengths)[targets].sum())
    assert res.bytes == n_bytes
    assert res.bpb[0] == pytest.approx(targets.numel() * math.log2(320) / n_bytes, rel=1e-6)


@pytest.fixture(scope="module")
def bpe300(corpus_dir, tmp_path_factory):
    """A BPE of 300 ids: its table has 304 rows, so ids 300..303 are padding."""
    return train_bpe(train_docs(corpus_dir), vocab_size=300, path=tmp_path_factory.mktemp("bpe300") / "tokenizer.json")


def test_generation_never_emits_a_token_table_s_padding(bpe300):
    """The ids generation may emit follow the model's vocabulary size, not its table's rows: a
    model whose padding ids (300..303) outrank every real id still writes only real ones, greedy
    and sampled, plain and drafted, with the draft heads' mask alike."""
    assert bpe300.size == 300
    allowed = emitted(300)
    assert len(allowed) == 304 and allowed[264:300] == [True] * 36 and not any(allowed[300:])
    assert emitted(259) == emitted(264) and len(emitted()) == 264 and not any(emitted()[258:])
    cfg = ModelConfig(n_layers=4, d_model=16, n_attn_heads=2, n_future=3, seq_len=32, vocab_size=300)
    model = uniform(cfg)
    model.vocab = bpe300
    with torch.no_grad():  # one padding row of each pair outranks everything, whatever the state's sign
        for u in model.unembed:
            u.weight[300:302] = torch.tensor([1e3, -1e3])[:, None]
            u.weight[302:304, 0] = torch.tensor([1e3, -1e3])
    hydra = ByteMTP(dataclasses.replace(cfg, draft="hydra"))  # a drafter reads only these as the id before
    assert hydra.drafter.allowed.tolist() == allowed
    hydra.reset_rope()
    assert hydra.drafter.allowed.tolist() == allowed
    decoder = Decoder(model, compile="off")
    for seed in range(3):
        sampling = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(seed))
        plain = generate(model, b"the \xff\x00", max_bytes=40, sampling=sampling)
        assert len(plain.output) >= 40 or plain.stats.stopped_by == "eos"
        for draft in ("plain", "chain-all"):
            sampling = Sampling(temperature=1.0, generator=torch.Generator().manual_seed(seed))
            got = decoder.generate([b"the \xff\x00"], max_bytes=40, sampling=sampling, draft=draft)[0]
            assert len(got.output) >= 40 or got.stats.stopped_by == "eos"
    greedy = generate(model, b"the", max_bytes=20)
    assert decoder.generate([b"the"], max_bytes=20, draft="chain-all")[0].output == greedy.output


def test_output_of_tokens_counts_and_stops_in_bytes(bpe):
    ids = bpe.encode(b" the quick brown fox")
    out = Output(DecodeStats(), max_bytes=100, stop=(b"ck b",), on_bytes=None, pieces=bpe.pieces)
    emitted = 0
    while not out.emit(ids[emitted]):
        emitted += 1
    assert emitted < len(ids) - 1  # it stopped before the last token
    assert bytes(out.text) == b" the quick b" and out.stats.stopped_by == "stop"
    out = Output(DecodeStats(), max_bytes=6, stop=(), on_bytes=None, pieces=bpe.pieces)
    for i in ids:
        if out.emit(i):
            break
    assert len(out.text) >= 6 and out.stats.stopped_by == "max_bytes"


@pytest.fixture(scope="module")
def token_run(corpus_dir, bpe, tmp_path_factory):
    run = tmp_path_factory.mktemp("token-run") / "run"
    cfg = tiny_cfg(corpus_dir, "train.steps=30", "model.n_future=4", "model.seq_len=24",
                   f"model.vocab_size={bpe.size}", f"data.tokenizer={bpe.path}")
    train_lib.train(cfg, run, show_progress=False, say=lambda m: None)
    return run


@pytest.mark.slow
def test_a_token_checkpoint_decodes_exactly_and_evaluates(token_run, corpus_dir, one_thread):
    model, cfg = load_model(token_run)
    assert model.vocab.size == cfg.model.vocab_size == 320
    prompts = [b"document 3\nthe quick", b"the lazy dog"]
    plain = [generate(model, p, max_bytes=50) for p in prompts]
    assert all(len(g.output) >= 50 for g in plain) and plain[0].stats.forward_passes < 50  # tokens, not bytes
    decoder = Decoder(model, compile="off")
    for draft in ("auto", "chain-all", "tree-all", "auto+lookup", "plain+lookup"):
        got = decoder.generate(prompts, max_bytes=50, draft=draft)
        assert [g.output for g in got] == [g.output for g in plain], draft
    res = CliRunner().invoke(main, ["generate", "--ckpt", str(token_run), "--prompt", "the quick", "--max-bytes", "30",
                                    "--device", "cpu", "--compile", "off", "--raw"])
    assert res.exit_code == 0, res.output
    assert res.output.encode() == generate(model, b"the quick", max_bytes=30).output
    res = CliRunner().invoke(main, ["eval", "--ckpt", str(token_run), "--data", str(corpus_dir), "--batches", "2",
                                    "--device", "cpu", "--json", "-"])
    assert res.exit_code == 0, res.output


def test_a_run_whose_tokenizer_was_replaced_by_another_of_its_size_is_refused_in_one_line(corpus_dir, bpe, tmp_path):
    """Resuming a token run (or starting one from its weights) after its tokenizer.json was replaced
    by another BPE of the same size stops before any work, naming the file: the checkpoint's copy
    says which tokenizer the run was trained with."""
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_bytes(Path(bpe.path).read_bytes())
    run = tmp_path / "run"
    train_lib.train(tiny_cfg(corpus_dir, "train.steps=2", "model.n_future=2", "model.seq_len=16",
                             f"model.vocab_size={bpe.size}", f"data.tokenizer={tokenizer}"),
                    run, show_progress=False, say=lambda m: None)
    other = train_bpe([d[::-1] for d in train_docs(corpus_dir)], vocab_size=bpe.size, path=tmp_path / "other.json")
    assert other.size == bpe.size and other.pieces != bpe.pieces
    tokenizer.write_bytes(Path(other.path).read_bytes())
    before = (run / "metrics.jsonl").read_bytes()
    res = CliRunner().invoke(main, ["train", "--resume", str(run), "--steps", "4"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.output.strip().splitlines() == [
        f"Error: {tokenizer} is not the tokenizer that {run / 'checkpoints' / 'step-00000002'} was trained with (its "
        f"tokenizer.json differs); put the run's tokenizer back there (a copy is "
        f"{run / 'checkpoints' / 'step-00000002' / 'tokenizer.json'}), or start a new run"]
    assert (run / "metrics.jsonl").read_bytes() == before  # nothing written
    with pytest.raises(CheckpointError, match="is not the tokenizer that"):
        train_lib.train(tiny_cfg(corpus_dir, "train.steps=1", "model.n_future=2", "model.seq_len=16",
                                 f"model.vocab_size={bpe.size}", f"data.tokenizer={tokenizer}", f"train.init={run}"),
                        tmp_path / "from-it", show_progress=False, say=lambda m: None)
    copy = run / "checkpoints" / "step-00000002" / "tokenizer.json"
    kept = copy.read_bytes()
    copy.unlink()  # the checkpoint's copy gone, another BPE at the path: one line naming the copy
    res = CliRunner().invoke(main, ["train", "--resume", str(run), "--steps", "4"])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.output.strip().splitlines() == [
        f"Error: {copy.parent} has no tokenizer.json, the copy of the tokenizer its run was trained with, so "
        f"{tokenizer} cannot be checked against it; put the run's tokenizer there as {copy}, or start a new run"]
    assert (run / "metrics.jsonl").read_bytes() == before
    copy.write_bytes(kept)
    tokenizer.write_bytes(Path(bpe.path).read_bytes())  # the right one back: it resumes
    res = CliRunner().invoke(main, ["train", "--resume", str(run), "--steps", "3"])
    assert res.exit_code == 0, res.output


def test_a_token_checkpoint_without_its_tokenizer_is_refused(token_run, tmp_path):
    import shutil

    from bytemtp.runtime.checkpoint import latest_checkpoint

    copy = tmp_path / "ckpt"
    shutil.copytree(latest_checkpoint(token_run), copy)
    (copy / "tokenizer.json").unlink()
    with pytest.raises(CheckpointError, match="but no tokenizer.json"):
        load_model(copy)
    assert BYTES.decode([104, 105, EOS]) == b"hi"


@pytest.mark.slow
def test_bench_tokens_trains_scores_and_decodes_both_arms(corpus_dir, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "tokens", "--preset", "tiny", "--data", str(corpus_dir), "--steps", "4", "--vocab", "300",
            "--held-out", str(corpus_dir.parent / "src"), "--held-out-bytes", "2000", "--n-prompts", "2",
            "--max-bytes", "16", "--rounds", "1", "--compile", "off", "--check-rounds", "2", "--out", str(out),
            "--device", "cpu", "--json", str(tmp_path / "r.json")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r.json").read_text())
    arms = {a["arm"]: a for a in data["arms"]}
    assert arms["bytes"]["val_bytes"] == arms["tokens"]["val_bytes"] > 0
    assert arms["bytes"]["held_out_bytes"] == arms["tokens"]["held_out_bytes"] > 2000  # and one EOS a document
    ctx = arms["tokens"]["context_ids"]
    assert arms["tokens"]["tokens_seen"] == 4 * round(8 * 64 / ctx) * ctx  # steps x batch (the bytes' positions) x context
    assert [d["batch_size"] for d in data["decoding"]] == [1, 8]
    assert set(data["decoding"][0]["modes"]) == {"bytes plain", "bytes auto", "bytes auto+lookup",
                                                 "tokens plain", "tokens plain+lookup"}
    assert "bits/byte, whole val" in res.output and "over the token arm's best" in res.output
    assert "bytes arm's settings on the preset: none" in res.output  # the settings compared, stated
    assert (f"tokens arm's settings on the preset: model.vocab_size=300 data.tokenizer={out.resolve()}/tokenizer.json "
            f"model.n_future=1 model.seq_len={ctx}") in res.output
    # the step check: both arms timed turn about, each arm's pace and share of it measured and written
    check = data["check"]
    assert check["rounds"] == 2 and [len(check["times"][arm]) for arm in ("bytes", "tokens")] == [2, 2]
    assert check["compiled"] == {"bytes": False, "tokens": False}  # as the 4-step runs trained
    for a in arms.values():
        assert a["check_step_s"] > 0 and a["train_s"] > 0 and a["steps_per_s"] == pytest.approx(4 / a["train_s"])
        assert a["expected_steps"] == pytest.approx(a["train_s"] / a["check_step_s"])
        assert a["share_of_expected_steps"] == pytest.approx(4 / a["expected_steps"])
    assert data["load_warnings"] == []  # --steps: equal work, whatever the load
    assert "step check after training (2 rounds" in res.output
    assert "share of the steps at the check's pace" in res.output
    assert (out / "step-check.json").is_file()
    again = CliRunner().invoke(main, args)  # measured before: read back, nothing trains again
    assert again.exit_code == 0 and "training a byte-level BPE" not in again.output
    assert "timing a training step" in res.output and "timing a training step" not in again.output
    assert json.loads((tmp_path / "r.json").read_text())["check"] == check
    other = CliRunner().invoke(main, [*args[:-6], "--check-rounds", "1", *args[-6:]])  # other rounds: taken anew
    assert other.exit_code == 0 and "timing a training step" in other.output, other.output
    assert len(json.loads((tmp_path / "r.json").read_text())["check"]["times"]["bytes"]) == 1
    # the measured figures read back; as a time-limited comparison, each arm's wall time just what its
    # steps take at the check's pace: no warning; the token arm's steps scaled down past the check's noise: one
    bench = TokenBench.from_json(data)
    at_pace = [dataclasses.replace(a, train_s=a.steps * a.check_step_s) for a in bench.arms]
    timed = dataclasses.replace(bench, steps=0, budget_s=60.0, arms=at_pace)
    assert [a.share for a in timed.arms] == [pytest.approx(1.0)] * 2 and timed.load_warnings() == []
    noise = bench.check.ratio("bytes", "tokens").width + 0.05
    cut = [dataclasses.replace(a, steps=a.steps / (2 + 2 * noise)) if a.arm == "tokens" else a for a in at_pace]
    warned = dataclasses.replace(timed, arms=cut).load_warnings()
    assert len(warned) == 1 and "the sitting favoured the bytes arm" in warned[0]


@pytest.mark.slow
def test_bench_tokens_takes_the_shared_decoding_options(corpus_dir, tmp_path):
    """bench tokens takes decoding's options as bench decode does: the drafts to time (a token arm
    without heads drafts prompt lookup alone, where a draft asks for it), the sampling options
    (a temperature below the greedy threshold is greedy), a seed and the dtype; the JSON says which."""
    args = ["bench", "tokens", "--preset", "tiny", "--data", str(corpus_dir), "--steps", "2", "--vocab", "300",
            "--n-prompts", "2", "--max-bytes", "12", "--batch-sizes", "2", "--rounds", "1", "--compile", "off",
            "--draft", "chain-2,plain+lookup", "--temperature", "1e-9", "--top-p", "0.9", "--seed", "4",
            "--out", str(tmp_path / "bench"), "--device", "cpu", "--json", str(tmp_path / "r.json")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["temperature"], data["top_p"], data["seed"], data["dtype"]) == (0.0, 0.9, 4, "float32")
    assert list(data["decoding"][0]["modes"]) == ["bytes plain", "bytes chain-2", "bytes plain+lookup",
                                                 "tokens plain", "tokens plain+lookup"]
    assert all(m["identical"] for m in data["decoding"][0]["modes"].values())  # greedy: checked, as bench decode does
    assert "decoding, greedy, 2 held-out prompts" in res.output


def test_uses_that_take_bytes_refuse_a_token_checkpoint_in_one_line(token_run, tmp_path):
    with pytest.raises(CheckpointError, match=r"^serve takes byte models; .* 320 BPE token ids"):
        load_model(token_run, bytes_only="serve")
    res = CliRunner().invoke(main, ["export", "--format", "hf", "--ckpt", str(token_run), "--out", str(tmp_path / "x")])
    assert res.exit_code == 1 and "the Hugging Face export takes byte models" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(main, ["inspect", str(token_run)])
    assert res.exit_code == 0 and "vocabulary  byte-level BPE of 320 ids (56 merges)" in res.output


@pytest.mark.slow
def test_bench_decode_measures_a_token_checkpoint(token_run, tmp_path):
    res = CliRunner().invoke(main, ["bench", "decode", "--ckpt", str(token_run), "--n-prompts", "2", "--max-bytes", "24",
                                    "--batch-sizes", "1", "--draft", "auto,plain+lookup,chain-all", "--rounds", "1",
                                    "--compile", "off", "--device", "cpu",
                                    "--json", str(tmp_path / "d.json")])
    assert res.exit_code == 0, res.output
    cases = json.loads((tmp_path / "d.json").read_text())["cases"]
    assert {c["mode"] for c in cases} == {"auto", "plain+lookup", "chain-all"}
    assert all(c["identical"] for c in cases)


def test_bench_tokens_refuses_runs_trained_with_other_settings(corpus_dir, tmp_path):
    from bytemtp.experiments.token_bench import compare

    common = dict(out=tmp_path / "b", preset="tiny", vocab_size=300, n_prompts=1, max_bytes=8, batch_sizes=(1,),
                  rounds=1, compile="off", sets=["train.device=cpu"], check_rounds=0)
    compare(str(corpus_dir), steps=2, **common)
    with pytest.raises(ValueError, match="bytes-s0 was trained with other settings"):
        compare(str(corpus_dir), steps=3, **common)


def test_bench_tokens_measures_a_cut_record_again_and_refuses_a_bad_draft_before_training(corpus_dir, tmp_path):
    """A kept step-check.json or scores.json that was cut is said in a line naming it and measured
    again (it was a JSON error that named no file); a draft the byte arm cannot run is refused,
    naming it, before anything trains (it was refused after both arms had trained, without its name)."""
    from bytemtp.experiments.token_bench import compare

    out = tmp_path / "b"
    common = dict(out=out, preset="tiny", vocab_size=300, n_prompts=1, max_bytes=8, batch_sizes=(1,), rounds=1,
                  compile="off", sets=["train.device=cpu"], check_rounds=1, steps=2)
    with pytest.raises(ValueError, match=r"^--draft chain-99: 99 is more than the byte arm's 8 heads"):
        compare(str(corpus_dir), drafts=("auto", "chain-99"), **common)
    assert not out.exists() or list(out.iterdir()) == []  # no tokenizer, no run
    first = compare(str(corpus_dir), **common)
    said = []
    for name in ("step-check.json", "bytes-s0/scores.json"):
        text = (out / name).read_text()
        (out / name).write_text(text[:len(text) // 2])
    again = compare(str(corpus_dir), say=said.append, **common)
    assert [line.split(" cannot be read")[0] for line in said if "cannot be read" in line] == [
        str(out / "step-check.json"), str(out / "bytes-s0" / "scores.json")]
    assert again.arms[0].val_bpb == first.arms[0].val_bpb and json.loads((out / "step-check.json").read_text())
    assert json.loads((out / "bytes-s0" / "scores.json").read_text())["val_bpb"] == first.arms[0].val_bpb


def _arm(arm: str, *, steps: int, train_s: float = 60.0, step_s: float | None, seed: int = 0) -> ArmFigures:
    return ArmFigures(name=f"{arm}-s{seed}", arm=arm, seed=seed, sets=[], params=1000, steps=steps, train_s=train_s,
                      tokens_seen=steps * 512, bytes_seen=steps * 512, context_ids=64, context_bytes=64.0, val_bpb=2.0,
                      val_bytes=100, held_out_bpb=None, held_out_bytes=0, check_step_s=step_s)


def _bench(arms: list[ArmFigures], check: StepCheck | None, *, steps: int = 0) -> TokenBench:
    return TokenBench(data="corpus", preset="tiny", budget_s=0.0 if steps else 60.0, steps=steps, seeds=1,
                      tokenizer="tokenizer.json", vocab_size=300, train_bytes_per_token=2.0, val_bytes_per_token=2.0,
                      held_out=None, arms=arms, decoding=[], prompts=1, max_bytes=8, temperature=0.0, compiled=False,
                      check=check)


def test_the_step_check_warns_where_the_sitting_favoured_one_arm():
    """Each arm's share of the steps its wall time buys at the step check's pace: a warning naming
    the arm favoured where the shares lie further apart than the check's spread plus 5%, none
    within it, none under --steps (equal work) and none without a check."""
    steady = StepCheck(rounds=3, steps_per_sample=1, compiled={"bytes": False, "tokens": False},
                       times={"bytes": [0.1, 0.1, 0.1], "tokens": [0.05, 0.05, 0.05]})
    fair = [_arm("bytes", steps=600, step_s=0.1), _arm("tokens", steps=1200, step_s=0.05)]
    assert [a.share for a in fair] == [pytest.approx(1.0)] * 2 and fair[0].steps_per_s == 10.0
    assert _bench(fair, steady).load_warnings() == []
    near = [fair[0], _arm("tokens", steps=1170, step_s=0.05)]  # 2.5% apart: inside the 5% floor
    assert _bench(near, steady).load_warnings() == []
    slowed = [fair[0], _arm("tokens", steps=960, step_s=0.05)]  # its slot gave it 80% of an equal machine
    bench = _bench(slowed, steady)
    warned = bench.load_warnings()
    assert len(warned) == 1 and warned[0].startswith("WARNING, seed 0: the sitting favoured the bytes arm 1.25x")
    assert "the tokens arm 80%" in warned[0] and "--steps 600" in warned[0]
    table = bench.table()
    assert warned[0] in table and "| share of the steps at the check's pace | 100% | 80% |" in table
    assert "| wall time (s) | 60 | 60 |" in table and "| steps a second | 10.00 | 16.00 |" in table
    assert "a bytes step over a tokens step 2.00x (2.00-2.00)" in table
    noisy = dataclasses.replace(steady, times={"bytes": [0.1, 0.1, 0.1], "tokens": [0.05, 0.04, 0.06]})
    assert _bench(slowed, noisy).load_warnings() == []  # rounds 42% apart: 25% is inside the noise
    assert _bench(slowed, steady, steps=600).load_warnings() == []
    # five rounds, the first slowed for both arms by a load (a ratio of 1.06 among 0.52-0.54): the
    # median step leaves it out, and so does the noise, so a tokens slot with half the machine warns
    loaded = StepCheck(rounds=5, steps_per_sample=1, compiled={"bytes": False, "tokens": False},
                       times={"bytes": [0.554, 0.128, 0.127, 0.127, 0.128], "tokens": [0.522, 0.247, 0.238, 0.242, 0.239]})
    halved = [_arm("bytes", steps=415, train_s=60.0, step_s=0.128), _arm("tokens", steps=117, train_s=60.0, step_s=0.242)]
    warned = _bench(halved, loaded).load_warnings()
    assert len(warned) == 1 and "favoured the bytes arm 1.88x" in warned[0] and "noise, 7%" in warned[0], warned
    unchecked = [dataclasses.replace(a, check_step_s=None) for a in slowed]
    assert _bench(unchecked, None).load_warnings() == [] and "share of the steps" not in _bench(unchecked, None).table()


def test_the_step_check_is_written_and_read_back_and_older_json_still_reads():
    bench = _bench([_arm("bytes", steps=600, step_s=0.1), _arm("tokens", steps=960, step_s=0.05)],
                   StepCheck(rounds=2, steps_per_sample=3, compiled={"bytes": True, "tokens": True},
                             times={"bytes": [0.1, 0.1], "tokens": [0.05, 0.05]}))
    data = json.loads(json.dumps(bench.to_json()))
    assert TokenBench.from_json(data) == bench
    assert data["check"]["times"]["tokens"] == [0.05, 0.05] and len(data["load_warnings"]) == 1
    assert [(a["steps_per_s"], a["expected_steps"], a["share_of_expected_steps"]) for a in data["arms"]] == [
        (10.0, pytest.approx(600.0), pytest.approx(1.0)), (16.0, pytest.approx(1200.0), pytest.approx(0.8))]
    for key in ("check", "load_warnings"):  # JSON written before the check
        del data[key]
    for arm in data["arms"]:
        for key in ("check_step_s", "steps_per_s", "expected_steps", "share_of_expected_steps"):
            del arm[key]
    old = TokenBench.from_json(data)
    assert old.check is None and old.arms[0].check_step_s is None and old.arms[1].share is None
    assert old.load_warnings() == [] and "| wall time (s) |" in old.table()


def test_the_step_check_steps_each_arm_as_its_run_trained(corpus_dir, bpe):
    """A configuration's step in the check: ids of its vocabulary (bytes and merges, a few EOS, no
    other special id), its micro-batches, and compiled as train.compile compiled its run."""
    from bytemtp.experiments.step_bench import _Variant

    cfg = tiny_cfg(corpus_dir, "model.n_future=1", "model.seq_len=24", f"model.vocab_size={bpe.size}",
                   f"data.tokenizer={bpe.path}", "train.grad_accum=2", "train.steps=3")
    v = _Variant(cfg, device=torch.device("cpu"), compiled=None)
    assert v.ids.shape == (cfg.data.batch_size, 25) and int(v.ids.max()) < bpe.size
    assert (v.ids >= FIRST_MERGE).any() and (v.ids == EOS).any()
    assert not ((v.ids >= 256) & (v.ids < FIRST_MERGE) & (v.ids != EOS)).any()
    assert v.accum == 2 and v.compiled is False  # 3 steps of tiny: train.compile=auto trains them eager
    v.step()
    check = check_steps({"tokens": cfg, "bytes": tiny_cfg(corpus_dir, "train.steps=3")}, rounds=2, warmup=1,
                        min_sample_s=0.0)
    assert check.rounds == 2 and [len(t) for t in check.times.values()] == [2, 2] and check.steps_per_sample == 1
    assert check.compiled == {"tokens": False, "bytes": False} and check.ratio("bytes", "tokens").low > 0


def test_the_step_check_times_each_phase_of_the_head_schedule_in_its_share(corpus_dir, monkeypatch):
    """A reverse head schedule runs 8 heads, then 7, ... then head 1 alone over half the steps
    (faded heads are skipped): the check times a step in each phase and weighs them by their shares,
    where timing the first step alone took every head for the whole run. Steps cost here what the
    heads they run say (a fake clock), so the weighing replays exactly."""
    from bytemtp.experiments import step_bench

    ran = []

    def fake_time(step, n):
        inner, seen = step.variant.step_fn, []
        step.variant.step_fn = lambda *a, **kw: seen.append(kw["weights"]) or inner(*a, **kw)
        step.step()  # a real step with that phase's weights: the heads of weight 0 do not run
        step.variant.step_fn = inner
        ran.append(sum(w > 0 for w in seen[0]))
        return n * (0.01 + 0.01 * step.phase.heads_run)

    monkeypatch.setattr(step_bench, "_time_steps", fake_time)
    faded = tiny_cfg(corpus_dir, "loss.head_schedule=reverse", "train.steps=3")
    constant = tiny_cfg(corpus_dir, "train.steps=3")
    check = check_steps({"faded": faded, "constant": constant}, rounds=2, warmup=1, min_sample_s=0.0)
    phases = check.phases["faded"]
    assert [p["heads_run"] for p in phases] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert sum(p["share"] for p in phases) == pytest.approx(1.0) and phases[-1]["share"] == pytest.approx(0.5)
    assert [p["heads_run"] for p in check.phases["constant"]] == [8] and set(ran) == set(range(1, 9))
    want = sum(p["share"] * (0.01 + 0.01 * p["heads_run"]) for p in phases)  # 0.04 s against 0.09 s
    assert check.times["faded"] == [pytest.approx(want)] * 2 and check.step_s("constant") == pytest.approx(0.09)
    assert check.ratio("faded", "constant").mid == pytest.approx(want / 0.09)
    bench = _bench([_arm("bytes", steps=1500, step_s=check.step_s("faded")), _arm("tokens", steps=1200, step_s=0.05)],
                   dataclasses.replace(check, times={"bytes": check.times["faded"], "tokens": [0.05, 0.05]},
                                       compiled={"bytes": False, "tokens": False},
                                       phases={"bytes": phases, "tokens": [{"heads_run": 1, "share": 1.0,
                                                                            "step_s": 0.05}]}))
    assert bench.load_warnings() == []  # the byte arm's 1,500 steps in 60 s are what its schedule buys
    assert "bytes: 8 heads 7% 90 ms / 7 heads 7% 80 ms" in bench.table() and "1 head 50% 20 ms" in bench.table()
    assert "| bytes seen a second | 12.8 KB | 10.2 KB |" in bench.table()
    # a run limited by time fixes its head schedule's length from its first, dearest steps: 525 of
    # the 1,241 it took, so heads 8..2 fade over its first 262 steps and head 1 runs alone in 79%
    ran.clear()
    short = check_steps({"faded": faded}, rounds=1, warmup=1, min_sample_s=0.0, trained={"faded": (525, 1241)})
    shares = [p["share"] for p in short.phases["faded"]]
    assert shares[:7] == [pytest.approx(525 / 14 / 1241, abs=1e-3)] * 7 and shares[7] == pytest.approx(1 - 262.5 / 1241,
                                                                                                   abs=1e-3)
    assert short.step_s("faded") < check.step_s("faded")


def test_the_token_arm_s_own_best_settings_are_valid_settings_of_their_preset():
    """`bench tokens` puts the token arm's own search's settings on its preset: each one a key the
    preset takes, the arm a next-token model of fewer layers than the byte arm's."""
    from bytemtp import config_io
    from bytemtp.experiments.token_bench import TOKEN_BEST

    for preset, sets in TOKEN_BEST.items():
        cfg = config_io.resolve(preset, overrides=["model.n_future=1", "model.ngram_embeds=0", *sets])
        assert cfg.model.n_layers < config_io.resolve(preset).model.n_layers


def test_bench_tokens_trains_the_arms_in_turn_first_at_even_seeds_and_second_at_odd_ones(corpus_dir, tmp_path,
                                                                                        monkeypatch):
    """Bytes, tokens, tokens, bytes, ...: a machine that speeds up or slows down over a sitting
    gives both arms the same share of its fast and slow minutes over two seeds, where bytes first
    at every seed gave the byte arm every seed's earlier slot."""
    from bytemtp.experiments import token_bench

    order = []

    def record(grid, out, **kw):
        order.extend(grid.candidates)
        raise KeyboardInterrupt  # nothing trains

    monkeypatch.setattr(token_bench, "run_sweep", record)
    with pytest.raises(KeyboardInterrupt):
        token_bench.compare(str(corpus_dir), out=tmp_path / "b", preset="tiny", vocab_size=300, seeds=4, steps=2)
    assert order == ["bytes-s0", "tokens-s0", "tokens-s1", "bytes-s1", "bytes-s2", "tokens-s2", "tokens-s3", "bytes-s3"]
