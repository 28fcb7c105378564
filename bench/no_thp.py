#!/usr/bin/env python3
"""no_thp.py COMMAND [ARGS...]: runs COMMAND with transparent huge pages disabled for it
(prctl PR_SET_THP_DISABLE, kept across exec). mimalloc asks for huge pages, so a proxy's RSS
otherwise grows in 2 MiB steps: with 2000 connections held, memory per connection could only
be read to the nearest 1 KiB."""
import ctypes, os, sys

PR_SET_THP_DISABLE = 41
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), "prctl(PR_SET_THP_DISABLE)")
os.execvp(sys.argv[1], sys.argv[1:])
