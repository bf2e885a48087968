"""Keeps the layering of DESIGN.md: a module imports only its own floor or lower ones, nothing
imports the CLI, and a name is imported from the module that defines it (no re-export facades).

A floor is a subpackage of bytemtp or a module at its root; the floors' order is the folder's
(bytemtp/__init__.py draws it)."""

import ast
import functools
import pathlib

import bytemtp

PACKAGE = pathlib.Path(bytemtp.__file__).parent
ROOT = PACKAGE.parent

FLOOR = {
    "config": 0, "config_docs": 0, "vocab": 0, "spread": 0, "tables": 0,
    "data": 1, "config_io": 1,
    "model": 2,
    "runtime": 3,
    "decoding": 4,
    "evaluation": 5,
    "training": 6,
    "interop": 7,
    "serving": 8,
    "experiments": 9,
}
# run or shipped on their own: they import nothing from bytemtp
STANDALONE = {"evaluation.guard", "interop.remote_code"}
NO_TORCH = {"config", "config_docs", "config_io", "vocab", "spread", "tables", "evaluation.execution",
            "evaluation.guard"}


def _imports(path: pathlib.Path, package: pathlib.Path = PACKAGE) -> set[str]:
    """Dotted names a module imports (a `from X import name` gives X.name as well as X)."""
    names = set()
    # the dotted package the module lives in, for relative imports: bytemtp/data/loader.py -> bytemtp.data
    here = [package.name, *path.parent.relative_to(package).parts]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                module = ".".join(here[: len(here) - node.level + 1] + ([module] if module else []))
            names.add(module)
            names |= {f"{module}.{a.name}" for a in node.names}
    return names


def _modules(package: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    """Every module of the package by dotted name below it ("decoding.decode", "config")."""
    return {".".join(p.relative_to(package).with_suffix("").parts): p for p in package.rglob("*.py")
            if p.name != "__init__.py" or p.parent != package}


def _floor_of(name: str) -> str:
    return name.split(".")[0]


def layering_faults(package: pathlib.Path = PACKAGE, floors: dict[str, int] = FLOOR) -> list[str]:
    """What breaks the floors in `package`: a module that imports a higher floor, a floor that is
    not placed, or a standalone module that imports the package."""
    faults = []
    top = package.name
    for name, path in _modules(package).items():
        floor = _floor_of(name)
        if floor not in floors:
            faults.append(f"{top}.{name} is on no floor: give `{floor}` one in tests/test_layering.py")
            continue
        standalone = next((s for s in STANDALONE if name == s or name.startswith(s + ".")), None)
        for imp in sorted(_imports(path, package)):
            parts = imp.split(".")
            if parts[0] != top or len(parts) < 2 or parts[1] not in floors:
                continue
            if standalone and not imp.startswith(f"{top}.{standalone}"):
                faults.append(f"{top}.{name} runs on its own but imports {imp}")
            elif parts[1] != floor and floors[parts[1]] >= floors[floor]:
                faults.append(f"{top}.{name} (floor {floors[floor]}) imports {top}.{parts[1]} (floor {floors[parts[1]]})")
    return sorted(set(faults))


def test_every_floor_is_a_whole_number_in_the_folders_order():
    assert all(isinstance(f, int) for f in FLOOR.values())
    on_disk = {p.stem for p in PACKAGE.iterdir() if (p.suffix == ".py" and p.stem != "__init__")
               or (p.is_dir() and (p / "__init__.py").exists())}
    assert on_disk == set(FLOOR), f"floors and folders differ: {sorted(on_disk ^ set(FLOOR))}"


def test_lower_floors_never_import_higher_ones():
    assert layering_faults() == []


def test_the_check_fails_when_a_lower_floor_imports_a_higher_one(tmp_path):
    pkg = tmp_path / "bytemtp"
    for sub in ("data", "training"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("")
    (pkg / "training" / "train.py").write_text("from bytemtp.data.loader import ByteLoader\nfrom bytemtp import config\n")
    (pkg / "data" / "loader.py").write_text("from bytemtp.config import Config\n")
    floors = {"config": 0, "data": 1, "training": 6}
    assert layering_faults(pkg, floors) == []
    (pkg / "data" / "loader.py").write_text("from bytemtp.config import Config\nfrom bytemtp.training import train\n")
    assert layering_faults(pkg, floors) == ["bytemtp.data.loader (floor 1) imports bytemtp.training (floor 6)"]
    (pkg / "data" / "loader.py").write_text("from ..training.train import run\n")
    assert layering_faults(pkg, floors) == ["bytemtp.data.loader (floor 1) imports bytemtp.training (floor 6)"]
    (pkg / "extra").mkdir()
    (pkg / "extra" / "x.py").write_text("")
    assert "bytemtp.extra.x is on no floor: give `extra` one in tests/test_layering.py" in layering_faults(pkg, floors)


def test_nothing_imports_the_cli_and_config_needs_no_torch():
    for name, path in list(_modules().items()) + [("__init__", PACKAGE / "__init__.py")]:
        imports = _imports(path)
        assert not any(i.split(".")[0] in ("cli", "bytemtp_cli") for i in imports), name
        if name in NO_TORCH | {"__init__"}:
            assert not any(i.split(".")[0] in ("torch", "numpy") for i in imports), name


@functools.cache
def _defined(path: pathlib.Path) -> set[str]:
    """Names a module defines at its top level (not the ones it imports)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.If, ast.Try)):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
                elif isinstance(sub, ast.Assign):
                    names |= {n.id for t in sub.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


@functools.cache
def _module_file(dotted: str) -> pathlib.Path | None:
    parts = dotted.split(".")
    path = ROOT.joinpath("cli" if parts[0] == "bytemtp_cli" else parts[0], *parts[1:])
    if path.is_dir():  # a package: its __init__ defines what it has besides its modules
        path = path / "__init__"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def facade_imports(files, *, attributes: bool = True) -> list[str]:
    """Names taken from a bytemtp module that does not define them (it imports them itself):
    `from bytemtp.X import name`, and (with `attributes`) `mod.name` where `mod` is a bytemtp
    module imported whole. Tests read or patch names where they are used, so theirs are not
    checked for attributes."""
    faults = []
    for path in files:
        tree = ast.parse(path.read_text())
        whole = {}  # local name -> dotted module, for modules imported whole
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                whole |= {a.asname: a.name for a in node.names if a.asname and a.name.startswith("bytemtp.")}
            if not (isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").startswith("bytemtp")):
                continue
            for a in node.names:
                dotted = f"{node.module}.{a.name}"
                if _module_file(dotted):
                    whole[a.asname or a.name] = dotted
                elif (source := _module_file(node.module)) is None or a.name not in _defined(source):
                    faults.append(f"{path.name}:{node.lineno} imports {a.name} from {node.module}, which does not "
                                  "define it")
        defined = {local: _defined(f) for local, dotted in whole.items() if attributes and (f := _module_file(dotted))}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in defined
                    and node.attr not in defined[node.value.id] and not node.attr.startswith("__")):
                faults.append(f"{path.name}:{node.lineno} uses {node.value.id}.{node.attr}, which "
                              f"{whole[node.value.id]} does not define")
    return faults


def test_every_name_is_imported_from_the_module_that_defines_it():
    assert facade_imports([*PACKAGE.rglob("*.py"), *(ROOT / "cli").rglob("*.py")]) == []
    assert facade_imports((ROOT / "tests").rglob("*.py"), attributes=False) == []


def test_the_facade_check_fails_on_a_re_exported_name(tmp_path):
    user = tmp_path / "user.py"
    user.write_text("from bytemtp.model.model import ByteMTP\nfrom bytemtp.data import loader\n")
    assert facade_imports([user]) == []
    user.write_text("from bytemtp.training.train import ByteMTP\n")  # train imports it from model.model
    assert facade_imports([user]) == ["user.py:1 imports ByteMTP from bytemtp.training.train, which does not define it"]
    user.write_text("from bytemtp.training import train\ntrain.ByteMTP\ntrain.train\n")
    assert facade_imports([user]) == ["user.py:2 uses train.ByteMTP, which bytemtp.training.train does not define"]


def test_import_of_the_package_has_no_torch_side_effect():
    import subprocess
    import sys

    code = "import sys, bytemtp, bytemtp.config, bytemtp.config_io, bytemtp.vocab; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_package_list_names_every_subpackage():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in PACKAGE.rglob("__init__.py")}
    assert on_disk <= listed, f"add to pyproject's [tool.setuptools] packages: {sorted(on_disk - listed)}"


README = ROOT / "README.md"


def floor_table(text: str) -> list[tuple[int, str, list[str]]]:
    """The rows of a README's floor table, the first markdown table whose header has a `floor` and
    a `module` column: (line number, floor cell, the backticked `.py` paths of the module cell)."""
    import re

    rows, columns = [], None
    for number, line in enumerate(text.splitlines(), 1):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]] if line.lstrip().startswith("|") else None
        if columns is None:
            header = [c.lower() for c in cells or []]
            if "floor" in header and any("module" in c for c in header):
                columns = header.index("floor"), next(i for i, c in enumerate(header) if "module" in c)
            continue
        if cells is None:
            break
        if set("".join(cells)) <= set("-: "):  # the line under the header
            continue
        floor, module = (cells[i] if i < len(cells) else "" for i in columns)
        rows.append((number, floor, re.findall(r"`([^`\s]+\.py)`", module)))
    return rows


def floor_table_faults(readme: pathlib.Path = README, package: pathlib.Path = PACKAGE,
                       floors: dict[str, int] = FLOOR) -> list[str]:
    """Where the README's floor table and the package disagree: a module of `package` that the
    table leaves out, a module the table names that does not exist, a module on another floor than
    `floors` gives it, a row that names no module, and rows out of the floors' order."""
    on_disk = {p.relative_to(package.parent).as_posix(): name for name, p in _modules(package).items()}
    rows = floor_table(readme.read_text())
    if not rows:
        return [f"{readme.name} has no floor table (a markdown table with a `floor` and a `module` column)"]
    faults, seen, last = [], set(), None
    for number, floor, paths in rows:
        where = f"{readme.name}:{number}"
        if not paths:
            faults.append(f"{where}: a row of the floor table names no module (a backticked path like "
                          f"`{package.name}/decoding/decode.py`)")
            continue
        if not floor.isdigit():
            faults.append(f"{where}: floor {floor!r} of {', '.join(paths)} is not a number")
            continue
        if last is not None and int(floor) < last:
            faults.append(f"{where}: floor {floor} comes after floor {last}; the table goes in FLOOR's order")
        last = int(floor)
        for path in paths:
            if path in seen:
                faults.append(f"{where}: {path} is in the floor table twice")
            seen.add(path)
            if path not in on_disk:
                faults.append(f"{where}: the floor table names {path}, which is not a module of {package.name}/")
                continue
            want = floors.get(_floor_of(on_disk[path]))
            if want != int(floor):
                faults.append(f"{where}: the floor table puts {path} on floor {floor}, FLOOR on "
                              f"{'no floor' if want is None else f'floor {want}'}")
    faults += [f"{path} is missing from {readme.name}'s floor table (floor "
               f"{floors.get(_floor_of(name), '?')})" for path, name in sorted(on_disk.items()) if path not in seen]
    return faults


def test_the_readme_floor_table_names_every_module_on_its_floor():
    assert floor_table_faults() == []


def test_the_floor_table_check_fails_on_a_missing_an_unknown_or_a_misplaced_module(tmp_path):
    pkg = tmp_path / "bytemtp"
    for sub in ("data", "decoding"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
        (pkg / sub / "x.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("")
    floors = {"config": 0, "data": 1, "decoding": 4}
    readme = tmp_path / "README.md"
    rows = ["| 0 | `bytemtp/config.py` | settings |", "| 1 | `bytemtp/data/__init__.py` | the data floor |",
            "| 1 | `bytemtp/data/x.py` | x |", "| 4 | `bytemtp/decoding/__init__.py` | the decoding floor |",
            "| 4 | `bytemtp/decoding/x.py` | x |"]
    table = lambda rows: "# bytemtp\n\nText.\n\n| floor | module | what it holds |\n|---|---|---|\n" + "\n".join(rows) + "\n\nAfter.\n"  # noqa: E731
    readme.write_text(table(rows))
    assert floor_table_faults(readme, pkg, floors) == []
    readme.write_text(table(rows[:2] + rows[3:]))  # data/x.py left out
    assert floor_table_faults(readme, pkg, floors) == ["bytemtp/data/x.py is missing from README.md's floor table (floor 1)"]
    readme.write_text(table(rows + ["| 4 | `bytemtp/decoding/warmth.py` | gone |"]))
    assert floor_table_faults(readme, pkg, floors) == [
        "README.md:12: the floor table names bytemtp/decoding/warmth.py, which is not a module of bytemtp/"]
    readme.write_text(table(rows[:2] + ["| 2 | `bytemtp/data/x.py` | x |"] + rows[3:]))
    assert floor_table_faults(readme, pkg, floors) == ["README.md:9: the floor table puts bytemtp/data/x.py on floor 2, FLOOR on floor 1"]
    readme.write_text(table(rows + ["| 4 | *(to be named)* | head types |"]))
    assert floor_table_faults(readme, pkg, floors) == [
        "README.md:12: a row of the floor table names no module (a backticked path like `bytemtp/decoding/decode.py`)"]
    readme.write_text(table(rows[3:] + rows[:3]))
    assert floor_table_faults(readme, pkg, floors) == ["README.md:9: floor 0 comes after floor 4; the table goes in FLOOR's order"]
    readme.write_text("# bytemtp\n\nNo table.\n")
    assert floor_table_faults(readme, pkg, floors) == [
        "README.md has no floor table (a markdown table with a `floor` and a `module` column)"]


# --- size: limits kept by a test, not by memory ----------------------------------------------------

MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80


def _sources(package: pathlib.Path = PACKAGE, cli: pathlib.Path = ROOT / "cli") -> list[pathlib.Path]:
    return sorted([*package.rglob("*.py"), *cli.rglob("*.py")])


def long_modules(files, limit: int = MAX_MODULE_LINES, root: pathlib.Path = ROOT) -> list[str]:
    """The modules over `limit` lines, each by its path below `root` with its count."""
    return [f"{p.relative_to(root).as_posix()}: {n} lines" for p in files
            if (n := len(p.read_text().splitlines())) > limit]


def long_functions(files, limit: int = MAX_FUNCTION_LINES, root: pathlib.Path = ROOT) -> list[str]:
    """The functions and methods over `limit` lines (decorators left out, docstring in), each by
    its module's path below `root`, its line and its count."""
    faults = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > limit:
                    faults.append(f"{p.relative_to(root).as_posix()}:{node.lineno} {node.name}: {n} lines")
    return faults


def test_no_module_is_over_500_lines():
    assert long_modules(_sources()) == []


def test_no_function_is_over_80_lines():
    assert long_functions(_sources()) == []


def test_the_size_checks_name_what_is_too_long(tmp_path):
    (tmp_path / "pkg").mkdir()
    short, long = tmp_path / "pkg" / "short.py", tmp_path / "pkg" / "long.py"
    short.write_text("def f():\n    return 1\n")
    long.write_text("def g():\n" + "    x = 1\n" * 80 + "\n" * 420)
    assert long_modules([short, long], root=tmp_path) == ["pkg/long.py: 501 lines"]
    assert long_functions([short, long], root=tmp_path) == ["pkg/long.py:1 g: 81 lines"]
