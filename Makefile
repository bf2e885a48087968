# bytemtp: `make test` installs what it needs and runs the tests; `make corpus` builds the
# default corpus offline (`make corpus-shakespeare` the nanoGPT benchmark's); `make bench` measures.
PYTHON ?= python3
TORCH_CPU ?= torch==2.13.0
BYTEMTP = $(PYTHON) -m bytemtp_cli

# `make corpus` prepares the Python standard library source of this interpreter (code, offline);
# `make corpus SRC=path/to/folder NAME=name` prepares your own files into data/corpus/NAME.
NAME ?= stdlib
SRC ?=
STDLIB = $(shell $(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')

DEMO_RUN ?= runs/demo
DEMO_TIME ?= 9m
DEMO_TUNED ?= $(DEMO_RUN)-tuned
DEMO_TUNE_TIME ?= 3m
DEMO_PROMPTS ?= 16

.PHONY: setup test test-quick corpus corpus-poly corpus-induction corpus-shakespeare corpus-speeches demo bench bench-tokens gpu-prep

# Installs into the interpreter that PYTHON names (activate a virtual environment first if you
# want one). A torch that is already importable (a CUDA build, say) is kept; only when there is
# none is $(TORCH_CPU) installed.
setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install --quiet --root-user-action=ignore "$(TORCH_CPU)"
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[dev,harness,hf,serve,parquet,tokens,tensorboard,wandb]'

# The suite runs in one process per core (pytest-xdist); tests that share fitted models stay on one.
test: setup
	$(PYTHON) -m pytest -q -n auto --dist loadgroup

# The inner loop: everything but the slow and the multi-process tests, in under a minute. It installs
# only when this checkout is not the one installed (make setup reinstalls), and keeps pytest's
# rewritten test modules between runs even where PYTHONDONTWRITEBYTECODE is set (half the collection).
INSTALLED_HERE = import pathlib, bytemtp, bytemtp_cli, xdist, hypothesis; \
  assert pathlib.Path(bytemtp_cli.__file__).resolve().parent == pathlib.Path("cli").resolve(); \
  assert pathlib.Path(bytemtp.__file__).resolve().parent == pathlib.Path("bytemtp").resolve()
test-quick:
	@$(PYTHON) -c '$(INSTALLED_HERE)' 2>/dev/null || $(MAKE) setup
	env -u PYTHONDONTWRITEBYTECODE $(PYTHON) -m pytest -q -n auto --dist loadgroup -m "not slow and not distributed"

corpus: setup
ifeq ($(SRC),)
	@if [ -f data/corpus/$(NAME)/manifest.json ]; then \
	  echo "data/corpus/$(NAME) exists (remove it to rebuild)"; $(BYTEMTP) corpus-info data/corpus/$(NAME); \
	else \
	  $(BYTEMTP) prep "$(STDLIB)" --out data/corpus/$(NAME) --include '*.py' --exclude 'site-packages/*' \
	    --name "Python $$($(PYTHON) -c 'import platform; print(platform.python_version())') standard library" \
	    --licence PSF-2.0; \
	fi
else
	$(BYTEMTP) prep "$(SRC)" --out data/corpus/$(NAME)
endif

# The paper's polynomial arithmetic (section 4.2): 200,000 problems of 1 to 5 operations over
# F7[X]/(X^5) in data/corpus/poly; `bytemtp eval-task poly --ckpt RUN` tests 1 to 10.
corpus-poly: setup
	@if [ -f data/corpus/poly/manifest.json ]; then echo "data/corpus/poly exists (remove it to rebuild)"; \
	else $(BYTEMTP) task-corpus poly --out data/corpus/poly --documents 200000; fi

# The paper's induction task (section 4.1): 100,000 short stories whose characters carry made-up
# two-part names, in data/corpus/induction; `bytemtp eval-task induction --ckpt RUN` scores the
# second part of each name at its later mentions.
corpus-induction: setup
	@if [ -f data/corpus/induction/manifest.json ]; then echo "data/corpus/induction exists (remove it to rebuild)"; \
	else $(BYTEMTP) task-corpus induction --out data/corpus/induction --documents 100000; fi

# Tiny Shakespeare with nanoGPT's split (the first 90% of its bytes train, the last 10% val), in
# data/corpus/shakespeare, for the benchmark against nanoGPT. Nothing is downloaded: SHAKESPEARE
# names your copy of the text (nanoGPT's data/shakespeare_char/input.txt, 1,115,394 bytes).
SHAKESPEARE ?= ../shared/data/tinyshakespeare.txt

corpus-shakespeare: setup
	@if [ -f data/corpus/shakespeare/manifest.json ]; then \
	  echo "data/corpus/shakespeare exists (remove it to rebuild)"; \
	elif [ ! -f "$(SHAKESPEARE)" ]; then \
	  echo "no Tiny Shakespeare at $(SHAKESPEARE) (nothing is downloaded): give your copy of nanoGPT's" \
	    "data/shakespeare_char/input.txt with make corpus-shakespeare SHAKESPEARE=path/to/input.txt" >&2; \
	  exit 1; \
	else \
	  $(BYTEMTP) prep "$(SHAKESPEARE)" --out data/corpus/shakespeare --val-tail 0.1 --name "Tiny Shakespeare" \
	    --licence "public domain"; \
	fi

# Tiny Shakespeare as a corpus of short documents: each speech (the text between blank lines) a
# JSONL record, the first 90% of them train and the rest val; for document masking (model.doc_mask).
SPEECHES_SPLIT = import json, sys; t = open(sys.argv[1], encoding="utf-8").read(); \
  s = [x for x in t.split("\n\n") if x.strip()]; n = int(0.9 * len(s)); \
  [open(p, "w").write("".join(json.dumps({"text": x}) + "\n" for x in part)) \
   for p, part in ((sys.argv[2], s[:n]), (sys.argv[3], s[n:]))]
corpus-speeches: setup
	@if [ -f data/corpus/speeches/manifest.json ]; then \
	  echo "data/corpus/speeches exists (remove it to rebuild)"; \
	elif [ ! -f "$(SHAKESPEARE)" ]; then \
	  echo "no Tiny Shakespeare at $(SHAKESPEARE): give it with make corpus-speeches SHAKESPEARE=path/to/input.txt" >&2; \
	  exit 1; \
	else \
	  tmp=$$(mktemp -d) && $(PYTHON) -c '$(SPEECHES_SPLIT)' "$(SHAKESPEARE)" $$tmp/train.jsonl $$tmp/val.jsonl && \
	  $(BYTEMTP) prep $$tmp/train.jsonl --val $$tmp/val.jsonl --out data/corpus/speeches \
	    --name "Tiny Shakespeare, one record a speech" --licence "public domain"; \
	  status=$$?; rm -rf $$tmp; exit $$status; \
	fi

# The main job: the default corpus, the `small` 8-head model trained for nine minutes on two CPU
# cores (its schedule fitted to the time; heads 2-8 fade out over its first quarter), head 1's held-out bits/byte,
# a sample, its draft heads tuned for decoding for 3 minutes (trunk and head 1 frozen, so greedy output does not
# change), and the compiled
# comparison on the tuned heads over held-out prompts, greedy and sampled. Run again to continue an unfinished run (the tune follows it).
demo: setup corpus
	@if ls $(DEMO_RUN)/checkpoints 2>/dev/null | grep -q '^step-'; then \
	  $(BYTEMTP) train --resume $(DEMO_RUN) --time $(DEMO_TIME); \
	else \
	  rm -rf $(DEMO_RUN); \
	  $(BYTEMTP) train --preset small --data data/corpus/$(NAME) --out $(DEMO_RUN) --time $(DEMO_TIME); \
	fi
	@echo "--- what head 1 reached, on the first 102,400 bytes of the val split (each head's bits/byte):"
	$(BYTEMTP) eval --ckpt $(DEMO_RUN) --batches 50
	@echo "--- a sample from $(DEMO_RUN) (temperature 0.5, seed 1, a fixed draft of 4 heads so the seed repeats it):"
	$(BYTEMTP) generate --ckpt $(DEMO_RUN) --prompt "$$(printf 'import os\n\ndef ')" --max-bytes 200 \
	  --temperature 0.5 --top-p 0.95 --seed 1 --draft chain-4 --stats
	@echo "--- heads 2-8 tuned on the model's own greedy text for $(DEMO_TUNE_TIME), into $(DEMO_TUNED):"
	@if ls $(DEMO_TUNED)/checkpoints 2>/dev/null | grep -q '^step-' && \
	  [ -z "$$(find $(DEMO_RUN)/checkpoints -mindepth 1 -maxdepth 1 -newer $(DEMO_TUNED)/run-config.json)" ]; then \
	  echo "$(DEMO_TUNED) is a tune of the newest $(DEMO_RUN) checkpoint already (remove it to tune again)"; \
	else \
	  rm -rf $(DEMO_TUNED); \
	  $(BYTEMTP) tune-heads --ckpt $(DEMO_RUN) --out $(DEMO_TUNED) --time $(DEMO_TUNE_TIME) --report-prompts 8; \
	fi
	@echo "--- the speed, on the compiled decode step, over $(DEMO_PROMPTS) held-out val prompts (256 bytes each): plain"
	@echo "    decoding against the heads alone (auto) and the default (auto+lookup: the heads and prompt-lookup"
	@echo "    drafts), greedy and then sampled, with how repetitive the decoded text is beside the real"
	@echo "    continuations; the first run compiles the step (a few minutes), later ones take it from the cache:"
	$(BYTEMTP) bench decode --ckpt $(DEMO_TUNED) --n-prompts $(DEMO_PROMPTS) --batch-sizes 1 --draft auto,auto+lookup \
	  --compile on
	$(BYTEMTP) bench decode --ckpt $(DEMO_TUNED) --n-prompts $(DEMO_PROMPTS) --batch-sizes 1 --draft auto,auto+lookup \
	  --compile on --temperature 0.8 --top-p 0.95 --seed 1

# Every benchmark in one run (a few minutes on two CPU cores); decode and eval use the
# make demo run, so it comes first when there is none.
bench: setup corpus
	@ls $(DEMO_RUN)/checkpoints 2>/dev/null | grep -q '^step-' || $(MAKE) demo
	$(BYTEMTP) bench all --ckpt $(DEMO_RUN) --data data/corpus/$(NAME) --json bench-all.json

# Bytes against tokens on the default corpus (docs/tokens.md): a byte-level BPE and the same
# model family on its tokens beside the byte model, 9 minutes each and 2 seeds (about 45 minutes
# on two CPU cores); held-out code: click's source, which neither arm trained on.
TOKENS_TIME ?= 9m
TOKENS_SEEDS ?= 2
bench-tokens: setup corpus
	$(BYTEMTP) bench tokens --data data/corpus/$(NAME) --time $(TOKENS_TIME) --seeds $(TOKENS_SEEDS) \
	  --held-out "$$($(PYTHON) -c 'import click, os; print(os.path.dirname(click.__file__))')/*.py" \
	  --held-out-bytes 107666 --out runs/tokens --json bench-tokens.json

# What the GPU-check parts (scripts/gpu/) carry to a GPU machine with no network, into .gpu/
# (git-ignored, under the device's 64 MiB): the project's own wheel with the sha256 of its sources
# (a part refuses a wheel older than its checkout), Python 3.12 wheels of what its image lacks, a tuned
# `small` model (GPU_RUN's, else trained GPU_TRAIN_TIME and tuned GPU_TUNE_TIME on the default
# corpus) and held-out code prompts cut from click's source (docs/benchmarks.md).
GPU_RUN ?=
GPU_TRAIN_TIME ?= 4m
GPU_TUNE_TIME ?= 2m
gpu-prep: setup
	$(PYTHON) scripts/gpu/prepare.py $(if $(GPU_RUN),--run $(GPU_RUN)) --train-time $(GPU_TRAIN_TIME) \
	  --tune-time $(GPU_TUNE_TIME)
