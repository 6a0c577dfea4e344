"""``bench.sandbox`` measures for real: one short run, every step of both sides in bwrap.

Each side of each optimization checks its own sandbox's exit status (the task image
built or found, the runtime mounted or copied and ``node`` run, the tests run with the
packaged toolchain or with pytest installed from the local wheels), so a row is printed
only if both sides did their work.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^(.+?)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d)x\s+(\d+\.\d)-(\d+\.\d)x$")


def test_one_round_prints_every_optimization_with_and_without(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    (runtime / "bin").mkdir(parents=True)
    (runtime / "bin" / "cli.js").write_text("console.log('agent');\n")
    done = subprocess.run(
        [sys.executable, "-m", "bench.sandbox", "--rounds", "1", "--runtime", str(runtime)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {
        m.group(1).strip(): m.groups()[1:] for m in map(ROW.match, done.stdout.splitlines()) if m
    }
    assert set(rows) == {
        "prebuilt task image",
        "agent runtime mounted",
        "grading toolchain packaged",
    }, done.stdout
    for with_s, without_s, ratio, low, high in rows.values():
        assert float(with_s) > 0
        assert float(without_s) > 0
        assert low == high == ratio  # one round: one paired ratio
