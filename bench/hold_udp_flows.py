#!/usr/bin/env python3
"""Opens N UDP client sockets, sends one datagram from each to HOST:PORT (a new flow each),
prints "ready" once the replies came back, then waits for a line on stdin before closing."""
import select
import socket
import sys
import time

host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.setblocking(False)
    s.sendto(b"hold", (host, port))
    socks.append(s)
answered, deadline = set(), time.time() + 10
while len(answered) < n and time.time() < deadline:
    ready, _, _ = select.select(socks, [], [], 0.2) if len(socks) < 1000 else (socks, [], [])
    for s in ready:
        try:
            s.recv(2048)
            answered.add(s.fileno())
        except BlockingIOError:
            pass
    if len(socks) >= 1000:
        time.sleep(0.05)
print("ready", len(answered), flush=True)
sys.stdin.readline()
