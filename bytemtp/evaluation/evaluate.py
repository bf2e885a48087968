"""Evaluation of a trained model on any corpus: every head's bits per byte and top-1 accuracy,
and the acceptance profile that self-speculative decoding would see.

The acceptance profile, from the true text: at a position t, draft head j (j = 2..K) is right
when its greedy byte equals the byte j positions ahead. For each k, `acceptance[k]` is the
fraction of positions at which heads 2..k are all right, among the positions whose targets 1..k
all lie inside the document. Greedy self-speculative decoding with k heads emits head 1's byte
plus the drafts up to the first wrong one, so where head 1 follows the text it emits on average
1 + acceptance[2] + ... + acceptance[k] bytes per forward pass (`bytes_per_forward[k]`). Decoding
verifies against the model's own greedy continuation rather than the text, so this is a
prediction from the data, not a measurement of decoding (`bytemtp bench decode` measures that).

The agreement profile asks what decoding asks, with the text as context: draft head j agrees at
t when its greedy byte equals head 1's greedy byte at t + j - 1, the position where that byte is
next (what the teacher term trains, `bytemtp.model.loss`). `agreement[k]` is the fraction of positions
at which heads 2..k all agree, and `agreed_bytes_per_forward[k]` = 1 + agreement[2] + ... +
agreement[k]; it does not need head 1 to be right, so it is the closer of the two predictions
for a model whose next-byte head is weak.

Under torchrun every rank evaluates its own share of the corpus; the sums are added over the
ranks before anything is divided.

Results are frozen dataclasses (`EvalResult`, `DraftReport`, `HeldOutDecoding`), each owning its
JSON form (`to_json`: what `bytemtp eval --json`, `tune --json` and `bench` write) and what the
commands print of it (`table`, `line`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from bytemtp.config import DataConfig
from bytemtp.data.loader import ByteLoader
from bytemtp.data.shards import CorpusError
from bytemtp.data.splits import has_splits, held_out_split, val_prompts
from bytemtp.decoding.strategy import EVALUATED_DRAFTS, Draft
from bytemtp.model.draft import forced_logits
from bytemtp.model.layout import build_layout
from bytemtp.model.loss import IGNORE, LN2, future_targets, head_loss
from bytemtp.model.model import ByteMTP
from bytemtp.runtime import distributed as dist_lib
from bytemtp.runtime.checkpoint import load_model
from bytemtp.runtime.devices import resolve_device
from bytemtp.tables import table
from bytemtp.vocab import EOS


@dataclass(frozen=True)
class EvalResult:
    """What `evaluate` measures; its JSON form (`bytemtp eval --json`, `bench all`) is `to_json`,
    read back by `from_json`. Per-head lists run over heads 1..K; the per-k profiles over k = 2..K."""
    bytes: int  # bytes scored by head 1
    bpb: list[float]  # bits per byte of each head
    accuracy: list[float]  # top-1 accuracy of each head
    acceptance: dict[int, float]  # k: heads 2..k all right about the text
    bytes_per_forward: dict[int, float]  # k: 1 + acceptance[2] + ... + acceptance[k]
    agreement: dict[int, float]  # k: heads 2..k all agree with head 1
    agreed_bytes_per_forward: dict[int, float]  # k: 1 + agreement[2] + ... + agreement[k]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> EvalResult:
        """An `eval --json` result read back (its other keys ignored; a field it lacks is empty,
        so a file with only the acceptance profile serves `bytemtp plot --eval`)."""
        def by_k(name):
            return {int(k): v for k, v in data.get(name, {}).items()}
        return cls(bytes=data.get("bytes", 0), bpb=list(data.get("bpb", [])), accuracy=list(data.get("accuracy", [])),
                   acceptance=by_k("acceptance"), bytes_per_forward=by_k("bytes_per_forward"),
                   agreement=by_k("agreement"), agreed_bytes_per_forward=by_k("agreed_bytes_per_forward"))

    def table(self) -> str:
        """What `bytemtp eval` prints, per head: bits/byte and accuracy; per k: heads 2..k right
        about the text and in agreement with head 1, and the bytes per pass each predicts for a
        chain of k heads."""
        def by_k(key, k, spec):
            return format(getattr(self, key).get(k + 1, 1.0), spec) if k else "-"
        rows = [(f"h{k + 1}", f"{b:.3f}", f"{a:.3f}", by_k("acceptance", k, ".3f"),
                 by_k("bytes_per_forward", k, ".2f"), by_k("agreement", k, ".3f"),
                 by_k("agreed_bytes_per_forward", k, ".2f"))
                for k, (b, a) in enumerate(zip(self.bpb, self.accuracy))]
        return table(rows, ("head", "bits/byte", "accuracy", "2..k right", "bytes/pass", "2..k agree with h1",
                            "bytes/pass (agreed)"))


@dataclass(frozen=True)
class HeldOutDecoding:
    """Bytes per pass measured by decoding held-out prompts (`held_out_decoding`)."""
    prompts: int  # how many prompts
    max_bytes: int  # bytes decoded from each
    bytes_per_forward: dict[str, float]  # per draft (`Draft` names)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    def line(self) -> str:
        """The prompts, the bytes decoded from each and the bytes per pass of each draft, in one line."""
        shapes = ", ".join(f"{name} {bpp:.2f}" for name, bpp in self.bytes_per_forward.items())
        return (f"decoded: {self.prompts} held-out prompts, {self.max_bytes} greedy bytes each; "
                f"bytes per pass: {shapes}")


@dataclass(frozen=True)
class DraftReport:
    """What a model's draft heads give decoding (`draft_report`); its JSON form is `to_json`
    (prompts and max_bytes only where prompts were decoded)."""
    split: str  # the split scored, or "all"
    bytes: int
    bpb: list[float]
    agreement: dict[int, float]
    agreed_bytes_per_forward: dict[int, float]
    decoded_bytes_per_forward: dict[str, float]  # per draft; empty when nothing was decoded
    prompts: int | None = None
    max_bytes: int | None = None

    def to_json(self) -> dict:
        out = dataclasses.asdict(self)
        if self.prompts is None:
            del out["prompts"], out["max_bytes"]
        return out

    def table(self, before: DraftReport | None = None) -> str:
        """What `tune-heads` prints: this report (after a tune) under `before` (the tune's source;
        None when it is gone): head 1's bits/byte (unchanged), how often heads 2..k all agree with
        head 1 (k = 2, 4, n), the bytes per pass that predicts, and the bytes per pass decoded."""
        n = len(self.bpb)
        ks = sorted({2, min(4, n), n})
        decoded = sorted(self.decoded_bytes_per_forward)
        header = ("heads", "h1 bits/byte", *(f"2..{k} agree" for k in ks), f"agreed bytes/pass ({n})",
                  *(f"{name} bytes/pass" for name in decoded))

        def row(name, res):
            return (name, f"{res.bpb[0]:.4f}", *(f"{res.agreement[k]:.3f}" for k in ks),
                    f"{res.agreed_bytes_per_forward[n]:.2f}",
                    *(f"{res.decoded_bytes_per_forward[d]:.2f}" for d in decoded))

        rows = ([row("before", before)] if before else []) + [row("after", self)]
        where = f"{self.bytes:,} bytes of the {self.split} split"
        if decoded:
            where += f"; decoded: {self.prompts} held-out prompts, {self.max_bytes} bytes each, greedy"
        return where + "\n" + table(rows, header)


def evaluate_checkpoint(ckpt, data: str, *, split: str | None = "val", batches: int = 50, batch_size: int = 8,
                        device: str = "auto", dtype: str | None = None, progress=None) -> EvalResult | None:
    """`evaluate` of a checkpoint (or a run's newest), in the process group that torchrun
    describes: each process evaluates its share and the sums are added. The result on rank 0,
    None on the others (progress is reported on rank 0 only)."""
    with dist_lib.process_group(resolve_device(device)) as d:
        model, _ = load_model(ckpt, device=d.device, dtype=dtype)
        result = evaluate(model, data, split=split, batches=batches, batch_size=batch_size, device=d.device,
                          d=d, progress=progress if d.is_main else None)
    return result if d.is_main else None


@torch.inference_mode()
def evaluate(model: ByteMTP, data: str, *, split: str | None = "val", batches: int = 50, batch_size: int = 8,
             device: torch.device = torch.device("cpu"), d: dist_lib.Dist | None = None,
             mask_after_eos: bool = True, progress=None) -> EvalResult:
    """Bits per byte, accuracy and the acceptance profile of `model` on up to `batches` batches
    (per rank) of one pass over the corpus (its `split`: val, train, or None for every file; a
    corpus that is not prepared has no splits, so only None). Training's validation is this too.

    One pass: a batch that runs into the second epoch is left out, unless it is the first (a
    split shorter than one batch is still scored). Under torchrun each rank reads its share, the
    ranks run their forward passes in step until every share is done (a sharded model needs every
    rank in each forward pass; a rank that is done scores nothing more), and the sums are added
    over the ranks before anything is divided. The model's train/eval mode is restored.

    A model over BPE tokens (`model.vocab`, the baseline of `bench tokens`) reads the corpus as its tokens,
    and its bits per byte divide its nats by the bytes its targets stand for (`Vocabulary.lengths`),
    so they are bits per byte of the same text; accuracy and the profiles stay per token."""
    if split is not None and not has_splits(data):
        raise CorpusError(f"{data} is not a prepared corpus, so it has no splits (no {split} split); "
                          "pass split=None to evaluate every file, or prepare it with bytemtp prep")
    d = d or dist_lib.Dist(device=device)
    cfg = model.config
    K = cfg.n_future
    vocab = model.vocab
    loader = ByteLoader(DataConfig(path=data, batch_size=batch_size, shuffle_buffer=1, tokenizer=vocab.path), cfg,
                        rank=d.rank, world_size=d.world_size, split=split)
    lengths = None if vocab.is_bytes else torch.tensor(vocab.lengths, device=device)
    if not loader.files:
        raise CorpusError(f"{data} has no {split} split to evaluate; pass split=None to read every file")
    sums = torch.zeros(6, K, dtype=torch.float64, device="cpu")  # nats, correct, count per head; accepted, agreed per k; bytes per head
    runs = torch.zeros(2, K, dtype=torch.float64, device="cpu")  # positions whose targets 1..k are all valid; and head 1's
    was_training = model.training
    model.eval()
    done = False  # this rank's pass is over: every document once
    for i in range(batches):
        batch = next(loader).to(device)
        done = done or (loader.epoch > 0 and i > 0)
        # ranks run forward passes together until every one is done (a sharded model gathers
        # weights in each), but a rank whose pass is over scores nothing more
        if not (dist_lib.any_rank(not done, d, device) if d.active else not done):
            break
        targets_BTK = future_targets(batch, n_future=K, mask_after_eos=mask_after_eos)
        ids_BT = batch[:, :targets_BTK.shape[1]]
        layout = build_layout(model, ids_BT)
        z_BTD = model(ids_BT, layout=layout)
        right_BTK = torch.zeros(targets_BTK.shape, dtype=torch.bool, device=device)
        agree_BTK = torch.ones(targets_BTK.shape, dtype=torch.bool, device=device)
        T = targets_BTK.shape[1]
        for k, logits in _head_logits(model, batch, z_BTD, layout):
            h = head_loss(logits, targets_BTK[:, :, k])
            greedy_BT = logits.argmax(-1)
            right_BTK[:, :, k] = (greedy_BT == targets_BTK[:, :, k]) & (targets_BTK[:, :, k] != IGNORE)
            if k == 0:
                head1_BT = greedy_BT
            else:  # head 1 makes this byte's prediction at t + k; the last k positions have no partner
                agree_BTK[:, :T - k, k] = greedy_BT[:, :T - k] == head1_BT[:, k:]
                agree_BTK[:, T - k:, k] = False
            if not done:
                sums[:3, k] += torch.tensor([float(h.nats), float(h.correct), float(h.count)],
                                             dtype=torch.float64, device="cpu")
                sums[5, k] += float(h.count) if lengths is None else float(_target_bytes(targets_BTK[:, :, k], lengths))
        if done:
            continue
        _count_profiles(right_BTK, agree_BTK, targets_BTK, sums=sums, runs=runs)
        if progress is not None:
            progress()
    model.train(was_training)
    if d.active:
        both = torch.cat([sums.flatten(), runs.flatten()]).to(device)
        torch.distributed.all_reduce(both)
        both = both.cpu()
        sums, runs = both[:6 * K].view(6, K), both[6 * K:].view(2, K)
    if sums[2, 0] == 0:
        raise CorpusError(f"{data} gave no bytes to evaluate ({split or 'all'} split)")
    return _result(sums, runs)


def _target_bytes(targets_BT: torch.Tensor, lengths_V: torch.Tensor) -> torch.Tensor:
    """The bytes that the scored targets (not IGNORE) stand for."""
    scored = targets_BT != IGNORE
    return (lengths_V[targets_BT.clamp(min=0)] * scored).sum()


def _head_logits(model: ByteMTP, batch: torch.Tensor, z_BTD: torch.Tensor, layout):
    """(k, logits (B, T, V)) of each head in turn: head 1 and the draft heads where the model has
    them (`model.draft`, reading the text's bytes), else the training heads."""
    if model.drafter is None:
        for k, h_BTD in model.head_states(z_BTD, layout=layout):
            yield k, model.head_logits(k, h_BTD)
        return
    first, drafts = forced_logits(model, batch, z_BTD.shape[1], layout=layout, z_BTD=z_BTD)
    yield 0, first
    for d in range(drafts.shape[2]):
        yield d + 1, drafts[:, :, d]


def _count_profiles(right_BTK, agree_BTK, targets_BTK, *, sums, runs) -> None:
    """Add one batch's runs of right and of agreeing drafts (sums[3], sums[4]) and the positions
    that could hold them (runs[0]: targets 1..k inside the document; runs[1]: and paired with
    head 1's byte inside the window), per k."""
    T, K = targets_BTK.shape[1:]
    device = targets_BTK.device
    valid_BTK = targets_BTK != IGNORE
    all_valid = valid_BTK.cumprod(dim=-1).bool()  # targets 1..k inside the document
    drafts_right = right_BTK.clone()
    drafts_right[:, :, 0] = True  # head 1's byte is emitted whatever; drafts are heads 2..k
    all_right = drafts_right.cumprod(dim=-1).bool() & all_valid
    paired = all_valid & (torch.arange(T, device=device)[:, None] + torch.arange(K, device=device) < T)
    all_agree = agree_BTK.cumprod(dim=-1).bool() & paired
    sums[3] += all_right.flatten(0, 1).sum(0).double().cpu()
    sums[4] += all_agree.flatten(0, 1).sum(0).double().cpu()
    runs[0] += all_valid.flatten(0, 1).sum(0).double().cpu()
    runs[1] += paired.flatten(0, 1).sum(0).double().cpu()


def _result(sums, runs) -> EvalResult:
    """The result from the sums over every rank: nats, correct and count per head, accepted and
    agreed runs per k (sums), and the positions that could hold them (runs)."""
    K = sums.shape[1]
    nats, correct, count, accepted, agreed, nbytes = sums
    acceptance = (accepted / runs[0].clamp(min=1)).tolist()
    agreement = (agreed / runs[1].clamp(min=1)).tolist()
    acceptance[0] = agreement[0] = 1.0
    return EvalResult(
        bytes=int(nbytes[0]),
        bpb=(nats / nbytes.clamp(min=1) / LN2).tolist(),
        accuracy=(correct / count.clamp(min=1)).tolist(),
        acceptance={k + 1: acceptance[k] for k in range(1, K)},
        bytes_per_forward={k + 1: 1 + sum(acceptance[1:k + 1]) for k in range(1, K)},
        agreement={k + 1: agreement[k] for k in range(1, K)},
        agreed_bytes_per_forward={k + 1: 1 + sum(agreement[1:k + 1]) for k in range(1, K)},
    )


def decoded_bytes_per_pass(model: ByteMTP, prompts: list[bytes], *, max_bytes: int = 150,
                           drafts: tuple[Draft, ...] = EVALUATED_DRAFTS, batch_size: int = 8,
                           progress=None) -> dict[str, float]:
    """Bytes per forward pass of greedy self-speculative decoding with each fixed draft
    (keyed by its name), measured by decoding the prompts: what the heads give back,
    whatever a pass costs on this machine. Eager passes (nothing to compile)."""
    from bytemtp.decoding.decode import Decoder
    from bytemtp.decoding.generation import SpeculativeStats

    decoder = Decoder(model, compile="off")
    result = {}
    for draft in drafts:
        stats = []
        for first in range(0, len(prompts), batch_size):
            gens = decoder.generate(prompts[first:first + batch_size], max_bytes=max_bytes, draft=draft)
            stats += [g.stats for g in gens]
            if progress is not None:
                progress()
        result[str(draft)] = SpeculativeStats.total(stats).bytes_per_forward
    return result


def draft_report(model: ByteMTP, data: str, *, batches: int = 20, batch_size: int = 8, prompts: int = 16,
                 prompt_bytes: int = 128, max_bytes: int = 150, device: torch.device = torch.device("cpu"),
                 progress=None) -> DraftReport:
    """What a model's draft heads give decoding, on held-out text: every head's bits per byte, the
    agreement profile (`evaluate`), and the bytes per pass of greedy decoding with a chain and a
    tree of all heads from `prompts` held-out prompts (0: no decoding)."""
    split = held_out_split(data)
    res = evaluate(model, data, split=split, batches=batches, batch_size=batch_size, device=device,
                   progress=progress)
    report = DraftReport(split=split or "all", bytes=res.bytes, bpb=res.bpb, agreement=res.agreement,
                         agreed_bytes_per_forward=res.agreed_bytes_per_forward, decoded_bytes_per_forward={})
    if prompts and model.config.n_future > 1 and split:
        decoded = held_out_decoding(model, data, prompts=prompts, prompt_bytes=prompt_bytes, max_bytes=max_bytes)
        report = dataclasses.replace(report, prompts=decoded.prompts, max_bytes=max_bytes,
                                     decoded_bytes_per_forward=decoded.bytes_per_forward)
    return report


def held_out_decoding(model: ByteMTP, data: str, *, prompts: int = 16, prompt_bytes: int = 128,
                      max_bytes: int = 150) -> HeldOutDecoding:
    """`decoded_bytes_per_pass` on the first `prompts` val documents of a prepared corpus (their
    first `prompt_bytes` bytes)."""
    held_out = val_prompts(data, n=prompts, prompt_bytes=prompt_bytes)
    return HeldOutDecoding(prompts=len(held_out), max_bytes=max_bytes,
                           bytes_per_forward=decoded_bytes_per_pass(model, held_out, max_bytes=max_bytes))


ANSWER_MAX_BYTES = 32  # how far task_accuracy decodes an answer that must end with EOS


def task_context(test: dict, *, until_eos: bool = True, max_bytes: int = ANSWER_MAX_BYTES) -> int:
    """The context that task_accuracy needs for a test set: the leading EOS, the longest prompt
    and what is decoded after it."""
    return max(1 + len(p.prompt.encode()) + (max_bytes if until_eos else len(p.answer.encode()))
               for items in test.values() for p in items)


def task_accuracy(model: ByteMTP, test: dict, *, batch_size: int = 64, max_bytes: int = ANSWER_MAX_BYTES,
                  until_eos: bool = True, progress=None) -> dict:
    """Greedy exact-match accuracy for each group of a task's test set ({group: [problem]}, each
    with a prompt and an answer). With until_eos the model continues each prompt until EOS (at
    most max_bytes) and the continuation must be the answer; without, it continues for as many
    bytes as the answer has, and they must be the answer. Decoding is self-speculative where the
    model has heads to draft with (the same bytes as plain greedy decoding), batch_size problems
    at a time."""
    from bytemtp.decoding.decode import Decoder

    decoder = Decoder(model)  # heads stacked once, pass costs measured once, acceptance kept
    accuracy = {}
    for group, items in test.items():
        right = 0
        for first in range(0, len(items), batch_size):
            chunk = items[first:first + batch_size]
            answers = [p.answer.encode() for p in chunk]
            limit = max_bytes if until_eos else max(map(len, answers))
            outs = decoder.generate([p.prompt.encode() for p in chunk], max_bytes=limit,
                                    draft="auto" if model.config.n_future > 1 else "plain")
            right += sum((out.output if until_eos else out.output[:len(answer)]) == answer
                         for out, answer in zip(outs, answers))
            if progress is not None:
                progress(len(chunk))
        accuracy[group] = right / len(items) if items else float("nan")
    return accuracy


@torch.inference_mode()
def task_answer_scores(model: ByteMTP, test: dict, *, until_eos: bool = True, batch_size: int = 64) -> dict:
    """Teacher-forced scores of the answers, a finer signal than exact match while a model is
    still far from solving a task: for each group, the next-byte head's top-1 accuracy on the
    answer bytes (and the EOS after them, with until_eos) given the true prefix (its newest
    seq_len bytes where it is longer), and their bits per byte. {group: {"byte_accuracy": ..., "bpb": ..., "bytes": bytes scored}}."""
    from bytemtp.model.kvcache import context_left

    device = model.embed.weight.device
    scores = {}
    for group, items in test.items():
        right = total = 0
        nats = 0.0
        for first in range(0, len(items), batch_size):
            chunk = items[first:first + batch_size]
            full = [[EOS, *p.prompt.encode(), *p.answer.encode(), *([EOS] if until_eos else [])]
                    for p in chunk]
            cuts = [max(0, -context_left(len(row), 0, model.config.seq_len)) for row in full]  # the newest context
            rows = [row[cut:] for row, cut in zip(full, cuts)]
            # staged on the host, then moved
            ids = torch.full((len(chunk), max(map(len, rows))), EOS, dtype=torch.long, device="cpu")
            targets = torch.full(ids.shape, IGNORE, dtype=torch.long, device="cpu")
            for r, (p, row) in enumerate(zip(chunk, rows)):
                ids[r, :len(row)] = torch.tensor(row, device="cpu")
                # position len(prompt) predicts the answer's first byte
                start = max(0, len(p.prompt.encode()) - cuts[r])
                targets[r, start:len(row) - 1] = torch.tensor(row[start + 1:], device="cpu")
            ids = ids.to(device)
            logits = model.logits(ids, heads=1, layout=build_layout(model, ids))[:, :, 0].float()
            targets = targets.to(device)
            mask = targets != IGNORE
            picked, tgt = logits[mask], targets[mask]
            right += int((picked.argmax(-1) == tgt).sum())
            nats += float(torch.nn.functional.cross_entropy(picked, tgt, reduction="sum"))
            total += int(mask.sum())
        scores[group] = {"byte_accuracy": right / total if total else float("nan"),
                         "bpb": nats / LN2 / total if total else float("nan"), "bytes": total}
    return scores
