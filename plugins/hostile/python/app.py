"""A deliberately hostile Python plugin for the host's tests: what it tries is chosen by the
`hostile` key of the facts. Each attempt at something the sandbox denies is caught and its
error reported as a trait, so the tests see exactly what the plugin got back."""

import os
import socket
import time

from heddle_plugin import Detection, Facts, Info, export


def attempt(d: Detection, key: str, action) -> None:
    try:
        got = action()
    except Exception as e:  # noqa: BLE001 - reporting whatever the sandbox answered
        d.add_trait(key, f"error: {type(e).__name__}: {e}")
    else:
        d.add_trait(key, f"got: {got!r}"[:200])


class Misbehave:
    @staticmethod
    def info() -> Info:
        return Info("py-misbehave", "0.1.0", "misbehaves on request (host tests only)",
                    reads=["/hostile", "/seed"])

    @staticmethod
    def detect(facts: Facts) -> Detection:
        d = Detection()
        mode = facts.str_at("/hostile") or "ok"
        if mode == "ok":
            d.add_trait("py.ok", "yes")
        elif mode == "socket":
            attempt(d, "py.connect", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM).connect(("198.51.100.7", 443)))
            attempt(d, "py.resolve", lambda: socket.getaddrinfo("example.com", 443))
            attempt(d, "py.udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("198.51.100.7", 53)))
        elif mode == "file":
            attempt(d, "py.passwd", lambda: open("/etc/passwd").read())
            attempt(d, "py.listdir", lambda: os.listdir("/"))
            attempt(d, "py.write", lambda: open("/tmp/heddle-plugin-was-here", "w").write("x"))
            attempt(d, "py.environ", lambda: sorted(os.environ))
        elif mode == "sleep":
            time.sleep(facts.int_at("/seed") or 3600)
            d.add_trait("py.slept", "yes")
        elif mode == "loop":
            while True:
                pass
        elif mode == "memory":
            hoard = []
            while True:
                hoard.append(bytearray(1 << 20))
        elif mode == "raise":
            raise KeyError("py-misbehave was asked to raise")
        return d


Plugin = export(Misbehave)
