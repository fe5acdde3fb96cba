# gpuserve: the two commands a newcomer needs are `make demo` and `make test`.
# Both do all set-up themselves on a fresh Debian/Ubuntu machine (run as root).

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup lab-deps demo test unit lab lint clean-lab

# Python side: a venv with gpuserve (editable) and its test tools.
$(STAMP): pyproject.toml
	@$(PYTHON) -m venv --help >/dev/null 2>&1 && $(PYTHON) -c 'import ensurepip' 2>/dev/null || \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

# System side: qemu, debootstrap, grub tools ... (installed with apt when missing).
lab-deps: setup
	$(BIN)/python -m lab deps

lint: setup
	$(BIN)/ruff check .

unit: setup
	$(BIN)/pytest -m "not lab"

lab: lab-deps
	$(BIN)/pytest -m lab

# Everything CI runs: lint, then the unit tier and the lab tier side by side. The lab
# tier is bound by its one emulated CPU (QEMU TCG), which leaves the machine's other core
# mostly idle: the unit tier runs there, niced so the guest keeps its core, its output
# kept in a log that is printed once both are done (a background job ignores Ctrl-C,
# so an interrupted run stops it by hand: the trap). The lab's disk image (debootstrap
# and dpkg, minutes on a fresh machine) is built first, beside the unit tier.
# (The unit tier stays on one core: under pytest-xdist a worker was lost near the end of
# the run, at a different test each time, 2 of 3 runs; not understood yet.)
test: lab-deps
	$(BIN)/ruff check .
	@nice -n 10 $(BIN)/pytest -m "not lab" -p no:cacheprovider >$(VENV)/unit.log 2>&1 & unit=$$!; \
	trap 'kill $$unit 2>/dev/null; tail -n 20 $(VENV)/unit.log; exit 130' INT TERM HUP; \
	echo "the unit tier runs beside the lab tier (log: $(VENV)/unit.log)"; \
	lab=1; if $(BIN)/python -m lab image; then $(BIN)/pytest -m lab --durations=60; lab=$$?; fi; \
	echo "waiting for the unit tier"; wait $$unit; unit=$$?; \
	echo "=== unit tier (exit $$unit) ==="; cat $(VENV)/unit.log; \
	echo "=== lab tier: exit $$lab, unit tier: exit $$unit ==="; \
	[ $$unit -eq 0 ] && [ $$lab -eq 0 ]

# Boot the lab host and serve on it, ending with the smoke completion line.
demo: lab-deps
	$(BIN)/python -m lab up
	$(BIN)/pyinfra -y inventory/lab.py deploy/serve.py

clean-lab: setup
	$(BIN)/python -m lab down --all
