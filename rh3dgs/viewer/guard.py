"""The HTTP / WebSocket guard in front of viser, for both viewers (``rh3dgs view`` and the nerfstudio viewer
of ``ns-train rh3dgs`` / ``ns-viewer --load-config``).

nerfstudio 1.1.5 pins ``viser==0.2.7``, whose static file handler serves
``http_server_root / Path(path).relative_to("/")`` for the raw request path: a request for
``/../../../../etc/passwd`` (``curl --path-as-is``) returns any file the process can read, and its
WebSocket accepts any ``Origin``, so any web page the user visits can drive the viewer. No viser release
that nerfstudio 1.1.5 accepts fixes this, and nothing in site-packages is patched: :func:`install` wraps
viser's server in this process when one of our viewers starts (idempotent):

* **static files** (:func:`static_file`): only regular files inside viser's own asset folder
  (``viser/client/build``), after percent-decoding and resolving symbolic links. A target that is not
  ``/``-rooted (absolute-form ``http://...``, ``*``), has a ``..`` segment (raw or ``%2e%2e``), an encoded
  ``/`` or ``\\`` (``%2f``, ``%5c``), a backslash, NUL, ``?`` / ``#`` once decoded, or resolves outside
  the folder (a symlink pointing out) gets ``403``; a missing file or a folder ``404``. No file content
  is ever sent for them;
* **Host** (DNS rebinding): a server bound to a loopback address answers only requests whose ``Host``
  is a loopback name (``localhost``, ``127.x.y.z``, ``[::1]``); otherwise ``403``;
* **WebSocket Origin** (cross-site WebSocket hijacking): an upgrade request carrying an ``Origin`` must
  come from the page's own origin (scheme ``http(s)``, same host and port as ``Host``), else ``403``
  and no connection. Clients that send no ``Origin`` (scripts, not browsers) are let through;
* **binding**: a viser server asked for a non-loopback address (nerfstudio's default ``0.0.0.0``,
  which ``ns-viewer`` uses whatever the run's config says) binds ``127.0.0.1`` instead and says so,
  unless our entry point registered that address as the user's explicit choice (``rh3dgs view --host``,
  ``--viewer.websocket-host``); binding beyond loopback then prints a warning.

The checks run in ``process_request`` of the ``websockets`` server viser starts (``viser.infra``'s
``websockets.server.serve`` call, redirected through :class:`RequestGuard`), before viser's own handler.

**Messages** a connected client sends are checked too (:func:`message_problem`), for both viewers: bytes that
are not a viser message (bad msgpack, a text frame, an unknown type, missing or extra fields), a camera that is not a camera
(non-finite or zero quaternion, position, look-at or up vector; a field of view outside (0, pi); an aspect
<= 0; values of the wrong type) and GUI updates that are not a mapping or carry NaN / Inf are dropped with one
line on stderr (``rh3dgs: viewer: ignored a message from client N: ...``), so the viewer keeps its last good
state and keeps serving; viser closed the connection (a bad message) or rendered NaN (a bad camera) before.
An error raised while a message is handled (an unknown GUI property, a value viser cannot cast, a callback
refusing a value) is one such line too instead of viser's traceback (``RH3DGS_DEBUG=1`` shows it).

Example::

    from rh3dgs.viewer import guard
    guard.install(explicit_host="127.0.0.1")   # then create viser.ViserServer(...) as usual
"""
from __future__ import annotations

import functools
import http
import inspect
import ipaddress
import math
import os
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Tuple, Union
from urllib.parse import unquote, urlsplit

__all__ = ["install", "installed", "is_loopback", "static_file", "host_allowed", "origin_allowed", "RequestGuard",
           "bind_host", "LOOPBACK", "message_problem", "CheckedMessages", "say_ignored"]

LOOPBACK = "127.0.0.1"
Response = Tuple[http.HTTPStatus, dict, bytes]

_lock = threading.Lock()
_installed = False
_explicit_hosts: set = set()  # non-loopback addresses the user asked for on a command line / in a config
_tls = threading.local()  # .server: the viser WebsockServer whose worker thread this is; .binding: nesting


# ----------------------------------------------------------------------------------------- pure checks
def is_loopback(host: Optional[str]) -> bool:
    """``localhost`` or a loopback IP (``127.0.0.0/8``, ``::1``); ``None`` / ``""`` (every interface) are not."""
    if not host or not isinstance(host, str):
        return False
    h = host.strip().lower()
    if h.startswith("[") and h.endswith("]"):
        h = h[1:-1]
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def _split_host_port(value: str) -> Tuple[str, Optional[int]]:
    """``"name:port"`` / ``"[v6]:port"`` / ``"name"`` -> (lower-case name, port or None); ValueError if malformed."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.index("]")
        name, rest = v[1:end], v[end + 1:]
        if rest and not rest.startswith(":"):
            raise ValueError(value)
        port = rest[1:] if rest else None
    elif v.count(":") == 1:
        name, port = v.split(":")
    elif ":" in v:  # a bare IPv6 address
        name, port = v, None
    else:
        name, port = v, None
    if not name or (port is not None and not port.isdigit()):
        raise ValueError(value)
    return name, (int(port) if port is not None else None)


def host_allowed(host_header: Optional[str], bind: Optional[str]) -> bool:
    """May a request with this ``Host`` header be answered by a server bound to ``bind``?

    Bound to a loopback address: only when ``Host`` names a loopback host (DNS rebinding sends the
    attacker's name). Bound beyond loopback (the user chose to expose it): any ``Host``.
    """
    if not is_loopback(bind):
        return True
    if not host_header:
        return False
    try:
        name, _ = _split_host_port(host_header)
    except ValueError:
        return False
    return is_loopback(name)


_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_allowed(origin: Optional[str], host_header: Optional[str]) -> bool:
    """Is a WebSocket ``Origin`` the page's own origin (same host and port as ``Host``)? No Origin: yes.

    Example::

        origin_allowed("http://127.0.0.1:8080", "127.0.0.1:8080")   # True
        origin_allowed("http://evil.example", "127.0.0.1:8080")     # False
    """
    if origin is None:
        return True
    if not host_header:
        return False
    try:
        u = urlsplit(origin.strip())
        if u.scheme not in _DEFAULT_PORTS or not u.netloc or u.path not in ("", "/") or u.query or u.username:
            return False
        o_name, o_port = _split_host_port(u.netloc)
        h_name, h_port = _split_host_port(host_header)
    except ValueError:
        return False
    default = _DEFAULT_PORTS[u.scheme]
    return o_name == h_name and (o_port or default) == (h_port or default)


_FORBIDDEN_DECODED = ("\\", "\x00", "?", "#")


def static_file(root: Union[str, Path], target: str) -> Union[Path, int]:
    """The regular file under ``root`` that the request target ``target`` names, or an HTTP status:
    403 for anything that tries to leave ``root`` (or is malformed), 404 for a missing file or a folder.

    ``target`` is the raw request target as the client sent it (``/a/b.js?v=1``); ``/`` is ``index.html``.

    Example::

        static_file(root, "/index.html")            # root/index.html (resolved)
        static_file(root, "/../../etc/passwd")      # 403
        static_file(root, "/%2e%2e/%2e%2e/etc/passwd")  # 403
    """
    if not isinstance(target, str) or not target.startswith("/") or target.startswith("//"):
        return 403
    raw = target.split("?", 1)[0].split("#", 1)[0]
    low = raw.lower()
    if "%2f" in low or "%5c" in low or "%00" in low:
        return 403
    try:
        path = unquote(raw, errors="strict")
    except UnicodeDecodeError:
        return 403
    if any(c in path for c in _FORBIDDEN_DECODED):
        return 403
    parts = [p for p in path.split("/") if p]
    if any(p in ("..", ".") for p in parts):
        return 403
    rel = "/".join(parts) or "index.html"
    try:
        base = Path(root).resolve(strict=True)
        resolved = (base / rel).resolve(strict=False)
    except (OSError, RuntimeError, ValueError):
        return 403
    try:
        resolved.relative_to(base)
    except ValueError:
        return 403  # e.g. a symbolic link inside the folder that points out of it
    try:
        if not resolved.is_file():
            return 404
    except OSError:
        return 404
    return resolved


def _response(status: int, text: str) -> Response:
    s = http.HTTPStatus(status)
    return (s, {"Content-Type": "text/plain; charset=utf-8", "X-Content-Type-Options": "nosniff"},
            f"{s.value} {s.phrase}: {text}\n".encode())


def _single(headers, name: str) -> Tuple[bool, Optional[str]]:
    """(ok, value) of a header that must appear at most once."""
    try:
        values = headers.get_all(name)
    except AttributeError:  # a plain mapping
        v = headers.get(name)
        values = [] if v is None else [v]
    if len(values) > 1:
        return False, None
    return True, (values[0] if values else None)


class RequestGuard:
    """``process_request`` for a websockets server: the checks of this module, then viser's handler.

    Args:
        root: the folder static files may come from (viser's ``client/build``); None: no static files.
        bind: the address the server is bound to (decides the ``Host`` rule).
        inner: viser's own ``process_request`` (called with a clean ``/<relative path>``), or None.

    Returns (awaited) None to continue a WebSocket handshake, or a (status, headers, body) response.
    """

    def __init__(self, root: Optional[Union[str, Path]], bind: Optional[str],
                 inner: Optional[Callable[..., Any]] = None):
        self.root = Path(root) if root is not None else None
        self.bind = bind
        self.inner = inner

    def check(self, path: str, headers) -> Union[None, str, Response]:
        """None: a WebSocket upgrade that may proceed; str: the clean relative path of a static file to
        serve; else the refusal response."""
        ok, host = _single(headers, "Host")
        if not ok or not host_allowed(host, self.bind):
            return _response(403, "this viewer only answers requests addressed to this machine (Host header)")
        upgrade = (headers.get("Upgrade") or "").lower()
        if "websocket" in upgrade:
            ok, origin = _single(headers, "Origin")
            if not ok or not origin_allowed(origin, host):
                return _response(403, "WebSocket connections are accepted from the viewer's own page only (Origin)")
            return None
        if self.root is None:
            return _response(404, "not found")
        found = static_file(self.root, path)
        if isinstance(found, int):
            return _response(found, "not found" if found == 404 else "only the viewer's own files are served")
        return found.relative_to(Path(self.root).resolve()).as_posix()

    async def __call__(self, path: str, headers):
        verdict = self.check(path, headers)
        if verdict is None or isinstance(verdict, tuple):
            return verdict
        if self.inner is None:  # pragma: no cover - root without a handler
            return _response(404, "not found")
        out = self.inner("/" + verdict, headers)
        return await out if inspect.isawaitable(out) else out


# ----------------------------------------------------------------------------------------- binding
def bind_host(requested: Optional[str]) -> str:
    """The address a viser server asked for ``requested`` binds: ``requested`` when it is loopback or was
    registered as the user's explicit choice (then a warning goes to stderr), else 127.0.0.1 (said on stderr)."""
    if is_loopback(requested):
        return str(requested)
    shown = requested if requested else "every interface"
    if requested in _explicit_hosts:
        what = "every network interface" if requested in ("", "0.0.0.0", "::") else requested
        print(f"rh3dgs: warning: the viewer listens on {what}, not only 127.0.0.1: anyone who can reach this "
              "machine on its port can open it, query the scene and export selections; bind 127.0.0.1 (the "
              "default) unless you mean to share it", file=sys.stderr, flush=True)
        return str(requested)
    print(f"rh3dgs: the viewer listens on {LOOPBACK} (this machine only), not {shown}: pass "
          f"--viewer.websocket-host {requested or '0.0.0.0'} (ns-train / ns-viewer; --host for rh3dgs view) to "
          "expose it to the network", file=sys.stderr, flush=True)
    return LOOPBACK


def _wrap_host(cls) -> None:
    """``cls.__init__`` binds :func:`bind_host` (``host`` argument) instead of what it was asked for."""
    orig = cls.__init__
    if getattr(orig, "_rh3dgs_guard", False):
        return
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self, *args, **kwargs):
        if getattr(_tls, "binding", False):  # ViserServer -> WebsockServer: decided once, at the outer one
            return orig(self, *args, **kwargs)
        ba = sig.bind(self, *args, **kwargs)
        ba.apply_defaults()
        ba.arguments["host"] = bind_host(ba.arguments.get("host"))
        _tls.binding = True
        try:
            return orig(*ba.args, **ba.kwargs)
        finally:
            _tls.binding = False

    __init__._rh3dgs_guard = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


class _Delegate:
    """Attribute access falls through to ``target``, except for the names given."""

    def __init__(self, target, **overrides):
        self._target = target
        self.__dict__.update(overrides)

    def __getattr__(self, name):
        return getattr(self._target, name)


# ----------------------------------------------------------------------------------------- client messages
def _finite(values, n: int) -> bool:
    return (isinstance(values, (tuple, list)) and len(values) == n
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values))


def _nonfinite_in(value, depth: int = 0) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth < 8 and isinstance(value, (tuple, list)):
        return any(_nonfinite_in(v, depth + 1) for v in value)
    if depth < 8 and isinstance(value, dict):
        return any(_nonfinite_in(v, depth + 1) for v in value.values())
    return False


def message_problem(message) -> Optional[str]:
    """Why a decoded client message must not reach the viewer (None when it may): a camera that is not a camera,
    a GUI update that is not a mapping of property names or that carries NaN / Inf."""
    kind = type(message).__name__
    if kind == "ViewerCameraMessage":
        m = message
        for name, n in (("wxyz", 4), ("position", 3), ("look_at", 3), ("up_direction", 3)):
            if not _finite(getattr(m, name, None), n):
                return f"camera {name} must be {n} finite numbers, got {getattr(m, name, None)!r}"[:200]
        if math.sqrt(sum(v * v for v in m.wxyz)) < 1e-8:
            return "camera quaternion wxyz is zero"
        if math.sqrt(sum(v * v for v in m.up_direction)) < 1e-8:
            return "camera up_direction is zero"
        for name, ok, rule in (("fov", lambda v: 0 < v < math.pi, "in (0, pi) radians"),
                               ("aspect", lambda v: 0 < v < 1e4, "in (0, 1e4)")):
            v = getattr(m, name, None)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and ok(v)):
                return f"camera {name} must be {rule}, got {v!r}"[:200]
    elif kind == "GuiUpdateMessage":
        updates = getattr(message, "updates", None)
        if not isinstance(getattr(message, "id", None), str) or not isinstance(updates, dict) \
                or not all(isinstance(k, str) for k in updates):
            return "GUI update must name an element and map property names to values"
        if _nonfinite_in(updates):
            return f"GUI update of {message.id} holds NaN / Inf: {updates!r}"[:200]
    return None


class _BinaryFrames:
    """A client connection whose text frames reach viser as bytes (its consumer asserts binary frames and closed
    the connection with a traceback on a text one); :class:`CheckedMessages` then drops them with one line."""

    def __init__(self, websocket):
        self._ws = websocket

    def __getattr__(self, name):
        return getattr(self._ws, name)

    async def recv(self):
        raw = await self._ws.recv()
        return raw.encode("utf-8", "replace") if isinstance(raw, str) else raw


class _Dropped:
    """Stands in for a refused message: no handler is registered for its type."""


def say_ignored(client_id, why: str) -> None:
    """One line on stderr: what a viewer refused from a client (and keeps serving)."""
    who = f" from client {client_id}" if client_id is not None else ""
    print(f"rh3dgs: viewer: ignored a message{who}: {' '.join(str(why).split())}"[:400], file=sys.stderr, flush=True)


class CheckedMessages:
    """viser's message class as its consumer loop uses it (``deserialize``), with :func:`message_problem` and
    decoding errors turned into a dropped message and one line instead of a closed connection."""

    def __init__(self, message_class):
        self._cls = message_class

    def __getattr__(self, name):
        return getattr(self._cls, name)

    def deserialize(self, raw):
        try:
            message = self._cls.deserialize(raw)
        except Exception as e:  # noqa: BLE001 - msgpack, an unknown type, missing / extra fields
            say_ignored(None, f"it is not a viser message ({type(e).__name__}: {e})")
            return _Dropped()
        problem = message_problem(message)
        if problem is not None:
            say_ignored(None, problem)
            return _Dropped()
        return message


def _one_line_errors(inner):
    """viser's ``error_print_wrapper``: an error while a client's message is handled is one line, not a traceback."""
    def wrapped() -> None:
        try:
            inner()
        except Exception as e:  # noqa: BLE001 - a handler refusing a client's value
            if os.environ.get("RH3DGS_DEBUG"):
                import traceback

                traceback.print_exc()
            say_ignored(None, f"{type(e).__name__}: {e}" if str(e) else type(e).__name__)

    return wrapped


def installed() -> bool:
    return _installed


def install(explicit_host: Optional[str] = None) -> None:
    """Put the guard in front of every viser server this process starts from now on (idempotent).

    Args:
        explicit_host: an address the user asked for explicitly (``rh3dgs view --host``,
            ``--viewer.websocket-host``): a viser server asked for it binds it (with a warning when it
            is not loopback); any other non-loopback address binds 127.0.0.1.

    Raises RuntimeError naming the viser version if viser's internals are not the ones this wraps
    (fail closed: no viewer without the guard).
    """
    global _installed
    with _lock:
        if explicit_host is not None and not is_loopback(explicit_host):
            _explicit_hosts.add(explicit_host)
        if _installed:
            return
        import viser
        from viser import _viser
        from viser.infra import _infra

        with warnings.catch_warnings():  # websockets >= 14 warns on importing its legacy API (viser 0.2.7 uses it)
            warnings.simplefilter("ignore", DeprecationWarning)
            from websockets.legacy import server as legacy_server

        ws = getattr(_infra, "websockets", None)
        worker = getattr(_infra.WebsockServer, "_background_worker", None)
        if ws is None or worker is None or not hasattr(_viser, "ViserServer") or \
                not hasattr(_infra, "error_print_wrapper") or \
                "host" not in inspect.signature(_infra.WebsockServer.__init__).parameters:
            raise RuntimeError(f"rh3dgs.viewer.guard: viser {getattr(viser, '__version__', '?')} is not laid out "
                               "like viser 0.2.7 (viser.infra._infra.WebsockServer); refusing to serve unguarded")
        real_serve = legacy_server.serve

        def serve(ws_handler, host=None, port=None, *args, process_request=None, **kwargs):
            srv = getattr(_tls, "server", None)
            root = getattr(srv, "_http_server_root", None) if process_request is not None else None
            guard = RequestGuard(root, host, process_request)

            async def handler(websocket, *rest):  # viser's loop asserts binary frames: give it bytes
                return await ws_handler(_BinaryFrames(websocket), *rest)

            return real_serve(handler, host, port, *args, process_request=guard, **kwargs)

        @functools.wraps(worker)
        def _background_worker(self, *args, **kwargs):
            _tls.server = self  # this thread runs this server's event loop: serve() above reads it
            if not isinstance(self._message_class, CheckedMessages):
                self._message_class = CheckedMessages(self._message_class)  # what its consumer loop decodes with
            return worker(self, *args, **kwargs)

        _infra.websockets = _Delegate(ws, server=_Delegate(legacy_server, serve=serve))
        _infra.WebsockServer._background_worker = _background_worker
        _infra.error_print_wrapper = _one_line_errors
        _wrap_host(_viser.ViserServer)
        _wrap_host(_infra.WebsockServer)
        _installed = True

