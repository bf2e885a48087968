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
from bytemtp.model.pass_heads import HeadsInTurn, PassHeads, StackedHeads
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
    assert logits.shape[2] == heads.graph_heads(k) and caches[1].lengths == caches[0].lengths == [6, 6]

    def first(logits_BTJV, greedy):
        return logits_BTJV[:, :, 0].masked_fill(~torch.tensor(emitted(logits_BTJV.shape[-1])), float("-inf")).argmax(-1)

    logits, greedy = heads.finish(logits, states, torch.zeros(2, 6, 1), heads=k, first=first)
    assert (greedy is None) == (heads.graph_heads(k) < k)  # picks made before the heads after them are stale
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

INTERFACE = {name for name in dir(PassHeads) if not name.startswith("_")} - {"name"} | {"model"}
QUESTIONS = {"type", "isinstance", "issubclass", "getattr", "hasattr", "vars", "id", "dir", "repr", "str"}


def _names_of_heads(tree: ast.AST) -> set[str]:
    """The names and `self.` attributes that hold pass heads in a module, aliases followed to a fixed
    point: anything called `pass_heads`, a parameter annotated PassHeads, what `decode_heads()` gives,
    and every name or attribute assigned from one of them (directly, or through `a if c else b`,
    `a or b`, a tuple, or getattr(x, "pass_heads"))."""
    held = {"pass_heads"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None and "PassHeads" in ast.unparse(node.annotation):
            held.add(node.arg)
    while True:
        before = set(held)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.NamedExpr)) and node.value is not None:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                for target in targets:
                    pairs = zip(target.elts, values) if isinstance(target, ast.Tuple) and len(values) > 1 else \
                        [(target, node.value)]
                    for t, v in pairs:
                        if _holds(v, held):
                            held.add(_key(t))
            elif isinstance(node, (ast.For, ast.comprehension)) and _holds(node.iter, held):
                held.add(_key(node.target))
        if held == before:
            return held - {None}


def _key(node: ast.AST) -> str | None:
    """The name a target binds: `x`, or `self.x` as `x` (attributes are followed by name)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _holds(node: ast.AST, held: set[str]) -> bool:
    """Whether an expression's value may be pass heads."""
    if isinstance(node, (ast.Name, ast.Attribute)):
        return _key(node) in held
    if isinstance(node, ast.Call):
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "decode_heads":
            return True
        if isinstance(f, ast.Name) and f.id == "getattr" and len(node.args) > 1:
            return isinstance(node.args[1], ast.Constant) and node.args[1].value in held
        return False
    if isinstance(node, ast.IfExp):
        return _holds(node.body, held) or _holds(node.orelse, held)
    if isinstance(node, ast.BoolOp):
        return any(_holds(v, held) for v in node.values)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_holds(v, held) for v in node.elts)
    return isinstance(node, ast.Starred) and _holds(node.value, held)


def kind_questions(source: str) -> list[int]:
    """Lines that tell kinds of pass heads apart, whatever the heads are called (`_names_of_heads`
    follows aliases): an attribute of theirs outside the interface (a flag, `.name`, `__class__`);
    a builtin that asks an object what it is (type, isinstance, getattr, hasattr, ...) on them; a
    comparison of them (`is None`, `==`); a try whose body calls them (a kind told by its failure);
    arithmetic on `graph_heads` that decides (a comparison: the old two-phase branch); or a kind
    named at all."""
    tree = ast.parse(source)
    held, lines = _names_of_heads(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _holds(node.value, held) and node.attr not in INTERFACE:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in QUESTIONS:
            if any(_holds(a, held) for a in node.args):
                lines.append(node.lineno)
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(_holds(x, held) for x in sides) or any(
                    isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute) and x.func.attr == "graph_heads"
                    for side in sides for x in ast.walk(side)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Try) and node.handlers:
            if any(isinstance(x, ast.Attribute) and _holds(x.value, held) for stmt in node.body for x in ast.walk(stmt)):
                lines.append(node.lineno)
        elif isinstance(node, ast.Name) and node.id in KIND_NAMES:
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and any(a.name in KIND_NAMES for a in node.names):
            lines.append(node.lineno)
    return sorted(set(lines))


KIND_NAMES = {"StackedHeads", "HeadsInTurn", "DraftPass"}


def test_decoding_never_asks_what_kind_of_heads_it_holds():
    found = [f"{path.name}:{line}" for path in sorted(DECODING.glob("*.py")) for line in kind_questions(path.read_text())]
    assert found == [], f"ask the pass heads (`PassHeads`) instead of telling their kinds apart: {found}"


WAYS = {  # ways to tell the kinds apart: the code, and the line that asks
    "getattr of a flag": ('x = getattr(self.pass_heads, "keeps_warm", False)', 1),
    "a comparison with None": ('if self.pass_heads is not None:\n    pass', 1),
    "hasattr": ('y = hasattr(decoder.pass_heads, "drafts")', 1),
    "isinstance": ('z = isinstance(self.pass_heads, Anything)', 1),
    "an old flag": ('w = self.pass_heads.two_phase', 1),
    "a kind imported": ('from bytemtp.model.model import StackedHeads', 1),
    "a kind named": ('v = DraftPass', 1),
    "an alias": ('h = self.pass_heads\nif isinstance(h, Anything):\n    pass', 2),
    "an alias of an alias": ('h = self.pass_heads\ng = h if ok else None\nq = g.stacked', 3),
    "an attribute alias": ('self.ph = model.decode_heads()\nfast = self.ph.drafter is None', 2),
    "a parameter": ('def f(heads: PassHeads):\n    return heads.drafter', 2),
    "getattr by name": ('h = getattr(self, "pass_heads")\nn = h.name', 2),
    "a .name comparison": ('if self.pass_heads.name == "drafts":\n    pass', 1),
    "a type() test": ('if type(self.pass_heads) is Anything:\n    pass', 1),
    "a __class__": ('c = self.pass_heads.__class__', 1),
    "an equality": ('same = self.pass_heads == other', 1),
    "a try/except": ('try:\n    self.pass_heads.after_picks(h, f, k)\nexcept AssertionError:\n    pass', 1),
    "arithmetic on graph_heads": ('if self.pass_heads.graph_heads(k) < k:\n    pass', 1),
    "unpacked": ('a, h = 1, self.pass_heads\nz = h.name', 2),
}


@pytest.mark.parametrize("way", WAYS)
def test_the_check_finds_each_way_of_telling_kinds_apart(way):
    code, line = WAYS[way]
    assert kind_questions(code) == [line], code


def test_the_check_lets_the_interface_be_used():
    assert kind_questions('k = self.pass_heads.graph_heads(k)\nok = cache is None\nn = getattr(stats, "shapes", {})\n'
                          'c = cached_costs(self.pass_heads) is None\nkeep = heads - self.pass_heads.graph_heads(heads)\n'
                          'w = self.decoder.pass_heads.whole_after(state.warm)\nm = pass_heads.model\n'
                          'f = self.pass_heads.after_picks\nlogits, g = self.pass_heads.finish(l, s, g, heads=k, first=f)\n'
                          'try:\n    x = cache.k\nexcept KeyError:\n    pass\n') == []
