"""A private Docker daemon for tests and benchmarks on machines without a running one (CI).

:class:`PrivateDockerDaemon` starts ``dockerd`` with its own data root, exec root, socket and
pidfile under a fresh temporary directory, with ``--iptables=false --bridge=none`` (sandbox
containers use ``--network none``, so the daemon needs no NAT rules or bridge and leaves none
behind). ``stop()`` terminates exactly the daemon it started (by PID), waits for it and deletes its
directories; ``new_links`` lists network links that appeared meanwhile (expected: none).

:func:`ensure_image` builds the sandbox image offline (``tools/image/build_offline.sh``) when the
daemon lacks it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["BUILD_SCRIPT", "PrivateDockerDaemon", "daemon_unavailable_reason", "ensure_image", "ping"]

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "image" / "build_offline.sh"


def daemon_unavailable_reason() -> str | None:
    """Why a private dockerd cannot be started here, or None."""
    if shutil.which("dockerd") is None:
        return "dockerd is not installed (apt-get install docker.io; scripts/setup.sh does this)"
    if os.geteuid() != 0:
        return "starting a private dockerd needs root (rootless Docker is not set up by the project)"
    return None


def ping(docker_host: str, timeout_s: float = 2.0) -> bool:
    """True when a Docker daemon answers at ``docker_host``."""
    import docker
    from docker.errors import DockerException

    try:
        client = docker.DockerClient(base_url=docker_host, version="auto", timeout=int(max(1, timeout_s)))
    except DockerException:
        return False
    try:
        return bool(client.ping())
    except DockerException:
        return False
    finally:
        client.close()


def _links() -> set[str]:
    try:
        return set(os.listdir("/sys/class/net"))
    except OSError:
        return set()


class PrivateDockerDaemon:
    """One dockerd started by this process. Use as a context manager or call start()/stop()."""

    def __init__(self, root: str | None = None, *, storage_driver: str = "overlay2") -> None:
        self.dir = Path(root) if root else Path(tempfile.mkdtemp(prefix="agentrl-dockerd-"))
        self.storage_driver = storage_driver
        self.socket = self.dir / "docker.sock"
        self.docker_host = f"unix://{self.socket}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._links_before: set[str] = set()
        self.new_links: list[str] = []
        self.log_path = self.dir / "dockerd.log"

    def start(self, timeout_s: float = 60.0) -> str:
        """Starts the daemon and waits until it answers; returns its ``DOCKER_HOST`` URL."""
        reason = daemon_unavailable_reason()
        if reason is not None:
            raise RuntimeError(reason)
        self._links_before = _links()
        argv = ["dockerd", f"--storage-driver={self.storage_driver}", f"--data-root={self.dir / 'data'}",
                f"--exec-root={self.dir / 'exec'}", f"--pidfile={self.dir / 'docker.pid'}",
                f"--host={self.docker_host}", "--iptables=false", "--ip-forward=false", "--ip-masq=false",
                "--bridge=none", f"--containerd-namespace=agentrl-{os.getpid()}",
                f"--containerd-plugins-namespace=agentrl-{os.getpid()}-plugins"]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"dockerd exited with {self.proc.returncode}: {self.log_tail()}")
            if self.socket.exists() and ping(self.docker_host):
                return self.docker_host
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"dockerd did not answer within {timeout_s:.0f} s: {self.log_tail()}")

    def log_tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops the daemon this object started, cleans up its network state and its directory."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # --bridge=none and --iptables=false: the daemon created no bridge and no netfilter rules, so there
        # is nothing to delete (deleting links by name here could remove another program's).
        self.new_links = sorted(_links() - self._links_before)
        for ctrl in os.listdir("/sys/fs/cgroup") if os.path.isdir("/sys/fs/cgroup") else []:
            with contextlib.suppress(OSError):  # runc's parent group; the kernel refuses while it is in use
                os.rmdir(f"/sys/fs/cgroup/{ctrl}/docker")
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateDockerDaemon:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def ensure_image(docker_host: str, tag: str, *, timeout_s: float = 1800.0) -> None:
    """Builds ``tag`` with the offline build script when the daemon does not have it."""
    import docker
    from docker.errors import ImageNotFound

    client = docker.DockerClient(base_url=docker_host, version="auto")
    try:
        client.images.get(tag)
        return
    except ImageNotFound:
        pass
    finally:
        client.close()
    env = dict(os.environ, DOCKER_HOST=docker_host)
    out = subprocess.run(["bash", str(BUILD_SCRIPT), tag], env=env, capture_output=True, text=True,
                         timeout=timeout_s, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT.name} failed ({out.returncode}): {out.stderr[-3000:]}")
