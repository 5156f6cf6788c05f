"""`docker`: the default sandbox backend, one container per episode, through the `docker` CLI.

Images. A task's image is built from its `environment/` directory (the build context, with
its Dockerfile) under `[environment] build_timeout_sec`, tagged
``collector-harbor/<task>:<content key>``: an unchanged directory is built once and found by
every later episode (`StartTimes.image_cached`), an edited one gets a new tag. Builds of one tag
in one process are serialised, so a batch of episodes of a new task builds it once. A build
that fails or times out is `ImageBuildFailed`, naming the task and the build's last line (its
intermediate containers are removed, failed or not: `--force-rm`).

Containers. `docker run -d` with `--network none` unless the episode was given a network,
`--cpus` / `--memory` from `task.toml`, the run's and episode's labels, the Dockerfile's
`WORKDIR`, and a shell that waits forever as its process (the agent's commands come through
`docker exec`). One that does not start (no daemon, a refused option) is `SandboxStartFailed`.

Commands run as ``timeout -s KILL N bash -c COMMAND`` inside the container, so a command past
its timeout is killed where it runs (not only its `docker exec` client, which is killed too
a few seconds later as a backstop); the images need `bash` and `timeout` (Harbor's own rule).
Output is read as it comes and held to its head and tail (`max_output_bytes`), so a flood
never fills the worker's memory. A daemon or container that goes away mid-episode is
`SandboxLost`. `stop` is ``docker rm -f``; `remove_labelled` removes every container carrying
the given labels, running or not. A start that fails or is cancelled removes what the daemon
made of it so far; a create the daemon finishes only later (its client killed: a cancelled
start, a SIGKILLed driver) is removed by the run's sweep at its end (`collector.run.job`).

Tests: tests/system/harbor/test_docker.py (a real daemon; `scripts/system-setup` starts one).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Mapping, Sequence

from collector.envs.harbor_task import HarborTask
from collector.envs.sandbox import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    Sandbox,
    SandboxBackend,
    StartTimes,
    bound_output,
)
from collector.errors import ImageBuildFailed, SandboxLost, SandboxStartFailed

#: What the docker CLI prints when the daemon or the container is gone.
_GONE = re.compile(
    r"Cannot connect to the Docker daemon|No such container|is not running|Error response from daemon"
)
#: Seconds the `docker exec` client gets past the command's own timeout before it is killed.
_BACKSTOP_S = 5.0
#: Exit statuses of `timeout -s KILL` when it killed the command.
_KILLED = frozenset({124, 137})


async def docker(
    *args: str, stdin: bytes | None = None, timeout_s: float = 60.0, limit: int = DEFAULT_MAX_OUTPUT_BYTES
) -> tuple[int, bytes, bool]:
    """Run the docker CLI: (exit status, bounded output, killed by `timeout_s`)."""
    try:
        process = await asyncio.create_subprocess_exec(
            "docker",
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
    except OSError as exc:
        raise SandboxStartFailed(f"the docker CLI cannot be run: {exc}") from exc
    head = bytearray()
    tail = bytearray()
    total = 0

    async def pump() -> None:
        nonlocal total
        assert process.stdout is not None
        if stdin is not None and process.stdin is not None:
            process.stdin.write(stdin)
            with contextlib.suppress(ConnectionError):
                await process.stdin.drain()
            process.stdin.close()
        while chunk := await process.stdout.read(65536):
            total += len(chunk)
            room = max(limit // 2 - len(head), 0)
            head.extend(chunk[:room])
            tail.extend(chunk[room:])
            del tail[: max(len(tail) - limit // 2, 0)]
        await process.wait()

    killed = False
    try:
        async with asyncio.timeout(timeout_s):
            await pump()
    except TimeoutError:
        killed = True
    finally:
        if process.returncode is None:  # timed out or cancelled: never leave the client running
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(process.wait())
    left_out = total - len(head) - len(tail)
    data = (
        bytes(head)
        + (f"\n[... {left_out:,} bytes of output left out ...]\n".encode() if left_out else b"")
        + bytes(tail)
    )
    return (process.returncode if process.returncode is not None else -1), data, killed


class DockerSandbox(Sandbox):
    """One running container."""

    def __init__(self, container: str, task: HarborTask, max_output_bytes: int) -> None:
        self.container = container
        self.task = task
        self.max_output_bytes = max_output_bytes

    async def exec(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult:
        started = time.perf_counter()
        variables = [part for key, value in (env or {}).items() for part in ("-e", f"{key}={value}")]
        seconds = max(1, round(timeout_s))
        code, output, killed = await docker(
            "exec",
            *variables,
            self.container,
            "timeout",
            "-s",
            "KILL",
            str(seconds),
            "bash",
            "-c",
            command,
            timeout_s=seconds + _BACKSTOP_S,
            limit=self.max_output_bytes * 2,
        )
        text = bound_output(output, self.max_output_bytes + 64)
        if code not in (0, *_KILLED) and code >= 125 and _GONE.search(text[:300]):
            raise SandboxLost(f"task {self.task.name}: the container went away: {text.strip()[:160]}")
        timed_out = killed or code in _KILLED
        return ExecResult(-1 if timed_out else code, text, timed_out, time.perf_counter() - started)

    async def write(self, path: str, data: bytes) -> None:
        code, output, _ = await docker(
            "exec",
            "-i",
            self.container,
            "sh",
            "-c",
            'mkdir -p "$(dirname "$1")" && cat > "$1"',
            "sh",
            path,
            stdin=data,
            timeout_s=60.0,
        )
        if code != 0:
            text = output.decode("utf-8", "replace").strip()
            if _GONE.search(text):
                raise SandboxLost(f"task {self.task.name}: the container went away: {text[:160]}")
            raise OSError(f"{path}: {text[:200] or f'exit status {code}'}")

    async def read(self, path: str) -> bytes | None:
        code, output, _ = await docker("exec", self.container, "cat", path, timeout_s=60.0, limit=1 << 20)
        if code != 0:
            if _GONE.search(output.decode("utf-8", "replace")[:300]) and b"No such file" not in output:
                raise SandboxLost(f"task {self.task.name}: the container went away")
            return None
        return output

    async def stop(self) -> None:
        await docker("rm", "-f", self.container, timeout_s=60.0)


class DockerBackend(SandboxBackend):
    """Containers from each task's own Dockerfile (see the module docstring)."""

    name = "docker"
    isolated = True

    def __init__(self, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        self.max_output_bytes = max_output_bytes
        self._building: dict[str, asyncio.Lock] = {}

    async def image(self, task: HarborTask) -> tuple[str, bool]:
        """The task's image tag, built unless already there; (tag, was cached)."""
        tag = f"collector-harbor/{_tag_part(task.name)}:{task.content_key}"
        lock = self._building.setdefault(tag, asyncio.Lock())
        async with lock:
            code, output, _ = await docker("image", "inspect", "--format", "{{.Id}}", tag, timeout_s=60.0)
            if code == 0:
                return tag, True
            if _GONE.search(output.decode("utf-8", "replace")) and b"No such image" not in output:
                raise SandboxStartFailed(
                    f"task {task.name}: docker is not answering: "
                    f"{output.decode('utf-8', 'replace').strip()[:160]}"
                )
            code, output, killed = await docker(
                "build",
                "--force-rm",  # a failed step's container is removed too, not left exited
                "--label",
                "collector.harbor=1",
                "-t",
                tag,
                str(task.environment_dir),
                timeout_s=task.build_timeout_s,
                limit=8192,
            )
            if killed:
                raise ImageBuildFailed(
                    f"task {task.name}: the image build ran past {task.build_timeout_s:g} s"
                )
            if code != 0:
                lines = [ln for ln in output.decode("utf-8", "replace").splitlines() if ln.strip()]
                raise ImageBuildFailed(
                    f"task {task.name}: the image did not build: "
                    f"{(lines[-1] if lines else f'exit status {code}')[:200]}"
                )
            return tag, False

    async def start(
        self, task: HarborTask, labels: Mapping[str, str], allow_network: bool = False
    ) -> tuple[Sandbox, StartTimes]:
        began = time.perf_counter()
        tag, cached = await self.image(task)
        built = time.perf_counter()
        options: list[str] = ["--network", "bridge" if allow_network else "none", "-w", task.workdir]
        for key, value in labels.items():
            options += ["--label", f"{key}={value}"]
        if task.cpus is not None:
            options += ["--cpus", f"{task.cpus:g}"]
        if task.memory_mb is not None:
            options += ["--memory", f"{task.memory_mb}m"]
        try:
            code, output, _ = await docker(
                "run",
                "-d",
                *options,
                "--entrypoint",
                "sh",
                tag,
                "-c",
                "while :; do sleep 3600; done",
                timeout_s=120.0,
            )
        except BaseException:
            # Cancelled mid-start (the episode's time to open ran out): the client is killed,
            # but what the daemon already created is this episode's, removed here. A create
            # it finishes later still carries the run's label: the run's end sweeps it.
            with contextlib.suppress(Exception):
                await asyncio.shield(self.remove_labelled(labels))
            raise
        text = output.decode("utf-8", "replace").strip()
        if code != 0:
            await self.remove_labelled(labels)  # a half-created container is not left behind
            raise SandboxStartFailed(f"task {task.name}: the container did not start: {text[-200:]}")
        container = text.splitlines()[-1]
        return (
            DockerSandbox(container, task, self.max_output_bytes),
            StartTimes(image_build_s=built - began, image_cached=cached, start_s=time.perf_counter() - built),
        )

    async def remove_labelled(self, labels: Mapping[str, str]) -> int:
        filters = [part for key, value in labels.items() for part in ("--filter", f"label={key}={value}")]
        code, output, _ = await docker("ps", "-aq", *filters, timeout_s=60.0)
        ids: Sequence[str] = output.decode().split() if code == 0 else []
        if ids:
            await docker("rm", "-f", *ids, timeout_s=120.0)
        return len(ids)


def _tag_part(name: str) -> str:
    """A task name as a docker repository name part: lower case, [a-z0-9._-]."""
    return re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._") or "task"
