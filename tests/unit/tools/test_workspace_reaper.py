"""The reaper's workspace entries: a folder and a Docker container registered by a process that is then
killed with SIGKILL are removed by its reaper (the container through a fake Docker API on a unix socket);
taken back, they are left alone."""

from __future__ import annotations

import os
import signal
import socketserver
import subprocess
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

pytestmark = [pytest.mark.timeout(120)]

OWNER = """
import sys, time
from agentrl._reaper import (reap_container_with_this_process, reap_path_with_this_process,
                             unreap_path)
keep, gone, host = sys.argv[1], sys.argv[2], sys.argv[3]
reap_path_with_this_process(gone)
reap_path_with_this_process(keep)
unreap_path(keep)
reap_container_with_this_process("abc123def", host)
print("registered", flush=True)
time.sleep(600)
"""


class _Unix(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def fake_docker(path: str, seen: list[str]) -> _Unix:
    class Handler(BaseHTTPRequestHandler):
        def do_DELETE(self) -> None:
            seen.append(self.path)
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

        def address_string(self) -> str:
            return "unix"

    server = _Unix(path, Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_a_killed_owner_has_its_folders_and_containers_removed(tmp_path: Path) -> None:
    keep, gone = tmp_path / "keep", tmp_path / "gone"
    for folder in (keep, gone):
        (folder / "deep" / "er").mkdir(parents=True)
        (folder / "deep" / "er" / "file").write_text("x")
    (gone / "deep" / "er" / "file").chmod(0)
    seen: list[str] = []
    server = fake_docker(str(tmp_path / "docker.sock"), seen)
    script = tmp_path / "owner.py"
    script.write_text(textwrap.dedent(OWNER))
    owner = subprocess.Popen([sys.executable, str(script), str(keep), str(gone), f"unix://{tmp_path}/docker.sock"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == "registered"
    finally:
        os.killpg(owner.pid, signal.SIGKILL)
        owner.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (gone.exists() or not seen):
        time.sleep(0.05)
    server.shutdown()
    assert not gone.exists()
    assert (keep / "deep" / "er" / "file").read_text() == "x"  # taken back before the owner died
    assert seen == ["/containers/abc123def?force=1&v=1"]


def test_entries_that_cannot_be_written_are_refused() -> None:
    from agentrl._reaper import reap_container_with_this_process, reap_path_with_this_process

    with pytest.raises(ValueError, match="without line breaks"):
        reap_path_with_this_process("/tmp/a\nadd 1 2")
    with pytest.raises(ValueError, match="expected a container id"):
        reap_container_with_this_process("abc def", "unix:///x")
