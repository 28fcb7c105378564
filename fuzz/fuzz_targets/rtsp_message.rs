//! Any bytes given to the RTSP framing of `protocol = "rtsp"` are framed or refused without a
//! panic; a frame never claims more bytes than the buffer holds or than `MAX_FRAME`; what the
//! proxy reads from a message (CSeq, Session, the URL's parts) stays inside it; a message with
//! a header rewritten (as SETUP's `Transport` is) frames again to the same start line with the
//! new value; and the Transport rewrites keep their own port pairs readable.
#![no_main]

use fulcrum_proxy::rtsp::message::{parse, split_url, Frame, MAX_FRAME};
use fulcrum_proxy::rtsp::transport::{ports, reply_to_client, request_to_member, PortPair};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let pair = PortPair {
        rtp: 40000,
        rtcp: 40001,
    };
    if let Some(client) = ports(data, "client_port") {
        let to_member = request_to_member(data, pair).expect("text stays text");
        assert_eq!(ports(&to_member, "client_port"), Some(pair));
        let back = reply_to_client(&to_member, client, pair, [192, 0, 2, 1].into())
            .expect("text stays text");
        assert_eq!(ports(&back, "client_port"), Some(client));
    }
    let Ok(Some(frame)) = parse(data) else {
        return;
    };
    assert!(frame.len() <= data.len() && frame.len() <= MAX_FRAME + 4);
    let Frame::Message(m) = frame else {
        return;
    };
    let _ = (m.cseq(data), m.session(data), m.status());
    if let Some(url) = m.url(data) {
        if let Some((authority, path)) = split_url(url) {
            assert!(authority.len() + path.len() <= url.len() + 1);
        }
    }
    let rewritten = m.with_header(data, "cseq", b"7");
    match parse(&rewritten) {
        Ok(Some(Frame::Message(again))) => {
            assert_eq!(again.method(&rewritten), m.method(data));
            assert_eq!(again.url(&rewritten), m.url(data));
            assert_eq!(again.status(), m.status());
            if m.cseq(data).is_some() {
                assert_eq!(again.cseq(&rewritten), Some(&b"7"[..]));
            }
            assert_eq!(again.len(), rewritten.len());
        }
        other => panic!("a rewritten message no longer frames: {other:?}"),
    }
});
