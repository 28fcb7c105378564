#!/usr/bin/env python3
"""Opens N TCP connections to HOST:PORT, sends a partial HTTP request on each (so a proxy has
connected onward), waits for a signal on stdin, then closes them. Used to measure memory per
connection of a proxy."""
import socket, sys

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\n")
    socks.append(s)
print("open", flush=True)
sys.stdin.readline()
for s in socks:
    s.close()
