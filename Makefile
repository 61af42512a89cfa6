# The README's two commands: `make demo` and `make test`. Both do all set-up on a fresh machine.
.PHONY: setup demo test test-unit contract lint bench docs base-image clean-images fuzz fuzz-mutants

VENV := .venv
BIN := $(VENV)/bin

setup:
	@bash scripts/setup-host.sh

base-image:
	@bash images/base/make-base-images.sh

demo: setup
	@bash scripts/demo.sh

test: setup
	@bash scripts/run-tests.sh

# lanectl and the stub engine held to vLLM's own code: the pin (0.31.0, into .contract-venv/ once), or another
# release with VLLM=0.32.0 (into .contract-venv-0.32.0/).
contract:
	@VLLM=$(VLLM) bash scripts/contract.sh

# The pure core only: no Docker, no network.
test-unit:
	$(BIN)/pytest -q -m "not docker and not network"

# The stateful fuzzers (tests/test_*fuzz*.py) with the long profile: thousands of sequences, not CI's hundred.
fuzz:
	HYPOTHESIS_PROFILE=long $(BIN)/pytest -q -p no:cacheprovider tests -k fuzz

# Each runtime check of the switch's executor removed in turn: the fuzzer must fail without it.
fuzz-mutants:
	@bash scripts/fuzz-mutants.sh

lint:
	$(BIN)/ruff check lanectl tests benchmarks images/stub-engine
	$(BIN)/mypy

# Every benchmark, or ONLY=name[,name]: each writes its section of benchmarks/RESULTS.md (benchmarks/run_all.py).
bench: setup
	$(BIN)/python benchmarks/run_all.py --only "$(ONLY)"

# The docs site (docs/, mkdocs.yml) into site/, strict: a broken link or a page missing from the nav fails it.
docs:
	@bash scripts/docs.sh

# Removes every image lanectl built (not the base images).
clean-images:
	docker images --filter label=io.lanectl.lane -q | sort -u | xargs -r docker rmi -f
