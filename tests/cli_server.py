"""Start `python src/<script>.py ...` for the tests without paying for the third-party imports every time.

Every command a test runs is a new Python process that imports torch, Lightning, torchvision and
torchmetrics (about 7 s of CPU on the 2-core CI machine) before it does anything; with about 150 commands
that was half of `make test`. This server imports those packages once, then forks one child per command.
The child is the command as a user runs it in every other way: the same interpreter, `sys.argv`, `sys.path[0]`
(the script's folder), working directory and environment, stdin from /dev/null, its output to its own
files, `__main__` run from the script file, exit status as Python gives it (1 on an uncaught error), and
its threads joined and atexit handlers run at exit (see `_end`). The project's own modules (`src`,
`hydra_plugins`, `tests`) are never imported here, so each command imports them afresh, import-time code
included.

A test can also start a command in the background (`start`, for commands that must run at the same time):
the server answers with its pid and goes on serving; the command's exit status arrives in a file.

What a forked child cannot reproduce, it does not try: a command whose environment differs from the
server's in a variable read when torch or its libraries load (`OMP_NUM_THREADS`, `TORCH_*`, `CUDA_*`, ...)
runs as a fresh process instead, and so does any command when the server is busy or gone
(`conftest.run_cli`). `pytest --fresh-processes` runs every command as a fresh process.
"""

import atexit
import contextlib
import gc
import importlib
import json
import os
import random
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

# What every command imports before its first step (and nothing a run imports only sometimes).
PRELOAD = ("torch", "torchvision", "torchmetrics", "lightning.pytorch", "hydra.utils", "omegaconf", "rich")

# Environment variables read while these packages load; a command that sets them otherwise runs fresh.
IMPORT_TIME_PREFIXES = ("OMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA_", "LD_", "PYTHON")
# Those of them read only later, when used: PYTHONPATH (the child puts its entries on sys.path, as Python does
# at start) and torch.compile's cache folder (read at each compile, by torch._inductor's cache_dir()).
READ_WHEN_USED = ("PYTHONPATH", "TORCHINDUCTOR_CACHE_DIR")


def env_matters(name: str) -> bool:
    """Whether the variable `name` is read when the preloaded packages are imported."""
    return name.startswith(IMPORT_TIME_PREFIXES) and name not in READ_WHEN_USED


def _child(request: dict, protocol: list, import_output: bytes) -> None:
    """Become the command of `request`; never returns (exits as Python would)."""
    for pipe in protocol:
        pipe.close()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    os.write(2, import_output)  # what a fresh process would have printed while importing these packages
    server_entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # A fresh process seeds Python's and NumPy's global generators from the OS; the forked ones would all
    # share the server's.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    script, *args = request["argv"]
    sys.argv = [script, *args]
    # Python's start: the script's folder first, then PYTHONPATH's entries, then the installed packages.
    command_entries = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    installed = sys.path[1 + len(server_entries) :]
    sys.path[:] = [
        os.path.dirname(os.path.abspath(script)),
        *map(os.path.abspath, command_entries),
        *installed,
    ]
    try:
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as exit:
        status = _exit_status(exit)
    except KeyboardInterrupt:
        traceback.print_exc()
        status = -signal.SIGINT
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    _end(status)


def _exit_status(exit: SystemExit) -> int:
    """The exit status Python gives an uncaught SystemExit, printing its message when it is not a number."""
    if exit.code is None:
        return 0
    if isinstance(exit.code, int):
        return exit.code
    print(exit.code, file=sys.stderr)
    return 1


def _end(status: int) -> None:
    """End the command as Python ends a process: wait for its threads that are not daemons, run its atexit
    handlers, flush the standard streams, then exit with `status` (-SIGINT: die of SIGINT, as Python does
    after an uncaught Ctrl+C). What Python would do after that, tear down every module and object, is skipped:
    in a fork it touches, and so copies, all the memory the child shares with the server (0.55 s of CPU a
    command); Python does not promise to finalize the objects alive at exit either."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the command
            stream.flush()
    if status == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status)


def serve() -> None:
    """Read one JSON request a line on stdin; answer `{"pid": ...}` at the start, `{"returncode": ...}` at the end."""
    # The protocol gets fds of its own; fds 0 and 1 are for the children (set per command).
    requests = os.fdopen(os.dup(0), "r")
    answers = os.fdopen(os.dup(1), "w")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)

    # Anything the imports print (a deprecation warning, say) is replayed into every command's stderr.
    with tempfile.TemporaryFile() as capture:
        saved_stderr = os.dup(2)
        os.dup2(capture.fileno(), 2)
        for module in PRELOAD:
            importlib.import_module(module)
        sys.stderr.flush()
        os.dup2(saved_stderr, 2)
        os.close(saved_stderr)
        capture.seek(0)
        import_output = capture.read()

    if threading.active_count() != 1 or len(os.listdir("/proc/self/task")) != 1:
        print(
            json.dumps({"error": "threads started while importing: forking is not safe"}),
            file=answers,
            flush=True,
        )
        return
    # What the imports made lives as long as the server: out of the collector's sight, a child's collections
    # do not walk it and so do not copy its memory pages (2.8 s of CPU a command before, 0.9 s after; the
    # fork-server use that gc.freeze's documentation describes).
    gc.freeze()
    # Commands started in the background (`"background": true`, Client.start): the server goes on serving, and
    # writes each one's exit status into its `returncode` file when it ends.
    background: dict[int, str] = {}

    def reap(*_: object) -> None:
        # A SIGCHLD can interrupt a reap with another one, which finds a child the first one has just waited
        # for (ChildProcessError) and leaves it to the first; the first skips those the second waited for.
        for pid, path in list(background.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if done:
                Path(f"{path}.tmp").write_text(str(os.waitstatus_to_exitcode(status)))
                os.replace(f"{path}.tmp", path)
                background.pop(pid, None)

    signal.signal(signal.SIGCHLD, reap)
    print(json.dumps({"ready": True}), file=answers, flush=True)
    protocol = [requests, answers]
    for line in requests:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            _child(request, protocol, import_output)
        print(json.dumps({"pid": pid}), file=answers, flush=True)
        if request.get("background"):
            background[pid] = request["returncode"]
            reap()  # in case it ended before it was registered
            continue
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}), file=answers, flush=True)


class Started:
    """A command started in the background, by the server or as a fresh process: `pid`, `poll()`,
    `send_signal()` and `wait()`, as subprocess.Popen has them."""

    def __init__(self, pid: int, returncode_file: Path | None, process: subprocess.Popen | None) -> None:
        self.pid, self._returncode_file, self._process = pid, returncode_file, process

    def poll(self) -> int | None:
        if self._process is not None:
            return self._process.poll()
        return int(self._returncode_file.read_text()) if self._returncode_file.exists() else None

    def send_signal(self, number: int) -> None:
        os.kill(self.pid, number)

    def wait(self, timeout: float = 600) -> int:
        if self._process is not None:
            return self._process.wait(timeout)
        deadline = time.monotonic() + timeout
        while (returncode := self.poll()) is None:
            if time.monotonic() > deadline:
                os.kill(self.pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.05)
        return returncode


class Client:
    """A test process's connection to its own server, started on first use and stopped at exit."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.env: dict[str, str] = {}
        self.enabled = True
        self.busy = threading.Lock()

    def _read(self, timeout: float | None = None) -> dict | None:
        """The server's next answer; None when none came within `timeout` seconds."""
        line = b""
        while not line.endswith(b"\n"):
            if not select.select([self.process.stdout], [], [], timeout)[0]:
                return None
            chunk = os.read(self.process.stdout.fileno(), 1)
            if not chunk:
                return {}  # the server is gone
            line += chunk
        return json.loads(line)

    def _send(self, request: dict) -> dict:
        """Send a request; the server's first answer ({} when the server is gone)."""
        try:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
        except BrokenPipeError:
            return {}
        return self._read()

    def _start(self) -> bool:
        if self.process is None and self.enabled:
            self.env = dict(os.environ)
            self.process = subprocess.Popen(
                [sys.executable, __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env=self.env,
            )
            atexit.register(self.stop)
            if self._read().get("ready") is not True:
                self.enabled = False  # it could not fork safely: every command runs fresh
                self.stop()
        return self.process is not None

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(BrokenPipeError):  # it is gone already
                self.process.stdin.close()
            self.process.wait()
            self.process = None

    def start(
        self, argv: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path
    ) -> Started | None:
        """The command started in the background, or None when it must run as a fresh process."""
        if not self.busy.acquire(blocking=False):
            return None
        try:
            if not self._start() or not self._same_environment(env):
                return None
            returncode = Path(f"{stdout}.returncode")
            request = {
                "argv": argv,
                "cwd": str(cwd),
                "env": env,
                "stdout": str(stdout),
                "stderr": str(stderr),
            }
            started = self._send(request | {"background": True, "returncode": str(returncode)})
            if "pid" not in started:
                self.enabled = False
                self.process = None
                return None
            return Started(started["pid"], returncode, None)
        finally:
            self.busy.release()

    def _same_environment(self, env: dict[str, str]) -> bool:
        """Whether `env` agrees with the server's in every variable read when the preloaded packages load."""
        names = {n for n in env.keys() | self.env.keys() if env_matters(n)}
        return all(env.get(name) == self.env.get(name) for name in names)

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess | None:
        """The finished command, or None when it must run as a fresh process (see cli_server.py)."""
        if not self.busy.acquire(blocking=False):
            return None
        try:
            if not self._start() or not self._same_environment(env):
                return None
            with tempfile.TemporaryDirectory() as out:
                files = {"stdout": f"{out}/stdout", "stderr": f"{out}/stderr"}
                request = {"argv": argv, "cwd": str(cwd), "env": env, **files}
                started = self._send(request)
                if "pid" not in started:  # the server is gone: this command runs fresh, and the next ones
                    self.enabled = False
                    self.process = None
                    return None
                done = self._read(timeout)
                if done is None:
                    os.kill(started["pid"], signal.SIGKILL)
                    self._read()  # the killed child's exit
                if done is not None and "returncode" not in done:
                    raise RuntimeError(f"tests/cli_server.py died while running {argv}")
                stdout, stderr = (Path(files[name]).read_text() for name in ("stdout", "stderr"))
            if done is None:
                raise subprocess.TimeoutExpired([sys.executable, *argv], timeout, stdout, stderr)
            return subprocess.CompletedProcess([sys.executable, *argv], done["returncode"], stdout, stderr)
        finally:
            self.busy.release()


def start(argv: list[str], cwd: Path, env: dict[str, str], stdout: Path, stderr: Path) -> Started:
    """Start a command without waiting for it (from the server when it can, else as a fresh process), its
    output into the files `stdout` and `stderr`."""
    started = CLIENT.start(argv, cwd, env, stdout, stderr)
    if started is not None:
        return started
    with open(stdout, "w") as out, open(stderr, "w") as err:
        process = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, stdout=out, stderr=err)
    return Started(process.pid, None, process)


CLIENT = Client()  # one per test process


if __name__ == "__main__":
    serve()
