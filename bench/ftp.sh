#!/usr/bin/env bash
# FTP through Fulcrum (`protocol = "ftp"`) against the same transfer straight from the member:
# one vsftpd on 127.0.0.31 serving a SIZE_MB file, curl downloading it ROUNDS times in passive
# (EPSV) mode, directly and through a Fulcrum ftp service on 127.0.0.32, alternating. Prints
# MB/s per round, the medians and Fulcrum's CPU time per transferred GB. All on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
need vsftpd /usr/sbin/vsftpd
need curl
SIZE_MB=${SIZE_MB:-512}
ROUNDS=${ROUNDS:-5}
FULCRUM=${FULCRUM:-$BUILD_DIR/fulcrum}
[ -x "$FULCRUM" ] || bench_build -p fulcrum
work=$(mktemp -d)
pids=()
teardown() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap teardown EXIT

mkdir -p "$work/root" "$work/empty"
chmod 755 "$work/root" "$work/empty"
head -c $((SIZE_MB * 1024 * 1024)) /dev/zero >"$work/root/big.bin"
member=127.0.0.31:2121
cat >"$work/vsftpd.conf" <<CONF
listen=YES
listen_ipv6=NO
listen_address=127.0.0.31
listen_port=2121
background=NO
anonymous_enable=YES
local_enable=NO
no_anon_password=YES
anon_root=$work/root
secure_chroot_dir=$work/empty
pasv_enable=YES
pasv_address=127.0.0.31
pasv_min_port=52000
pasv_max_port=52100
seccomp_sandbox=NO
isolate=NO
isolate_network=NO
xferlog_enable=NO
syslog_enable=NO
vsftpd_log_file=/dev/null
CONF
taskset -c "$BENCH_CPU_LOAD" /usr/sbin/vsftpd "$work/vsftpd.conf" &
pids+=($!)
wait_port "$member"
admin=127.0.0.1:$((20000 + RANDOM % 10000))
cat >"$work/fulcrum.toml" <<CONF
[admin]
listen = "$admin"
[[virtual_service]]
name = "ftp"
listen = ["127.0.0.32:2121"]
protocol = "ftp"
pool = "ftp"
ftp_passive_ports = "53000-53100"
[[pool]]
name = "ftp"
[[pool.member]]
address = "$member"
CONF
taskset -c "$BENCH_CPU_PROXY" "$FULCRUM" run -c "$work/fulcrum.toml" 2>"$work/fulcrum.log" &
pids+=($!)
fpid=$!
wait_port 127.0.0.32:2121

rate() {  # rate URL: MB/s of one download
  taskset -c "$BENCH_CPU_LOAD" curl -sS --epsv -o /dev/null -w '%{speed_download}\n' "$1" |
    awk '{printf "%.1f", $1 / 1048576}'
}
direct=() through=()
ticks0=$(cpu_ticks "$fpid")
for r in $(seq "$ROUNDS"); do
  d=$(rate "ftp://$member/big.bin")
  t=$(rate "ftp://127.0.0.32:2121/big.bin")
  direct+=("$d") through+=("$t")
  echo "round $r: direct $d MB/s, through Fulcrum $t MB/s"
done
ticks1=$(cpu_ticks "$fpid")
cpu_per_gb=$(awk -v t=$((ticks1 - ticks0)) -v hz="$CLK_TCK" -v n="$ROUNDS" -v mb="$SIZE_MB" \
  'BEGIN { printf "%.2f", t / hz / (n * mb / 1024) }')
md=$(median "${direct[@]}") mt=$(median "${through[@]}")
echo
echo "| $SIZE_MB MB download, passive (median of $ROUNDS) | MB/s |"
echo "|---|---|"
echo "| vsftpd directly | $md |"
echo "| through Fulcrum ftp service | $mt |"
echo "through ÷ direct: $(ratio "$mt" "$md"); Fulcrum CPU: $cpu_per_gb s per GB relayed; $FULCRUM"
