"""Starting ``shoal broker`` and ``shoal gateway`` processes without paying their imports each time.

A test run starts about three hundred brokers and fifty gateways, and each
spends most of a second of CPU importing the same modules (kio's schemas,
pydantic, gRPC, OpenTelemetry) before it does anything: minutes of a
two-core machine's test run. A zygote is one process per test process that
imports those modules once and then forks a child per broker or gateway; the
child sets its own argv, environment, working directory and log file and runs
the same ``shoal`` entry point ``python -m shoal`` runs. So each broker and
gateway is still a real process of its own (its own pid, killed, frozen and
restarted for real), started from a warm interpreter.

What a forked child does not get that ``python -m shoal`` would: the
environment's effect at interpreter start (``PYTHON*`` variables; the zygote
itself runs unbuffered, as the tests' processes do) and module state set at
import time from the environment (none of Shoal's: its settings are read when a
command runs). Random generators are reseeded after every fork by Python
itself. Processes that need anything else (another interpreter, a network
namespace, ``PYTHON*`` flags) keep using :class:`subprocess.Popen`.

The zygote reaps its children and reports each exit status back, so
:class:`ZygoteChild` answers ``poll``, ``wait`` and ``returncode`` as
:class:`subprocess.Popen` does (minus the signal's number for a death by
signal). It exits when the test process that started it does, and its
children with it.

``SHOAL_TEST_ZYGOTE=0`` turns it off (every process from ``python -m shoal``).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

PRELOADED = (
    "shoal.cli.app",
    "shoal.cli.broker",
    "shoal.cli.gateway",
    # What the two commands import when they run (kept out of the CLI's own import).
    "shoal.broker.app",
    "shoal.broker.cluster.store",
    "shoal.broker.log.manager",
    "shoal.gateway.server",
    "shoal.tracing",
)

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """Ask the kernel for SIGKILL when the parent goes: no process outlives its test run."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


# -- the test process's side ----------------------------------------------------------


class ZygoteChild:
    """A process the zygote forked: the part of :class:`subprocess.Popen` tests use."""

    def __init__(self, pid: int, args: Sequence[str]) -> None:
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._exited = threading.Event()

    def _exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, signum: int) -> None:
        # As Popen: never signal a pid already reaped (it may be someone else's now).
        if self.returncode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The test process's handle on its zygote: :meth:`spawn` asks it for a child."""

    def __init__(self, log_path: Path) -> None:
        ours, theirs = socket.socketpair()
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, __file__, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        theirs.close()
        self._socket = ours
        self._lock = threading.Lock()
        self._started: list[ZygoteChild] = []
        self._started_ready = threading.Condition()
        self._children: dict[int, ZygoteChild] = {}
        self._exits: dict[int, int] = {}
        self._reader = threading.Thread(target=self._read, name="zygote", daemon=True)
        self._reader.start()

    def spawn(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path
    ) -> ZygoteChild:
        """Fork a child that runs ``shoal`` with ``argv`` (its first item is the
        program's name), ``env`` as its whole environment, in ``cwd``, with its
        output appended to ``log_path``."""
        request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "log": str(log_path)}
        # As Popen's caller opens it: the log exists once this returns, before the child runs.
        log_path.touch()
        with self._lock, self._started_ready:
            self._socket.sendall(json.dumps(request).encode() + b"\n")
            if not self._started_ready.wait_for(
                lambda: self._started or not self._reader.is_alive(), 30
            ):
                raise RuntimeError("the zygote did not answer in 30 s")
            if not self._started:
                raise RuntimeError(f"the zygote exited with {self._process.wait(5)}")
            return self._started.pop()

    def _read(self) -> None:
        with self._socket.makefile("rb") as lines, contextlib.suppress(OSError):
            for line in lines:
                message: dict[str, Any] = json.loads(line)
                if "started" in message:
                    pid = message["started"]
                    child = self._children[pid] = ZygoteChild(pid, message["argv"])
                    with self._started_ready:
                        self._started.append(child)
                        self._started_ready.notify_all()
                else:
                    self._children.pop(message["exited"])._exit(message["code"])
        with self._started_ready:
            self._started_ready.notify_all()

    @property
    def alive(self) -> bool:
        return self._process.poll() is None


_zygotes: dict[int, Zygote] = {}
"""This process's zygote, by pid: a process forked from a test process (a
multiprocessing worker) must not use its parent's."""
_zygotes_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("SHOAL_TEST_ZYGOTE", "1") != "0"


def zygote(log_dir: Path) -> Zygote:
    """This test process's zygote, started on first use (its log in ``log_dir``)."""
    with _zygotes_lock:
        current = _zygotes.get(os.getpid())
        if current is None or not current.alive:
            log_dir.mkdir(parents=True, exist_ok=True)
            current = _zygotes[os.getpid()] = Zygote(log_dir / f"zygote-{os.getpid()}.log")
        return current


# -- the zygote's side ----------------------------------------------------------------


def _serve(channel: socket.socket) -> None:
    """Fork a child per request, report its pid, reap it and report its exit status.

    Returns when the test process closes its end (done, or killed): the children,
    asked to die with the zygote, go with it.
    """
    for module in PRELOADED:
        __import__(module)
    # What each broker and gateway loads before it serves (shoal.wire.load_schemas): the
    # children find it loaded.
    from shoal.broker.handlers import API_VERSIONS
    from shoal.gateway.apis import DECODED_VERSIONS

    from shoal.wire import load_schemas

    load_schemas(API_VERSIONS)
    load_schemas(DECODED_VERSIONS)
    # Forking a process with threads copies their locks, held or not, without them.
    assert threading.active_count() == 1, threading.enumerate()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    pending = b""
    while True:
        readable, _, _ = select.select([channel, wake_read], [], [])
        if wake_read in readable:
            while True:
                try:
                    if not os.read(wake_read, 512):
                        break
                except BlockingIOError:
                    break
            _reap(channel)
        if channel in readable:
            data = channel.recv(65536)
            if not data:  # the test process is gone or done: so are its children
                return
            pending += data
            *requests, pending = pending.split(b"\n")
            for raw in requests:
                request = json.loads(raw)
                pid = os.fork()
                if pid == 0:
                    _child(request, channel, (wake_read, wake_write))
                _send(channel, {"started": pid, "argv": request["argv"]})
            # A child that exited before its start was reported is reaped now, after.
            _reap(channel)


def _reap(channel: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _send(channel, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})


def _send(channel: socket.socket, message: dict[str, Any]) -> None:
    channel.sendall(json.dumps(message).encode() + b"\n")


def _child(request: dict[str, Any], channel: socket.socket, wake: tuple[int, int]) -> None:
    """In the forked child: become ``shoal <argv>``; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        channel.close()
        for fd in wake:
            os.close(fd)
        _die_with_parent()
        os.chdir(request["cwd"])
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        code = _run_shoal()
    finally:
        # What the interpreter does at exit, then leave without unwinding the zygote's loop.
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


def _run_shoal() -> int:
    """``python -m shoal``'s main, and the exit code the interpreter would give it."""
    from shoal.cli.app import main

    try:
        main()
    except SystemExit as exc:
        if exc.code is None:
            return 0
        if isinstance(exc.code, int):
            return exc.code
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        import traceback

        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
