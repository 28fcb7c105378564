;; A message framing hook (`framing = { wasm = "iso8583_frame.wat" }` on a message service), the
;; job an iRule does in front of an ISO 8583 host: each message starts with its body length in
;; four ASCII digits; the body starts with a 12-byte sequence key (the test switch's id, where a
;; real switch would have its MTI and STAN). `fulcrum_on_message_frame(root, size)` reads the
;; buffered bytes as DOWNSTREAM_DATA and answers 0 (more bytes), -1 (malformed) or the frame's
;; length in bits 0-31 with the key's offset in bits 32-47 and its length in bits 48-62.
(module
  (import "env" "proxy_get_buffer_bytes" (func $get_buf (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  ;; One scratch area: the host allocates once per call, at most four bytes.
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 4096))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "fulcrum_on_message_frame") (param $root i32) (param $size i32) (result i64)
    (local $p i32) (local $i i32) (local $len i32) (local $digit i32)
    (if (i32.lt_u (local.get $size) (i32.const 4)) (then (return (i64.const 0))))
    (if (call $get_buf (i32.const 2) (i32.const 0) (i32.const 4) (i32.const 16) (i32.const 20))
      (then (return (i64.const -1))))
    (local.set $p (i32.load (i32.const 16)))
    (loop $digits
      (local.set $digit (i32.sub (i32.load8_u (i32.add (local.get $p) (local.get $i))) (i32.const 48)))
      (if (i32.gt_u (local.get $digit) (i32.const 9)) (then (return (i64.const -1))))
      (local.set $len (i32.add (i32.mul (local.get $len) (i32.const 10)) (local.get $digit)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $digits (i32.lt_u (local.get $i) (i32.const 4))))
    ;; A body too short for its key cannot be paired with an answer.
    (if (i32.lt_u (local.get $len) (i32.const 12)) (then (return (i64.const -1))))
    (i64.or
      (i64.extend_i32_u (i32.add (local.get $len) (i32.const 4)))
      (i64.or (i64.shl (i64.const 4) (i64.const 32)) (i64.shl (i64.const 12) (i64.const 48))))))
