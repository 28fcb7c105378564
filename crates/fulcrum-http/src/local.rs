//! Answers the proxy makes itself: a rule's redirect or respond, or an error.

use bytes::Bytes;

/// A local answer: a rule's redirect or respond, or an error.
#[derive(Debug, Clone)]
pub struct Local {
    pub status: u16,
    pub location: Option<Vec<u8>>,
    pub body: Bytes,
    pub retry_after: bool,
    /// Close the client connection after the answer.
    pub close: bool,
    /// Fields a filter's local reply carries (names lower-case).
    pub fields: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Local {
    pub fn error(status: u16, text: &str) -> Local {
        let reason = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Error");
        let body = if text.is_empty() {
            format!("{status} {reason}\n")
        } else {
            format!("{status} {reason}: {text}\n")
        };
        Local {
            status,
            location: None,
            body: Bytes::from(body),
            retry_after: false,
            close: false,
            fields: Vec::new(),
        }
    }

    /// An error after which the client connection closes: what the client sends next cannot
    /// be read in step (a bad, unfinished or timed-out request).
    #[inline]
    pub fn closing_error(status: u16, text: &str) -> Local {
        Local {
            close: true,
            ..Local::error(status, text)
        }
    }
}
