#!/usr/bin/env python3
"""Failover client for bench/ha.sh: run inside the client namespace.

ha_client.py serve NAME ADDR PORT     an HTTP server answering every GET with NAME
ha_client.py load HOST PORT SECONDS [TIMEOUT [RETRIES]]
                                      GETs HOST:PORT back to back (10 ms apart, TIMEOUT seconds per
                                      attempt, default 0.2, RETRIES more attempts on failure,
                                      default 1) and prints one JSON line: the service gap (last
                                      answer of the old master to the first answer of the new
                                      one), failed attempts, requests that failed even after their
                                      retries, and the total.
"""
import http.server
import json
import socket
import socketserver
import sys
import time


def serve(name, addr, port):
    body = (name + "\n").encode()

    class H(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True
        allow_reuse_address = True

    S((addr, int(port)), H).serve_forever()


def get(host, port, timeout=0.2):
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(b"GET / HTTP/1.1\r\nHost: vip\r\nConnection: close\r\n\r\n")
            data = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        if not (head.startswith(b"HTTP/1.") and head[8:13] == b" 200 "):
            return None
        return body.decode().strip()
    except OSError:
        return None


def load(host, port, seconds, timeout="0.2", retries="1"):
    port, timeout, retries = int(port), float(timeout), int(retries)
    end = time.monotonic() + float(seconds)
    log = []  # (time, who or None)
    failed_attempts = failed_requests = total = 0
    while time.monotonic() < end and total < 100000:
        total += 1
        who = None
        for _ in range(1 + retries):  # an idempotent GET: the client may retry
            who = get(host, port, timeout)
            if who is not None:
                break
            failed_attempts += 1
        if who is None:
            failed_requests += 1
        log.append((time.monotonic(), who))
        time.sleep(0.01)
    answered = [w for _, w in log if w]
    first = answered[0] if answered else None
    gap = None
    if first:
        last_first = max(i for i, (_, w) in enumerate(log) if w == first)
        after = [t for t, w in log[last_first:] if w and w != first]
        if after:
            gap = after[0] - log[last_first][0]
    print(json.dumps({"gap_ms": None if gap is None else round(gap * 1000, 1),
                      "failed_attempts": failed_attempts, "failed_requests": failed_requests,
                      "requests": total, "first": first, "last": answered[-1] if answered else None}))


if __name__ == "__main__":
    {"serve": serve, "load": load}[sys.argv[1]](*sys.argv[2:])
