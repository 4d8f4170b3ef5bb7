"""The tests' zygote (tests/zygote.py) starts a ``shoal`` command as ``python -m shoal``
would: same output, same exit codes, same signals, and nothing left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zygote
from harness import EtcdServer, free_port, wait_until

TESTS = Path(__file__).parent.parent


def both_ways(
    args: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> list[tuple[int, str]]:
    """``shoal args`` run to its end by ``python -m shoal`` and by the zygote: exit
    codes and output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    popen_log, zygote_log = tmp_path / "popen.log", tmp_path / "zygote.log"
    with open(popen_log, "ab") as log:
        spawned = subprocess.run(
            [sys.executable, "-m", "shoal", *args], stdout=log, stderr=log, env=env, check=False
        )
    forked = zygote.zygote(tmp_path).spawn(["shoal", *args], env, Path.cwd(), zygote_log)
    return [
        (spawned.returncode, popen_log.read_text()),
        (forked.wait(60), zygote_log.read_text()),
    ]


def test_a_refused_command_line_exits_and_explains_alike(tmp_path: Path) -> None:
    (spawned, forked) = both_ways(["broker", "--node-id=seven"], tmp_path)
    assert spawned == forked
    assert spawned[0] == 2 and "--node-id" in spawned[1]


def test_a_failing_start_exits_with_the_same_code_and_message(tmp_path: Path) -> None:
    """A broker whose data directory is a file: refused at start with exit code 1."""
    (tmp_path / "not-a-dir").write_text("")
    args = ["broker", f"--data-dir={tmp_path / 'not-a-dir'}", "--etcd=http://127.0.0.1:1/x",
            f"--listen=127.0.0.1:{free_port()}"]  # fmt: skip
    (spawned, forked) = both_ways(args, tmp_path, {"SHOAL_LOG_FORMAT": "json"})
    assert spawned[0] == forked[0] != 0
    assert spawned[1].splitlines()[-1] == forked[1].splitlines()[-1]


def test_a_forked_broker_reads_its_environment_and_answers_to_signals(
    etcd: EtcdServer, tmp_path: Path
) -> None:
    log_path = tmp_path / "broker.log"
    env = {
        **os.environ,
        "SHOAL_DATA_DIR": str(tmp_path / "data"),
        "SHOAL_LISTEN": f"127.0.0.1:{free_port()}",
        "SHOAL_ETCD": etcd.chroot_url(),
        "SHOAL_LOG_FORMAT": "json",
    }
    forked = zygote.zygote(tmp_path).spawn(["shoal", "broker"], env, tmp_path, log_path)
    wait_until(lambda: b'"event": "broker_ready"' in log_path.read_bytes(), 60, "broker ready")
    assert forked.poll() is None
    forked.send_signal(signal.SIGSTOP)
    wait_until(lambda: _state(forked.pid) == "T", 10, "the broker to stop")
    forked.send_signal(signal.SIGCONT)
    forked.terminate()
    assert forked.wait(30) == 0
    killed = zygote.zygote(tmp_path).spawn(["shoal", "broker"], env, tmp_path, log_path)
    wait_until(lambda: log_path.read_bytes().count(b'"event": "broker_ready"') == 2, 60, "restart")
    killed.kill()
    assert killed.wait(10) == -signal.SIGKILL
    running = zygote.zygote(tmp_path).spawn(["shoal", "broker"], env, tmp_path, log_path)
    with pytest.raises(subprocess.TimeoutExpired):
        running.wait(0.1)
    running.kill()
    running.wait(10)


def test_its_children_go_when_the_test_process_dies(etcd: EtcdServer, tmp_path: Path) -> None:
    """A test process killed outright (a worker's crash, a CI timeout) leaves no broker running."""
    pid_file = tmp_path / "pid"
    script = textwrap.dedent(f"""
        import os, sys, time
        from pathlib import Path
        sys.path.insert(0, {str(TESTS)!r})
        from harness import BrokerProcess
        broker = BrokerProcess({etcd.chroot_url()!r}, Path({str(tmp_path / "data")!r})).start()
        Path({str(pid_file)!r}).write_text(str(broker.process.pid))
        time.sleep(600)
    """)
    test_process = subprocess.Popen([sys.executable, "-c", script])
    try:
        wait_until(lambda: pid_file.exists() and pid_file.read_text(), 60, "the broker to start")
        broker_pid = int(pid_file.read_text())
        os.kill(broker_pid, 0)
    finally:
        test_process.kill()
        test_process.wait()
    wait_until(lambda: _state(broker_pid) in "ZX", 10, "the broker to go")


def _state(pid: int) -> str:
    """The process's state letter in /proc (T stopped, Z zombie); X once it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except OSError:
        return "X"
