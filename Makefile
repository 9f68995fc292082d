# Everything a fresh machine needs: `make demo` and `make test` create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0
# DESIGN §1: numpy<2 and ml-dtypes 0.5.4 are required by Larq Compute Engine 0.16.
STACK := "numpy<2" "ml-dtypes==0.5.4" tensorflow-cpu==2.21.0 larq-compute-engine==0.16.0
DEMO_RUN ?= runs/demo

.PHONY: install install-dev demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first: the pinned CPU build; a bare `torch` requirement would pull the CUDA wheels.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(STACK) -e ".[dev]"
	touch $@

install: $(VENV)/.installed

install-dev: install

demo: install
	$(BIN)/bnnexport train --out $(DEMO_RUN) --epochs 5
	$(BIN)/bnnexport summary $(DEMO_RUN)

test: install
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) runs build *.egg-info
