# substrate — developer entry points. `make test` is the README's test command and what CI runs.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: test lint typecheck unit venv system-deps demo sim bench drills docs gen-proto clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

# runsc, nftables, busybox-static, gcc: installed from Debian's packages when run as root.
system-deps:
	bash scripts/system_deps.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check substrate daemons tests examples benchmarks scripts
	$(VENV)/bin/ruff format --check substrate daemons tests examples benchmarks scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy substrate daemons

unit: $(STAMP) system-deps
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The whole suite: lint, types, import boundaries (a test), every test tier.
test: lint typecheck unit

# The main job: install what is missing, start the local stack (`ate up`: gVisor as root with
# runsc, else the fake runtime) unless it is up, and run the counter demo. The stack stays up.
demo: $(STAMP) system-deps
	@$(PY) -m substrate.cli status >/dev/null 2>&1 || $(PY) -m substrate.cli up
	$(PY) examples/counter/demo.py
	@echo "The local stack is still up: '$(VENV)/bin/ate status' shows it, '$(VENV)/bin/ate down' stops it."

sim: $(STAMP)
	$(PY) examples/simulation.py

bench: $(STAMP)
	$(PY) benchmarks/bench_scheduler.py
	$(PY) benchmarks/bench_parking.py

# The six failure drills of issue 7 (each starts its own stack with PostgreSQL and S3),
# then the end-to-end benchmarks; DRILL_ARGS e.g. "--only 1,3 --short". Results: /tmp/substrate-drills.
drills: $(STAMP) system-deps
	$(PY) -m benchmarks.drills --bench $(DRILL_ARGS)

docs: $(STAMP)
	$(PY) scripts/render_lifecycle.py > docs/lifecycle.md
	$(PY) scripts/render_api_docs.py > docs/api.md
	$(PY) scripts/render_cli_docs.py > docs/cli.md

gen-proto: $(STAMP)
	$(PY) scripts/gen_proto.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
