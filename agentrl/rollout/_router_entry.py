"""Subprocess entry point that starts sglang-router with any policy of its core.

``consistent_hashing`` and ``prefix_hash`` exist in sglang-router 0.3.2's core but are not choices of
its command line, so this entry parses the ordinary router arguments and sets the policy (every
policy, for one code path) through the Python API. It also avoids ``sglang_router.launch_router``, whose module imports all of SGLang
(about 12 s of start-up) when SGLang is installed. Usage (by :class:`agentrl.rollout.router.Router`)::

    python -m agentrl.rollout._router_entry --policy-override consistent_hashing <router cli args>
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> None:
    import argparse

    from sglang_router.router import Router
    from sglang_router.router_args import RouterArgs

    i = argv.index("--policy-override") if "--policy-override" in argv else -1
    if i < 0 or i + 1 >= len(argv):
        raise SystemExit("agentrl-router: expected --policy-override POLICY before the router arguments")
    policy = argv[i + 1]
    argv = argv[:i] + argv[i + 2:]
    parser = argparse.ArgumentParser(prog="agentrl-router")
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    args = RouterArgs.from_cli_args(parser.parse_args(argv), use_router_prefix=False)
    args.policy = policy
    args._validate_router_args()
    Router.from_args(args).start()


if __name__ == "__main__":
    main(sys.argv[1:])
