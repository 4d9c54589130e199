"""`--plot DIR` for bench, eval and chaos (dspark_proxy/plotting.py, docs/performance.md): every figure is
written as a valid PNG, small enough for docs/img/, from the same records the commands keep; the option
is checked before anything is measured (a directory created if missing, a file refused naming it,
`bench --plot FILE.png` kept with one deprecation line, no matplotlib: one line and exit code 5).
The real runs' plots are checked beside their runs (tests/test_bench.py, test_chaos.py, test_spec_eval.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dspark_proxy.bench.measure import Samples
from dspark_proxy.plotting import PNG_MAGIC, plot_target

MAX_BYTES = 200_000  # docs/img/ keeps a few of them


def assert_png(path: str | Path) -> None:
    """A PNG file (its 8-byte signature and an IHDR chunk first), under the docs' size bound."""
    data = Path(path).read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", path
    assert len(data) < MAX_BYTES, (path, len(data))


def test_bench_figures_one_file_each(tmp_path: Path) -> None:
    from dspark_proxy.bench.plot import plot_dir

    rng = np.random.default_rng(0)
    samples = Samples()
    for place in ("same_core", "split"):
        for k in ("handoff", "futex_adaptive", "pipe", "tcp"):
            samples.add(f"handoff/{place}/{k}", rng.integers(5_000, 50_000, 300))
    samples.add("gil/process/busy_2/engine_wait", rng.integers(5_000, 50_000, 300))
    res = {"scaling": {"cases": [{"W": 16, "mix": "decode", "n": n, "proxy_cost": {"p50_us": 10.0 + n}}
                                 for n in (1, 16, 256)]},
           "eval": {"num_spec": 5, "prompts": 4, "max_new": 16, "max_batch": 2,
                    "accept_by_position": [0.8, 0.6, 0.5, 0.4, 0.3],
                    "tokens_per_s": {"target_only": 100.0, "proxy": 150.0}}}
    paths = plot_dir(res, samples, tmp_path)
    assert sorted(Path(p).name for p in paths) == ["bench_gil.png", "bench_handoff.png", "bench_scaling.png",
                                                  "eval_acceptance.png", "eval_tokens_per_s.png"]
    for p in paths:
        assert_png(p)


def test_eval_figures(tmp_path: Path) -> None:
    from dspark_proxy.spec.plot import plot_eval

    r = {"num_spec": 5, "prompts": 16, "max_new": 64, "max_batch": 4,
         "accept_by_position": [0.79, 0.66, 0.57, 0.51, 0.46], "accept_by_position_ngram": [0.5, 0.4, 0.3, 0.2, 0.1],
         "tokens_per_s": {"target_only": 300.0, "ngram": 360.0, "proxy": 390.0, "thread": 400.0, "proxy_full_k": 380.0},
         "tokens_per_s_runs": {"target_only": [290.0, 300.0, 310.0], "proxy": [380.0, 390.0, 400.0]}}
    paths = plot_eval(r, tmp_path)
    assert [Path(p).name for p in paths] == ["eval_acceptance.png", "eval_tokens_per_s.png"]
    for p in paths:
        assert_png(p)
    assert plot_eval({}, tmp_path / "nothing") == []  # an eval without those fields draws nothing


def test_chaos_figure_from_the_engine_record(tmp_path: Path) -> None:
    from dspark_proxy.chaos import Injection
    from dspark_proxy.chaos.plot import plot_chaos

    n = 3000
    end = (np.arange(n) * 1_200_000).tolist()  # a round every 1.2 ms
    wait = np.full(n, 30_000)
    wait[500:700] = 30_000_000  # a held fault: every round waits out the 30 ms deadline
    injs = [Injection(kind="worker_stall_long", n=1, idx_start=400, t_start=401, clock_start_s=0.5,
                      idx_clear=700, idx_end=1400),
            Injection(kind="conn_drop", n=1, idx_start=1500, t_start=1501, clock_start_s=1.8, idx_clear=1510,
                      idx_end=2500),
            Injection(kind="conn_drop", n=2, idx_start=2500, t_start=2501, clock_start_s=3.0, idx_clear=2505,
                      idx_end=3000),
            Injection(kind="proxy_kill", n=1, idx_start=3000, t_start=3001, clock_start_s=3.6)]  # never ended
    paths = plot_chaos(end, wait.tolist(), injs, 30.0, 20.0, tmp_path)
    assert [Path(p).name for p in paths] == ["chaos_wait.png"]
    assert_png(paths[0])
    assert plot_chaos(end, wait.tolist(), injs[3:], 30.0, 20.0, tmp_path / "x") == []


def test_plot_dir_is_created_and_a_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d, f = plot_target("eval", str(tmp_path / "a" / "b"))
    assert d == tmp_path / "a" / "b" and d.is_dir() and f is None
    assert plot_target("eval", None) == (None, None)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=f"--plot {tmp_path / 'file'}: exists and is not a directory"):
        plot_target("chaos", str(tmp_path / "file"))
    with pytest.raises(ValueError, match="give a directory"):
        plot_target("eval", str(tmp_path / "out.png"))
    assert capsys.readouterr().err == ""


def test_bench_png_path_keeps_its_meaning_with_one_warning(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    d, f = plot_target("bench", str(tmp_path / "bench.png"), legacy_png=True)
    assert d is None and f == str(tmp_path / "bench.png") and not (tmp_path / "bench.png").exists()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "--plot FILE.png is deprecated: give a directory" in err[0], err


def test_cli_refuses_a_plot_file_before_measuring(tmp_path: Path) -> None:
    """One line naming --plot and the path, exit code 2, and no model loaded (it would take seconds)."""
    from dspark_proxy.cli import cli

    (tmp_path / "f").write_text("x")
    for cmd in (["eval", "--quick"], ["chaos", "--duration", "1"], ["bench", "--sections", "handoff"]):
        res = CliRunner().invoke(cli, [*cmd, "--plot", str(tmp_path / "f")])
        assert res.exit_code == 2 and "--plot" in res.output and str(tmp_path / "f") in res.output, res.output
        assert "Traceback" not in res.output


@pytest.mark.timeout(60)
def test_without_matplotlib_one_line_and_exit_5(tmp_path: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None; from dspark_proxy.cli import cli; "
            f"cli(['chaos', '--plot', {str(tmp_path / 'p')!r}])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 5, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--plot needs the Python package 'matplotlib'" in lines[0] and "[plot]" in lines[0], lines
    assert not (tmp_path / "p").exists()
