# The Fulcrum and HAProxy configurations of the HTTP/2 benchmarks (bench/h2.sh,
# bench/h2-callgrind.sh): TLS + HTTP/2 on one port, HTTP/1.1 to the members $M1 and $M2 over
# reused connections. Written into $work; Fulcrum on $F (admin $FA), HAProxy on $H.
h2_configs() {
cat >"$work/fulcrum.toml" <<CONF
$(fulcrum_head "127.0.0.1:$FA")
[[virtual_service]]
name = "bench"
listen = "127.0.0.1:$F"
protocol = "https"
pool = "nginx"
tls = [{ cert = "$work/site.crt", key = "$work/site.key" }]
forward_headers = { x_forwarded_host = false, via = false }
$(fulcrum_member_pool "$M1" "$M2")
CONF
cat >"$work/haproxy.cfg" <<CONF
global
  nbthread 1
  maxconn 9000
defaults
  mode http
  timeout connect 3s
  timeout client 60s
  timeout server 60s
  option forwardfor
  http-reuse safe
frontend bench
  bind 127.0.0.1:$H ssl crt $work/site.pem alpn h2,http/1.1
  http-request set-header X-Forwarded-Proto https
  default_backend nginx
backend nginx
  balance roundrobin
  server a 127.0.0.1:$M1
  server b 127.0.0.1:$M2
CONF
}
