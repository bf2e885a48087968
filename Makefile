# bytemtp: `make test` installs what it needs and runs the tests; `make bench` measures.
PYTHON ?= python3
TORCH_CPU ?= torch==2.13.0

.PHONY: setup test bench

# Installs into the interpreter that PYTHON names (activate a virtual environment first if you
# want one). A torch that is already importable (a CUDA build, say) is kept; only when there is
# none is $(TORCH_CPU) installed.
setup:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install --quiet --root-user-action=ignore "$(TORCH_CPU)"
	$(PYTHON) -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -e '.[dev]'

test: setup
	$(PYTHON) -m pytest -q

bench: setup
	$(PYTHON) -m bytemtp_cli bench train-step --preset small --json bench-train-step.json
