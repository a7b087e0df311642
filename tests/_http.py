"""Raw HTTP / WebSocket-handshake requests (no URL normalisation, like ``curl --path-as-is``) and the
addresses a local TCP port listens on (``/proc/net/tcp``), for the viewer security tests."""
from __future__ import annotations

import socket
from typing import Dict, List, Optional, Tuple

WS_HEADERS = {"Upgrade": "websocket", "Connection": "Upgrade", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
              "Sec-WebSocket-Version": "13"}


def raw_request(port: int, target: str, headers: Optional[Dict[str, str]] = None, host: Optional[str] = None,
                timeout: float = 10.0) -> Tuple[int, bytes]:
    """Send ``GET <target> HTTP/1.1`` byte for byte to 127.0.0.1:port -> (status code, body)."""
    hdrs = {"Host": host if host is not None else f"127.0.0.1:{port}", **(headers or {})}
    upgrade = "Upgrade" in hdrs
    if not upgrade:
        hdrs["Connection"] = "close"
    lines = [f"GET {target} HTTP/1.1"] + [f"{k}: {v}" for k, v in hdrs.items()]
    data = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        while True:  # to the end (plain requests: Connection: close) or the end of the head (upgrades)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            data += chunk
            if upgrade and b"\r\n\r\n" in data:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else -1
    return status, body


def ws_handshake(port: int, origin: Optional[str] = None, host: Optional[str] = None) -> int:
    """Status of a WebSocket upgrade request (101 = accepted) with the given ``Origin`` header (or none)."""
    headers = dict(WS_HEADERS)
    if origin is not None:
        headers["Origin"] = origin
    return raw_request(port, "/", headers, host=host)[0]


def _addr4(hexaddr: str) -> str:
    return ".".join(str(int(hexaddr[i:i + 2], 16)) for i in (6, 4, 2, 0))


def _addr6(hexaddr: str) -> str:
    words = [hexaddr[i:i + 8] for i in range(0, 32, 8)]
    raw = b"".join(bytes.fromhex(w)[::-1] for w in words)
    return socket.inet_ntop(socket.AF_INET6, raw)


def listen_addresses(port: int) -> List[str]:
    """The local addresses with a socket listening on TCP ``port`` (IPv4 and IPv6)."""
    out = []
    for name, conv in (("/proc/net/tcp", _addr4), ("/proc/net/tcp6", _addr6)):
        try:
            lines = open(name).read().splitlines()[1:]
        except OSError:
            continue
        for ln in lines:
            f = ln.split()
            addr, p = f[1].split(":")
            if f[3] == "0A" and int(p, 16) == port:  # 0A = LISTEN
                out.append(conv(addr))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
