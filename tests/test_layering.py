"""Keeps the layering of DESIGN.md: lower layers never import higher ones, nothing imports the CLI."""

import ast
import pathlib

import bytemtp

PACKAGE = pathlib.Path(bytemtp.__file__).parent

# a module may import bytemtp modules of a strictly lower layer only
LAYER = {
    "config": 0, "vocab": 0, "generation": 0.5, "shards": 0.75,
    "kvcache": 0.5, "devices": 0.5,
    "model": 1, "drafting": 1, "sampling": 1, "loss": 1, "corpus": 1, "prep": 1.5, "compiled": 1.5,
    "step": 2, "rollout": 2, "tasks": 2, "checkpoint": 2, "loader": 2, "decode": 2, "distributed": 2, "flops": 2,
    "likelihood": 2, "evaluate": 2.5, "runs": 2.5, "speed": 2.5, "train": 3, "plot": 4, "harness": 4, "export": 3,
    "bench": 4,
    "guard": 0, "execution": 0.5, "humaneval": 3, "remote_code": 0,
}
NO_TORCH = {"config", "vocab", "execution", "guard"}


def _imports(path: pathlib.Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import inside the package
                base = f"bytemtp.{node.module}" if node.module else "bytemtp"
                names |= {base} if node.module else {f"bytemtp.{a.name}" for a in node.names}
            elif node.module == "bytemtp":
                names |= {f"bytemtp.{a.name}" for a in node.names}
            else:
                names.add(node.module)
    return names


def _modules():
    return {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}


def test_every_module_has_a_layer():
    missing = set(_modules()) - set(LAYER)
    assert not missing, f"give these modules a layer in tests/test_layering.py: {sorted(missing)}"


def test_lower_layers_never_import_higher_ones():
    for name, path in _modules().items():
        for imp in _imports(path):
            if not imp.startswith("bytemtp."):
                continue
            dep = imp.split(".")[1]
            assert dep in LAYER, f"{name} imports unknown module {imp}"
            assert LAYER[dep] < LAYER[name] or (dep == name), (
                f"bytemtp.{name} (layer {LAYER[name]}) imports bytemtp.{dep} (layer {LAYER[dep]})")


def test_nothing_imports_the_cli_and_config_needs_no_torch():
    for name, path in list(_modules().items()) + [("__init__", PACKAGE / "__init__.py")]:
        imports = _imports(path)
        assert not any(i.split(".")[0] in ("cli", "bytemtp_cli") for i in imports), name
        if name in NO_TORCH | {"__init__"}:
            assert not any(i.split(".")[0] in ("torch", "numpy") for i in imports), name


def test_import_of_the_package_has_no_torch_side_effect():
    import subprocess
    import sys

    code = "import sys, bytemtp, bytemtp.config, bytemtp.vocab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
