"""`local_no_isolation`: a sandbox backend with NO isolation, files in a scratch directory.

Never the default and never chosen unless named (`env.options.backend =
"local_no_isolation"`): nothing separates a task from the machine but the path mapping below.
It exists to run Harbor tasks written for it (the own tasks under `examples/harbor`), their
verifiers and the whole episode loop without a container runtime, in one process.

Files: every sandbox gets a scratch root; an absolute sandbox path `/app/x` is
`ROOT/app/x`, and a path that would leave the root (`..`) is refused. The task's `environment/`
directory is copied to the root first (no Dockerfile is run: the image is the build context
as it is), and commands start in the Dockerfile's `WORKDIR`.

Commands run in an in-process interpreter of a small part of `sh`, not a shell: no process is
started. The Dockerfile's `RUN` lines are run the same way at start (a failing one is
`ImageBuildFailed`); its `FROM`, `COPY` and the rest are not read. It reads words as `sh`
does (quotes, `#` comments), runs command lists joined by
newlines, `;`, `&&` and `||`, honours `>`, `>>` and `2>&1` redirections, and knows `echo`,
`printf` (no formats), `cat`, `mkdir [-p]`, `rm [-rf]`, `test`/`[` (`-f -d -e -s`, `=`, `!=`),
`grep -q`, `seq`, `sleep`, `cd`, `true`, `false`, `exit` and `sh`/`bash FILE` (runs a script
file the same way). Anything else exits 127, as `sh` does for an unknown command. Tasks whose
verifier needs more (pytest, a compiler) need the Docker backend.

Tests: tests/envs/test_harbor.py.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from collector.envs.harbor_task import HarborTask
from collector.envs.sandbox import (
    DEFAULT_MAX_OUTPUT_BYTES,
    ExecResult,
    Sandbox,
    SandboxBackend,
    StartTimes,
    bound_output,
)
from collector.errors import ImageBuildFailed, SandboxStartFailed

_OPERATORS = frozenset({"&&", "||", ";"})


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class LocalSandbox(Sandbox):
    """Files under a scratch root, commands by the in-process interpreter (module docstring)."""

    def __init__(self, root: Path, workdir: str, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES) -> None:
        self.root = root
        self.workdir = workdir
        self.max_output_bytes = max_output_bytes
        self.stopped = False

    def host_path(self, path: str, cwd: str = "/") -> Path:
        """The file a sandbox path names, refusing one outside the root."""
        absolute = path if path.startswith("/") else f"{cwd.rstrip('/')}/{path}"
        resolved = (self.root / absolute.lstrip("/")).resolve()
        if resolved != self.root and self.root not in resolved.parents:
            raise PermissionError(f"{path}: outside the sandbox")
        return resolved

    async def exec(self, command: str, timeout_s: float, env: Mapping[str, str] | None = None) -> ExecResult:
        if self.stopped:
            from collector.errors import SandboxLost

            raise SandboxLost("the local sandbox was stopped")
        started = time.perf_counter()
        out = bytearray()
        shell = _Shell(self, out)
        code, timed_out = 0, False
        try:
            async with asyncio.timeout(timeout_s):
                code = await shell.run_script(command)
        except TimeoutError:
            code, timed_out = -1, True
        except _Exit as done:
            code = done.code
        return ExecResult(
            code, bound_output(bytes(out), self.max_output_bytes), timed_out, time.perf_counter() - started
        )

    async def write(self, path: str, data: bytes) -> None:
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    async def read(self, path: str) -> bytes | None:
        target = self.host_path(path)
        return target.read_bytes() if target.is_file() else None

    async def stop(self) -> None:
        self.stopped = True
        shutil.rmtree(self.root, ignore_errors=True)


class LocalBackend(SandboxBackend):
    """Scratch directories on this machine: no isolation (see the module docstring)."""

    name = "local_no_isolation"
    isolated = False

    def __init__(self, max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES, base: Path | None = None) -> None:
        self.max_output_bytes = max_output_bytes
        self.base = base

    async def start(
        self, task: HarborTask, labels: Mapping[str, str], allow_network: bool = False
    ) -> tuple[Sandbox, StartTimes]:
        started = time.perf_counter()
        try:
            root = _scratch_root(task, self.base)
        except OSError as exc:
            raise SandboxStartFailed(f"task {task.name}: scratch directory: {exc}") from exc
        box = LocalSandbox(root, task.workdir, self.max_output_bytes)
        built = time.perf_counter()
        try:
            await _run_build_steps(box, task)
        except BaseException:
            await box.stop()
            raise
        start_s = built - started
        return box, StartTimes(image_build_s=time.perf_counter() - built, image_cached=False, start_s=start_s)


def _scratch_root(task: HarborTask, base: Path | None) -> Path:
    """A new scratch root holding the task's build context, its working directory made."""
    root = Path(tempfile.mkdtemp(prefix="harbor-", dir=base)).resolve()
    shutil.copytree(task.environment_dir, root, dirs_exist_ok=True)
    (root / task.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return root


async def _run_build_steps(box: LocalSandbox, task: HarborTask) -> None:
    """The Dockerfile's `RUN` lines, in order, by the interpreter: one that fails fails the build."""
    dockerfile = (task.environment_dir / "Dockerfile").read_text(encoding="utf-8", errors="replace")
    for line in dockerfile.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "RUN":
            result = await box.exec(parts[1], task.build_timeout_s)
            if result.exit_code != 0:
                last = (result.output.strip().splitlines() or [""])[-1]
                raise ImageBuildFailed(
                    f"task {task.name}: RUN {parts[1][:80]!r} exited {result.exit_code}"
                    + (f" ({last[:120]})" if last else "")
                )


class _Shell:
    """One `exec`'s interpreter state: the working directory and the output buffer."""

    def __init__(self, box: LocalSandbox, out: bytearray) -> None:
        self.box = box
        self.out = out
        self.cwd = box.workdir

    async def run_script(self, text: str) -> int:
        lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>\n")
        lexer.whitespace = " \t\r"  # a newline ends a command, as in sh
        lexer.commenters = "#"
        code, words, joiner = 0, [], ";"
        for token in [*(_operator(t) for t in lexer), ";"]:
            if token not in _OPERATORS:
                words.append(token)
                continue
            if words and (joiner == ";" or (joiner == "&&") == (code == 0)):
                code = await self.run_command(words)
            words, joiner = [], token
        return code

    async def run_command(self, words: list[str]) -> int:
        target: str | None = None
        append = False
        args: list[str] = []
        items = iter(words)
        for word in items:
            if word in (">", ">>", ">&"):
                destination = next(items, None)
                if args and args[-1] == "2":  # stderr is already in the output: 2>&1, 2>/dev/null
                    args.pop()
                elif destination is not None and word != ">&":
                    target, append = destination, word == ">>"
            else:
                args.append(word)
        mark = len(self.out)
        code = await self.builtin(args)
        if target is not None and target != "/dev/null":
            produced = bytes(self.out[mark:])
            del self.out[mark:]
            path = self.box.host_path(target, self.cwd)
            with path.open("ab" if append else "wb") as handle:
                handle.write(produced)
        elif target == "/dev/null":
            del self.out[mark:]
        return code

    def say(self, text: str) -> None:
        self.out += text.encode("utf-8", "replace")

    def path(self, name: str) -> Path:
        return self.box.host_path(name, self.cwd)

    async def builtin(self, args: list[str]) -> int:
        if not args:
            return 0
        name, rest = args[0], args[1:]
        try:
            if name == "echo":
                newline = not (rest and rest[0] == "-n")
                self.say(" ".join(rest[0 if newline else 1 :]) + ("\n" if newline else ""))
            elif name == "printf":
                self.say(rest[0].replace("\\n", "\n") if rest else "")
            elif name == "cat":
                for file in rest:
                    self.out += self.path(file).read_bytes()
            elif name == "mkdir":
                for directory in (a for a in rest if not a.startswith("-")):
                    self.path(directory).mkdir(parents=True, exist_ok="-p" in rest)
            elif name == "rm":
                for item in (self.path(a) for a in rest if not a.startswith("-")):
                    if (item.is_dir() and "-rf" in rest) or "-r" in rest:
                        shutil.rmtree(item, ignore_errors=True)
                    elif item.exists() or "-f" not in rest:
                        item.unlink()
            elif name in ("test", "["):
                return 0 if self.test(rest[:-1] if name == "[" else rest) else 1
            elif name == "grep":
                pattern, files = (
                    next(a for a in rest if not a.startswith("-")),
                    [a for a in rest if not a.startswith("-")][1:],
                )
                found = any(re.search(pattern, self.path(f).read_text("utf-8", "replace")) for f in files)
                return 0 if found else 1
            elif name == "seq":
                first, last = (1, int(rest[0])) if len(rest) == 1 else (int(rest[0]), int(rest[1]))
                for n in range(first, last + 1):
                    self.say(f"{n}\n")
                    if n % 1000 == 0:
                        await asyncio.sleep(0)
            elif name == "sleep":
                await asyncio.sleep(float(rest[0]))
            elif name == "cd":
                target = self.path(rest[0] if rest else "/")
                if not target.is_dir():
                    raise FileNotFoundError(rest[0] if rest else "/")
                self.cwd = "/" + target.relative_to(self.box.root).as_posix().lstrip(".")
            elif name in ("true", ":"):
                return 0
            elif name == "false":
                return 1
            elif name == "exit":
                raise _Exit(int(rest[0]) if rest else 0)
            elif name in ("sh", "bash") and rest and rest[0] != "-c":
                return await self.run_script(self.path(rest[0]).read_text("utf-8", "replace"))
            elif name in ("sh", "bash") and len(rest) >= 2:
                return await self.run_script(rest[1])
            else:
                self.say(f"{name}: command not found\n")
                return 127
        except (OSError, ValueError, IndexError) as exc:
            self.say(f"{name}: {exc}\n")
            return 1
        return 0

    def test(self, args: list[str]) -> bool:
        if args and args[0] == "!":
            return not self.test(args[1:])
        if len(args) == 2:
            path = self.path(args[1])
            checks: dict[str, Callable[[], bool]] = {
                "-f": path.is_file,
                "-d": path.is_dir,
                "-e": path.exists,
                "-s": lambda: path.is_file() and path.stat().st_size > 0,
            }
            check = checks.get(args[0])
            return bool(check and check())
        if len(args) == 3 and args[1] in ("=", "!="):
            return (args[0] == args[2]) == (args[1] == "=")
        return bool(args and args[0])


def _operator(token: str) -> str:
    """A token as the command list reads it: newlines are `;`, and `&&` or `||` at a line's end
    continues the list (the newline after it is dropped)."""
    if token and set(token) <= set(";&|<>\n") and "\n" in token:
        stripped = token.replace("\n", "")
        return stripped or ";"
    return token
