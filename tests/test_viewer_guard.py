"""rh3dgs.viewer.guard: viser 0.2.7 (pinned by nerfstudio 1.1.5) served any file through ``..``; the guard
confines static files to the viewer's asset folder, refuses foreign-Origin WebSockets and DNS-rebinding
Host headers, and binds beyond 127.0.0.1 only on an explicit request (with a warning).

Requests are sent byte for byte on a socket (``curl --path-as-is``): no client normalises the ``..`` away.
Every refusal is checked for its status code *and* for the absence of the file's bytes in the answer.
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from _http import WS_HEADERS, free_port, listen_addresses, raw_request, ws_handshake

pytest.importorskip("viser")

import rh3dgs  # noqa: E402
from rh3dgs import Gaussians  # noqa: E402
from rh3dgs.viewer import guard  # noqa: E402

SECRET = b"rh3dgs-secret-0d4c2f: must never be served\n"


# ----------------------------------------------------------------------------- an asset folder with traps
@pytest.fixture
def assets(tmp_path):
    """root/ (served) with index.html, sub/a.js, a symlink inside->inside, symlinks inside->outside;
    outside/secret.txt next to it (not served)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "index.html").write_bytes(b"<html>index</html>")
    (root / "sub" / "a.js").write_bytes(b"console.log(1)")
    (root / "sp ace.txt").write_bytes(b"spaced")
    (outside / "secret.txt").write_bytes(SECRET)
    os.symlink(root / "index.html", root / "link_in.html")
    os.symlink(outside / "secret.txt", root / "link_out.txt")
    os.symlink(outside, root / "link_dir")
    return root, outside / "secret.txt"


def _traversal_targets(root: Path, secret: Path):
    """(name, raw request target) for every traversal form: each would reach ``secret`` (or /etc/passwd)."""
    up = "../" * (len(root.parts) + 2)
    rel_secret = str(secret).lstrip("/")
    return [
        ("raw ..", "/" + up + rel_secret),
        ("raw .. to /etc/passwd", "/" + "../" * 20 + "etc/passwd"),
        ("raw .. to /proc/self/environ", "/" + "../" * 20 + "proc/self/environ"),
        ("%2e%2e", "/" + "%2e%2e/" * (len(root.parts) + 2) + rel_secret),
        ("%2E%2E upper case", "/" + "%2E%2E/" * (len(root.parts) + 2) + rel_secret),
        (".%2e mixed", "/" + ".%2e/" * (len(root.parts) + 2) + rel_secret),
        ("..%2f encoded slash", "/" + "..%2f" * (len(root.parts) + 2) + rel_secret.replace("/", "%2f")),
        ("%2e%2e%2f all encoded", "/" + "%2e%2e%2f" * (len(root.parts) + 2) + rel_secret.replace("/", "%2F")),
        ("absolute path via %2f", "/%2f" + rel_secret.replace("/", "%2f")),
        ("absolute path via //", "/" + str(secret)),
        ("absolute-form target", f"http://127.0.0.1/{up}{rel_secret}"),
        ("no leading slash", up + rel_secret),
        ("backslashes", "/" + "..\\" * (len(root.parts) + 2) + rel_secret.replace("/", "\\")),
        ("%5c encoded backslashes", "/" + "..%5c" * (len(root.parts) + 2) + rel_secret.replace("/", "%5c")),
        ("double-encoded %252e", "/" + "%252e%252e/" * (len(root.parts) + 2) + rel_secret),
        ("NUL", "/index.html%00/" + up + rel_secret),
        ("dot segment after a real folder", "/sub/../" + up + rel_secret),
        ("symlinked file pointing out", "/link_out.txt"),
        ("symlinked folder pointing out", "/link_dir/secret.txt"),
    ]


def test_static_file_serves_only_regular_files_under_the_root(assets):
    root, secret = assets
    base = root.resolve()
    assert guard.static_file(root, "/") == base / "index.html"
    assert guard.static_file(root, "/index.html?v=3#top") == base / "index.html"
    assert guard.static_file(root, "/sub/a.js") == base / "sub" / "a.js"
    assert guard.static_file(root, "/sp%20ace.txt") == base / "sp ace.txt"
    assert guard.static_file(root, "/link_in.html") == base / "index.html"  # a link that stays inside
    assert guard.static_file(root, "/missing.js") == 404
    assert guard.static_file(root, "/sub") == 404  # a folder is not a file
    for name, target in _traversal_targets(root, secret):
        got = guard.static_file(root, target)
        assert got in (403, 404), (name, target, got)


@pytest.mark.parametrize("origin,host,ok", [
    (None, "127.0.0.1:8080", True),  # not a browser: no Origin
    ("http://127.0.0.1:8080", "127.0.0.1:8080", True),
    ("http://localhost:8080", "localhost:8080", True),
    ("http://LOCALHOST:8080", "localhost:8080", True),
    ("http://[::1]:8080", "[::1]:8080", True),
    ("https://box.example", "box.example:443", True),
    ("http://evil.example", "127.0.0.1:8080", False),
    ("http://127.0.0.1:9999", "127.0.0.1:8080", False),  # another local page (other port)
    ("http://localhost:8080", "127.0.0.1:8080", False),  # another origin, same machine
    ("null", "127.0.0.1:8080", False),  # sandboxed iframe / file://
    ("file://", "127.0.0.1:8080", False),
    ("http://127.0.0.1:8080/path", "127.0.0.1:8080", False),
    ("http://u@127.0.0.1:8080", "127.0.0.1:8080", False),
    ("http://127.0.0.1:8080", None, False),
])
def test_origin_rule(origin, host, ok):
    assert guard.origin_allowed(origin, host) is ok


@pytest.mark.parametrize("host,bind,ok", [
    ("127.0.0.1:8080", "127.0.0.1", True), ("localhost:8080", "127.0.0.1", True), ("[::1]:8080", "::1", True),
    ("127.0.0.2", "localhost", True),
    ("evil.example:8080", "127.0.0.1", False),  # DNS rebinding: the attacker's name, our address
    ("192.168.1.5:8080", "127.0.0.1", False), (None, "127.0.0.1", False), ("127.0.0.1:x", "127.0.0.1", False),
    ("evil.example:8080", "0.0.0.0", True),  # exposed on purpose: any name
])
def test_host_rule(host, bind, ok):
    assert guard.host_allowed(host, bind) is ok


def test_is_loopback():
    assert all(guard.is_loopback(h) for h in ("127.0.0.1", "127.9.9.9", "localhost", "::1", "[::1]"))
    assert not any(guard.is_loopback(h) for h in ("0.0.0.0", "::", "", None, "192.168.1.5", "example.com"))


# ----------------------------------------------------------------------------- through the real viser server
@pytest.fixture
def viser_server(assets):
    """viser's own WebsockServer (the class both viewers run on), serving the trap folder, guard installed."""
    from viser.infra import WebsockServer

    guard.install()
    root, secret = assets
    port = free_port()
    srv = WebsockServer("127.0.0.1", port, http_server_root=root, verbose=False)
    srv.start()
    try:
        yield port, root, secret
    finally:
        srv.stop()


def test_viser_serves_the_asset_folder(viser_server):
    port, root, _ = viser_server
    assert raw_request(port, "/") == (200, b"<html>index</html>")
    assert raw_request(port, "/sub/a.js") == (200, b"console.log(1)")
    assert raw_request(port, "/sp%20ace.txt") == (200, b"spaced")
    assert raw_request(port, "/link_in.html") == (200, b"<html>index</html>")
    assert raw_request(port, "/missing.js")[0] == 404
    assert raw_request(port, "/sub/")[0] == 404


def test_viser_traversal_requests_get_403_or_404_and_no_content(viser_server):
    port, root, secret = viser_server
    passwd = Path("/etc/passwd").read_bytes()[:64]
    for name, target in _traversal_targets(root, secret):
        status, body = raw_request(port, target)
        assert status in (403, 404), (name, target, status, body[:200])
        assert SECRET not in body and b"must never be served" not in body, (name, target)
        assert passwd not in body and b"root:" not in body, (name, target)


def test_viser_websocket_origin_and_host(viser_server):
    port, _, _ = viser_server
    assert ws_handshake(port) == 101  # a script (no Origin)
    assert ws_handshake(port, origin=f"http://127.0.0.1:{port}") == 101  # the viewer's own page
    assert ws_handshake(port, origin="http://evil.example") == 403
    assert ws_handshake(port, origin=f"http://localhost:{port}") == 403  # origin and Host disagree
    assert ws_handshake(port, origin="null") == 403
    # DNS rebinding: evil.example resolved to 127.0.0.1; the browser sends Host and Origin evil.example
    assert ws_handshake(port, origin=f"http://evil.example:{port}", host=f"evil.example:{port}") == 403
    status, body = raw_request(port, "/index.html", host=f"evil.example:{port}")
    assert status == 403 and b"index" not in body
    # duplicated Origin headers are refused (the browser sends exactly one)
    status = raw_request(port, "/", {**WS_HEADERS, "Origin": f"http://127.0.0.1:{port}",
                                     "origin": "http://evil.example"})[0]
    assert status == 403


# ----------------------------------------------------------------------------- `rh3dgs view` itself
def _plain_scene(tmp_path):
    n = 200
    g = Gaussians.from_activated(torch.rand(n, 3), 0.04 * torch.ones(n, 3), torch.randn(n, 4), 0.5 * torch.ones(n),
                                 torch.rand(n, 3))
    return rh3dgs.load(rh3dgs.save_ply(tmp_path / "plain.ply", g))


def test_rh3dgs_view_refuses_traversal_and_foreign_origin(tmp_path):
    from rh3dgs.viewer.server import Viewer, ViewerConfig

    viewer = Viewer(_plain_scene(tmp_path), ViewerConfig(port=0, output_dir=tmp_path / "out"))
    try:
        port = int(viewer.start().rsplit(":", 1)[1])
        status, body = raw_request(port, "/")
        assert status == 200 and b"<html" in body.lower()
        environ = b"PATH=" + os.environ.get("PATH", "").encode()[:20]
        for target in ["/" + "../" * 20 + "etc/passwd", "/" + "%2e%2e/" * 20 + "etc/passwd",
                       "/" + "..%2f" * 20 + "etc%2fpasswd", "/" + "../" * 20 + "proc/self/environ", "//etc/passwd",
                       "/%2fetc%2fpasswd"]:
            status, body = raw_request(port, target)
            assert status in (403, 404) and b"root:" not in body and environ not in body, (target, status)
        assert ws_handshake(port, origin=f"http://127.0.0.1:{port}") == 101
        assert ws_handshake(port, origin="http://evil.example") == 403
        assert listen_addresses(port) == ["127.0.0.1"]
    finally:
        viewer.stop()


def test_non_loopback_bind_needs_an_explicit_request(tmp_path, capfd, monkeypatch):
    """A viser server asked for 0.0.0.0 without the user asking (nerfstudio's default) binds 127.0.0.1;
    `rh3dgs view --host 0.0.0.0` (explicit) binds 0.0.0.0 and prints a warning."""
    import viser

    from rh3dgs.viewer.server import Viewer, ViewerConfig

    monkeypatch.setattr(guard, "_explicit_hosts", set())
    guard.install()
    port = free_port()
    server = viser.ViserServer(host="0.0.0.0", port=port, verbose=False)
    try:
        assert server.get_host() == "127.0.0.1" and listen_addresses(port) == ["127.0.0.1"]
    finally:
        server.stop()
    err = capfd.readouterr().err
    assert "listens on 127.0.0.1 (this machine only), not 0.0.0.0" in err and "--viewer.websocket-host" in err

    viewer = Viewer(_plain_scene(tmp_path), ViewerConfig(host="0.0.0.0", port=0, output_dir=tmp_path / "out"))
    try:
        url = viewer.start()
        port = int(url.rsplit(":", 1)[1])
        assert re.fullmatch(r"http://0\.0\.0\.0:\d+", url) and listen_addresses(port) == ["0.0.0.0"]
        err = capfd.readouterr().err
        assert "warning: the viewer listens on every network interface" in err
        # exposed on purpose, still guarded
        assert raw_request(port, "/" + "../" * 20 + "etc/passwd")[0] == 403
        assert ws_handshake(port, origin="http://evil.example") == 403
    finally:
        viewer.stop()


def test_install_is_idempotent_and_wraps_once():
    from viser import _viser
    from viser.infra import _infra

    guard.install()
    init, worker = _viser.ViserServer.__init__, _infra.WebsockServer._background_worker
    guard.install()
    assert guard.installed() and _viser.ViserServer.__init__ is init and _infra.WebsockServer._background_worker is worker


# ----------------------------------------------------------------------------- nerfstudio's viewer of our methods
@pytest.mark.parametrize("argv,host", [
    (["ns-viewer", "--load-config", "c.yml"], None),
    (["ns-viewer", "--load-config", "c.yml", "--viewer.websocket-host", "0.0.0.0"], "0.0.0.0"),
    (["ns-train", "rh3dgs", "--viewer.websocket_host=192.168.1.5"], "192.168.1.5"),
    (["ns-train", "rh3dgs", "--viewer.websocket-port", "7007"], None),
])
def test_requested_viewer_host(argv, host):
    pytest.importorskip("nerfstudio")
    from rh3dgs.nerfstudio.viewer import requested_viewer_host

    assert requested_viewer_host(argv) == host


def _ns_dataset(root: Path, views: int = 4, size: int = 32) -> Path:
    from rh3dgs.data.synthetic import SceneConfig, make_scene, write_dataset
    from rh3dgs.data.teacher_sim import simulate_teacher

    write_dataset(make_scene(SceneConfig(num_views=views, image_size=size, gaussians_per_unit_area=800.0)), root,
                  progress=False)
    simulate_teacher(root, progress=False)
    return root


def test_nerfstudio_viewer_of_an_rh3dgs_pipeline_binds_localhost_and_is_guarded(tmp_path, monkeypatch, capfd):
    """nerfstudio's own viewer class, built as ``ns-viewer --load-config`` builds it: with nerfstudio's default
    ViewerConfig (websocket_host 0.0.0.0, which ns-viewer puts in place of the run's config) and an rh3dgs
    pipeline: it listens on 127.0.0.1 only, its banner says so, and it is guarded."""
    pytest.importorskip("nerfstudio")
    pytest.importorskip("gsplat")
    from nerfstudio.configs.base_config import ViewerConfig
    from nerfstudio.viewer.viewer import Viewer as NSViewer

    from rh3dgs.nerfstudio.config import rh3dgs_lite_config

    monkeypatch.setattr(guard, "_explicit_hosts", set())
    data = _ns_dataset(tmp_path / "data")
    c = rh3dgs_lite_config()
    c.pipeline.datamanager.data = data
    c.pipeline.datamanager.teacher_cache_dir = tmp_path / "cache"
    c.pipeline.datamanager.dataparser.load_3D_points = False  # random init: no open3d needed here
    pipe = c.pipeline.setup(device="cpu", test_mode="val")  # builds the model, hence its text-query panel
    cfg = ViewerConfig(websocket_port=free_port())
    assert cfg.websocket_host == "0.0.0.0"  # nerfstudio's default, what ns-viewer passes
    viewer = NSViewer(cfg, log_filename=tmp_path / "log" / "viewer_log_filename.txt", datapath=data, pipeline=pipe)
    try:
        port = viewer.viser_server.get_port()
        assert viewer.viser_server.get_host() == "127.0.0.1" and listen_addresses(port) == ["127.0.0.1"]
        assert viewer.viewer_info == [f"Viewer running locally at: http://127.0.0.1:{port}"]
        status, body = raw_request(port, "/")
        assert status == 200 and b"<html" in body.lower()
        for target in ["/" + "../" * 20 + "etc/passwd", "/" + "%2e%2e/" * 20 + "etc/passwd"]:
            status, body = raw_request(port, target)
            assert status in (403, 404) and b"root:" not in body, (target, status)
        assert ws_handshake(port, origin="http://evil.example") == 403
        assert ws_handshake(port, origin=f"http://127.0.0.1:{port}") == 101
        # crafted client messages: one line each, the connection stays open (the same guard as rh3dgs view)
        import msgspec
        from websockets.sync.client import connect

        capfd.readouterr()
        with connect(f"ws://127.0.0.1:{port}", max_size=None, open_timeout=20) as ws:
            for raw in (b"\xc1\xff", msgspec.msgpack.encode(_camera(wxyz=[float("nan"), 0.0, 0.0, 0.0])),
                        msgspec.msgpack.encode(_camera(fov=0.0))):
                ws.send(raw)
            time.sleep(1.0)
            ws.send(msgspec.msgpack.encode(_camera()))  # still open: a good camera is taken
            time.sleep(0.5)
        err = capfd.readouterr().err
        ignored = [ln for ln in err.splitlines() if ln.startswith("rh3dgs: viewer: ignored a message")]
        assert len(ignored) == 3 and "Traceback" not in err, err[-2000:]
    finally:
        viewer.viser_server.stop()


def _wait_listening(proc, port: int, log: Path, timeout: float = 300.0) -> None:
    import socket
    import time

    t0 = time.time()
    while True:
        assert proc.poll() is None, log.read_text()[-4000:]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.time() - t0 < timeout, "ns-viewer did not listen:\n" + log.read_text()[-4000:]
            time.sleep(1)


@pytest.mark.slow
def test_ns_viewer_load_config_on_an_rh3dgs_run_binds_localhost(tmp_path):
    """The real commands: ``ns-train rh3dgs-lite`` (2 steps), then ``ns-viewer --load-config`` with no host flag
    listens on 127.0.0.1 only and refuses traversal / foreign Origin; ``--viewer.websocket-host 0.0.0.0`` (explicit)
    listens on every interface with a warning, still guarded."""
    import subprocess
    import sys

    pytest.importorskip("nerfstudio")
    from importlib.metadata import entry_points

    from _browser import stop_server

    from rh3dgs.nerfstudio import METHOD_CONFIGS_ENV

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, OMP_NUM_THREADS="2")
    if not {"rh3dgs", "rh3dgs-lite"} <= set(entry_points(group="nerfstudio.method_configs").names):
        env["NERFSTUDIO_METHOD_CONFIGS"] = METHOD_CONFIGS_ENV
    data = _ns_dataset(tmp_path / "data")
    out = tmp_path / "outputs"
    r = subprocess.run([str(bin_dir / "ns-train"), "rh3dgs-lite", "--machine.device-type", "cpu", "--vis",
                        "tensorboard", "--output-dir", str(out), "--experiment-name", "e", "--timestamp", "run",
                        "--max-num-iterations", "2", "--pipeline.datamanager.teacher-cache-dir", str(tmp_path / "cache"),
                        "--data", str(data), "nerfstudio-data", "--load-3D-points", "False"],
                       env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-4000:])
    cfg = out / "e" / "rh3dgs-lite" / "run" / "config.yml"
    for extra, expect, say in [([], ["127.0.0.1"], "listens on 127.0.0.1 (this machine only), not 0.0.0.0"),
                               (["--viewer.websocket-host", "0.0.0.0"], ["0.0.0.0"],
                                "warning: the viewer listens on every network interface")]:
        port = free_port()
        log = tmp_path / f"ns-viewer-{len(extra)}.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([str(bin_dir / "ns-viewer"), "--load-config", str(cfg), "--viewer.websocket-port",
                                     str(port), *extra], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
            try:
                _wait_listening(proc, port, log)
                assert listen_addresses(port) == expect, (extra, listen_addresses(port))
                status, body = raw_request(port, "/" + "../" * 20 + "etc/passwd")
                assert status == 403 and b"root:" not in body
                assert ws_handshake(port, origin="http://evil.example") == 403
                assert ws_handshake(port, origin=f"http://127.0.0.1:{port}") == 101
            finally:
                stop_server(proc, 15)
        assert say in log.read_text(), log.read_text()[-3000:]


# ----------------------------------------------------------------------------- crafted client messages
def _camera(**changes):
    msg = {"type": "ViewerCameraMessage", "wxyz": [1.0, 0.0, 0.0, 0.0], "position": [0.0, 0.0, -3.0], "fov": 0.9,
           "aspect": 1.0, "look_at": [0.0, 0.0, 0.0], "up_direction": [0.0, -1.0, 0.0]}
    msg.update(changes)
    return msg


def _crafted(threshold_id: str):
    """(case, raw bytes) of the messages a hostile or broken client may send."""
    import msgspec

    enc = msgspec.msgpack.encode
    nan, inf = float("nan"), float("inf")
    return [
        ("bad msgpack", b"\xc1\xff\x00\x93"),
        ("a text frame", '{"type": "ViewerCameraMessage"}'),
        ("not a mapping", enc([1, 2, 3])),
        ("unknown message type", enc({"type": "NoSuchMessage", "x": 1})),
        ("camera with missing fields", enc({"type": "ViewerCameraMessage", "wxyz": [1, 0, 0, 0]})),
        ("camera with an extra field", enc({**_camera(), "extra": 1})),
        ("NaN quaternion", enc(_camera(wxyz=[nan, 0.0, 0.0, 0.0]))),
        ("zero quaternion", enc(_camera(wxyz=[0.0, 0.0, 0.0, 0.0]))),
        ("fov 0", enc(_camera(fov=0.0))),
        ("fov 4 rad", enc(_camera(fov=4.0))),
        ("Inf position", enc(_camera(position=[inf, 0.0, 0.0]))),
        ("aspect -1", enc(_camera(aspect=-1.0))),
        ("wrong type: wxyz a string", enc(_camera(wxyz="abcd"))),
        ("wrong type: fov a string", enc(_camera(fov="wide"))),
        ("GUI: NaN threshold", enc({"type": "GuiUpdateMessage", "id": threshold_id, "updates": {"value": nan}})),
        ("GUI: unknown property", enc({"type": "GuiUpdateMessage", "id": threshold_id, "updates": {"nope": 1}})),
        ("GUI: wrong type", enc({"type": "GuiUpdateMessage", "id": threshold_id, "updates": {"value": "high"}})),
        ("GUI: updates not a mapping", enc({"type": "GuiUpdateMessage", "id": threshold_id, "updates": [1]})),
        ("GUI: threshold out of range", enc({"type": "GuiUpdateMessage", "id": threshold_id,
                                             "updates": {"value": 7.5}})),
    ]


def test_message_problem_names_what_is_wrong():
    from viser import _messages as M

    ok = M.ViewerCameraMessage((1.0, 0, 0, 0), (0, 0, -3.0), 0.9, 1.0, (0, 0, 0), (0, -1.0, 0))
    assert guard.message_problem(ok) is None
    assert "fov" in guard.message_problem(M.ViewerCameraMessage((1.0, 0, 0, 0), (0, 0, -3.0), 0.0, 1.0, (0, 0, 0),
                                                                (0, -1.0, 0)))
    assert "wxyz" in guard.message_problem(M.ViewerCameraMessage((float("nan"), 0, 0, 0), (0, 0, -3.0), 0.9, 1.0,
                                                                 (0, 0, 0), (0, -1.0, 0)))
    assert "NaN" in guard.message_problem(M.GuiUpdateMessage("x", {"value": float("inf")}))
    assert guard.message_problem(M.GuiUpdateMessage("x", {"value": 0.3})) is None


def test_rh3dgs_view_answers_crafted_messages_in_one_line_and_keeps_serving(tmp_path, capfd):
    """Every crafted message: one stderr line, no traceback, the state unchanged; a valid camera afterwards
    still gets a new frame."""
    import msgspec
    from websockets.sync.client import connect

    from fuzz.targets import seed_dir
    from rh3dgs.viewer.server import Viewer, ViewerConfig

    viewer = Viewer(rh3dgs.load(seed_dir() / "scene"), ViewerConfig(port=0, output_dir=tmp_path / "out"))
    try:
        port = int(viewer.start().rsplit(":", 1)[1])
        before = viewer.controls.state
        cases = _crafted(viewer.panel.threshold._impl.id)
        with connect(f"ws://127.0.0.1:{port}", max_size=None, open_timeout=20) as ws:
            def frames(timeout: float, enough: int = 1 << 30) -> int:
                """Frames (background images) received within ``timeout`` s (returns at ``enough``)."""
                n, end = 0, time.time() + timeout
                while time.time() < end and n < enough:
                    try:
                        raw = ws.recv(timeout=max(0.05, end - time.time()))
                    except TimeoutError:
                        break
                    for m in msgspec.msgpack.decode(raw):
                        n += m.get("type") == "BackgroundImageMessage"
                return n

            ws.send(msgspec.msgpack.encode(_camera()))  # a browser's first message: the client is connected
            assert frames(30.0, enough=1) >= 1
            capfd.readouterr()
            for case, raw in cases:
                ws.send(raw)
                time.sleep(0.05)
            frames(2.0)
            err = capfd.readouterr().err
            lines = [ln for ln in err.splitlines() if ln.strip()]
            assert "Traceback" not in err and len(lines) == len(cases), err[-3000:]
            assert all(ln.startswith("rh3dgs: viewer: ignored a message") for ln in lines), lines
            assert viewer.controls.state == before and viewer.panel.threshold.value == before.threshold
            ws.send(msgspec.msgpack.encode(_camera(position=[0.0, 0.0, -2.5])))
            assert frames(30.0, enough=1) >= 1  # still serving: a new frame for the good camera
    finally:
        viewer.stop()
