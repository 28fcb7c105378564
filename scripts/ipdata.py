#!/usr/bin/env python3
"""Regenerates crates/fulcrum-ipdata/data/ipdata.bin, the address table Fulcrum ships for
`[[ip_table]]` `asns` and `countries` (without `geoip`), from two npm packages of the
ip-location-db project, pinned by version and integrity:

  @ip-location-db/asn          prefix -> AS number (RouteViews, the five RIRs, DB-IP ASN Lite;
                               CC BY 4.0 by RouteViews, DB-IP and the NRO)
  @ip-location-db/asn-country  prefix -> country of registration (the five RIRs' statistics;
                               package CC0-1.0, the NRO's data CC BY 4.0)

    python3 scripts/ipdata.py              # npm pack the pinned versions, write the table
    python3 scripts/ipdata.py --check      # the same, but compare with the committed file
    python3 scripts/ipdata.py --asn A.tgz --country C.tgz   # from tarballs already at hand

The output depends only on the two tarballs (same input, same bytes); no compression library
is involved, so any Python 3 reproduces it. Format (all integers unsigned LEB128 varints):

  "FIPD" 0x01                        magic, format version
  str version, str source            str = varint length + UTF-8
  varint n, n x 2 bytes              country codes (ASCII), sorted; values index them
  4 sections: asn v4, asn v6, country v4, country v6; each:
    varint count, then count records (gap, size, value) in address order, where
    gap = start - (end of the previous record + 1) (the first: start itself), size = end + 1 - start,
    gap and size written as ((x >> t) << 8 | t) with t the trailing zero bits of x (0 for x = 0),
    value = AS number, or index into the country codes.
Adjacent records with the same value are merged; a record overlapping the previous one
(one in the asn IPv4 file) is clipped to start after it: the first listed wins.
"""

import argparse
import base64
import csv
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile

VERSION = "2.3.2026061719"
DATE = "2026-06-17"
PACKAGES = {
    "asn": (
        "@ip-location-db/asn",
        "sha512-PpqYi7wyEyWwunXBtl+y3Vi403SvNywotWwvmiYCOUtE0SVol/Sf492Ee+eErEznmGapxEQB2SAfrpXuZ9a+vQ==",
    ),
    "country": (
        "@ip-location-db/asn-country",
        "sha512-KN/mUGqf/nwkI0RDvv4knOc5xGXxbooU1MlTXThEJcJVyWxHoCx6oRed8p7NguGKZRpQPmZWdWw/zslHZsUC6Q==",
    ),
}
SOURCE = (
    f"@ip-location-db/asn {VERSION} (CC BY 4.0: RouteViews, DB-IP, NRO); "
    f"@ip-location-db/asn-country {VERSION} (CC0-1.0; RIR statistics CC BY 4.0 by the NRO)"
)
OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "crates", "fulcrum-ipdata", "data", "ipdata.bin"
)


def varint(x):
    out = bytearray()
    while True:
        b = x & 0x7F
        x >>= 7
        if x:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def scaled(x):
    t = 0
    if x:
        while not (x >> t) & 1:
            t += 1
    return varint(((x >> t) << 8) | t)


def text(s):
    b = s.encode()
    return varint(len(b)) + b


def rows(tgz, member):
    """(start, end, value) of one `-num.csv` file of a package tarball."""
    with tarfile.open(tgz, "r:gz") as tar:
        data = tar.extractfile("package/" + member).read().decode()
    for row in csv.reader(io.StringIO(data)):
        yield int(row[0]), int(row[1]), row[2]


def normalise(records):
    """Sorted, disjoint, merged (start, end, value)."""
    out = []
    for start, end, value in records:
        if out and start <= out[-1][1]:
            start = out[-1][1] + 1  # overlap: the first listed wins
            if start > end:
                continue
        if out and out[-1][2] == value and out[-1][1] + 1 == start:
            out[-1] = (out[-1][0], end, value)
        else:
            out.append((start, end, value))
    return out


def section(records):
    out = bytearray(varint(len(records)))
    next_start = 0
    for start, end, value in records:
        if start < next_start:
            sys.exit(f"records out of order at {start}")
        out += scaled(start - next_start) + scaled(end + 1 - start) + varint(value)
        next_start = end + 1
    return bytes(out)


def build(asn_tgz, country_tgz):
    asn4 = normalise((s, e, int(v)) for s, e, v in rows(asn_tgz, "asn-ipv4-num.csv"))
    asn6 = normalise((s, e, int(v)) for s, e, v in rows(asn_tgz, "asn-ipv6-num.csv"))
    c4 = list(rows(country_tgz, "asn-country-ipv4-num.csv"))
    c6 = list(rows(country_tgz, "asn-country-ipv6-num.csv"))
    codes = sorted({v for _, _, v in c4 + c6})
    for c in codes:
        if len(c) != 2 or not c.isascii() or not c.isupper():
            sys.exit(f"unexpected country code {c!r}")
    index = {c: i for i, c in enumerate(codes)}
    c4 = normalise((s, e, index[v]) for s, e, v in c4)
    c6 = normalise((s, e, index[v]) for s, e, v in c6)
    out = bytearray(b"FIPD\x01")
    out += text(DATE) + text(SOURCE)
    out += varint(len(codes)) + "".join(codes).encode()
    for records in (asn4, asn6, c4, c6):
        out += section(records)
    counts = dict(asn_v4=len(asn4), asn_v6=len(asn6), country_v4=len(c4), country_v6=len(c6))
    return bytes(out), counts


def npm_pack(name, workdir):
    """npm pack `name@VERSION` into workdir; returns the tarball path."""
    spec = f"{name}@{VERSION}"
    subprocess.run(["npm", "pack", "--silent", spec], cwd=workdir, check=True, stdout=subprocess.DEVNULL)
    base = name.lstrip("@").replace("/", "-")
    return os.path.join(workdir, f"{base}-{VERSION}.tgz")


def integrity(path):
    with open(path, "rb") as f:
        return "sha512-" + base64.b64encode(hashlib.sha512(f.read()).digest()).decode()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asn", help="@ip-location-db/asn tarball (default: npm pack it)")
    ap.add_argument("--country", help="@ip-location-db/asn-country tarball (default: npm pack it)")
    ap.add_argument("--check", action="store_true", help="compare with the committed file, write nothing")
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asn = args.asn or npm_pack(PACKAGES["asn"][0], tmp)
        country = args.country or npm_pack(PACKAGES["country"][0], tmp)
        for key, path in (("asn", asn), ("country", country)):
            got = integrity(path)
            if got != PACKAGES[key][1]:
                sys.exit(f"{path}: integrity {got} is not the pinned {PACKAGES[key][1]}")
        data, counts = build(asn, country)
    if args.check:
        with open(args.out, "rb") as f:
            same = f.read() == data
        print(("identical to " if same else "DIFFERS from ") + args.out)
        sys.exit(0 if same else 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {args.out}: {len(data)} bytes, {counts}")


if __name__ == "__main__":
    main()
