# agentrl: the two commands a newcomer runs are `make demo` and `make test` (see README.md).
# Both run scripts/setup.sh first, which is idempotent and fast when nothing changed.
VENV := .venv/bin

.PHONY: setup demo test lint typecheck unit
setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/agentrl render examples/conversation.json --template qwen3

lint: setup
	$(VENV)/ruff check agentrl tools environments tests bench examples

typecheck: setup
	bash scripts/typecheck.sh

unit: setup
	$(VENV)/pytest tests/unit -q

test: lint typecheck
	$(VENV)/pytest tests
