# The two commands of the README: `make run` (install + the main job) and `make test` (install + tests).
# Installs are pinned by constraints.txt (every package's exact version); `make lock` refreshes it.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out/shakespeare-$(shell date +%Y%m%d-%H%M%S)
# The index for the torch wheel alone. Default: the PyTorch project's CPU-only index where this
# machine reaches it within 10 s, else pip's usual indexes (and find-links, where pip is set up with
# them); `make install` says which it used. Set TORCH_INDEX=URL to choose one.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# ADDRESS=host:port: the Ray cluster `make run` sweeps on (`critbatch run --address`); unset, Ray starts in-process.
ADDRESS ?=
# UI_PORT: the port of `make ui` (`critbatch ui --port`); unset, critbatch's default, 5000.
UI_PORT ?=

.PHONY: install run ui test check lock

# torch first, pinned to 2.13.0 so pip takes no newer torch. Which build that is depends on the index:
# PyPI's Linux x86_64 wheel of 2.13.0 is the CUDA 13 build (it pulls multi-GB nvidia-*/cuda-* wheels);
# the CPU-only build 2.13.0+cpu comes from the CPU-only index (tried first, below) or from a local
# wheel cache (as on this project's machines, where that index is not reachable); pip ranks
# 2.13.0+cpu above 2.13.0 where both are. The install's last torch line says which build was installed.
# (Comments stand outside the recipes: make echoes a recipe's comment lines.)
$(VENV)/.installed: pyproject.toml constraints.txt
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@index="$(TORCH_INDEX)"; \
	if [ -z "$$index" ] && $(PY) -c "import urllib.request; urllib.request.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" 2>/dev/null; then \
	  index="$(TORCH_CPU_INDEX)"; fi; \
	if [ -n "$$index" ]; then \
	  echo "torch==2.13.0 from $$index"; \
	  $(PY) -m pip install -q -c constraints.txt --no-deps --index-url "$$index" torch==2.13.0; \
	else \
	  echo "torch==2.13.0 from pip's default indexes: $(TORCH_CPU_INDEX) is not reachable from here"; \
	  $(PY) -m pip install -q -c constraints.txt torch==2.13.0; \
	fi; \
	$(PY) -W ignore -c "import torch; print('installed torch', torch.__version__, '(CUDA build)' if torch.version.cuda else '(CPU-only build)')"
	$(PY) -m pip install -q -c constraints.txt -e '.[sweep,service,test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/critbatch run sweeps/examples/shakespeare-char.yaml --output $(OUT)$(if $(ADDRESS), --address $(ADDRESS))

# The MLflow UI over the runs `make run` wrote (./mlflow.db): it prints the address of the sweep's runs table.
ui: install
	$(VENV)/bin/critbatch ui$(if $(UI_PORT), --port $(UI_PORT))

# The whole suite, once: the fast checks (`make check`, which runs the tests not marked slow), then the slow ones.
test: check
	$(PY) -m pytest -q -m slow

# The fast checks: format and lint (ruff), types (pyright, pyproject.toml's [tool.pyright]),
# the import rules and size caps, then the tests not marked slow.
check: install
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pyright --pythonpath $(PY)
	$(PY) -m pytest -q tests/test_layering.py
	$(PY) -m pytest -q -m "not slow"

# constraints.txt anew from what is installed in $(VENV) now (pip freeze, less the editable critbatch,
# pip, setuptools, wheel and local version suffixes like torch's +cpu), its header comment kept.
# Rewritten only when something changed; then the venv is what the lock says, so it is not reinstalled.
lock:
	@test -x $(PY) || { echo "make lock: no $(PY); run make install first" >&2; exit 1; }
	$(PY) -m pip freeze --exclude-editable > $(VENV)/freeze.txt
	sed '/^[^#]/,$$d' constraints.txt > $(VENV)/constraints.new
	grep -v -i -E '^(critbatch|pip|setuptools|wheel)([=<>~!@ ]|$$)' $(VENV)/freeze.txt \
	  | sed -E 's/^([^ =]+==[^+ ]+)\+[^ ]+$$/\1/' >> $(VENV)/constraints.new
	rm -f $(VENV)/freeze.txt
	if cmp -s $(VENV)/constraints.new constraints.txt; then rm $(VENV)/constraints.new; echo "constraints.txt: unchanged"; \
	else mv $(VENV)/constraints.new constraints.txt && touch -c $(VENV)/.installed && echo "constraints.txt: rewritten"; fi
