# Everything a fresh machine needs: `make demo` and `make test` create .venv and install into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_PIN := torch==2.13.0
# docs/LCE_NOTES.md "Dependency stack": numpy<2 and ml-dtypes 0.5.4 are required by Larq Compute Engine 0.16.
STACK := "numpy<2" "ml-dtypes==0.5.4" tensorflow-cpu==2.21.0 larq-compute-engine==0.16.0
DEMO_RUN ?= runs/demo

.PHONY: install install-dev demo test test-quick test-all lint clean ssh-tools device-tools

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# torch first: the pinned CPU build; a bare `torch` requirement would pull the CUDA wheels.
# The real BNN libraries tests/converters/normalize/test_real_clients.py converts. --no-deps: bitorch 0.4.1 and
# Brevitas 0.13.4 would otherwise pull an older torch / downgrade setuptools (<81); their few
# pure-Python dependencies are listed by hand (bitorch imports pandas; Brevitas needs
# dependencies and unfoldNd, and onnxoptimizer for export_qonnx).
CLIENTS := bitorch==0.4.1 brevitas==0.13.4 dependencies==2.0.1 unfoldNd==0.2.3 onnxoptimizer==0.4.2
CLIENT_DEPS := "pandas==2.2.3" sympy

$(VENV)/.installed: $(BIN)/python pyproject.toml Makefile
	$(BIN)/pip install -q $(TORCH_PIN)
	$(BIN)/pip install -q $(STACK) -e ".[dev]"
	$(BIN)/pip install -q "numpy<2" $(CLIENT_DEPS)
	$(BIN)/pip install -q --no-deps $(CLIENTS)
	touch $@

install: $(VENV)/.installed

install-dev: install

# train -> verify -> pack -> export -> convert --target arm64 -> bench on the host; ends with the
# bench table and the path of report.md. --force: every `make demo` starts the run afresh.
demo: install
	$(BIN)/bnnexport pipeline --out $(DEMO_RUN) --force

# The device tests start a real sshd on 127.0.0.1. CI starts as root on a bare Debian machine, so
# install OpenSSH from the Debian packages when it is missing (idempotent: nothing to do after).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
ssh-tools:
	@if ! command -v ssh >/dev/null 2>&1 || { ! command -v sshd >/dev/null 2>&1 && \
	    ! test -x /usr/sbin/sshd; }; then \
		echo "installing openssh-server and openssh-client for the device tests"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		$(SUDO) apt-get install -y -qq openssh-server openssh-client >/dev/null \
		|| echo "could not install OpenSSH: the SSH device tests will be skipped"; \
	fi

# The emulated aarch64 device (tests/support/aarch64_device.py, docs/LCE_NOTES.md "aarch64 device") is built from these Debian
# packages; installed once, nothing to do after. Without them the aarch64 tests skip, saying why.
DEVICE_TOOLS := qemu-user-static binfmt-support arch-test mmdebstrap
device-tools:
	@if ! command -v mmdebstrap >/dev/null 2>&1 || ! command -v arch-test >/dev/null 2>&1 || \
	    ! command -v update-binfmts >/dev/null 2>&1 || \
	    ! command -v qemu-aarch64-static >/dev/null 2>&1; then \
		echo "installing $(DEVICE_TOOLS) for the emulated aarch64 device"; \
		$(SUDO) apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
		$(SUDO) apt-get install -y -qq $(DEVICE_TOOLS) >/dev/null \
		|| echo "could not install $(DEVICE_TOOLS): the aarch64 device tests will be skipped"; \
	fi

# `make test`: the suite without the tests marked `long` (full-size conversions, minutes in all);
# `make test-all`: everything. `make test-quick`: neither `slow` nor `long` (no training, no
# conversion through TensorFlow), the loop to run while editing.
# Tests run in two worker processes (pytest-xdist; a test file stays on one worker, so its module
# fixtures are built once), each with one thread per library: a second OpenMP thread per worker
# only contends for the same two cores (on a busy 2-core machine a training step took 10x longer).
PYTEST := OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2 --dist loadfile

# The device tests run LCE's real aarch64 lce_benchmark_model on the emulated device where this
# checkout has it beside it (CI clones the repository with ../shared next to it; a user's clone
# has none, and the tests then run the stand-in). A value of your own wins:
# `make test BNNEXPORT_LCE_BENCHMARK_AARCH64=/path/to/lce_benchmark_model_aarch64`. The test
# session's header says which tool ran.
SHARED ?= ../shared
export BNNEXPORT_LCE_BENCHMARK_AARCH64 ?= $(abspath $(wildcard $(SHARED)/tools/lce_benchmark_model_aarch64))

test-quick: install
	$(PYTEST) -m "not slow and not long"

test: install ssh-tools device-tools
	$(PYTEST) -m "not long"

test-all: install ssh-tools device-tools
	$(PYTEST)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) runs build *.egg-info
