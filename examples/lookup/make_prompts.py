"""Builds lookup-edit.jsonl and lookup-code.jsonl here from held-out third-party code (click, tqdm,
attrs, certifi: not in the stdlib training corpus): `python examples/lookup/make_prompts.py
examples/lookup`. Edit-like prompts hold a function, then start it again renamed (`name_v2`), so a
greedy answer repeats much of it; code prompts are the first half of other functions."""
import ast
import json
import pathlib
import sys
import textwrap

import click

site = pathlib.Path(click.__file__).parent.parent  # the site-packages that hold click, tqdm, attrs, certifi
files = ["click/utils.py", "click/formatting.py", "tqdm/utils.py", "attr/_make.py", "certifi/core.py",
         "click/termui.py", "tqdm/std.py", "click/parser.py"]
picked, seen = [], set()
for f in files:
    src = (site / f).read_text()
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.FunctionDef) and node.name not in seen:
            seg = ast.get_source_segment(src, node, padded=True)
            seg = seg and textwrap.dedent(seg)
            if seg and 150 <= len(seg) <= 450 and not seg.startswith("@"):
                seen.add(node.name)
                picked.append((f, node.name, seg))
print(len(picked), file=sys.stderr)
out = pathlib.Path(sys.argv[1])
with open(out / "lookup-edit.jsonl", "w") as e, open(out / "lookup-code.jsonl", "w") as c:
    for f, name, seg in picked[:16]:
        header = seg.partition("\n")[0]
        renamed = header.replace(f"def {name}(", f"def {name}_v2(", 1)
        e.write(json.dumps({"prompt": f"{seg}\n\n{renamed}\n", "source": f"{f}:{name}"}) + "\n")
    for f, name, seg in picked[16:32]:
        c.write(json.dumps({"prompt": seg[:len(seg) // 2], "source": f"{f}:{name}"}) + "\n")
