"""The megatron-core train backend: Hugging Face Qwen3 models (dense and mixture-of-experts) with tensor,
pipeline, data and expert parallelism, and rollout routing replay.

Importing this package needs no megatron-core; building a model does (``scripts/setup`` installs
it). Everything device-specific goes through :mod:`agentrl.train.device`; on a CPU-only machine
megatron-core needs a test-only shim (see the tests), so CPU use is for tests.
"""

import lazy_loader

# The names are listed in __init__.pyi; each submodule is imported on first use, so importing a
# config module does not pull in torch or Ray.
__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
