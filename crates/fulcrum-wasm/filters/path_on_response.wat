;; On the response head, copies the property request.path (the request as it went to the
;; member) into the response field x-path: a property of the request read after the request's
;; own phase, as Envoy allows.
(module
  (import "env" "proxy_get_property" (func $get_prop (param i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value"
    (func $add_hdr (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "request\00path")
  (data (i32.const 32) "x-path")
  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  ;; 64 and 68: where the host writes the value's address and length.
  (func (export "proxy_on_response_headers") (param i32 i32 i32) (result i32)
    (if (i32.eqz (call $get_prop (i32.const 16) (i32.const 12) (i32.const 64) (i32.const 68)))
      (then (drop (call $add_hdr (i32.const 2) (i32.const 32) (i32.const 6)
                                 (i32.load (i32.const 64)) (i32.load (i32.const 68))))))
    (i32.const 0)))
