"""Every benchmark starts both ways: ``python -m bench.X`` and ``python bench/X.py``.

Run as a script, a benchmark's own directory comes first on ``sys.path``; a module named
like a package of the project (``bench/recorder.py`` once; ``bench/sandbox.py``, which
takes itself off ``sys.path`` first) would shadow that package, and a benchmark importing
a sibling as ``bench.*`` would not find it. ``--help`` imports the
whole module and parses its arguments without measuring anything.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem != "__init__")


def test_benchmarks_are_found() -> None:
    assert {"overhead", "recording", "sandbox", "turn_cost"} <= set(BENCHMARKS)


@pytest.mark.parametrize("name", BENCHMARKS)
@pytest.mark.parametrize("way", ["module", "script"])
def test_starts(name: str, way: str) -> None:
    target = ["-m", f"bench.{name}"] if way == "module" else [str(ROOT / "bench" / f"{name}.py")]
    done = subprocess.run(
        [sys.executable, *target, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout


def test_each_round_starts_with_the_next_system() -> None:
    """No proxy is always measured right after another (which leaves it its deferred work)."""
    from bench.overhead import rotated

    systems = ["a", "b", "c"]
    firsts = [rotated(systems, r)[0] for r in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]
    assert all(sorted(rotated(systems, r)) == systems for r in range(6))
    assert rotated([], 3) == []


def test_each_round_adds_to_its_own_direct_p50() -> None:
    """The added p50 by round pairs each round's proxy with that round's direct path, so the
    machine's drift between rounds shows as a spread instead of moving the figure."""
    from bench.overhead import Measured, added_by_round, spread

    def run(*latencies_ms: float) -> Measured:
        return Measured([x / 1e3 for x in latencies_ms], 1.0, 0.0, 0.0, 0.0, 0.0)

    direct = [run(1.0, 1.0, 9.0), run(3.0, 3.0, 3.0)]  # the machine slowed in round 2
    through = [run(2.5, 2.5, 2.5), run(4.0, 4.0, 50.0)]
    by_round = added_by_round(through, direct)
    assert by_round == pytest.approx([1.5, 1.0])
    assert spread(by_round) == "by round 1.00 to 1.50"
    assert spread([]) == "no rounds"
    with pytest.raises(ValueError, match="shorter"):
        added_by_round(through, direct[:1])  # rounds measured for one path only


def test_the_fsync_floor_is_measured_after_the_pause_a_lone_turn_has(tmp_path: Path) -> None:
    """A disk's fsync can cost more after a pause: each sample waits ``pause_s`` first."""
    import time

    from bench.overhead import fsync_seconds

    began = time.monotonic()
    timings = fsync_seconds(tmp_path, 4, pause_s=0.05)
    assert time.monotonic() - began >= 4 * 0.05
    assert len(timings) == 4
    assert all(t >= 0 for t in timings)
    assert not (tmp_path / "fsync-probe").exists()  # the probe file is gone
    assert len(fsync_seconds(tmp_path, 3)) == 3  # back to back by default


def test_a_lone_turns_fsync_floor_waits_one_direct_turn_each_time(tmp_path: Path) -> None:
    """Both benchmarks pace the fsync floor by the round's direct p50 (one lone turn)."""
    import time

    from bench.overhead import FSYNC_SAMPLES, Measured, lone_turn_fsyncs

    direct = Measured([0.004, 0.01, 0.5], 1.0, 0.0, 0.0, 0.0, 0.0)  # p50: 10 ms
    began = time.monotonic()
    timings = lone_turn_fsyncs(tmp_path, direct)
    assert len(timings) == FSYNC_SAMPLES
    assert time.monotonic() - began >= FSYNC_SAMPLES * 0.01


def test_a_round_trip_goes_to_another_process_and_back() -> None:
    """The hop a proxy adds to a turn: each sample is one byte sent to an echo server in
    another process and read back; the connection closes with the block."""
    from bench.overhead import echo_peer, round_trip_seconds

    with echo_peer() as connection:
        timings = round_trip_seconds(connection, 5)
        connection.sendall(b"abc")  # what comes back is what was sent, from elsewhere
        assert connection.recv(64) == b"abc"
    assert len(timings) == 5
    assert all(t > 0 for t in timings)
    assert connection.fileno() == -1  # closed with the block


def test_the_proxies_run_on_the_interpreter_given() -> None:
    """``--python``: the proxies' command starts with that interpreter, with the same
    arguments as on this one; the report names the interpreter, and one that does not run
    is refused before anything starts."""
    import platform

    from bench.overhead import interpreter, proxy_command

    here = proxy_command(None, ["--workers", "2"])
    assert here[0] == sys.executable
    assert here[1:] == ["-m", "cli.main", "serve", "--log-level", "warning", "--workers", "2"]
    other = proxy_command("/opt/py/bin/python", ["--workers", "2"])
    assert other == ["/opt/py/bin/python", *here[1:]]
    described = interpreter(None)
    assert platform.python_version() in described
    assert sys.executable in described
    with pytest.raises(RuntimeError, match="does not run"):
        interpreter("/nonexistent/python")


def test_the_bare_forwarder_runs_on_lego_proxys_interpreter() -> None:
    """``bench.peers --python``: the bare forwarder, the floor of lego-proxy's stack, runs
    on the interpreter lego-proxy runs on, so what lego-proxy adds beyond it is its own."""
    from bench.peers import forwarder_command

    here = forwarder_command("http://127.0.0.1:1", Path("/m"), 2, 16, None)
    assert here[:3] == [sys.executable, "-m", "bench.forwarder"]
    other = forwarder_command("http://127.0.0.1:1", Path("/m"), 2, 16, "/opt/py/bin/python")
    assert other == ["/opt/py/bin/python", *here[1:]]
    durable = forwarder_command("http://127.0.0.1:1", Path("/m"), 2, 16, None, Path("/d"))
    assert durable == [*here, "--durable", "/d"]


def test_the_load_client_measures_with_its_heap_frozen() -> None:
    """The load client's own full collections (61-243 ms with transformers imported)
    stopped every client at once and showed as the proxy's p99: ``measure`` freezes the
    client's heap while it measures, reports its longest full pass, and gives the heap back
    afterwards."""
    import asyncio
    import gc
    import os

    import httpx

    from bench.overhead import measure

    frozen_during: list[int] = []

    async def call(client: httpx.AsyncClient, slot: int) -> None:
        frozen_during.append(gc.get_freeze_count())
        gc.collect()  # a full pass, timed by the callback

    before = gc.get_freeze_count()
    measured = asyncio.run(measure(call, 3, 1, os.getpid()))
    assert len(measured.latencies) == 3
    assert frozen_during[0] == before  # the warm-up call runs before the freeze
    assert all(count > before for count in frozen_during[1:])
    assert measured.client_gc_longest_s > 0
    assert gc.get_freeze_count() <= before  # given back (unfreezing gives back all)


def test_the_load_client_reports_what_its_requests_cost_the_machine() -> None:
    """``measure`` reports every core's busy time and the load client's own CPU over the
    measured calls, and, given its pid, a backend's: the machine's is at least the client's
    (``/proc/stat`` counts in ticks of 10 ms, hence the calls' 40 ms each), and the backend
    here is a process of its own that spins all along, so its CPU is its and not ours."""
    import asyncio
    import subprocess
    import sys
    import time

    import httpx

    from bench.overhead import measure

    async def call(client: httpx.AsyncClient, slot: int) -> None:
        until = time.process_time() + 0.04
        while time.process_time() < until:
            pass

    backend = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # its start-up is not in the window
        measured = asyncio.run(measure(call, 3, 1, backend.pid, backend_pid=backend.pid))
    finally:
        backend.kill()
        backend.wait()
    assert measured.client_cpu_s >= 0.11  # the three measured calls, not the warm-up
    assert measured.client_cpu_s < 0.16 + 0.1
    assert measured.machine_cpu_s >= measured.client_cpu_s - 0.03  # one tick each end
    assert measured.backend_cpu_s is not None
    assert measured.backend_cpu_s >= 0.03  # it spun through the calls' 0.12 s or more
    assert abs(measured.cpu_s - measured.backend_cpu_s) <= 0.02  # the same pid, twice
    assert asyncio.run(measure(call, 1, 1, backend.pid)).backend_cpu_s is None
