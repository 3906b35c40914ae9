# The two commands of the README: `make run` (install + the main job) and `make test` (install + tests).
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= out/shakespeare-$(shell date +%Y%m%d-%H%M%S)

.PHONY: install run test

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

run: install
	$(VENV)/bin/critbatch run sweeps/examples/shakespeare-char.yaml --output $(OUT)

test: install
	$(PY) -m pytest -q
