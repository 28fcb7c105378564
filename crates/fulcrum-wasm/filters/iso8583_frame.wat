;; A message framing hook (`framing = { wasm = "iso8583_frame.wat" }` on a message service), the
;; job an iRule does in front of an ISO 8583 host: each message starts with its body length in
;; four ASCII digits; the body starts with a 12-byte sequence key (the test switch's id, where a
;; real switch would have its MTI and STAN). `fulcrum_on_message_frame(root, size)` reads the
;; buffered bytes as DOWNSTREAM_DATA and answers 0 (more bytes), -1 (malformed) or the frame's
;; length in bits 0-31 with the key's offset in bits 32-47 and its length in bits 48-62.
;; Fulcrum's member-choice hook, as an iRule's `node` command: a payload that starts with
;; "@ip:port;" goes to that member (the property fulcrum.member), ahead of persistence.
(module
  (import "env" "proxy_get_buffer_bytes" (func $get_buf (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_set_property" (func $set_prop (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "proxy_abi_version_0_2_1"))
  ;; One scratch area: the host copies at most 64 bytes at a time.
  (func (export "proxy_on_memory_allocate") (param i32) (result i32) (i32.const 4096))
  (func (export "proxy_on_context_create") (param i32 i32))
  ;; "@ip:port;" at the start of `n` bytes at `p`: fulcrum.member = ip:port.
  (func $choose (param $p i32) (param $n i32) (local $i i32)
    (if (i32.or (i32.lt_u (local.get $n) (i32.const 2))
                (i32.ne (i32.load8_u (local.get $p)) (i32.const 64))) (then (return)))
    (local.set $i (i32.const 1))
    (block $found (loop $scan
      (br_if $found (i32.eq (i32.load8_u (i32.add (local.get $p) (local.get $i))) (i32.const 59)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $scan (i32.lt_u (local.get $i) (local.get $n)))
      (return)))
    (drop (call $set_prop (i32.const 64) (i32.const 14)
      (i32.add (local.get $p) (i32.const 1)) (i32.sub (local.get $i) (i32.const 1)))))
  (data (i32.const 64) "fulcrum.member")
  (func (export "fulcrum_on_message_frame") (param $root i32) (param $size i32) (result i64)
    (local $p i32) (local $i i32) (local $len i32) (local $digit i32) (local $n i32)
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
    ;; The payload seen so far (at most 64 bytes of it, none of the next message).
    (local.set $n (i32.sub (local.get $size) (i32.const 16)))
    (if (i32.gt_s (local.get $n) (i32.sub (local.get $len) (i32.const 12)))
      (then (local.set $n (i32.sub (local.get $len) (i32.const 12)))))
    (if (i32.gt_s (local.get $n) (i32.const 64)) (then (local.set $n (i32.const 64))))
    (if (i32.gt_s (local.get $n) (i32.const 0)) (then
      (if (i32.eqz (call $get_buf (i32.const 2) (i32.const 16) (local.get $n) (i32.const 16) (i32.const 20)))
        (then (call $choose (i32.load (i32.const 16)) (i32.load (i32.const 20)))))))
    (i64.or
      (i64.extend_i32_u (i32.add (local.get $len) (i32.const 4)))
      (i64.or (i64.shl (i64.const 4) (i64.const 32)) (i64.shl (i64.const 12) (i64.const 48))))))
