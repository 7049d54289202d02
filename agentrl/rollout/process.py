"""Subprocess and HTTP helpers shared by the engine and router launchers.

A launcher starts its server in a new session (its own process group), remembers the process, and
stops exactly the tree it started: the process and every descendant it has at stop time, SIGTERM
first, SIGKILL after a grace period (an SGLang server's root is SIGKILLed first: it takes its
children's exit for a crash and would sleep 5 s for diagnostics). Nothing is ever looked up or killed
by name.

Because each server has its own session, a signal that ends the parent does not reach it: a
SIGTERM to the parent would leave the engines (and SGLang's scheduler and detokenizer children)
running. So every live :class:`ManagedProcess` is in a registry that :func:`stop_all` stops; it
runs at interpreter exit (``atexit``: normal exit, an uncaught exception, SIGINT's
``KeyboardInterrupt``), and :func:`stop_all_on_exit` adds handlers for SIGTERM and SIGHUP that stop
the trees, then let the signal end the process as it would have. The first ManagedProcess started
from the main thread installs them where those signals still have their default action. A SIGKILL
of the parent cannot be handled in-process: for that, every tree is also registered with a reaper
process (:mod:`agentrl._reaper`, one per parent) that watches a pipe from the parent and,
when the parent dies however it dies, stops every tree still registered within seconds.
:meth:`ManagedProcess.start` stops the tree again when the server never becomes ready;
:func:`wait_ready` is the readiness loop and :func:`request_json` the one-shot control request.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import random
import signal
import socket
import subprocess
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from agentrl import _reaper
from agentrl._deprecated import moved_names

__all__ = [
    "PORT_DRAWS",
    "ManagedProcess",
    "default_log_dir",
    "free_port",
    "listens_on",
    "port_taken",
    "request_json",
    "stop_all",
    "stop_all_on_exit",
    "wait_ready",
]

# the reaper's owner side moved to the shared utility agentrl._reaper (the workspaces of agentrl.tools use
# it too, and tools may not import rollout)
__getattr__ = moved_names(__name__, dict.fromkeys(_reaper.__all__, "agentrl._reaper"))

EXIT_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class _Registry:
    """The live ManagedProcesses of this interpreter, and which exit hooks are installed."""

    def __init__(self) -> None:
        self.live: dict[int, ManagedProcess] = {}
        self.lock = threading.Lock()
        self.atexit = False
        self.signals: set[int] = set()

    def add(self, process: ManagedProcess) -> None:
        with self.lock:
            self.live[process.pid] = process
            first, self.atexit = not self.atexit, True
        if first:
            atexit.register(stop_all)
            if threading.current_thread() is threading.main_thread():
                stop_all_on_exit(only_default=True)

    def discard(self, process: ManagedProcess) -> None:
        with self.lock:
            self.live.pop(process.pid, None)

    def take_all(self) -> list[ManagedProcess]:
        with self.lock:
            live = list(self.live.values())
            self.live.clear()
        return live


_REGISTRY = _Registry()


def default_log_dir() -> Path:
    """Where server logs go when the config names no folder: ``$AGENTRL_LOG_DIR`` or ``/tmp/agentrl-logs``."""
    return Path(os.environ.get("AGENTRL_LOG_DIR", "/tmp/agentrl-logs"))


# Servers' ports are drawn from here, below the kernel's ephemeral range where there is room.
_SERVER_PORTS_FROM = 20000
# How many ports a launcher draws for one server before it gives up (each taken before the server bound it).
PORT_DRAWS = 3


def _ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux; the usual default elsewhere)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago, for a server about to be started on it.

    Drawn at random from below the kernel's ephemeral range (ports 20000 up to its start) where
    there is room: a port the OS hands out for ``bind(0)`` lies in that range, from which every
    outgoing connection of the machine also takes its local port, and one of them could take it in
    the seconds before the server binds it. A server started on a port taken all the same fails
    with "address already in use" (:func:`port_taken`): the launchers then draw another."""
    low, _ = _ephemeral_ports()
    if low - _SERVER_PORTS_FROM >= 1000:
        for _ in range(50):
            port = random.randrange(_SERVER_PORTS_FROM, low)
            if _bindable(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_taken(process: ManagedProcess) -> bool:
    """Whether the server's log (what it wrote since this start) says it could not bind its port."""
    return "address already in use" in process.log_since_start().lower()


def listens_on(process: ManagedProcess, port: int) -> bool:
    """Whether a process of the server's tree has a TCP socket listening on ``port`` (so that what
    answers there is this server, not another one that had bound the port first). True as well when
    the system does not let this process read the tree's sockets: it cannot tell, and does not refuse."""
    readable = False
    for proc in process.tree():
        try:
            sockets = proc.net_connections(kind="tcp")
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        readable = True
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in sockets):
            return True
    return not readable


class ManagedProcess:
    """One started server process, its log file, and how to stop its whole tree."""

    def __init__(self, cmd: Sequence[str], *, env: Mapping[str, str], log_path: Path, name: str,
                 kill_root_first: bool = False) -> None:
        self.cmd = list(cmd)
        self.name = name
        self.kill_root_first = kill_root_first
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            self._log_start = log.tell()  # the log is appended to: what an earlier server wrote stays before this
            self.popen = subprocess.Popen(
                self.cmd, env=dict(env), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        _REGISTRY.add(self)
        _reaper.reap_with_this_process(self.popen.pid)

    @classmethod
    async def start(cls, cmd: Sequence[str], *, env: Mapping[str, str], log_path: Path, name: str,
                    ready: Callable[[ManagedProcess], Awaitable[object]],
                    kill_root_first: bool = False) -> ManagedProcess:
        """Starts the process and awaits ``ready(process)``; if that raises or is cancelled, stops the
        tree (off the event loop) and re-raises."""
        process = cls(cmd, env=env, log_path=log_path, name=name, kill_root_first=kill_root_first)
        try:
            await ready(process)
        except BaseException:
            await asyncio.to_thread(process.stop)
            raise
        return process

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, n_chars: int = 4000) -> str:
        """The last ``n_chars`` bytes of the log (decoded), at most what this start of the server wrote."""
        return self._read_log(n_chars)

    def log_since_start(self, limit: int = 1 << 20) -> str:
        """What this start of the server wrote to its log (the last ``limit`` bytes of it)."""
        return self._read_log(limit)

    def _read_log(self, limit: int) -> str:
        try:
            with open(self.log_path, "rb") as log:
                end = log.seek(0, os.SEEK_END)
                log.seek(max(self._log_start, end - limit))
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def tree(self) -> list[psutil.Process]:
        """The process and its live descendants (empty once it has exited and been reaped)."""
        try:
            root = psutil.Process(self.popen.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def kill_now(self) -> None:
        """SIGKILL the whole tree at once (what a crash looks like; used by failure tests)."""
        for proc in self.tree():
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        self.popen.wait(timeout=30)
        _REGISTRY.discard(self)
        _reaper.unreap(self.popen.pid)

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM the tree, wait up to ``grace_s``, SIGKILL what is left, reap the root.

        With ``kill_root_first`` the root is SIGKILLed before its descendants get SIGTERM: for a server
        whose root treats a child's exit as a crash and stalls on it (SGLang's sleeps 5 s for crash
        diagnostics before it exits), while the children still shut down on SIGTERM."""
        procs = self.tree()
        if self.kill_root_first and procs:
            try:
                procs[0].send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        # Children that left the tree (re-parented) but kept our process group go too.
        try:
            pgid = os.getpgid(self.popen.pid)
        except ProcessLookupError:
            pgid = None
        _reaper.terminate(procs, grace_s)
        if pgid is not None and pgid == self.popen.pid:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.popen.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        _REGISTRY.discard(self)
        _reaper.unreap(self.popen.pid)


def stop_all(grace_s: float = 5.0) -> int:
    """Stops the tree of every live :class:`ManagedProcess` of this process; returns how many."""
    live = _REGISTRY.take_all()
    for process in live:
        try:
            process.stop(grace_s=grace_s)
        except Exception:  # stopping the others matters more than one failure here
            pass
    return len(live)


def stop_all_on_exit(signals: Sequence[signal.Signals] = EXIT_SIGNALS, *, only_default: bool = False) -> None:
    """Installs handlers that :func:`stop_all`, then hand the signal on: to the handler that was
    there before, or, if that was the default action, by re-raising it with the default action
    (so the exit status still says which signal ended the process). Main thread only (a Python
    rule for signal handlers). ``only_default`` leaves signals that already have a handler alone.
    Idempotent per signal."""
    for sig in signals:
        if sig in _REGISTRY.signals:
            continue
        previous = signal.getsignal(sig)
        if only_default and previous is not signal.SIG_DFL:
            continue

        def handler(signum: int, frame: object, previous: object = previous) -> None:
            stop_all()
            if callable(previous):
                previous(signum, frame)
            elif previous is signal.SIG_IGN:
                return
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)
        _REGISTRY.signals.add(sig)


async def wait_ready(probe: Callable[[], Awaitable[bool]], *, what: str, timeout_s: float, poll_s: float,
                     error_cls: type[Exception], process: ManagedProcess | None = None,
                     port: int | None = None, port_taken_cls: type[Exception] | None = None) -> None:
    """Calls ``probe`` every ``poll_s`` until it returns True. Raises ``error_cls`` (naming ``what``,
    with the log tail of ``process``) if ``process`` exits first or ``timeout_s`` runs out, and
    ``port_taken_cls`` (default ``error_cls``) when ``process`` cannot have its ``port``: its log
    says the port was taken (some servers, SGLang's, log that and then hang rather than exit), or
    the probe was answered by a server outside its tree."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    taken = port_taken_cls or error_cls
    while loop.time() < deadline:
        if process is not None and port_taken(process):
            raise taken(f"{what} could not bind its port: another process had taken it; log {process.log_path}:\n"
                        f"{process.log_tail()}")
        if process is not None and not process.alive():
            raise error_cls(f"{what} exited with code {process.returncode()} while starting; "
                            f"log {process.log_path}:\n{process.log_tail()}")
        if await probe():
            if process is not None and port is not None and not await asyncio.to_thread(listens_on, process, port):
                raise taken(f"{what} could not bind its port: another server answers on port {port}, "
                            f"not this one (pid {process.pid}); log {process.log_path}:\n{process.log_tail()}")
            return
        await asyncio.sleep(poll_s)
    log = f"; log {process.log_path}:\n{process.log_tail()}" if process is not None else ""
    raise error_cls(f"{what} not ready after {timeout_s:g} s{log}")


async def request_json(method: str, url: str, body: Any = None, *, timeout_s: float, error_cls: type[Exception],
                       text_fallback: bool = False) -> Any:
    """One HTTP request with a JSON body; returns the decoded JSON answer (``None`` when empty).

    Every failure is an ``error_cls`` naming the request: an HTTP status >= 400, a lost connection,
    a timeout, or an answer that is not JSON (with ``text_fallback``, that answer's text is returned
    instead).
    """
    import aiohttp  # here, not at the top: the run config imports this module and must stay light

    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
            async with session.request(method, url, json=body) as resp:
                text = await resp.text()
                if resp.status >= 400:
                    raise error_cls(f"{method} {url} -> HTTP {resp.status}: {text[:1000]}")
                if not text:
                    return None
                try:
                    return await resp.json(content_type=None)
                except ValueError:
                    if text_fallback:
                        return text
                    raise
    except error_cls:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as err:
        raise error_cls(f"{method} {url} failed: {type(err).__name__}: {err}") from err
