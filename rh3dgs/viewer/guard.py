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

Example::

    from rh3dgs.viewer import guard
    guard.install(explicit_host="127.0.0.1")   # then create viser.ViserServer(...) as usual
"""
from __future__ import annotations

import functools
import http
import inspect
import ipaddress
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Tuple, Union
from urllib.parse import unquote, urlsplit

__all__ = ["install", "installed", "is_loopback", "static_file", "host_allowed", "origin_allowed", "RequestGuard",
           "bind_host", "LOOPBACK"]

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
                "host" not in inspect.signature(_infra.WebsockServer.__init__).parameters:
            raise RuntimeError(f"rh3dgs.viewer.guard: viser {getattr(viser, '__version__', '?')} is not laid out "
                               "like viser 0.2.7 (viser.infra._infra.WebsockServer); refusing to serve unguarded")
        real_serve = legacy_server.serve

        def serve(ws_handler, host=None, port=None, *args, process_request=None, **kwargs):
            srv = getattr(_tls, "server", None)
            root = getattr(srv, "_http_server_root", None) if process_request is not None else None
            guard = RequestGuard(root, host, process_request)
            return real_serve(ws_handler, host, port, *args, process_request=guard, **kwargs)

        @functools.wraps(worker)
        def _background_worker(self, *args, **kwargs):
            _tls.server = self  # this thread runs this server's event loop: serve() above reads it
            return worker(self, *args, **kwargs)

        _infra.websockets = _Delegate(ws, server=_Delegate(legacy_server, serve=serve))
        _infra.WebsockServer._background_worker = _background_worker
        _wrap_host(_viser.ViserServer)
        _wrap_host(_infra.WebsockServer)
        _installed = True

