"""The seccomp filter the sandbox worker installs in every execution's process, as classic BPF.

The filter is built here, in pure Python, for the machine's own architecture (x86-64 or AArch64;
the sandbox runs on the host's kernel) and handed to the worker program as base64 on its command
line; the worker loads it with ``prctl(PR_SET_SECCOMP)`` after it has set up the execution's
namespaces and mounts, right before the program's code runs. No library (libseccomp) is needed.

Policy: allow everything except :data:`BLOCKED`, which fail with ``EPERM``: kernel surfaces an
ordinary Python, numpy or subprocess program never uses (io_uring, userfaultfd, keyrings, ptrace
and cross-process memory access, every mount and namespace call, kernel modules and kexec, bpf,
perf events, swap, reboot, clock setting, ...). A system call made through another ABI than the
native one (x32 numbers on x86-64, or the 32-bit ``int 0x80`` entry) kills the process: its numbers
differ and the list above would not apply to them.
"""

from __future__ import annotations

import base64
import platform
import struct

__all__ = ["BLOCKED", "SeccompUnsupported", "blocked_numbers", "build_filter", "filter_b64"]

# Syscall numbers: x86-64 from asm/unistd_64.h; AArch64 uses the generic table (asm-generic/unistd.h).
_NUMBERS: dict[str, tuple[int | None, int | None]] = {
    # name: (x86_64, aarch64)
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "userfaultfd": (323, 282),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41), "chroot": (161, 51),
    "move_mount": (429, 429), "open_tree": (428, 428), "fsopen": (430, 430), "fsconfig": (431, 431),
    "fsmount": (432, 432), "fspick": (433, 433), "mount_setattr": (442, 442),
    "unshare": (272, 97), "setns": (308, 268),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "create_module": (174, None), "get_kernel_syms": (177, None), "query_module": (178, None),
    "bpf": (321, 280), "perf_event_open": (298, 241), "fanotify_init": (300, 262),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89),
    "quotactl": (179, 60), "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "lookup_dcookie": (212, 18), "nfsservctl": (180, 42), "syslog": (103, 116), "vhangup": (153, 58),
    "clock_settime": (227, 112), "settimeofday": (164, 170),
    "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None), "_sysctl": (156, None),
}
BLOCKED: tuple[str, ...] = tuple(sorted(_NUMBERS))
"""The system calls that fail with ``EPERM`` inside an execution (those the architecture has)."""

_ARCHES = {"x86_64": (0, 0xC000003E), "amd64": (0, 0xC000003E), "aarch64": (1, 0xC00000B7), "arm64": (1, 0xC00000B7)}
X32_SYSCALL_BIT = 0x40000000

# classic BPF opcodes and seccomp return values (linux/filter.h, linux/seccomp.h)
BPF_LD_W_ABS = 0x20
BPF_JEQ_K = 0x15
BPF_JGE_K = 0x35
BPF_RET_K = 0x06
RET_ALLOW = 0x7FFF0000
RET_ERRNO = 0x00050000
RET_KILL_PROCESS = 0x80000000
EPERM = 1
OFFSET_NR, OFFSET_ARCH = 0, 4  # struct seccomp_data


class SeccompUnsupported(RuntimeError):
    """No filter for this machine's architecture."""


def _arch(machine: str | None) -> tuple[int, int, str]:
    name = (machine or platform.machine()).lower()
    if name not in _ARCHES:
        raise SeccompUnsupported(f"no seccomp filter for architecture {name!r} (supported: x86_64, aarch64)")
    column, audit = _ARCHES[name]
    return column, audit, name


def blocked_numbers(machine: str | None = None) -> dict[str, int]:
    """``{name: number}`` of the blocked system calls on ``machine`` (default: this one)."""
    column, _, _ = _arch(machine)
    return {name: nums[column] for name, nums in sorted(_NUMBERS.items()) if nums[column] is not None}  # type: ignore[misc]


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(machine: str | None = None) -> bytes:
    """The filter program (an array of ``struct sock_filter``) for ``machine`` (default: this one)."""
    _, audit, name = _arch(machine)
    numbers = sorted(set(blocked_numbers(machine).values()))
    prog = [_insn(BPF_LD_W_ABS, OFFSET_ARCH),
            _insn(BPF_JEQ_K, audit, jt=1, jf=0),
            _insn(BPF_RET_K, RET_KILL_PROCESS),
            _insn(BPF_LD_W_ABS, OFFSET_NR)]
    if name in ("x86_64", "amd64"):
        prog.append(_insn(BPF_JGE_K, X32_SYSCALL_BIT, jt=0, jf=1))  # the x32 ABI: not ours
        prog.append(_insn(BPF_RET_K, RET_KILL_PROCESS))
    # one comparison per blocked number; a match jumps forward to the final EPERM return
    for i, nr in enumerate(numbers):
        prog.append(_insn(BPF_JEQ_K, nr, jt=len(numbers) - i, jf=0))
    prog.append(_insn(BPF_RET_K, RET_ALLOW))
    prog.append(_insn(BPF_RET_K, RET_ERRNO | EPERM))
    if len(prog) > 255:  # jump offsets are 8 bits
        raise SeccompUnsupported(f"seccomp filter too long ({len(prog)} instructions)")
    return b"".join(prog)


def filter_b64(machine: str | None = None) -> str:
    """:func:`build_filter` as base64 (how the worker program receives it)."""
    return base64.b64encode(build_filter(machine)).decode("ascii")
