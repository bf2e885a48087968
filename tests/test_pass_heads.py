"""What a decoding pass runs after the trunk (`bytemtp.model.pass_heads.PassHeads`): every kind gives
the logits its call gives through the two phases a decoding pass runs, keeps the caches it says it
keeps, and decoding asks the interface only, never the kind (a test, as for head-type names)."""

import ast
import pathlib

import pytest
import torch
from doubles import rare_eos_model, tiny_model

import bytemtp
from bytemtp.model.draft import DraftPass
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.pass_heads import HeadsInTurn, StackedHeads
from bytemtp.vocab import emitted

DECODING = pathlib.Path(bytemtp.__file__).parent / "decoding"

KINDS = {  # name: (model, the kind its decoder runs)
    "stacked transformer": (lambda: tiny_model(n_future=4), StackedHeads),
    "stacked linear": (lambda: tiny_model(head_type="linear", n_future=4), StackedHeads),
    "causal in turn": (lambda: tiny_model(head_type="causal", n_future=4), HeadsInTurn),
    "medusa drafts": (lambda: _noisy(rare_eos_model(0, draft="medusa", n_future=4)), DraftPass),
    "hydra drafts": (lambda: _noisy(rare_eos_model(0, draft="hydra", n_future=4)), DraftPass),
}


def _noisy(model):
    """Draft heads moved off their copies of head 1, so that their logits differ from it."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_a_pass_in_two_phases_equals_the_call(kind):
    """`run_pass` (the graph's part) and then `after_picks` (from head 1's greedy pick at every node)
    give the logits that `logits` gives at once, and write the same cache."""
    make, cls = KINDS[kind]
    model = make().double().eval()
    heads = model.decode_heads()
    assert type(heads) is cls
    ids = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(1))
    k = model.config.n_future
    caches = [KVCache.for_model(model, batch_size=2) for _ in range(2)]
    want = heads.logits(ids, caches[0], heads=k, layout=build_layout(model, ids, caches[0]))
    logits, states = heads.run_pass(ids, caches[1], heads=k, layout=build_layout(model, ids, caches[1]))
    j = heads.graph_heads(k)
    assert logits.shape[2] == j and caches[1].lengths == caches[0].lengths == [6, 6]
    if j < k:
        first = logits[:, :, 0].masked_fill(~torch.tensor(emitted(logits.shape[-1])), float("-inf")).argmax(-1)
        after = heads.after_picks(states.reshape(12, -1), first.reshape(12), k)
        logits = torch.cat([logits, after.view(2, 6, k - j, -1)], dim=2)
    torch.testing.assert_close(logits, want)
    torch.testing.assert_close(caches[1].k, caches[0].k)
    written = [n for n in range(model.config.total_layers) if bool(caches[0].k[n].any())]
    assert written == sorted(heads.cache_layers(k)) == list(range(heads.layers_written(k)))


@pytest.mark.parametrize("kind", KINDS)
def test_which_caches_a_pass_leaves_whole(kind):
    """Training heads past a pass's k lack its keys; draft heads keep no cache, so none goes stale."""
    model = KINDS[kind][0]()
    heads, n = model.decode_heads(), model.config.n_future
    for k in range(1, n + 1):
        assert heads.whole_after(k) == (n if isinstance(heads, DraftPass) else k)


def test_the_reference_runs_the_heads_one_by_one():
    model = tiny_model(n_future=3).double().eval()
    ids = torch.randint(0, 256, (2, 9), generator=torch.Generator().manual_seed(2))
    layout = build_layout(model, ids)
    torch.testing.assert_close(model.decode_heads().logits(ids, layout=layout),
                               model.decode_heads(stacked=False).logits(ids, layout=layout))
    assert isinstance(model.decode_heads(stacked=False), HeadsInTurn)


# --- decoding asks the interface, never the kind -------------------------------------------------

KIND_NAMES = {"StackedHeads", "HeadsInTurn", "DraftPass"}
FLAGS = {"stacked", "two_phase", "keeps_warm", "drafter"}  # what decoding once told the kinds apart by
ABOUT_HEADS = {"pass_heads", "stacked", "drafter"}


def _about_heads(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr in ABOUT_HEADS or isinstance(node, ast.Name) and node.id in ABOUT_HEADS


def kind_questions(source: str) -> list[int]:
    """Lines that tell kinds of heads apart: a getattr/hasattr or an isinstance on them, a comparison
    of them with None, an attribute among the old flags, or a kind named at all."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id in ("getattr", "hasattr") and node.args and _about_heads(node.args[0]):
                lines.append(node.lineno)
            if node.func.id == "isinstance" and node.args and _about_heads(node.args[0]):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value is None for s in sides) and any(map(_about_heads, sides)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in FLAGS:
            lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in KIND_NAMES:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name in KIND_NAMES for a in node.names):
            lines.append(node.lineno)
    return sorted(set(lines))


def test_decoding_never_asks_what_kind_of_heads_it_holds():
    found = [f"{path.name}:{line}" for path in sorted(DECODING.glob("*.py")) for line in kind_questions(path.read_text())]
    assert found == [], f"ask the pass heads (`PassHeads`) instead of telling their kinds apart: {found}"


def test_the_check_finds_each_way_of_telling_kinds_apart():
    for code in ('x = getattr(self.pass_heads, "keeps_warm", False)', 'if self.stacked is not None:\n    pass',
                 'y = hasattr(decoder.pass_heads, "drafts")', 'z = isinstance(self.pass_heads, Anything)',
                 'w = self.two_phase', 'from bytemtp.model.model import StackedHeads', 'v = model.drafter is None'):
        assert kind_questions(code) == [1], code
    assert kind_questions('k = self.pass_heads.graph_heads(k)\nok = cache is None\nn = getattr(stats, "shapes", {})\n'
                          'c = cached_costs(self.pass_heads) is None\n') == []
