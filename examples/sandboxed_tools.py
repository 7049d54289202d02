"""Tools and the code sandbox, end to end: define a tool, look at its schema, run model-style calls.

    python examples/sandboxed_tools.py [--backend bwrap|docker|local]

1. ``@tool`` turns a typed, documented function into a tool whose JSON schema the chat templates
   list unchanged.
2. ``create_sandbox`` starts a warm pool (bubblewrap by default) and reports which limits this
   machine enforces.
3. The ``python`` tool runs code in that pool; failures come back as values with a kind.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from agentrl.tools import PythonTool, tool
from agentrl.tools.sandbox import create_sandbox


@tool(timeout_s=5)
def unit_price(total: float, quantity: int) -> float:
    """Price of one item.

    Args:
        total: What all items cost together.
        quantity: How many items there are.
    """
    return round(total / quantity, 4)


async def main(backend: str) -> None:
    print(json.dumps(unit_price.schema(), indent=2))
    print(await unit_price(total=12.5, quantity=5))           # content "2.5"
    print(await unit_price(total=12.5))                        # missing_required_argument
    print(await unit_price(total=12.5, quantity=0))            # tool_error: ZeroDivisionError

    async with create_sandbox(backend, timeout_s=3, memory_mb=256, pool_size=2) as sandbox:
        for name, how in sandbox.capabilities().enforced.items():
            print(f"{name:>18}: {how}")
        python = PythonTool(sandbox, max_output_chars=500)    # shares the pool; we close it
        calls = [
            "import math\nmath.comb(10, 3)",                   # last expression is printed: 120
            "print('partial')\n1 / 0",                          # stdout kept, traceback in [stderr]
            "import time\ntime.sleep(10)",                      # tool_timeout after 3 s
            "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=1)",  # no network
        ]
        results = await asyncio.gather(*(python(code=code) for code in calls))  # run concurrently
        for code, result in zip(calls, results, strict=True):
            kind = result.error_kind.value if result.error_kind else "ok"
            print(f"--- {code.splitlines()[-1]!r} -> {kind}\n{result.content}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", default="bwrap", choices=["bwrap", "docker", "local"])
    asyncio.run(main(parser.parse_args().backend))
