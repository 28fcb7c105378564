#!/usr/bin/env python3
"""A raw HTTP/2 (h2c, prior knowledge) client that breaks the protocol on purpose, for
tests/http2_conformance.rs: the protocol errors h2spec checks that matter most for a proxy.

Frames are written by hand (hpack from python3-h2 encodes the header blocks), so that frames no
well-behaved library would send can be sent. Usage: client.py HOST:PORT CASE. Prints one JSON
object: the GOAWAY error code (or null), the RST_STREAM codes by stream, the :status of each
response, and whether the server closed the connection.
"""

import json
import socket
import struct
import sys
import time

from hpack import Decoder, Encoder

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, stream) + payload


def settings(*pairs):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


class Conn:
    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=5)
        self.enc, self.dec = Encoder(), Decoder()
        self.buf = b""
        self.result = {"goaway": None, "rst": {}, "status": {}, "ended": [], "closed": False}
        self.send(PREFACE + settings())

    def send(self, data):
        try:
            self.sock.sendall(data)
        except OSError:
            self.result["closed"] = True

    def request(self, stream, end_stream=True, end_headers=True):
        block = self.enc.encode(
            [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x")]
        )
        flags = (END_HEADERS if end_headers else 0) | (END_STREAM if end_stream else 0)
        return frame(HEADERS, flags, stream, block)

    def read_frame(self, deadline):
        while len(self.buf) < 9 or len(self.buf) < 9 + int.from_bytes(self.buf[:3], "big"):
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                got = self.sock.recv(65536)
            except socket.timeout:
                return None
            except OSError:
                got = b""
            if not got:
                self.result["closed"] = True
                return None
            self.buf += got
        n = int.from_bytes(self.buf[:3], "big")
        kind, flags, stream = struct.unpack(">BBI", self.buf[3:9])
        payload, self.buf = self.buf[9 : 9 + n], self.buf[9 + n :]
        return kind, flags, stream & 0x7FFFFFFF, payload

    def run(self, until, secs=5.0):
        """Reads frames until `until(result)` holds, the server closes, or `secs` pass."""
        deadline = time.monotonic() + secs
        while not until(self.result):
            f = self.read_frame(deadline)
            if f is None:
                break
            kind, flags, stream, payload = f
            if kind == SETTINGS and not flags & ACK:
                self.send(frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                self.send(frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                self.result["goaway"] = struct.unpack(">I", payload[4:8])[0]
            elif kind == RST_STREAM:
                self.result["rst"][str(stream)] = struct.unpack(">I", payload[:4])[0]
            elif kind == HEADERS:
                for name, value in self.dec.decode(payload):
                    if name in (":status", b":status"):
                        self.result["status"][str(stream)] = int(value)
            if kind in (HEADERS, DATA) and flags & END_STREAM:
                self.result["ended"].append(stream)
        return self.result


def answered(stream):
    return lambda r: stream in r["ended"] or str(stream) in r["rst"] or r["goaway"] is not None


def goaway(r):
    return r["goaway"] is not None or r["closed"]


def case(c, name):
    if name == "ok":
        c.send(c.request(1))
        return c.run(answered(1))
    if name == "data_on_stream_0":
        c.send(frame(DATA, 0, 0, b"hello"))
        return c.run(goaway)
    if name == "headers_on_stream_0":
        c.send(c.request(0))
        return c.run(goaway)
    if name == "settings_on_stream_1":
        c.send(frame(SETTINGS, 0, 1, b""))
        return c.run(goaway)
    if name == "data_on_closed_stream":
        c.send(c.request(1))
        c.run(answered(1))
        c.send(frame(DATA, END_STREAM, 1, b"late"))
        return c.run(lambda r: goaway(r) or "1" in r["rst"], secs=3.0)
    if name == "even_stream_id":
        c.send(c.request(2))
        return c.run(goaway)
    if name == "window_update_overflows_connection":
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)))
        return c.run(goaway)
    if name == "window_update_overflows_stream":
        c.send(c.request(1, end_stream=False))
        c.send(frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 0x7FFFFFFF)))
        return c.run(lambda r: goaway(r) or "1" in r["rst"])
    if name == "settings_enable_push_2":
        c.send(settings((0x2, 2)))
        return c.run(goaway)
    if name == "settings_initial_window_too_large":
        c.send(settings((0x4, 0x80000000)))
        return c.run(goaway)
    if name == "settings_max_frame_size_too_small":
        c.send(settings((0x5, 16383)))
        return c.run(goaway)
    if name == "oversized_header_block":
        # A 64 KiB field over HEADERS and CONTINUATION frames, past max_header_size.
        block = c.enc.encode(
            [(":method", "GET"), (":scheme", "http"), (":path", "/"), (":authority", "x"),
             ("x-big", "a" * 65536)]
        )
        chunks = [block[i : i + 16384] for i in range(0, len(block), 16384)]
        out = frame(HEADERS, END_STREAM, 1, chunks[0])
        for i, chunk in enumerate(chunks[1:], 1):
            out += frame(CONTINUATION, END_HEADERS if i == len(chunks) - 1 else 0, 1, chunk)
        c.send(out)
        return c.run(lambda r: goaway(r) or "1" in r["rst"] or answered(1)(r))
    if name == "continuation_flood":
        # CVE-2024-27316's shape: a header block that never ends, one small CONTINUATION at a
        # time, each a new field (so nothing is refused as empty).
        c.send(c.request(1, end_headers=False))
        sent = 0
        for i in range(20000):
            field = c.enc.encode([("x-flood-%d" % i, "v")])
            c.send(frame(CONTINUATION, 0, 1, field))
            sent += 1
            if c.result["closed"]:
                break
        r = c.run(lambda r: goaway(r) or "1" in r["rst"] or answered(1)(r))
        r["continuations_sent"] = sent
        return r
    raise SystemExit("unknown case " + name)


def main():
    addr, name = sys.argv[1], sys.argv[2]
    c = Conn(addr)
    print(json.dumps(case(c, name)))


if __name__ == "__main__":
    main()
