"""Test doubles the test files share: tiny models from a seed, small models fitted to repetitive
text (made once a process), and stub models with the interface the decoder calls, whose outputs
are scripted (`ScriptedModel`, `ScriptedBatchModel`, `PathModel`) or drawn from fixed tables
(`MarkovModel`, `EosMarkovModel`), so that a decoding test knows the right answer exactly.

Imported as a plain module (`from doubles import ...`): pytest puts tests/ on sys.path for the test
files, and the torchrun worker scripts in tests/ have it there as their own folder.

Legend: B batch, T nodes of a pass, K heads, V vocabulary, L cache slots.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import pytest
import torch

from bytemtp import config as C
from bytemtp import config_io
from bytemtp.config import ModelConfig
from bytemtp.decoding import decode
from bytemtp.decoding.drafting import TREE_RANKS, PassCosts
from bytemtp.decoding.sampling import Sampling
from bytemtp.evaluation import humaneval as he
from bytemtp.model.layout import attend
from bytemtp.model.model import ByteMTP
from bytemtp.model.pass_heads import PassHeads
from bytemtp.vocab import BYTES, EOS, VOCAB_SIZE

# --- decoding in one call -------------------------------------------------------------------------


def generate_batch(model, prompts, *, max_bytes, draft="auto", sampling=None, stop=(), on_bytes=None, cancel=None,
                   stacked=True, costs=None, compile="auto"):
    """`Decoder(model).generate(...)` in one call (a new decoder: it makes the model's pass heads and,
    for the automatic choice, measures pass costs unless `costs` are given)."""
    return decode.Decoder(model, stacked=stacked, costs=costs, compile=compile).generate(
        prompts, max_bytes=max_bytes, draft=draft, sampling=sampling, stop=stop, on_bytes=on_bytes, cancel=cancel)


def generate_speculative(model, prompt, *, max_bytes, draft="auto", sampling=None, stop=(), on_bytes=None, **kw):
    """Self-speculative decoding of one prompt (`generate_batch` of one)."""
    return generate_batch(model, [prompt], max_bytes=max_bytes, draft=draft, sampling=sampling, stop=stop,
                          on_bytes=None if on_bytes is None else (lambda _, piece: on_bytes(piece)), **kw)[0]


# --- tiny models ----------------------------------------------------------------------------------


def build_model(model_cfg: ModelConfig, seed: int = 0) -> ByteMTP:
    """A model of `model_cfg` with its weights drawn from `seed`."""
    model = ByteMTP(model_cfg)
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    return model


def tiny_model(seed: int = 0, **overrides) -> ByteMTP:
    """The tiny preset's model with `overrides` (ModelConfig fields), its weights drawn from `seed`."""
    return build_model(dataclasses.replace(config_io.tiny().model, **overrides), seed)


def rare_eos_model(seed=0, **kw):
    """A tiny model in eval mode whose EOS logit is 0 against random others, so its outputs run long."""
    model = tiny_model(seed, **kw).eval()
    with torch.no_grad():  # make EOS rare so outputs run long
        for unembed in model.unembed:
            unembed.weight[EOS] = 0.0  # EOS logit 0 against random others: rare
    return model


# --- fitted models --------------------------------------------------------------------------------

# Tests that share the fitted models (made once a process) run on one test worker.
FITTED = pytest.mark.xdist_group("fitted-models")


_FITTED_MODELS = {}
SONGS = [b"one two three four five six seven eight\n", b"la la la, la la lo\n", b"0123456789abcdef"]


def fitted_model(seed: int, head_type: str) -> ByteMTP:
    """A tiny model fitted for a few seconds to repetitive text, so that its heads' drafts are
    often, but not always, accepted (an untrained model's drafts never are)."""
    key = (seed, head_type)
    if key not in _FITTED_MODELS:
        from bytemtp.training.step import forward_backward

        model = tiny_model(seed, head_type=head_type)
        cfg = model.config
        text = list(b"".join(SONGS[(seed + i) % 3] for i in range(12)))
        windows = torch.tensor([text[i:i + cfg.seq_len + cfg.n_future] for i in range(0, 120, 15)])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(60 + 20 * seed):
            forward_backward(model, windows, loss_cfg=C.LossConfig())
            opt.step()
            opt.zero_grad()
        _FITTED_MODELS[key] = model.double().eval()  # float64: chunked and single-step logits tie-free
    return _FITTED_MODELS[key]


# --- scripted models: the decoder against known texts ---------------------------------------------

class ScriptedHeads(PassHeads):
    """What a scripted model's passes run: the whole model at once, its own `logits` (the trunk is
    part of the script), every head in the pass."""

    name = "scripted"

    def __call__(self, z_BTD, layout, cache, *, k, last=None):
        raise AssertionError("a scripted model's passes run whole (`logits`, `run_pass`), never on a trunk state")

    def logits(self, ids_BT, cache, *, heads, layout, last=None):
        return self.model.logits(ids_BT, cache, heads=heads, layout=layout, last=last)

    def run_pass(self, ids_BT, cache, *, heads, layout):
        return self.model.logits(ids_BT, cache, heads=heads, layout=layout), ids_BT[..., :0]


def scripted_heads(model, *, stacked: bool = True) -> ScriptedHeads:
    return ScriptedHeads(model)


class ScriptedModel:
    """Knows a text: head 1 always predicts its next byte; head j > 1 predicts the byte j ahead
    when `right(j)` says so, else a wrong byte. Positions count from the leading EOS."""

    cache_layers = ByteMTP.cache_layers  # what a pass writes, from the config as the model says it
    layers_written = ByteMTP.layers_written
    decode_heads = scripted_heads  # every pass: `logits`
    drafter = None
    vocab = BYTES  # ids are bytes

    def __init__(self, text: bytes, right, n_future: int = 8):
        self.config = dataclasses.replace(config_io.tiny().model, n_future=n_future, seq_len=128)
        self.embed = torch.nn.Embedding(1, 1)  # only its device is read
        self.rope_cos = self.rope_sin = torch.zeros(self.config.seq_len, 1)
        self.stream = [EOS, *text, EOS]
        self.right = right
        self.calls = 0

    def _byte(self, position: int) -> int:
        return self.stream[position] if position < len(self.stream) else EOS

    def logits(self, ids, cache, heads=None, *, layout=None, last=None):
        assert layout is None or layout.chain
        self.calls += 1
        K = heads or self.config.n_future
        B, T = ids.shape
        out = torch.zeros(B, T, K, VOCAB_SIZE)
        for b in range(B):
            for t in range(T):
                pos = cache.lengths[b] + t
                for j in range(K):
                    target = self._byte(pos + j + 1)
                    if j > 0 and not self.right(j + 1):
                        target = (target + 1) % 256
                    out[b, t, j, target] = 10.0
        cache.advance(T)
        return out if last is None else out[torch.arange(B), last][:, None]


TEXT = b"def main():\n    return 42\n"


class ScriptedBatchModel:
    """A batch version of ScriptedModel: knows several documents (prompt + text), and each row
    follows the one its own prefix selects. Head 1 predicts the document's next byte; head j > 1
    the byte j ahead when that document's `right(j)` says so, else a wrong byte.

    The stub keeps each row's ids in the KV cache it is given (layer 0, head 0, feature 0), so
    it sees every row's prefix exactly as the decoder's cache bookkeeping (per-row lengths,
    rewinds, dropped rows) leaves it; a prefix that matches no document predicts '?' bytes."""

    cache_layers = ByteMTP.cache_layers  # what a pass writes, from the config as the model says it
    layers_written = ByteMTP.layers_written
    decode_heads = scripted_heads  # every pass: `logits`
    drafter = None
    vocab = BYTES  # ids are bytes

    def __init__(self, docs: list[tuple[bytes, bytes, object]], n_future: int = 8):
        self.config = dataclasses.replace(config_io.tiny().model, head_type="linear", n_layers=1, d_model=2,
                                          n_attn_heads=1, n_future=n_future, seq_len=128)
        self.embed = torch.nn.Embedding(1, 1, dtype=torch.float64)  # cache dtype: ids stored exactly
        self.rope_cos = self.rope_sin = torch.zeros(self.config.seq_len, 1)
        self.docs = [([EOS, *prompt, *text, EOS], right) for prompt, text, right in docs]
        self.calls = 0

    def _doc(self, prefix: list[int]):
        for stream, right in self.docs:
            if (stream + [EOS] * len(prefix))[:len(prefix)] == prefix:  # EOS after the end
                return stream, right
        return None, None

    def logits(self, ids, cache, heads=None, *, layout=None, last=None):
        assert layout is None or layout.chain
        self.calls += 1
        K = heads or self.config.n_future
        B, T = ids.shape
        assert len(cache.lengths) == B
        history = cache.k[0, :, 0, :, 0]  # (B, L)
        out = torch.zeros(B, T, K, VOCAB_SIZE)
        for b in range(B):
            start = cache.lengths[b]
            history[b, start:start + T] = ids[b].to(history.dtype)
            for t in range(T):
                pos = start + t
                stream, right = self._doc([int(i) for i in history[b, :pos + 1].tolist()])
                for j in range(K):
                    if stream is None:
                        target = ord("?")
                    else:
                        target = stream[pos + j + 1] if pos + j + 1 < len(stream) else EOS
                        if j > 0 and not right(j + 1):
                            target = (target + 1) % 256
                    out[b, t, j, target] = 10.0
        cache.advance(T)
        return out if last is None else out[torch.arange(B), last][:, None]


# --- Markov models: sampling against an exact distribution ---------------------------------------

MARKOV_SYMBOLS = list(b"abc")


# head 1's distribution over a, b, c given the previous id, at even and odd positions
MARKOV_TARGET = {
    0: {EOS: (0.5, 0.3, 0.2), 97: (0.6, 0.3, 0.1), 98: (0.2, 0.2, 0.6), 99: (0.3, 0.45, 0.25)},
    1: {EOS: (0.4, 0.4, 0.2), 97: (0.15, 0.5, 0.35), 98: (0.7, 0.1, 0.2), 99: (0.25, 0.25, 0.5)},
}


# the draft heads' distributions: deliberately far from the target (head 3 reversed)
MARKOV_DRAFT = {EOS: (0.1, 0.3, 0.6), 97: (0.2, 0.6, 0.2), 98: (0.5, 0.4, 0.1), 99: (0.6, 0.2, 0.2)}


class MarkovModel:
    """A stub whose head 1 samples from a table indexed by the previous id and the cache slot mod
    the number of tables (`head1`, one {previous id: probabilities over `ids`} per phase; every
    other id at -inf); heads 2..K draft from `drafts` (head 3 and every other one reversed). The
    default: a, b or c (EOS excluded) by the position's parity. Vectorized over the batch, so
    thousands of rows decode in seconds."""

    cache_layers = ByteMTP.cache_layers  # what a pass writes, from the config as the model says it
    layers_written = ByteMTP.layers_written
    decode_heads = scripted_heads  # every pass: `logits`
    drafter = None
    vocab = BYTES  # ids are bytes

    def __init__(self, n_future: int = 3, *, head1=(MARKOV_TARGET[0], MARKOV_TARGET[1]), drafts=MARKOV_DRAFT,
                 ids=MARKOV_SYMBOLS, seq_len: int = 8):
        self.config = dataclasses.replace(config_io.tiny().model, head_type="linear", n_layers=1, d_model=2,
                                          n_attn_heads=1, n_future=n_future, seq_len=seq_len)
        self.embed = torch.nn.Embedding(1, 1)
        self.rope_cos = self.rope_sin = torch.zeros(self.config.seq_len, 1)
        table = torch.full((len(head1), VOCAB_SIZE, n_future, VOCAB_SIZE), float("-inf"))
        table[..., ids] = 0.0  # ids that never occur: uniform over the ids
        for phase, rows in enumerate(head1):
            for prev, probs in rows.items():
                table[phase, prev, 0, ids] = torch.tensor(probs).log()
                for j in range(1, n_future):
                    q = drafts[prev] if j % 2 else drafts[prev][::-1]
                    table[phase, prev, j, ids] = torch.tensor(q).log()
        self.table = table

    def logits(self, ids, cache, heads=None, *, layout=None, last=None):
        assert layout is None or layout.chain
        B, T = ids.shape
        slot_BT = torch.tensor(cache.lengths)[:, None] + torch.arange(T)
        out = self.table[slot_BT % len(self.table), ids.cpu()][:, :, :heads or self.config.n_future]
        cache.advance(T)
        return out if last is None else out[torch.arange(B), last][:, None]


EOS_MARKOV_IDS = [*b"abc", EOS]
EOS_MARKOV_HEAD1 = [  # head 1's distribution over a, b, c, EOS by the previous id, at slots 0, 1, 2 mod 3
    {EOS: (.5, .3, .15, .05), 97: (.5, .2, .1, .2), 98: (.2, .2, .5, .1), 99: (.3, .4, .2, .1)},
    {EOS: (.4, .3, .2, .1), 97: (.15, .5, .3, .05), 98: (.6, .1, .15, .15), 99: (.2, .25, .45, .1)},
    {EOS: (.2, .2, .5, .1), 97: (.1, .2, .6, .1), 98: (.3, .5, .1, .1), 99: (.6, .1, .1, .2)},
]
EOS_MARKOV_DRAFTS = {EOS: (.1, .3, .5, .1), 97: (.2, .5, .1, .2), 98: (.4, .4, .1, .1), 99: (.5, .2, .2, .1)}


class EosMarkovModel(MarkovModel):
    """A stub like MarkovModel, with EOS among its ids: head 1 draws a, b, c
    or EOS from a table indexed by the previous id and its cache slot mod 3; the draft heads
    from other tables (head 3 reversed). Vectorized over the batch.

    Its window is 8 ids and a slide keeps 4, so a decoder that keeps a stale cache length after
    a slide (slot 8 where 4 is right) or drafts past the window's end (slot 8 where a slide
    would give 3) draws from another table: slots mod 3 tell them apart."""

    def __init__(self, n_future: int = 4, seq_len: int = 8):
        super().__init__(n_future, head1=EOS_MARKOV_HEAD1, drafts=EOS_MARKOV_DRAFTS, ids=EOS_MARKOV_IDS,
                         seq_len=seq_len)


# --- path models: tree drafts against plain decoding -----------------------------------------------

CONTEXT = 8  # tokens of context that say where in which document a node stands
UNKNOWN = ord("?")  # what a node predicts from a context no document holds
FLAT = PassCosts({(1, 1): 1.0, (1, 16): 1.0, (8, 1): 1.0, (8, 16): 1.0})  # every pass costs alike
# a plain pass costs 1, heads and nodes cost more: automatic drafting picks 3 heads and smaller trees
CPU_LIKE = PassCosts({(1, 1): 1.0, (1, 16): 1.5, (8, 1): 1.45, (8, 16): 2.4})


@dataclass(frozen=True)
class Doc:
    """A prompt and the text that follows it; `rank(depth, index)` is where the true byte (stream
    index `index`) stands among the candidates of the head that drafts it at `depth` (head
    depth + 1): 0 its top byte, 1 its second, ...; None when it is not among them."""

    prompt: bytes
    text: bytes
    rank: Callable[[int, int], int | None]


class PathModel:
    """The scripted model of the module docstring: documents are known by their last CONTEXT
    tokens (fewer at a document's start), so every window of the context, slid or not,
    predicts the same bytes."""

    cache_layers = ByteMTP.cache_layers  # what a pass writes, from the config as the model says it
    layers_written = ByteMTP.layers_written
    decode_heads = scripted_heads  # every pass: `logits`
    drafter = None
    vocab = BYTES  # ids are bytes

    def __init__(self, docs: list[Doc], *, n_future: int = 4, seq_len: int = 128):
        self.config = ModelConfig(n_layers=n_future + 1, d_model=2, n_attn_heads=1, n_future=n_future,
                                  seq_len=seq_len)
        self.embed = torch.nn.Embedding(1, 1, dtype=torch.float64)  # cache device and dtype: ids kept exactly
        positions = torch.arange(seq_len, dtype=torch.float64)[:, None]
        self.rope_cos = self.rope_sin = positions  # a layout's rotation tables then hold each node's position
        self.docs = docs
        self.streams = [[EOS, *d.prompt, *d.text, EOS] for d in docs]
        self.follows: dict[tuple[int, ...], tuple[int, int]] = {}  # context -> (doc, index of the next id)
        for n, (doc, stream) in enumerate(zip(docs, self.streams)):
            for i in range(1 + len(doc.prompt), len(stream)):  # the text's bytes and its EOS
                key = tuple(stream[max(0, i - CONTEXT):i])
                assert key not in self.follows, f"{bytes(k for k in key if k < 256)!r} occurs twice"
                self.follows[key] = (n, i)
        self.calls = 0
        self._ranked: dict[tuple, list[int]] = {}  # ((doc, index), head) -> `_candidates`

    def logits(self, ids_BT: torch.Tensor, cache, heads: int | None = None, *, layout,
               last: list[int] | None = None) -> torch.Tensor:
        self.calls += 1
        cfg = self.config
        B, T = ids_BT.shape
        K = cfg.n_future if heads is None else heads
        layers = list(range(cfg.trunk_layers + K * cfg.layers_per_head))  # the trunk and the heads that run
        x = ids_BT.to(torch.float64)[:, None, :, None].expand(B, 1, T, cfg.head_dim)  # (B, H, T, E)
        for layer in layers:
            attend(x, x, x, layout, cache.k[layer], cache.v[layer])
        held = cache.k[layers, :, 0, :layout.L, 0].round().long().tolist()  # (layers, B, L)
        see = self._visible(layout, B, T)
        pos = layout.cos[..., 0].reshape(-1, T).expand(B, T).round().long().tolist()  # (B, T)
        out_BTKV = torch.zeros(B, T, K, VOCAB_SIZE)
        first_head = cfg.trunk_layers  # (a property: read once, not at every slot)
        at, scores = [], []  # (b, t, j, byte) and its score
        for b in range(B):
            row_held = [held[layer][b] for layer in (0, *range(first_head, first_head + K))]
            for t in range(T):
                slots = [s for s, seen in enumerate(see[b][t]) if seen]
                trunk = [row_held[0][s] for s in slots]
                for j in range(K):
                    own = [row_held[1 + j][s] for s in slots]
                    ok = own == trunk and pos[b][t] == len(trunk) - 1
                    for r, byte in enumerate(self._candidates(trunk if ok else None, j)):
                        at.append((b, t, j, byte))
                        scores.append(30.0 - r)
        if at:  # one write: element by element, it was most of a scripted pass's time
            out_BTKV[tuple(torch.tensor(at).T)] = torch.tensor(scores)
        cache.advance(T)
        return out_BTKV if last is None else out_BTKV[torch.arange(B), last][:, None]

    @staticmethod
    def _visible(layout, B: int, T: int) -> list[list[list[bool]]]:
        """(B, T, L): the cache slots each node attends to, read from the layout as `attend` reads it."""
        L = layout.L
        if layout.mask is not None:
            see = layout.mask[:, 0].expand(B, T, L)
        elif layout.causal:  # a chain from slot 0
            see = torch.ones(T, L, dtype=torch.bool).tril().expand(B, T, L)
        else:  # one node a row, at the rows' common length: it sees every slot
            see = torch.ones(B, T, L, dtype=torch.bool)
        return see.tolist()

    def _candidates(self, context: list[int] | None, j: int) -> list[int]:
        """Head j + 1's top candidates, best first, after this context (None: a wrong one)."""
        hit = None if context is None else self.follows.get(tuple(context[-CONTEXT:]))
        if hit is None:
            return [UNKNOWN]
        if (hit, j) not in self._ranked:
            self._ranked[hit, j] = self._rank(*hit, j)
        return self._ranked[hit, j]

    def _rank(self, n: int, i: int, j: int) -> list[int]:
        stream = self.streams[n]
        true = stream[i + j] if i + j < len(stream) else EOS
        rank = 0 if j == 0 else self.docs[n].rank(j, i + j)
        wrong = [EOS] if true != EOS else []  # a wrong EOS draft must not end the output
        wrong += [w for w in ((true * 7 + 13 * r + 1) % 256 for r in range(1, 40)) if w != true]
        wrong = list(dict.fromkeys(wrong))[:TREE_RANKS]
        if rank is None:
            return wrong
        return (wrong[:rank] + [true] + wrong[rank:])[:TREE_RANKS]


class SpyDecoder(decode.Decoder):
    """The decoder (given pass costs, never compiled), keeping the path each pass accepted, by row."""

    def __init__(self, model, costs: PassCosts = FLAT):
        super().__init__(model, costs=costs, compile="off")
        self.paths: dict[bytes, list[list[tuple[int, int]]]] = {}  # by prompt: (rank, byte) along each path

    def accept(self, row, b, path, tree, cache, **kw):
        nodes = [(tree.ranks[n], row.cand[tree.depths[n] - 1][tree.ranks[n]]) for n in path[1:]]
        self.paths.setdefault(row.prompt, []).append(nodes)
        return super().accept(row, b, path, tree, cache, **kw)

    def branches(self) -> list[list[tuple[int, int]]]:
        """Accepted paths that left the top-ranked chain, of every row."""
        return [p for paths in self.paths.values() for p in paths if any(rank for rank, _ in p)]


# --- HumanEval ------------------------------------------------------------------------------------

TOY = [he.Problem("toy/add", "def add(a, b):\n    return ", "def check(f):\n    assert f(2, 3) == 5\n", "add",
                  canonical_solution="a + b\n"),
       he.Problem("toy/one", "def one():\n    return ", "def check(f):\n    assert f() == 1\n", "one",
                  canonical_solution="1\n")]


def bigram_model() -> ByteMTP:
    """A tiny model whose next-byte head writes "1\\n#" after any byte but "1" and "\\n": every
    layer's output projection is zero, so the state is the last byte's embedding, and the
    embeddings and the first unembedding make a bigram table. "\\n#" is a stop string, so after a
    prompt that ends in a space the completion is "1" (and after a newline "#1")."""
    model = ByteMTP(config_io.tiny().model).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("attn.out.weight", "mlp.out.weight")):
                p.zero_()
        slot = {ord("1"): 0, ord("\n"): 1}  # every other id: slot 2
        model.embed.weight.zero_()
        for i in range(model.embed.weight.shape[0]):
            model.embed.weight[i, slot.get(i, 2)] = 1.0
        for unembed in model.unembed:
            unembed.weight.zero_()
        nxt = model.unembed[0].weight
        nxt[ord("\n"), 0] = nxt[ord("#"), 1] = nxt[ord("1"), 2] = 10.0
    return model


# --- sampling: seeded settings and the chi-square test's critical value --------------------------


def seeded_sampling(seed: int, **kw) -> Sampling:
    return Sampling(**{"temperature": 1.0, **kw}, generator=torch.Generator().manual_seed(seed))


def chi2_critical(df: int, p: float = 0.001) -> float:
    """The chi-square value that a statistic with df degrees of freedom exceeds with
    probability p (bisection on torch's regularized upper incomplete gamma)."""
    lo, hi = 0.0, 10.0 * df + 100.0
    for _ in range(100):
        mid = (lo + hi) / 2
        tail = float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                             torch.tensor(mid / 2, dtype=torch.float64)))
        lo, hi = (mid, hi) if tail > p else (lo, mid)
    return lo


def lm_eval_tasks(root, docs: list[dict], *, until: list[str], max_gen_toks: int):
    """A folder of two lm-eval tasks over one local JSON file of `docs` ({"q", "choices", "gold"}):
    tiny_mc (multiple choice, acc) and tiny_gen (generate_until, exact match); its path."""
    import json

    (root / "docs.json").write_text("\n".join(json.dumps(d) for d in docs))
    tasks = root / "tasks"
    tasks.mkdir()
    common = (f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root / 'docs.json'}\n"
              f"  cache_dir: {root / 'hf-cache'}\ntest_split: test\ndoc_to_text: \"{{{{q}}}}\"\n")
    metric = "    aggregation: mean\n    higher_is_better: true\n"
    (tasks / "tiny_mc.yaml").write_text(
        "task: tiny_mc\n" + common + "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\n"
        "doc_to_target: gold\nmetric_list:\n  - metric: acc\n" + metric)
    (tasks / "tiny_gen.yaml").write_text(
        "task: tiny_gen\n" + common + "output_type: generate_until\ndoc_to_target: \"{{choices[0]}}\"\n"
        f"generation_kwargs:\n  until: {json.dumps(until)}\n  max_gen_toks: {max_gen_toks}\n"
        "metric_list:\n  - metric: exact_match\n" + metric)
    return tasks
