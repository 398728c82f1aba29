"""The browser first-glyph benchmark runs end to end and measures what it says: for each answer, the page's
own time from Enter to the first glyph painted, never less than that answer's engine time to first token
(a glyph cannot appear before the first token). Speed targets live in the benchmark's printout."""

import json
import subprocess
import sys

from tests.helpers.servers import ROOT


def test_the_benchmark_measures_each_answers_first_glyph_after_its_first_token(server_url, tmp_path):
    out = subprocess.run([sys.executable, "-m", "bench.browser", "--url", server_url, "--users", "1",
                          "--rounds", "3", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "first glyph p50" in out.stdout
    (run,) = json.loads((tmp_path / "browser-glyph.json").read_text())["runs"]
    assert (run["users"], run["errors"]) == (1, [])
    samples = run["samples"]
    assert [(s["user"], s["round"]) for s in samples] == [(0, 0), (0, 1), (0, 2)]
    for s in samples:
        assert type(s["glyph_ms"]) is int and type(s["engine_ttft_ms"]) is int
        assert s["glyph_ms"] > 0 and s["engine_ttft_ms"] > 0
        assert s["glyph_ms"] >= s["engine_ttft_ms"], s  # the page saw the answer no sooner than the engine made it


def test_lowering_the_servers_cpu_share_is_refused_when_the_server_shares_the_browsers_session(server_url, tmp_path):
    # The session's server runs inside pytest, and the benchmark is pytest's child: one scheduling group.
    out = subprocess.run([sys.executable, "-m", "bench.browser", "--url", server_url, "--users", "1",
                          "--server-nice", "19", "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        "--server-nice: the server runs in this benchmark's session, so its scheduling group is the browser's too; "
        "start the server in a session of its own (setsid python -m app)")
    assert not (tmp_path / "browser-glyph.json").exists()
