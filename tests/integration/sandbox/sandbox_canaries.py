"""Host-side secrets and listeners that no sandboxed program may reach (used by the fixtures)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[3]
CANARY_ENV = "AGENTRL_SANDBOX_TEST_SECRET"


@dataclass
class HostCanaries:
    """Secrets and listeners on the host that no sandboxed program may reach."""

    token: str
    nonce: str
    project: Path
    host_pid: int
    tcp_port: int
    udp_port: int
    tcp_hits: list[bytes] = field(default_factory=list)
    udp_hits: list[bytes] = field(default_factory=list)

    def fill(self, code: str) -> str:
        return (code.replace("NONCE", str(self.nonce)).replace("PROJECT", str(self.project))
                .replace("HOSTPID", str(self.host_pid)).replace("TCPPORT", str(self.tcp_port))
                .replace("UDPPORT", str(self.udp_port)))
