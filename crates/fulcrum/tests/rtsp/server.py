#!/usr/bin/python3
"""A real RTSP server for Fulcrum's rtsp tests: GStreamer's RTSP server (gst-rtsp-server) on
IP:PORT (argv[1], argv[2]) serving a live test tone as L16 audio over RTP at each mount point
of argv[3] (comma-separated, e.g. "/a,/b"). A path it does not mount is answered 404, so a test
can tell which member a request reached. With argv[4] "keep", a session's UDP media goes on
after its control connection closes (gst-rtsp-server's stop-on-disconnect off; the default
stops it). Prints "ready" once it listens."""

import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def main():
    ip, port, paths = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    keep = sys.argv[4:5] == ["keep"]
    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address(ip)
    server.set_service(port)
    mounts = server.get_mount_points()
    for path in paths:
        factory = GstRtspServer.RTSPMediaFactory()
        factory.set_launch(
            "( audiotestsrc is-live=true wave=sine samplesperbuffer=441 "
            "! audio/x-raw,format=S16BE,rate=44100,channels=1 "
            "! rtpL16pay name=pay0 pt=96 ) "
        )
        factory.set_shared(True)
        factory.set_stop_on_disconnect(not keep)
        mounts.add_factory(path, factory)
    if server.attach(None) == 0:
        print("cannot listen", file=sys.stderr, flush=True)
        sys.exit(1)
    print("ready", flush=True)
    GLib.MainLoop().run()


if __name__ == "__main__":
    main()
