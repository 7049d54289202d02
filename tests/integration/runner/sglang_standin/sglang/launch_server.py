"""Stand-in for ``python -m sglang.launch_server``: records the command line and the device
environment it was started with (``$AGENTRL_STANDIN_RECORD/<port>.json``), then serves as a fake
SGLang worker on ``--host``/``--port`` so the launcher's health check and the router accept it.

The launcher runs for real up to this process: the engine host actor, ``SGLangEngine.launch`` and
``ManagedProcess`` build the same command and environment as for SGLang itself.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from aiohttp import web

from agentrl.testing.fake_worker import FakeWorker, FakeWorkerState

DEVICE_VARS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES")


def main() -> None:
    argv = sys.argv[1:]
    host, port = argv[argv.index("--host") + 1], int(argv[argv.index("--port") + 1])
    record = Path(os.environ["AGENTRL_STANDIN_RECORD"]) / f"{port}.json"
    record.write_text(json.dumps({"argv": argv, "env": {k: os.environ.get(k) for k in DEVICE_VARS},
                                  "pid": os.getpid(), "host": host, "port": port}))
    web.run_app(FakeWorker(FakeWorkerState(name=str(port))).app(), host=host, port=port, access_log=None, print=None)


if __name__ == "__main__":
    main()
