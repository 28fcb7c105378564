# The Fulcrum configuration of the proxy-wasm benchmarks (bench/wasm-filter.sh,
# bench/wasm-callgrind.sh): one worker, admin on $ADMIN, six http services in front of the
# members $M1 and $M2 — none ($NONE), a declarative rule ($RULE), a no-op filter ($NOOP: only
# the header callbacks, each returning Continue), the committed C filter ($HDR), the probe
# filter ($BODY) and the AssemblyScript SDK filter ($SDK). Written into $work.
wasm_filter_config() {
  filters=crates/fulcrum-wasm/filters
  cat >"$work/noop.wat" <<'WAT'
(module
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_request_headers") (param i32 i32 i32) (result i32) (i32.const 0))
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32) (i32.const 0)))
WAT
  service() {  # service NAME PORT EXTRA
    printf '[[virtual_service]]\nname = "%s"\nlisten = ["127.0.0.1:%s"]\nprotocol = "http"\npool = "p"\n%b\n' "$1" "$2" "$3"
  }
  {
    fulcrum_head "127.0.0.1:$ADMIN"
    service none "$NONE" ""
    service rule "$RULE" '[[virtual_service.rule]]\npath_prefix = "/"\npool = "p"\nrequest_headers = { set = { "x-filter" = "bench" }, remove = ["x-internal"] }'
    service noop "$NOOP" "[[virtual_service.filter]]\nmodule = \"$work/noop.wat\""
    service header "$HDR" "[[virtual_service.filter]]\nmodule = \"$PWD/$filters/add_header.wasm\"\nconfig = \"bench\""
    service body "$BODY" "[[virtual_service.filter]]\nmodule = \"$PWD/$filters/probe.wat\""
    service sdk "$SDK" "[[virtual_service.filter]]\nmodule = \"$PWD/$filters/sdk_add_header.wasm\"\nroot_id = \"add_header\"\nconfig = \"bench\""
    printf '[[pool]]\nname = "p"\n[[pool.member]]\naddress = "127.0.0.1:%s"\n[[pool.member]]\naddress = "127.0.0.1:%s"\n' "$M1" "$M2"
  } >"$work/fulcrum.toml"
}
