//! Where header fields are written: HTTP/1 heads straight into the bytes of a write buffer,
//! HTTP/2 ones into a header map (`fields::MapSink`).

/// Where header fields are written.
pub trait Sink {
    fn begin(&mut self, name: &[u8]);
    fn push(&mut self, value: &[u8]);
    fn end(&mut self);
    fn field(&mut self, name: &[u8], value: &[u8]) {
        self.begin(name);
        self.push(value);
        self.end();
    }
}

impl Sink for Vec<u8> {
    #[inline]
    fn begin(&mut self, name: &[u8]) {
        self.extend_from_slice(name);
        self.extend_from_slice(b": ");
    }
    #[inline]
    fn push(&mut self, value: &[u8]) {
        self.extend_from_slice(value);
    }
    #[inline]
    fn end(&mut self) {
        self.extend_from_slice(b"\r\n");
    }
}

/// The status line for an HTTP/1.x client.
pub fn write_status_line(out: &mut Vec<u8>, status: u16, reason: &[u8]) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(itoa::Buffer::new().format(status).as_bytes());
    out.push(b' ');
    if reason.is_empty() {
        let r = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("");
        out.extend_from_slice(r.as_bytes());
    } else {
        out.extend_from_slice(reason);
    }
    out.extend_from_slice(b"\r\n");
}
