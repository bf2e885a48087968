"""Head types (`bytemtp.config.HeadType`): each type's layers, stacking and skipping, what a head
reads, and the cache layers a pass writes, held against what the model really does; and no module
compares a head type's name."""

import ast
import dataclasses
import pathlib

import pytest
import torch
from doubles import tiny_model

import bytemtp
from bytemtp import config_io
from bytemtp.config import DRAFT_DESIGNS, HEAD_TYPES, ModelConfig
from bytemtp.model.draft import DRAFTERS
from bytemtp.model.kvcache import KVCache
from bytemtp.model.layout import build_layout
from bytemtp.model.pass_heads import StackedHeads

PACKAGE = pathlib.Path(bytemtp.__file__).parent


def test_each_type_says_its_layers_and_whether_it_stacks_skips_and_chains():
    got = {name: (t.layers_per_head(2), t.layered, t.stackable, t.skippable, t.chained)
           for name, t in HEAD_TYPES.items()}
    assert got == {"transformer": (2, True, True, True, False),
                   "linear": (0, False, True, True, False),
                   "causal": (2, True, False, False, True)}
    assert list(HEAD_TYPES) == ["transformer", "linear", "causal"]  # the order the error message lists


@pytest.mark.parametrize("head_type", list(HEAD_TYPES))
@pytest.mark.parametrize("param_match", [True, False])
@pytest.mark.parametrize("n_future,head_layers", [(1, 1), (4, 1), (4, 2), (8, 1)])
def test_the_layer_accounting_is_the_documented_one(head_type, param_match, n_future, head_layers):
    cfg = ModelConfig(n_layers=20, n_future=n_future, head_type=head_type, head_layers=head_layers,
                      param_match=param_match)
    assert cfg.head is HEAD_TYPES[head_type]
    per = 0 if head_type == "linear" else head_layers
    assert cfg.layers_per_head == per
    assert cfg.trunk_layers == 20 - (n_future if param_match else 1) * per
    assert cfg.total_layers == cfg.trunk_layers + n_future * per


def test_a_skipped_head_is_every_head_of_weight_0_or_for_chained_heads_the_tail():
    weights = [1.0, 0.0, 0.5, 0.0, 0.0]
    assert HEAD_TYPES["transformer"].skipped(weights) == {1, 3, 4}
    assert HEAD_TYPES["linear"].skipped(weights) == {1, 3, 4}
    assert HEAD_TYPES["causal"].skipped(weights) == {3, 4}
    assert HEAD_TYPES["causal"].skipped([1.0, 1.0]) == frozenset()


def test_a_head_reads_the_trunk_or_for_chained_heads_the_previous_head():
    for name, t in HEAD_TYPES.items():
        assert t.head_input(0, "z", None) == "z"
        assert t.head_input(2, "z", "h1") == ("h1" if name == "causal" else "z")


@pytest.mark.parametrize("head_type", list(HEAD_TYPES))
def test_the_model_stacks_and_skips_as_its_type_says(head_type):
    model = tiny_model(head_type=head_type, n_future=3).eval()
    assert isinstance(model.decode_heads(), StackedHeads) == model.config.head.stackable
    z = torch.zeros(1, 4, model.config.d_model)
    layout = build_layout(model, torch.zeros(1, 4, dtype=torch.long))
    if model.config.head.skippable:
        assert [k for k, _ in model.head_states(z, layout=layout, skip=frozenset({1}))] == [0, 2]
    else:
        with pytest.raises(AssertionError, match="cannot skip"):
            list(model.head_states(z, layout=layout, skip=frozenset({1})))


def test_the_cache_layer_order_of_stacked_and_one_by_one_heads():
    cfg = dataclasses.replace(config_io.tiny().model, n_layers=2 + 3 * 2, n_future=3, head_layers=2)
    assert cfg.trunk_layers == 2
    head = cfg.head
    one_by_one = head.cache_layers(trunk_layers=2, head_layers=2, heads=2, stacked=False)
    stacked = head.cache_layers(trunk_layers=2, head_layers=2, heads=2, stacked=True)
    assert one_by_one == (0, 1, 2, 3, 4, 5)  # head 0's layers 0, 1, then head 1's
    assert stacked == (0, 1, 2, 4, 3, 5)  # layer 0 of heads 0 and 1, then their layer 1
    assert HEAD_TYPES["linear"].cache_layers(trunk_layers=8, head_layers=2, heads=3, stacked=True) == tuple(range(8))
    with pytest.raises(AssertionError, match="do not stack"):
        HEAD_TYPES["causal"].cache_layers(trunk_layers=2, head_layers=1, heads=2, stacked=True)


CASES = [(t, layers, stacked) for t in HEAD_TYPES for layers in (1, 2) for stacked in (False, True)
         if not (stacked and not HEAD_TYPES[t].stackable) and not (t == "linear" and layers == 2)]


@pytest.mark.parametrize("head_type,head_layers,stacked", CASES)
@pytest.mark.parametrize("heads", [1, 3])
def test_the_cache_layers_are_the_ones_a_pass_writes_in_the_order_it_writes_them(head_type, head_layers,
                                                                                  stacked, heads):
    model = tiny_model(head_type=head_type, head_layers=head_layers, n_future=4,
                       n_layers=2 + 4 * head_layers).double().eval()
    ids = torch.randint(0, 256, (2, 5), generator=torch.Generator().manual_seed(0))
    stack = model.decode_heads(stacked=stacked)
    order = model.cache_layers(heads, stacked=stacked)
    assert sorted(order) == list(range(model.layers_written(heads)))

    # the layers a pass with a cache writes: those, and no other
    cache = KVCache.for_model(model, 2)
    with torch.no_grad():
        stack.logits(ids, cache, heads=heads, layout=build_layout(model, ids, cache))
    changed = [n for n in range(model.config.total_layers) if bool(cache.k[n].any())]
    assert changed == sorted(order)

    # the order they come in: a static pass keeps its keys as its layers run (`layout.written`)
    static_cache = KVCache.for_model(model, 2)
    layout = build_layout(model, ids, static_cache, depths=torch.arange(5), ancestors=torch.ones(5, 5).tril().bool(),
                          starts_B=torch.zeros(2, dtype=torch.long))
    with torch.no_grad():
        stack.logits(ids, static_cache, heads=heads, layout=layout)
    written = torch.cat([k if k.dim() == 5 else k[None] for k, _ in layout.written])  # (N, B, H, T, E)
    assert written.shape[0] == len(order)
    torch.testing.assert_close(written, cache.k[list(order), :, :, :5])


# --- no module compares a head type's name ------------------------------------------------------


def _is_head_type(node: ast.AST, names: tuple[str, ...] = ("head_type",)) -> bool:
    return (isinstance(node, ast.Name) and node.id in names) or \
        (isinstance(node, ast.Attribute) and node.attr in names)


def _is_str_literal(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_is_str_literal(e) for e in node.elts)


def name_comparisons(source: str, names: tuple[str, ...] = ("head_type",)) -> list[int]:
    """Lines where `head_type` (or another of `names`) is compared with a string literal (==, !=, in, ...)."""
    return [node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Compare)
            and any(_is_head_type(n, names) for n in [node.left, *node.comparators])
            and any(map(_is_str_literal, [node.left, *node.comparators]))]


def test_no_module_compares_a_head_type_name():
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
             for line in name_comparisons(path.read_text())]
    assert found == [], f"ask the head type (ModelConfig.head) instead: {found}"


def test_the_check_finds_a_comparison_of_the_name():
    for code in ('if cfg.head_type == "linear":\n    pass', 'x = "causal" != self.config.head_type',
                 'y = head_type in ("linear", "causal")', 'z = a < cfg.head_type == "causal"'):
        assert name_comparisons(code) == [1], code
    assert name_comparisons('ok = cfg.head_type in HEAD_TYPES\nname = f"{cfg.head_type} heads"\n') == []


def test_no_module_compares_a_draft_design_name():
    """The draft heads' design (`model.draft`) is asked as head types are (`ModelConfig.drafts`, a
    `DraftDesign`), in the package and the CLI alike."""
    paths = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "cli").rglob("*.py")]
    found = [f"{path.relative_to(PACKAGE.parent)}:{line}" for path in sorted(paths)
             for line in name_comparisons(path.read_text(), names=("draft",))]
    assert found == [], f"ask the draft design (ModelConfig.drafts) instead: {found}"
    assert name_comparisons('if cfg.draft == "none":\n    pass', names=("draft",)) == [1]
    assert [d for d, design in DRAFT_DESIGNS.items() if design.heads] == sorted(DRAFTERS, reverse=True)
    assert DRAFT_DESIGNS["hydra"].reads_bytes and not DRAFT_DESIGNS["medusa"].reads_bytes
