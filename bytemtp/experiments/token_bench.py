"""Bytes against tokens, on the user's corpus: `bench tokens`.

What a byte-level model is judged against is the model its users would otherwise train: the
same family over BPE tokens. The comparison here:

1. trains a byte-level BPE (`bytemtp.vocab`: Hugging Face `tokenizers`, lossless for any bytes)
   of `vocab` ids on the corpus's train split, and measures its bytes a token there;
2. trains two arms of the same preset with the same trunk code, optimizer, schedule fitting and
   budget (wall time, or steps), one after the other in one sitting, seed after seed (each seed
   both arms: `bytes-sN`, then `tokens-sN`, as the sweep runs candidates, read back when measured,
   so an interrupted comparison goes on where it stopped):
   - `bytes`: the preset as it is (multi-token heads and all);
   - `tokens`: the preset over the BPE's ids (`model.vocab_size`, `data.tokenizer`), without its
     hashed byte n-gram tables (`model.ngram_embeds=0`: a token already spans bytes), next-token
     only by default (`token_heads`), with a context of `token_seq_len` tokens (by default the
     byte context over the train split's bytes a token, so both windows hold about the same
     text), as many windows a batch as make the byte arm's positions a step (a step then covers
     about 3 times the text; at 3 minutes on the default corpus this gave 1.799 bits/byte on val
     where the preset's 16 windows gave 1.816), the settings its own search found best for the
     preset (`TOKEN_BEST`), and the user's (`token_sets`) on top;
   then times a training step of each (seed 0's settings) as its training took it, in each
   phase of its head schedule weighed by the phase's share (the byte arm's reverse schedule runs
   head 1 alone over half its steps), the arms turn about in one process
   (`step_bench.check_steps`, `check_rounds`; kept in OUT/step-check.json): each arm's steps
   against those its wall time buys at that pace (its share), and a warning where the arms'
   shares differ by more than the check's round-by-round spread plus SHARE_FLOOR, since the
   machine's load during one arm's slot changes how many steps a time budget gives it;
3. scores both on the whole val split and on `held_out` text with `likelihood.score_texts`: every
   document whole, each arm in windows of its own context, nats summed over the document and its
   closing EOS, divided by the same bytes for both arms;
4. decodes the same held-out prompts (val documents cut at `prompt_bytes`, or a prompts file)
   with both arms' decoders in one interleaved run at each batch size, timed as `bench decode`
   times its modes (`bench.time_arms`, greedy or sampled alike): plain decoding and the drafts
   asked for (`drafts`, by default auto and auto+lookup) where each arm can run them (`arm_drafts`:
   an arm without draft heads drafts prompt lookup alone), in bytes a second, with the repetition
   of the decoded text beside the real continuation's; each arm's best mode, and the byte arm's
   default (auto+lookup where timed) over the token arm's best with its spread (batch by batch
   and round by round).

What it does not control for is said in docs/benchmarks.md: the tokenizer is trained on the same
train split the models see (no tokenizer is that well fitted to a user's text for free); the
byte arm's preset was sized for bytes by a sweep and the token arm takes it as it is; and a
context of the same number of bytes is a shorter one in positions for tokens.

The result is a `TokenBench` of one `ArmFigures` per arm (and seed) and one `TokenDecoding` per
batch size (`bytemtp.experiments.token_results`: their JSON and the table the command prints).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import tqdm

from bytemtp.data.corpus import corpus_files
from bytemtp.data.splits import documents, has_splits, held_out_split, val_continuations
from bytemtp.decoding.decode import Decoder
from bytemtp.decoding.generation import load_prompts
from bytemtp.decoding.sampling import Sampling
from bytemtp.decoding.strategy import Draft
from bytemtp.experiments.bench import time_arms
from bytemtp.evaluation.likelihood import score_texts
from bytemtp.experiments.step_bench import StepCheck, check_steps
from bytemtp.experiments.token_results import DEFAULT_MODE, ArmFigures, TokenBench, TokenDecoding
from bytemtp.experiments.sweep import Grid, run_sweep
from bytemtp.runtime.checkpoint import load_model, read_train_state
from bytemtp.runtime.devices import resolve_device
from bytemtp.vocab import BPE, load_vocabulary, train_bpe

TOKENIZER = "tokenizer.json"
SCORES = "scores.json"  # OUT/ARM-sN/scores.json: the arm's bits per byte, once measured
DRAFTS = ("auto", "auto+lookup")  # the drafts timed against plain decoding by default
# The token arm's own settings on top of the preset, found by its own search at equal wall time
# (issue 59: neither arm judged on the other's settings): for `small`, 6 layers in all where the
# preset's 12 are sized for a trunk under 8 byte heads (3 minutes, 2 seeds: 0.954x the 12-layer
# arm's bits/byte on val, 0.971x on held-out code; a learning rate of 1e-2 and width 96 lost;
# BENCHMARKS.md, "Each arm at its best"). The user's --token-set goes on top.
TOKEN_BEST = {"small": ("model.n_layers=6",)}
STEP_CHECK = "step-check.json"  # OUT/step-check.json: the step check, once measured, and the settings it timed


def held_out_texts(path: str, limit: int = 0) -> list[bytes]:
    """The documents of a held-out corpus (a prepared one's val split, or every file), cut to
    `limit` bytes in all (0: all of them)."""
    docs = documents(path, held_out_split(path))
    if not limit:
        return docs
    out, left = [], limit
    for doc in docs:
        if left <= 0:
            break
        out.append(doc[:left])
        left -= len(out[-1])
    return out


def bytes_per_token(vocab: BPE, docs: list[bytes]) -> float:
    """The documents' bytes over their tokens (EOS not counted)."""
    tokens = sum(len(ids) for ids in vocab.encode_many(docs))
    return sum(map(len, docs)) / max(1, tokens)


def compare(data: str, *, out: str | Path, preset: str = "small", budget_s: float = 540.0, steps: int = 0,
            seeds: int = 1, vocab_size: int = 4096, held_out: str | None = None, held_out_bytes: int = 0,
            sets: list[str] = (), token_sets: list[str] = (), token_heads: int = 1, token_seq_len: int = 0,
            prompts_path: str | None = None, n_prompts: int = 16, prompt_bytes: int = 128, max_bytes: int = 256,
            batch_sizes=(1, 8), rounds: int = 2, drafts=DRAFTS, compile: str = "auto", temperature: float = 0.0,
            top_k: int = 0, top_p: float = 1.0, seed: int = 0, device: str = "cpu", dtype: str = "float32",
            check_rounds: int = 5, fresh: bool = False, say=tqdm.tqdm.write) -> TokenBench:
    """The whole comparison into `out` (see the module docstring); an arm's run found there is read
    back only when it was trained with the settings asked for now, else refused unless `fresh`
    (`sweep.run_sweep`)."""
    from bytemtp.config_io import resolve

    if not has_splits(data):
        raise ValueError(f"{data} is not a prepared corpus with a val split; bench tokens trains the tokenizer "
                         "and both models on its train split and scores them on its val split (bytemtp prep)")
    if held_out and not corpus_files(held_out, split=held_out_split(held_out)):
        raise ValueError(f"--held-out {held_out}: no files to score")  # corpus_files names a path that is not there
    checked = Sampling(temperature=temperature, top_k=top_k, top_p=top_p)  # a bad value stops here
    base = resolve(preset, overrides=list(sets))
    for draft in drafts:  # refused before anything trains, naming the draft
        d = Draft.parse(str(draft))
        try:
            d.for_model(base.model.n_future)
        except ValueError:
            raise ValueError(f"--draft {d}: {d.heads} is more than the byte arm's {base.model.n_future} heads; "
                             f"choose 1 to {base.model.n_future} heads") from None
    sampling = dict(temperature=checked.temperature, top_k=top_k, top_p=top_p, seed=seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok_path = out / TOKENIZER
    train_docs = documents(data, "train")
    vocab = load_vocabulary(tok_path) if tok_path.is_file() else None
    if vocab is None or vocab.size != vocab_size:
        say(f"training a byte-level BPE of {vocab_size} ids on {sum(map(len, train_docs)):,} bytes of {data}'s train split")
        vocab = train_bpe(train_docs, vocab_size=vocab_size, path=tok_path)
    train_bpt = bytes_per_token(vocab, train_docs)
    val_docs = documents(data, "val")
    val_bpt = bytes_per_token(vocab, val_docs)
    seq_len = token_seq_len or max(8, round(base.model.seq_len / train_bpt / 8) * 8)
    batch = max(1, round(base.data.batch_size * base.model.seq_len / seq_len))  # the byte arm's positions a step
    shared = [f"data.path={data}", "train.eval_every=0", *sets]
    token_arm = (f"model.vocab_size={vocab.size}", f"data.tokenizer={tok_path.resolve()}",
                 f"model.n_future={token_heads}", f"model.seq_len={seq_len}", f"data.batch_size={batch}",
                 "model.ngram_embeds=0",  # no hashed tables: a token is its own n-gram
                 *TOKEN_BEST.get(preset, ()), *token_sets)
    candidates = {}
    for seed in range(seeds):  # bytes first at even seeds, tokens first at odd ones: a machine
        seeded = (f"train.seed={seed}", f"data.seed={seed}")  # that drifts over a sitting favours neither
        pair = [(f"bytes-s{seed}", seeded), (f"tokens-s{seed}", (*token_arm, *seeded))]
        candidates.update(pair[::-1] if seed % 2 else pair)
    grid = Grid(preset=preset, sets=tuple(shared), candidates=candidates)
    for name in candidates:  # every setting checked before anything trains
        try:
            grid.config(name, budget_s=budget_s, steps=steps)
        except ValueError as e:
            raise ValueError(f"the {name.rsplit('-s', 1)[0]} arm: {e}") from None
    trained = run_sweep(grid, out, budget_s=budget_s, eval_bytes=1, tune_s=0.0, steps=steps, fresh=fresh)
    check = (_step_check(out, grid, budget_s=budget_s, steps=steps, rounds=check_rounds, say=say)
             if check_rounds else None)
    dev = resolve_device(device)
    held = held_out_texts(held_out, held_out_bytes) if held_out else []
    arms = [_scored(out, r, grid, bpt=train_bpt, val_docs=val_docs, held=held, budget_s=budget_s, steps=steps,
                    device=dev, say=say) for r in trained]
    if check is not None:
        arms = [dataclasses.replace(a, check_step_s=check.step_s(a.arm)) for a in arms]
    decoding, compiled, n = _decode(out, data, prompts_path=prompts_path, n_prompts=n_prompts,
                                    prompt_bytes=prompt_bytes, max_bytes=max_bytes, batch_sizes=batch_sizes,
                                    rounds=rounds, drafts=drafts, compile=compile, sampling=sampling, device=dev,
                                    dtype=dtype, say=say)
    return TokenBench(data=data, preset=preset, budget_s=0.0 if steps else budget_s, steps=steps, seeds=seeds,
                      tokenizer=str(tok_path), vocab_size=vocab.size, train_bytes_per_token=train_bpt,
                      val_bytes_per_token=val_bpt, held_out=held_out, arms=arms, decoding=decoding,
                      prompts=n, max_bytes=max_bytes, compiled=compiled, dtype=dtype, check=check, **sampling)


def _step_check(out: Path, grid: Grid, *, budget_s: float, steps: int, rounds: int, say) -> StepCheck:
    """The step check of seed 0's arms (`step_bench.check_steps`, `rounds` rounds): read back from
    OUT/step-check.json where it was taken of the settings and rounds asked for now, else taken now
    (and kept)."""
    settings = {arm: [*grid.sets, *grid.candidates[f"{arm}-s0"], f"train.max_time={0.0 if steps else budget_s}",
                      f"train.steps={steps}"] for arm in ("bytes", "tokens")}
    path = out / STEP_CHECK
    kept = _kept(path, StepCheck.from_json, say=say)
    if (kept is not None and kept[0].get("settings") == settings and kept[0].get("rounds") == rounds
            and kept[0].get("phases")):  # one taken before the phases timed the first step alone
        return kept[1]
    say(f"timing a training step of each arm, the arms turn about, {rounds} rounds (the step check)")
    check = check_steps({arm: grid.config(f"{arm}-s0", budget_s=budget_s, steps=steps) for arm in settings},
                        rounds=rounds, trained={arm: _trained(out / f"{arm}-s0") for arm in settings})
    path.write_text(json.dumps({"settings": settings, **check.to_json()}, indent=2) + "\n")
    return check


def _trained(run_dir: Path) -> tuple[int, int]:
    """A run's head schedule's length and its steps, from its newest train state: the proportions in
    which its steps ran each phase of its head schedule (`schedule.head_phases`)."""
    state = read_train_state(run_dir)
    return state.get("head_schedule_steps") or state.get("schedule_steps") or 0, state["step"]


def _scored(out: Path, r, grid: Grid, *, bpt: float, val_docs: list[bytes], held: list[bytes], budget_s: float,
            steps: int, device: torch.device, say) -> ArmFigures:
    """An arm's figures: read back where measured before, else scored now (and kept)."""
    path = out / r.name / SCORES
    kept = _kept(path, ArmFigures.from_json, say=say)
    if kept is not None:
        return kept[1]
    arm, seed = r.name.rsplit("-s", 1)
    model, cfg = load_model(out / r.name, device=device)
    say(f"scoring {r.name} on {sum(map(len, val_docs)):,} val bytes" + (f" and {sum(map(len, held)):,} held-out bytes"
                                                                         if held else ""))
    val = score_texts(model, val_docs)
    held_score = score_texts(model, held) if held else None
    per_id = 1.0 if arm == "bytes" else bpt
    figures = ArmFigures(
        name=r.name, arm=arm, seed=int(seed), sets=list(grid.candidates[r.name]), params=model.num_params(),
        steps=r.steps, train_s=r.train_s or 0.0, tokens_seen=r.bytes_seen, bytes_seen=round(r.bytes_seen * per_id),
        context_ids=cfg.model.seq_len, context_bytes=cfg.model.seq_len * per_id,
        val_bpb=val.bits_per_byte, val_bytes=val.bytes,
        held_out_bpb=None if held_score is None else held_score.bits_per_byte,
        held_out_bytes=0 if held_score is None else held_score.bytes)
    path.write_text(json.dumps(figures.to_json(), indent=2) + "\n")
    return figures


def _kept(path: Path, read, *, say):
    """A record measured before (its JSON, and `read` of it), or None where there is none, or where
    it cannot be read (cut, or not what `read` takes): said in one line naming it, and measured again
    (then written whole in its place)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        return data, read(data)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        say(f"{path} cannot be read ({type(e).__name__}: {str(e)[:120]}); measuring it again")
        return None


def arm_drafts(drafts, n_future: int) -> list[Draft]:
    """An arm's drafts, plain first: those asked for where the arm has draft heads; without them,
    prompt lookup alone (plain+lookup) where any draft asks for lookup."""
    asked = [Draft.parse(str(d)) for d in drafts]
    if n_future == 1:
        asked = [Draft.parse("plain+lookup")] if any(d.lookup for d in asked) else []
    return list(dict.fromkeys([Draft.plain(), *asked]))


def _decode(out: Path, data: str, *, prompts_path: str | None, n_prompts: int, prompt_bytes: int, max_bytes: int,
            batch_sizes, rounds: int, drafts, compile: str, sampling: dict, device: torch.device, dtype: str,
            say) -> tuple[list[TokenDecoding], bool, int]:
    """Both seed-0 arms decoding the same held-out prompts, every draft of each, interleaved
    (`bench.time_arms`); whether they ran the compiled step, and how many prompts they decoded."""
    real = None
    if prompts_path is not None:
        texts = load_prompts(prompts_path)[:n_prompts]
    else:
        pairs = val_continuations(data, n=n_prompts, prompt_bytes=prompt_bytes, continuation_bytes=max_bytes)
        texts, real = [p for p, _ in pairs], [c for _, c in pairs]
    decoders = {}
    for arm in ("bytes", "tokens"):
        model, _ = load_model(out / f"{arm}-s0", device=device, dtype=dtype)
        decoders[arm] = Decoder(model, compile=compile)
    drafts_of = {arm: arm_drafts(drafts, d.model.config.n_future) for arm, d in decoders.items()}
    work = len(texts) * max_bytes * rounds * len(batch_sizes) * 4
    compiled = all([decoders[arm].policy.settle(batch_size=batch_sizes[0], work_bytes=work) for arm in decoders])
    if not compiled:  # both arms on the same kind of step
        decoders = {arm: Decoder(d.model, compile="off") for arm, d in decoders.items()}
    arms = {f"{arm} {draft}": (decoders[arm], draft) for arm, ds in drafts_of.items() for draft in ds}
    default = f"bytes {DEFAULT_MODE}" if f"bytes {DEFAULT_MODE}" in arms else f"bytes {drafts_of['bytes'][-1]}"
    results = []
    for B in batch_sizes:
        say(f"decoding {len(texts)} held-out prompts x {max_bytes} bytes at batch {B}, both arms interleaved")
        timed, = time_arms(arms, texts, batch_sizes=(B,), max_bytes=max_bytes, rounds=rounds, real=real, **sampling)
        figures = {name: timed.figures(name, base=f"{name.split()[0]} plain") for name in arms}
        best = {}
        for arm in drafts_of:
            names = [n for n in arms if n.startswith(arm + " ")]
            best[arm] = max(names, key=lambda n: figures[n].plain_bytes_s if n.endswith(" plain")
                            else figures[n].spec_bytes_s)
        vs = timed.figures(default, base=best["tokens"], same_step=False)
        results.append(TokenDecoding(batch_size=B, modes=figures, best=best, default_over_best_tokens=vs))
    return results, compiled, len(texts)
