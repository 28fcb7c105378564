#!/usr/bin/env python3
"""Timing loops of bench/config.sh (all traffic on 127.0.0.1 or the bench's namespaces).

  config_api.py fulcrum API TOKEN POOL N FIRST_PORT   N member writes through /api/v1/config
  config_api.py haproxy SOCKET BACKEND N FIRST_PORT   N `add server` + `enable server` (runtime API)
  config_api.py pair API TOKEN PEER_ADDR N FIRST_PORT N services added on this node through the
                                                      API, each timed until the peer serves it

Prints one line: p50_ms p99_ms writes_per_s.
"""
import http.client
import json
import socket
import sys
import time


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def api(host, token, method, path, body=None):
    h, p = host.split(":")
    c = http.client.HTTPConnection(h, int(p), timeout=30)
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        sys.exit(f"{method} {path}: {r.status} {data[:300]!r}")
    return data


def fulcrum(host, token, pool, n, first):
    lat = []
    start = time.monotonic()
    for i in range(n):
        addr = f"127.0.0.1:{first + i}"
        t = time.monotonic()
        api(host, token, "PUT", f"/api/v1/config/pools/{pool}/members/{addr}", {"weight": 1})
        lat.append(time.monotonic() - t)
        # Applied when the write answers: the running pool has the member.
        api(host, token, "GET", f"/api/v1/pools/{pool}/members/{addr}")
    return lat, time.monotonic() - start


def haproxy(sock_path, backend, n, first):
    def cmd(line):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sock_path)
        s.sendall(line.encode() + b"\n")
        out = b""
        while True:
            b = s.recv(4096)
            if not b:
                break
            out += b
        s.close()
        return out.decode()

    lat = []
    start = time.monotonic()
    for i in range(n):
        t = time.monotonic()
        out = cmd(f"add server {backend}/s{first + i} 127.0.0.1:{first + i}")
        if "New server registered" not in out:
            sys.exit(f"add server: {out!r}")
        cmd(f"enable server {backend}/s{first + i}")
        lat.append(time.monotonic() - t)
    return lat, time.monotonic() - start


def pair(host, token, peer, n, first):
    lat = []
    start = time.monotonic()
    for i in range(n):
        port = first + i
        t = time.monotonic()
        api(host, token, "PUT", f"/api/v1/config/virtual_services/s{port}",
            {"listen": [f"0.0.0.0:{port}"], "protocol": "tcp", "pool": "local"})
        deadline = t + 10
        while True:
            try:
                with socket.create_connection((peer, port), timeout=0.5) as c:
                    c.settimeout(1)
                    if c.recv(16):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                sys.exit(f"the peer does not serve port {port} after 10 s")
            time.sleep(0.001)
        lat.append(time.monotonic() - t)
    return lat, time.monotonic() - start


def main():
    mode = sys.argv[1]
    if mode == "fulcrum":
        lat, took = fulcrum(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    elif mode == "haproxy":
        lat, took = haproxy(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        lat, took = pair(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    print(f"{pct(lat, 50) * 1000:.2f} {pct(lat, 99) * 1000:.2f} {len(lat) / took:.1f}")


if __name__ == "__main__":
    main()
