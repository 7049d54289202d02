"""Subprocess entry point that starts sglang-router with any policy of its core.

``consistent_hashing`` and ``prefix_hash`` exist in sglang-router 0.3.2's core but are not choices of
its command line, so this entry parses the ordinary router arguments and sets the policy through
the Python launch API. Usage (by :class:`agentrl.rollout.router.Router`)::

    python -m agentrl.rollout._router_entry --policy-override consistent_hashing <router cli args>
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    from sglang_router.launch_router import launch_router, parse_router_args

    policy: str | None = None
    if "--policy-override" in argv:
        i = argv.index("--policy-override")
        policy = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    args = parse_router_args(argv)
    if policy is not None:
        args.policy = policy
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
