"""rh3dgs.progress.track: rich bars at a terminal (nested tracks share one display), nothing elsewhere."""
import io

import pytest
from rich.console import Console

from rh3dgs import progress
from rh3dgs.progress import track


def _console():
    buf = io.StringIO()
    return buf, Console(file=buf, force_terminal=True, width=100)


def test_not_a_terminal_prints_nothing(capsys, monkeypatch):
    monkeypatch.delenv("RH3DGS_PROGRESS", raising=False)
    assert not progress.enabled()  # pytest captures both streams
    assert list(track(range(50), description="lift: IRLS pass 1")) == list(range(50))
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""


def test_lines_on_request(capsys, monkeypatch):
    monkeypatch.delenv("RH3DGS_QUIET", raising=False)
    monkeypatch.setenv("RH3DGS_PROGRESS", "lines")
    assert list(track(range(20), description="extract")) == list(range(20))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[rh3dgs] extract: 0/20" and lines[-1] == "[rh3dgs] extract: 20/20" and len(lines) == 11
    monkeypatch.setenv("RH3DGS_QUIET", "1")
    list(track(range(20), description="extract"))
    assert capsys.readouterr().err == ""


def test_terminal_bar_and_nesting():
    buf, console = _console()
    seen = []
    for i in track(range(3), description="suite", console=console):
        live = progress._live
        assert live is not None
        for _ in track(range(4), description=f"lift {i}"):  # nested: a second task of the same display
            seen.append(len(live.tasks))
        assert len(live.tasks) == 1  # the inner task is removed when it ends
    assert progress._live is None and seen == [2] * 12
    text = buf.getvalue()
    assert "suite" in text and "lift 0" in text and "\x1b[" in text  # drawn with terminal codes


def test_early_exit_releases_the_display():
    _, console = _console()
    for i in track(range(10), description="x", console=console):
        if i == 2:
            break
    import gc

    gc.collect()
    assert progress._live is None
    with pytest.raises(ValueError):
        for i in track(range(10), description="y", console=console):
            raise ValueError
    assert progress._live is None


def test_known_future_warnings_are_filtered():
    import subprocess
    import sys

    code = ("import warnings; from rh3dgs.progress import silence_known_warnings; silence_known_warnings(); "
            "warnings.warn('`torch.jit.script` is deprecated. Please switch', FutureWarning); "
            "warnings.warn('`torch.cuda.amp.custom_fwd(args...)` is deprecated.', FutureWarning); "
            "warnings.warn('something else', FutureWarning)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "something else" in p.stderr and "deprecated" not in p.stderr, p.stderr
