"""The seccomp filter program, run through a small classic-BPF interpreter (no kernel involved).

The same filter runs in the real kernel in tests/integration/sandbox/test_sandbox_seccomp.py.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest

from agentrl.tools.sandbox.seccomp import (
    BLOCKED,
    SeccompUnsupported,
    blocked_numbers,
    build_filter,
)

ALLOW, ERRNO_EPERM, KILL = 0x7FFF0000, 0x00050001, 0x80000000
AUDIT = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
# Calls ordinary Python, numpy and subprocess programs make (x86-64 / AArch64 numbers).
ORDINARY = {"x86_64": {"read": 0, "write": 1, "close": 3, "mmap": 9, "munmap": 11, "rt_sigaction": 13,
                       "ioctl": 16, "socket": 41, "connect": 42, "clone": 56, "fork": 57, "vfork": 58,
                       "execve": 59, "wait4": 61, "kill": 62, "futex": 202, "openat": 257, "prlimit64": 302,
                       "getrandom": 318, "clone3": 435, "sched_getaffinity": 204, "madvise": 28},
            "aarch64": {"read": 63, "write": 64, "close": 57, "mmap": 222, "clone": 220, "execve": 221,
                        "openat": 56, "futex": 98, "wait4": 260, "socket": 198, "clone3": 435}}


def run_filter(program: bytes, arch: int, nr: int) -> int:
    """Evaluates a classic BPF seccomp program on ``struct seccomp_data`` {nr, arch}."""
    data = struct.pack("=iI", nr, arch) + bytes(56)
    insns = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        if code == 0x20:  # BPF_LD | BPF_W | BPF_ABS
            acc = struct.unpack_from("=I", data, k)[0]
            pc += 1
        elif code in (0x15, 0x35):  # BPF_JMP | BPF_JEQ / BPF_JGE | BPF_K
            hit = acc == k if code == 0x15 else acc >= k
            pc += 1 + (jt if hit else jf)
        elif code == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected BPF opcode {code:#x} at {pc}")


@pytest.mark.parametrize("machine", ["x86_64", "aarch64"])
def test_blocked_calls_get_eperm_and_ordinary_ones_pass(machine: str) -> None:
    program = build_filter(machine)
    numbers = blocked_numbers(machine)
    assert {"io_uring_setup", "userfaultfd", "keyctl", "ptrace", "mount", "kexec_load", "init_module",
            "bpf", "unshare", "setns"} <= set(numbers)
    for name, nr in numbers.items():
        assert run_filter(program, AUDIT[machine], nr) == ERRNO_EPERM, name
    for name, nr in ORDINARY[machine].items():
        assert run_filter(program, AUDIT[machine], nr) == ALLOW, name
    assert set(numbers.values()).isdisjoint(ORDINARY[machine].values())


def test_other_abis_are_killed() -> None:
    program = build_filter("x86_64")
    assert run_filter(program, 0x40000003, 0) == KILL  # i386 (int 0x80): other numbers
    assert run_filter(program, AUDIT["x86_64"], 0x40000000 + 1) == KILL  # x32 write
    assert run_filter(build_filter("aarch64"), AUDIT["x86_64"], 0) == KILL


def test_unknown_architectures_are_refused_by_name() -> None:
    with pytest.raises(SeccompUnsupported, match="riscv64"):
        build_filter("riscv64")
    assert all(name in BLOCKED for name in blocked_numbers("x86_64"))


@pytest.mark.parametrize(("machine", "header", "pattern"), [
    ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h", r"#define __NR_(\w+)\s+(\d+)"),
    ("aarch64", "/usr/include/asm-generic/unistd.h", r"#define __NR(?:3264)?_(\w+)\s+(\d+)"),
])
def test_numbers_match_the_kernel_headers(machine: str, header: str, pattern: str) -> None:
    path = Path(header)
    if not path.exists():
        pytest.skip(f"{header} not installed (linux-libc-dev)")
    table = {m.group(1): int(m.group(2)) for m in re.finditer(pattern, path.read_text())}
    for name, nr in blocked_numbers(machine).items():
        if name in table:
            assert table[name] == nr, (name, table[name], nr)
