"""A throwaway two-node Ray cluster on this machine, started and ended by one test.

`ray start --head` plus a second `ray start --address=...`, each node with its own ports
(free ones, asked of the OS) so that nothing collides with another engineer's cluster, and
token authentication disabled for both (runtime-notes: otherwise the second node fails
with AuthenticationError). Every process either node starts inherits a marker variable
holding a fresh uuid; teardown kills exactly the processes whose environment carries it,
by pid. `ray stop` is never used: it stops every Ray process on the machine, other
people's included.

A lost node is declared dead within about 3 s instead of Ray's 13-15 s: the GCS checks each
node's health every second and gives up after three failed checks in a row (`HEALTH_CHECKS`;
each check still waits Ray's default 10 s for an answer, so a node that is only slow on a
loaded machine is not declared dead). The tests' subject is what the driver does once Ray
reports the loss, not how long Ray takes to notice; the wait for it was most of their time.

Loopback only: both nodes take 127.0.0.1 as their address, and every server of theirs
listens there. `ray start --node-ip-address=127.0.0.1` alone is not enough (Ray rewrites a
loopback address to the machine's own, and its servers then listen on `*`), so `ray start`
runs with that rewrite turned off (`RAY_START`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field

MARKER = "COLLECTOR_FAULTS_CLUSTER"
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}
#: Ray's variable for clusters confined to one machine (named for Windows and macOS, where it is
#: the default): "0" there makes Ray take loopback as this machine's node address.
LOCAL_CLUSTER = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
#: Ray's GCS settings (read from its environment) for noticing a dead node: a check every
#: second, dead after three failures in a row (Ray's defaults: every 3 s, five failures).
HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
#: `ray start`, keeping the node address as given: Ray's CLI otherwise replaces 127.0.0.1 by
#: the machine's address (`resolve_ip_for_localhost`), and a node whose address is not
#: loopback has its servers listen on every interface.
RAY_START = [sys.executable, "-c",
             "import sys, ray._private.services as s; s.resolve_ip_for_localhost = lambda host: host; "
             "from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()", "start"]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _node_ports() -> list[str]:
    """Per-node ports Ray would otherwise take from fixed defaults shared by every cluster."""
    return [
        f"--node-manager-port={free_port()}",
        f"--object-manager-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        f"--dashboard-agent-grpc-port={free_port()}",
        f"--metrics-export-port={free_port()}",
        f"--runtime-env-agent-port={free_port()}",
    ]


def _environ_of(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _cmdline_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _parent_of(pid: int) -> int:
    """The parent pid (0 once the process is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # "pid (comm) state ppid ...": comm may hold spaces, so split after its ")".
            return int(fh.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


@dataclass
class TwoNodeCluster:
    """Start with `start()`; `address` is the head's GCS address; `stop()` always cleans up."""

    cpus_per_node: int = 1
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    temp_dir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rayf", dir="/tmp"))
    port: int = field(default_factory=free_port)
    second_node_manager_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The environment for drivers attaching to this cluster. Ray's switch for single-machine
        clusters is on there, so that a driver takes 127.0.0.1 as its own node's address (the
        address both nodes have; with the machine's it finds no node to attach to)."""
        return {**self._start_env(), LOCAL_CLUSTER: "0"}

    def _start_env(self) -> dict[str, str]:
        """The environment for `ray start` (where that switch would refuse a second node)."""
        return {**{k: v for k, v in os.environ.items() if k != LOCAL_CLUSTER}, MARKER: self.token,
                "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", **HEALTH_CHECKS}

    def _ray_start(self, args: list[str]) -> None:
        common = [
            f"--num-cpus={self.cpus_per_node}",
            "--object-store-memory=100000000",
            "--disable-usage-stats",
            "--log-style=record",
        ]
        proc = subprocess.run(
            [*RAY_START, *args, *common], env=self._start_env(), capture_output=True, text=True, timeout=120
        )
        if proc.returncode != 0:
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"ray start {' '.join(args[:2])} failed:\n{tail}")

    def start(self) -> TwoNodeCluster:
        self._ray_start(
            ["--head", f"--port={self.port}", "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp_dir}",
             "--include-dashboard=false", f"--ray-client-server-port={free_port()}", *_node_ports()]
        )
        return self.start_second_node()

    def start_second_node(self) -> TwoNodeCluster:
        """Start a (new) second node and wait until two nodes are alive: after `kill_second_node`,
        the cluster is two nodes again for the next test, without paying for a new head."""
        ports = _node_ports()
        self.second_node_manager_port = int(ports[0].split("=")[1])
        self._ray_start([f"--address={self.address}", "--node-ip-address=127.0.0.1", *ports])
        self._wait_for_nodes(2)
        outside = self.listening_off_loopback()
        assert outside == [], f"the test cluster listens off loopback: {outside}"
        return self

    def second_node_alive(self) -> bool:
        try:
            self.second_raylet_pid()
        except RuntimeError:
            return False
        return True

    def listening_off_loopback(self) -> list[tuple[str, str, int]]:
        """(process, address, port) of every listening socket of this cluster not on loopback."""
        import psutil

        found = []
        for pid in self.pids():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                found += [(proc.name(), c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="inet")
                          if c.status == psutil.CONN_LISTEN and c.laddr.ip not in LOOPBACK]
        return found

    def _wait_for_nodes(self, count: int) -> None:
        """Block until `count` nodes are alive in the GCS.

        `ray start` of a second node can return before the GCS lists it; a driver attaching
        in that window places every worker on the head (SPREAD only spreads over the nodes
        it knows), and killing the second node would then hit nothing.
        """
        probe = (
            "import sys, time, ray\n"
            "ray.init(address=sys.argv[1], logging_level='ERROR')\n"
            "deadline = time.monotonic() + 60\n"
            "while sum(n['Alive'] for n in ray.nodes()) < int(sys.argv[2]):\n"
            "    if time.monotonic() > deadline: sys.exit('nodes did not come up')\n"
            "    time.sleep(0.2)\n"
        )
        subprocess.run(
            [sys.executable, "-c", probe, self.address, str(count)],
            env=self.env(), check=True, capture_output=True, timeout=120,
        )

    def pids(self) -> list[int]:
        """Every live process started by this cluster (its environment holds the marker)."""
        needle = f"{MARKER}={self.token}".encode()
        own = os.getpid()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != own and needle in _environ_of(int(entry)):
                found.append(int(entry))
        return found

    def second_raylet_pid(self) -> int:
        """The pid of the second node's raylet (found by its node-manager port)."""
        flag = f"--node_manager_port={self.second_node_manager_port}"
        for pid in self.pids():
            cmd = _cmdline_of(pid)
            if "raylet" in cmd and flag in cmd:
                return pid
        raise RuntimeError("the second node's raylet is not running")

    def on_second_node(self, pid: int) -> bool:
        """Whether `pid` is a process of the second node (its raylet is an ancestor)."""
        raylet = self.second_raylet_pid()
        while pid > 1:
            if pid == raylet:
                return True
            pid = _parent_of(pid)
        return False

    def kill_second_node(self) -> None:
        """SIGKILL the second node's raylet and its workers, as a preempted machine would vanish.

        The workers too: a worker whose raylet alone died goes on serving its actor calls
        until it notices, and could finish the held batch and reply before the run sees a
        death (seen once the driver refilled continuously and runs got shorter).
        """
        raylet = self.second_raylet_pid()
        workers = [pid for pid in self.pids() if pid != raylet and self.on_second_node(pid)]
        os.kill(raylet, signal.SIGKILL)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        """Kill every process of this cluster by pid, wait for them, remove the temp dir."""
        for _ in range(3):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
                for pid in pids:
                    with contextlib.suppress(ChildProcessError, OSError):
                        os.waitpid(pid, os.WNOHANG)
                time.sleep(0.1)
        subprocess.run(["rm", "-rf", self.temp_dir], check=False)
