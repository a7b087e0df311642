"""The ``rh3dgs view`` server: a viser page that renders any :class:`~rh3dgs.api.Scene` with text queries.

The page is served through :mod:`rh3dgs.viewer.guard` (installed by :meth:`Viewer.start`): only viser's own
asset files, requests addressed to this machine, WebSocket connections from the page's own origin; binding
beyond 127.0.0.1 (``--host``) prints a warning.

One render thread per connected browser: while the camera moves it renders at
``moving_res`` pixels on the long side, once the camera has been still for ``still_delay``
seconds (or a control changed) it renders at ``max_res``. Frames go to the browser with
``client.scene.set_background_image``; each client's panel shows its last frame time.
Rendering goes through :func:`rh3dgs.rendering.render` on the scene's device; a lock keeps
one render at a time (clients share the CPU / GPU).
"""
from __future__ import annotations

import contextlib
import errno
import io
import os
import socket
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Dict, Optional, Tuple

import numpy as np
import torch

from ..cameras import Cameras
from ..errors import ConfigError
from ..ranges import Range, check_fields, check_setting
from .camera import ViewPose, cameras_from_viser, pose_from_cameras
from .controls import QueryControls, ViserControlPanel, export_selection

FAR_DEPTH = 150.0  # viser's depth image covers [0, 167.77] scene units

__all__ = ["ViewerConfig", "Viewer", "RenderCache", "check_port", "initial_pose", "render_frame"]


@dataclass
class ViewerConfig:
    """Settings of the viewer's server (rh3dgs view)."""

    host: str = "127.0.0.1"
    """Address to bind (127.0.0.1: this machine only; others print a warning)."""
    port: Annotated[int, Range(ge=0, le=65535)] = 8080
    """TCP port; 0 picks a free one."""
    max_res: Optional[Annotated[int, Range(ge=8)]] = None
    """Long side of still frames in pixels (None: 512 on CPU, 1024 on CUDA)."""
    moving_res: Optional[Annotated[int, Range(ge=8)]] = None
    """Long side of frames while the camera moves (None: max_res / 2)."""
    still_delay: Annotated[float, Range(ge=0)] = 0.25
    """Seconds without camera messages after which the camera is still."""
    output_dir: Path = Path("outputs/view")
    """Where the export button writes selections."""
    jpeg_quality: Annotated[int, Range(ge=1, le=100)] = 90
    """JPEG quality of the still frames sent to the browser, 1-100 (moving ones: 60)."""

    def __post_init__(self) -> None:
        check_fields(self)  # every numeric field against its declared Range (rh3dgs.ranges)


def check_port(host: str, port: int) -> int:
    """Raise :class:`ConfigError` naming the port if ``host:port`` cannot be listened on; returns the port
    (a free one when ``port`` is 0)."""
    check_setting(ViewerConfig, "port", port)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise ConfigError(f"cannot listen on {host}:{port}: unknown host {host!r} ({exc.strerror})") from exc
    family, _, _, _, addr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as asyncio's server does
        try:
            s.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is already in use: stop what is listening there, or pass "
                                  f"--port N (or --port 0 for any free port)") from exc
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
        return int(s.getsockname()[1])


def _scene_center_extent(means: torch.Tensor) -> Tuple[np.ndarray, float]:
    """:func:`rh3dgs.cameras.scene_bounds` as (float64 array, extent)."""
    from ..cameras import scene_bounds

    center, extent = scene_bounds(means)
    return center.numpy().astype(np.float64), extent


def initial_pose(scene) -> Tuple[ViewPose, np.ndarray]:
    """(the pose to open the page at, the world up direction): the scene's first camera when it has
    cameras (world up = the cameras' mean up vector), else a view of the Gaussians from 35 degrees above,
    about the up axis :func:`rh3dgs.cameras.detect_up` finds (what ``rh3dgs render`` orbits without cameras)."""
    center, extent = _scene_center_extent(scene.gaussians.means)
    if scene.cameras is not None and len(scene.cameras):
        cams = scene.cameras
        c2w = torch.linalg.inv(cams.viewmats.double().cpu())
        up = -c2w[:, :3, 1].mean(0)
        up = (up / up.norm().clamp_min(1e-12)).numpy()
        eye = c2w[0, :3, 3].numpy()
        dist = float(np.linalg.norm(center - eye)) or extent
        pose = pose_from_cameras(cams, 0, target_distance=dist)
        # orbit about the world up (the cameras' mean up), not camera 0's own tilted up axis: otherwise a
        # horizontal drag in the browser rolls the horizon
        pose.up = up
        return pose, up
    from ..cameras import AXES, detect_up, orbit_cameras

    up_name, _ = detect_up(scene.gaussians.means, scene.gaussians.opacities)  # as `rh3dgs render` without cameras
    cam = orbit_cameras(torch.tensor(center).float(), extent, up_name, views=8, width=128, height=128,
                        elevation_deg=35.0)[1]
    return pose_from_cameras(cam, 0, target_distance=2.5 * extent), np.array(AXES[up_name])


class RenderCache:
    """The last render's maps, so that a control change with a still camera only recomposes."""

    def __init__(self):
        self.key = None
        self.maps = None

    @staticmethod
    def key_of(camera: Cameras):
        return (camera.viewmats.cpu().numpy().tobytes(), camera.Ks.cpu().numpy().tobytes(), camera.width,
                camera.height)


def render_frame(scene, controls: QueryControls, camera: Cameras, cache: Optional[RenderCache] = None):
    """Render ``camera`` and compose what the controls ask for -> (Frame, seconds rendering, seconds composing).

    With a ``cache``, a camera equal to the last one re-uses its render (0 s rendering) when it has
    the maps needed (a latent map when a heat map is shown).
    """
    from ..rendering import render

    state = controls.state
    want = controls.wants_latents(state)
    t0 = time.perf_counter()
    key = RenderCache.key_of(camera) if cache is not None else None
    with torch.no_grad():
        if cache is not None and cache.key == key and (cache.maps[1] is not None or not want):
            rgb, lat, alpha, depth = cache.maps
        else:
            r = render(scene.gaussians, camera, scene.field.latents if want else None)
            rgb, lat, alpha = r.rgb[0], (r.features[0] if want else None), r.alpha[0]
            # z-depth for viser's depth compositing of the selection's points; far where nothing was drawn,
            # pushed back 2 % so points on a surface are not hidden by it
            depth = torch.where(alpha > 0.5, r.depth[0] * 1.02, torch.full_like(alpha, FAR_DEPTH))
            if rgb.is_cuda:
                torch.cuda.synchronize()
            if cache is not None:
                cache.key, cache.maps = key, (rgb, lat, alpha, depth)
        t1 = time.perf_counter()
        frame = controls.frame(rgb, lat if want else None, alpha, state)
        frame.depth = depth.float().cpu().numpy()
    return frame, t1 - t0, time.perf_counter() - t1


class _ClientRenderer:
    """Render loop of one browser tab."""

    def __init__(self, viewer: "Viewer", client):
        self.viewer = viewer
        self.client = client
        self.trigger = threading.Event()
        self.running = True
        self.cam_version = 0
        self.last_move = 0.0
        self.done_full: Optional[Tuple[int, int]] = None
        self.done_low: Optional[int] = None
        self.frames = 0
        self.cache = RenderCache()
        self.info = client.gui.add_markdown("*waiting for the first frame*")
        self.thread = threading.Thread(target=self._loop, name=f"rh3dgs-view-{client.client_id}", daemon=True)

    def camera_moved(self) -> None:
        self.cam_version += 1
        self.last_move = time.time()
        self.trigger.set()

    def rerender(self) -> None:
        self.trigger.set()

    def stop(self) -> None:
        self.running = False
        self.trigger.set()

    def _loop(self) -> None:
        cfg = self.viewer.config
        timeout = 0.05
        while self.running:
            self.trigger.wait(timeout=timeout)
            self.trigger.clear()
            timeout = 0.5
            if not self.running:
                break
            ctl = self.viewer.controls.version
            cam = self.cam_version
            moving = time.time() - self.last_move < cfg.still_delay
            try:
                if moving:
                    if self.done_low != cam:
                        self._render(cfg.moving_res, full=False)
                        self.done_low = cam
                    # come back to render full resolution once the camera has been still for still_delay
                    timeout = max(0.01, cfg.still_delay - (time.time() - self.last_move))
                elif self.done_full != (cam, ctl):
                    self._render(cfg.max_res, full=True)
                    self.done_full = (cam, ctl)
            except Exception as exc:  # keep serving; say what went wrong, in one line (RH3DGS_DEBUG: traceback)
                if os.environ.get("RH3DGS_DEBUG"):
                    traceback.print_exc(file=sys.stderr)
                print(f"rh3dgs: viewer: render failed for client {self.client.client_id}: {type(exc).__name__}: "
                      f"{' '.join(str(exc).split())}"[:400], file=sys.stderr, flush=True)
                self.info.content = f"**Render failed**: {type(exc).__name__}: {exc}"
                self.done_full = (cam, ctl)
                time.sleep(0.5)

    def _render(self, res: int, full: bool) -> None:
        c = self.client.camera
        camera = cameras_from_viser(c.wxyz, c.position, c.fov, c.aspect, res)
        with self.viewer.render_lock:
            frame, t_render, t_compose = render_frame(self.viewer.scene, self.viewer.controls, camera, self.cache)
        t0 = time.perf_counter()
        self.client.scene.set_background_image(frame.image, format="jpeg",
                                               jpeg_quality=self.viewer.config.jpeg_quality if full else 60,
                                               depth=frame.depth if self.viewer.depth_compositing else None)
        t_send = time.perf_counter() - t0
        self.frames += 1
        q = f" · query: {frame.query}" if frame.query else ""
        kind = "full" if full else "moving"
        self.info.content = (f"**Frame** {self.frames} ({kind}) {camera.width}×{camera.height}: "
                             f"{1000 * (t_render + t_compose):.0f} ms (render {1000 * t_render:.0f} + relevancy/colour "
                             f"{1000 * t_compose:.0f}), encode {1000 * t_send:.0f} ms{q}")


class Viewer:
    """Serve ``scene`` in the browser. ``start()`` binds and returns the URL; ``serve_forever()`` blocks."""

    def __init__(self, scene, config: Optional[ViewerConfig] = None):
        self.scene = scene
        self.config = config or ViewerConfig()
        cuda = scene.gaussians.device.type == "cuda"
        if self.config.max_res is None:
            self.config.max_res = 1024 if cuda else 512
        if self.config.moving_res is None:
            self.config.moving_res = max(64, self.config.max_res // 2)
        self.controls = QueryControls.from_scene(scene)
        self.render_lock = threading.Lock()
        self.server = None
        self.panel: Optional[ViserControlPanel] = None
        self._renderers: Dict[int, _ClientRenderer] = {}
        self._clients_lock = threading.Lock()
        self.url: Optional[str] = None

    def start(self) -> str:
        import viser

        from . import guard

        cfg = self.config
        guard.install(explicit_host=cfg.host)  # static files, Host, WebSocket Origin; cfg.host is the user's choice
        port = check_port(cfg.host, cfg.port)
        with contextlib.redirect_stdout(io.StringIO()):  # viser prints its own banner
            server = viser.ViserServer(host=cfg.host, port=port, label="rh3dgs view", verbose=False)
        if server.get_port() != port:  # taken between our check and viser's bind (viser would move on silently)
            server.stop()
            raise ConfigError(f"port {port} on {cfg.host} is already in use: pass --port N "
                              "(or --port 0 for any free port)")
        self.server = server
        self._pose, up = initial_pose(self.scene)
        server.scene.set_up_direction(tuple(float(x) for x in up))
        center, extent = _scene_center_extent(self.scene.gaussians.means)
        self._build_gui(extent)
        server.on_client_connect(self._on_connect)
        server.on_client_disconnect(self._on_disconnect)
        host = cfg.host if ":" not in cfg.host else f"[{cfg.host}]"
        self.url = f"http://{host}:{port}"
        return self.url

    def _build_gui(self, extent: float) -> None:
        gui = self.server.gui
        s = self.scene
        kind = "semantic scene" if s.field is not None else "3DGS scene (RGB only)"
        gui.add_markdown(f"**{kind}**: {len(s):,} Gaussians on {s.gaussians.device.type}"
                         + (f", {len(s.cameras)} cameras" if s.cameras is not None else ""))
        self.panel = ViserControlPanel(gui, self.controls, on_change=self._rerender_all, scene_api=self.server.scene,
                                       means=s.gaussians.means, export=self._export, point_size=0.006 * extent)

    @property
    def depth_compositing(self) -> bool:
        """Send depth with the frames only while 3D elements (the selection's points) need it."""
        return self.panel is not None and self.panel.points_shown

    def _export(self, mask, name: str) -> Path:
        return export_selection(self.scene, self.config.output_dir, mask, name)

    def _rerender_all(self) -> None:
        with self._clients_lock:
            for r in self._renderers.values():
                r.rerender()

    def _on_connect(self, client) -> None:
        renderer = _ClientRenderer(self, client)
        p = self._pose
        with client.atomic():
            client.camera.fov = float(p.fov)
            client.camera.up_direction = tuple(float(x) for x in p.up)
            client.camera.position = tuple(float(x) for x in p.position)
            client.camera.look_at = tuple(float(x) for x in p.look_at)
        client.camera.on_update(lambda _cam: renderer.camera_moved())
        with self._clients_lock:
            self._renderers[client.client_id] = renderer
        renderer.thread.start()
        renderer.camera_moved()

    def _on_disconnect(self, client) -> None:
        with self._clients_lock:
            r = self._renderers.pop(client.client_id, None)
        if r is not None:
            r.stop()

    def stop(self) -> None:
        with self._clients_lock:
            for r in self._renderers.values():
                r.stop()
            self._renderers.clear()
        if self.server is not None:
            with contextlib.suppress(Exception):
                self.server.stop()
            self.server = None

    def serve_forever(self) -> None:
        try:
            while True:
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            self.stop()
