"""Nothing survives from one execution to the next, on real bwrap and real Docker pools.

Every test runs an attacker and then a victim on a pool of ONE worker (so both land in the same
warm worker or container). The victim (``sandbox_state.VICTIM``) prints a description of the
sandbox it finds; it must equal the victim's output on a brand-new pool. The squatting cases check
that the victim gets the memory and the ``/tmp``/``/dev/shm`` space its limits promise; the
property test does the same after random attackers.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from sandbox_state import ACTIONS, MQ_NAMES, SYSV_KEYS, attacker, random_attacker, victim

from agentrl.tools.sandbox import Sandbox, create_sandbox
from agentrl.tools.sandbox.base import SCOPES, WORKER_SOURCE
from agentrl.tools.sandbox.bwrap import BwrapSandbox
from agentrl.tools.sandbox.docker import DockerSandbox
from agentrl.tools.sandbox.seccomp import blocked_numbers

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.asyncio(loop_scope="module")]

LIMITS: dict[str, Any] = {"timeout_s": 10.0, "cpu_s": 8, "memory_mb": 128, "tmp_mb": 32, "max_processes": 32}
NUMBERS = blocked_numbers()
VICTIM = victim(memory_mb=96, fill_mb=28, keyctl_nr=NUMBERS["keyctl"])
PROPERTY_RUNS = {"bwrap": 24, "docker": 10}
SEED = int(os.environ.get("AGENTRL_SANDBOX_SEED", "20240611"))


def _options(request: pytest.FixtureRequest, backend: str) -> dict[str, Any]:
    options = dict(LIMITS, pool_size=1)
    if backend == "docker":
        options["docker_host"] = request.getfixturevalue("docker_host")
    return options


async def _pristine(backend: str, options: dict[str, Any]) -> str:
    """The victim's output on a brand-new pool."""
    async with create_sandbox(backend, **options) as fresh:
        result = await fresh.run(VICTIM)
    assert result.ok, result
    return result.stdout


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["bwrap", "docker"])
async def pool(request: pytest.FixtureRequest) -> AsyncIterator[tuple[Sandbox, str]]:
    """A pool of one worker shared by the module's tests, and the victim's pristine output."""
    options = _options(request, request.param)
    pristine = await _pristine(request.param, options)
    sandbox = create_sandbox(request.param, **options)
    await sandbox.start()
    yield sandbox, pristine
    await sandbox.close()


async def attack_then_check(pool: tuple[Sandbox, str], code: str) -> Any:
    sandbox, pristine = pool
    worker_hash = WORKER_SOURCE.read_bytes()
    attack = await sandbox.run(code)
    after = await sandbox.run(VICTIM)
    assert after.ok, after
    assert json.loads(after.stdout) == json.loads(pristine), _diff(pristine, after.stdout)
    assert WORKER_SOURCE.read_bytes() == worker_hash
    return attack


def _diff(pristine: str, seen: str) -> str:
    a, b = json.loads(pristine), json.loads(seen)
    return "victim differs from a fresh pool: " + repr({k: (a.get(k), b.get(k)) for k in set(a) | set(b)
                                                        if a.get(k) != b.get(k)})


def _code(*actions: str, mb: int = 4) -> str:
    return attacker(list(actions), n=0, key=SYSV_KEYS[0], mq=MQ_NAMES[0], mb=mb, add_key_nr=NUMBERS["add_key"])


@pytest.mark.parametrize("action", sorted(ACTIONS))
async def test_victim_sees_a_pristine_sandbox_after(pool: tuple[Sandbox, str], action: str) -> None:
    attack = await attack_then_check(pool, _code(action))
    assert attack.exit_code == 0 and not attack.timed_out, attack


async def test_fake_shell_and_preload_cannot_reach_the_next_call(pool: tuple[Sandbox, str]) -> None:
    """The root, /bin, /lib and /etc are read-only: no fake programs, no ld.so.preload."""
    attack = await attack_then_check(pool, _code("replace_bin", "ld_preload", "root_files"))
    assert attack.stdout.strip() == "0", attack  # not one of those writes succeeded
    sandbox, _ = pool
    follow = await sandbox.run("echo $((1 + 1)); ls / >/dev/null && echo ls-ok", language="bash")
    assert follow.stdout == "2\nls-ok\n", follow


async def test_memory_squatting_leaves_the_victim_its_own_limit(pool: tuple[Sandbox, str]) -> None:
    """Full /tmp and /dev/shm (hidden under mode 000), 48 MiB of SysV shared memory, message queues:
    on top of the victim's 96 MiB this would exceed the 160 MiB group, were any of it left."""
    code = _code("chmod_dirs", "fill_tmp", "sysv_shm", "sysv_sem_msg", "posix_mq", mb=48)
    attack = await attack_then_check(pool, code)
    assert int(attack.stdout) >= 5, attack  # the writes, the segment, the IPC objects all happened


async def test_disk_squatting_leaves_the_victim_its_own_space(pool: tuple[Sandbox, str]) -> None:
    """/tmp and /dev/shm filled to the last byte from folders the attacker then locked (000, 500)."""
    code = _code("chmod_dirs", "fill_tmp", "chmod_files", "chmod_tmp", mb=31)
    await attack_then_check(pool, code)


async def test_ipc_objects_do_not_reach_the_next_call(pool: tuple[Sandbox, str]) -> None:
    code = _code("sysv_shm", "sysv_sem_msg", "posix_mq", "keyring", mb=1)
    attack = await attack_then_check(pool, code)
    assert int(attack.stdout) >= 4, attack  # shm, sem, msg and the queue were created; the key was not


async def test_forged_exception_is_only_a_claim(pool: tuple[Sandbox, str]) -> None:
    sandbox, _ = pool
    forged = await sandbox.run("import os\nos.write(3, b'ZeroDivisionError')\nprint('fine')")
    assert forged.ok and forged.exit_code == 0 and forged.claimed_exception is None, forged
    assert forged.killed_reason is None and not forged.timed_out
    claimed = await sandbox.run("import os\nos.write(3, b'Forged')\nos._exit(1)")
    assert claimed.claimed_exception == "Forged" and claimed.exit_code == 1 and not claimed.ok, claimed
    # The set-up channels (request and ready pipes, fds 4 and 5) are closed before the code runs.
    probe = await sandbox.run("import os\nfor fd in (4, 5, 6):\n    try:\n        os.write(fd, b'G')\n"
                              "        print(fd, 'open')\n    except OSError as e:\n        print(fd, e.errno)")
    assert probe.stdout.split() == ["4", "9", "5", "9", "6", "9"], probe  # EBADF for each
    real = await sandbox.run("1 / 0")
    assert real.claimed_exception == "ZeroDivisionError" and real.exit_code == 1, real


async def test_a_memory_kill_retires_the_worker(pool: tuple[Sandbox, str]) -> None:
    sandbox, pristine = pool
    before = _identity(sandbox)
    killed = await sandbox.run("chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))")
    assert killed.killed_reason == "memory", killed
    after = await sandbox.run(VICTIM)
    assert json.loads(after.stdout) == json.loads(pristine), _diff(pristine, after.stdout)
    assert _identity(sandbox) != before  # a new worker (or container) served the victim


async def test_property_random_attackers_leave_nothing(pool: tuple[Sandbox, str]) -> None:
    sandbox, _ = pool
    rng = random.Random(SEED + (0 if isinstance(sandbox, BwrapSandbox) else 1))
    for n in range(PROPERTY_RUNS[sandbox.backend]):
        actions, code = random_attacker(rng, n, NUMBERS["add_key"])
        try:
            await attack_then_check(pool, code)
        except AssertionError as exc:
            raise AssertionError(f"attacker {n} (seed {SEED}) doing {actions}: {exc}") from exc


SCOPE_CONTRACT = {
    "bwrap": {"tmp": "execution", "dev_shm": "execution", "mounts": "execution", "ipc": "execution",
              "network": "worker", "processes": "execution", "keyrings": "execution", "interpreter": "execution",
              "root_filesystem": "worker", "cgroup": "worker", "worker_program": "pool", "usr": "host"},
    "docker": {"tmp": "worker", "dev_shm": "worker", "ipc": "worker", "network": "worker", "processes": "worker",
               "keyrings": "execution", "root_filesystem": "worker", "cgroup": "worker", "image": "pool"},
}


async def test_capabilities_say_what_lives_how_long(pool: tuple[Sandbox, str]) -> None:
    sandbox, _ = pool
    caps = sandbox.capabilities()
    assert all(value.split(":", 1)[0] in SCOPES for value in caps.scopes.values()), caps.scopes
    contract = SCOPE_CONTRACT[sandbox.backend]
    assert {key: caps.scope(key) for key in contract} == contract
    with pytest.raises(KeyError, match="no entry 'nonexistent'"):
        caps.scope("nonexistent")


def _identity(sandbox: Sandbox) -> frozenset[Any]:
    if isinstance(sandbox, BwrapSandbox):
        return frozenset(sandbox.worker_pids())
    assert isinstance(sandbox, DockerSandbox)
    return frozenset(sandbox.container_ids())


DEEP_TREE = """import os
os.chdir("/tmp")
for i in range(100):
    os.mkdir("d")
    os.chdir("d")
open("bottom", "w").write("secret")
os.chmod(".", 0)
print("deep")
"""


async def test_a_container_that_cannot_be_emptied_is_replaced(pool: tuple[Sandbox, str]) -> None:
    """A tree deeper than the reset descends: the reset cannot verify /tmp empty, so the container
    is replaced rather than handed to the next call (bwrap: a fresh /tmp anyway)."""
    sandbox, pristine = pool
    before = _identity(sandbox)
    attack = await sandbox.run(DEEP_TREE)
    assert attack.stdout == "deep\n", attack
    after = await sandbox.run(VICTIM)
    assert json.loads(after.stdout) == json.loads(pristine), _diff(pristine, after.stdout)
    if isinstance(sandbox, DockerSandbox):
        assert _identity(sandbox) != before
        assert any("/tmp still holds" in reason for reason in sandbox.retired), sandbox.retired
    else:
        assert _identity(sandbox) == before  # nothing to clean: the worker serves on
