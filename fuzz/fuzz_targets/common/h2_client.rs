//! The client half shared by the fuzz targets that run whole HTTP exchanges over an in-memory
//! client stream: an HTTP/2 request with prior knowledge, and reading a response to its end.

use tokio::io::AsyncReadExt;

/// The HTTP/2 client's request: prior-knowledge preface, empty SETTINGS, HEADERS for
/// `GET http://f/h2` (HPACK literals without indexing), END_STREAM | END_HEADERS.
pub fn h2_request() -> Vec<u8> {
    let mut block = Vec::new();
    for (n, v) in [
        (&b":method"[..], &b"GET"[..]),
        (b":scheme", b"http"),
        (b":path", b"/h2"),
        (b":authority", b"f"),
        (b"accept-encoding", b"gzip"),
    ] {
        block.push(0);
        block.push(n.len() as u8);
        block.extend_from_slice(n);
        block.push(v.len() as u8);
        block.extend_from_slice(v);
    }
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    out.extend_from_slice(&[0, 0, 0, 4, 0, 0, 0, 0, 0]);
    let len = block.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[1, 0x5, 0, 0, 0, 1]);
    out.extend_from_slice(&block);
    out
}

/// Reads until the response is over: the connection closes (HTTP/1, `Connection: close`), or
/// for HTTP/2, stream 1 ends (END_STREAM, RST_STREAM) or the server sends GOAWAY.
pub async fn read_response(client: &mut tokio::io::DuplexStream, h2: bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        match client.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if !h2 {
            continue;
        }
        let mut at = 0;
        while buf.len() >= at + 9 {
            let len = usize::from(buf[at]) << 16
                | usize::from(buf[at + 1]) << 8
                | usize::from(buf[at + 2]);
            let (kind, flags) = (buf[at + 3], buf[at + 4]);
            let stream = u32::from_be_bytes([buf[at + 5], buf[at + 6], buf[at + 7], buf[at + 8]])
                & 0x7fff_ffff;
            if buf.len() < at + 9 + len {
                break;
            }
            let ends = stream == 1 && matches!(kind, 0 | 1) && flags & 1 != 0;
            if ends || (stream == 1 && kind == 3) || kind == 7 {
                return;
            }
            at += 9 + len;
        }
    }
}
