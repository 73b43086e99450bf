"""Smoke test of scripts/bench_history_daemon.py: it fills, serves, compacts, restarts and prints
its table on tiny sizes. It checks the script, not the speed (figures are for scripts/, never tests)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_history_benchmark_runs_end_to_end_and_prints_its_table(tmp_path):
    results = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_history_daemon.py"), "--tasks", "0,300",
         "--seconds", "2", "--clients", "2", "--compact-wal-bytes", "4000", "--json", str(results),
         "--tmp-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert ("| N | cycles/s | p50 ms | p99 ms | max ms | longest gap ms | daemon silent ms | longest turn ms | "
            "compactions |" in done.stdout)
    assert "Targets (issue 11):" in done.stdout and "- N=300:" in done.stdout
    rows = json.loads(results.read_text())["rows"]
    assert [row["tasks"] for row in rows] == [0, 300]
    for row in rows:
        assert row["cycles_per_second"] > 0 and row["errors"] == 0 and row["write_failures"] == 0
        assert row["restart_seconds"] > 0 and row["wal_bytes_written"] > 0
        # No client went longer without an answer than the daemon went without answering anyone.
        assert 0 < row["silence_ms"] <= row["longest_gap_ms"]
        assert row["longest_turn_ms"] > 0   # from the daemon's own report (protocol version 5)
        # Second by second (what --plot draws): the window's two seconds, within the whole-window figures.
        series = row["series"]
        assert len(series["cycles"]) == len(series["longest_cycle_ms"]) == len(series["silence_ms"]) == 2
        assert 0 < sum(series["cycles"]) and max(series["longest_cycle_ms"]) <= row["max_ms"] + 0.1
        assert 0 < max(series["silence_ms"]) <= row["silence_ms"] + 0.1
    assert rows[1]["compactions"], "no compaction in the window at a 4000-byte floor"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["bench.json"]  # scratch removed
