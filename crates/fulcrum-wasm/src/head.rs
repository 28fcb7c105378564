//! The head of one header phase as filters see it, built only when one of them looks.
//!
//! Filters built with the public SDKs export the header callbacks whether or not they use
//! them, and building the header pairs (two allocations per field) was about a third of what a
//! no-op filter cost per request. So the proxy lends its own head, owned, for the length of the
//! phase; the pairs are built on a filter's first header-map call or header-derived property,
//! kept for the next filters of the chain, and handed back with the head. Owned rather than
//! borrowed: the store's data must be `'static`.

use std::any::Any;

use crate::abi::Pair;

/// A request or response head in the proxy's own form.
pub trait Head: Any + Send {
    /// The head as filters see it: pseudo-fields first, then the fields, names in lower case.
    fn pairs(&self) -> Vec<Pair>;
    /// How many pairs `pairs` gives (the callback's argument), without building them.
    fn count(&self) -> usize;
    /// A pseudo-field's value (`:path` for the property `request.path`, `:status` for
    /// `response.code`), without building the pairs when the head has it directly.
    fn pseudo(&self, name: &[u8]) -> Option<Vec<u8>> {
        self.pairs()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// The header map of one phase: the lent head, and its pairs once a filter read or changed
/// them. Empty (no head, no pairs) outside a header phase.
#[derive(Default)]
pub struct HeadPairs {
    lent: Option<Box<dyn Head>>,
    pairs: Option<Vec<Pair>>,
}

impl HeadPairs {
    /// Lends `head` to the filters of one phase.
    pub fn lend<H: Head>(head: H) -> HeadPairs {
        HeadPairs {
            lent: Some(Box::new(head)),
            pairs: None,
        }
    }

    /// Pairs already built (a head the proxy holds as pairs): nothing is lent.
    pub fn from_pairs(pairs: Vec<Pair>) -> HeadPairs {
        HeadPairs {
            lent: None,
            pairs: Some(pairs),
        }
    }

    /// The number of pairs the filters see.
    pub fn len(&self) -> usize {
        match (&self.pairs, &self.lent) {
            (Some(p), _) => p.len(),
            (None, Some(h)) => h.count(),
            (None, None) => 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pairs, built from the lent head on first use.
    pub fn pairs_mut(&mut self) -> &mut Vec<Pair> {
        let lent = &self.lent;
        self.pairs
            .get_or_insert_with(|| lent.as_ref().map(|h| h.pairs()).unwrap_or_default())
    }

    /// A pseudo-field's value, from the pairs when built (a filter may have changed them),
    /// else from the head.
    pub fn pseudo(&self, name: &[u8]) -> Option<Vec<u8>> {
        match (&self.pairs, &self.lent) {
            (Some(p), _) => p.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()),
            (None, Some(h)) => h.pseudo(name),
            (None, None) => None,
        }
    }

    /// The lent head back, with the pairs when a filter built them; `None` when no head of
    /// type `H` was lent.
    pub fn take_back<H: Head>(self) -> Option<(H, Option<Vec<Pair>>)> {
        let lent: Box<dyn Any> = self.lent?;
        let head = lent.downcast::<H>().ok()?;
        Some((*head, self.pairs))
    }
}

/// The request's pseudo-fields as the filters left them, kept for the properties of the later
/// phases (`request.path` and the like in a body, response or log callback, as Envoy has
/// them): the request head itself is the proxy's again by then. One buffer, two allocations
/// per request.
#[derive(Debug)]
pub struct RequestLine {
    text: Vec<u8>,
    /// Where `:method`, `:scheme`, `:authority` and `:path` end in `text`.
    ends: [usize; 4],
    has_authority: bool,
}

impl RequestLine {
    pub fn new(method: &[u8], scheme: &[u8], authority: Option<&[u8]>, path: &[u8]) -> RequestLine {
        let authority_bytes = authority.unwrap_or_default();
        let mut text =
            Vec::with_capacity(method.len() + scheme.len() + authority_bytes.len() + path.len());
        let mut ends = [0; 4];
        for (i, part) in [method, scheme, authority_bytes, path]
            .into_iter()
            .enumerate()
        {
            text.extend_from_slice(part);
            ends[i] = text.len();
        }
        RequestLine {
            text,
            ends,
            has_authority: authority.is_some(),
        }
    }

    /// A pseudo-field by its name (`:method`, `:scheme`, `:authority`, `:path`).
    pub fn get(&self, name: &[u8]) -> Option<&[u8]> {
        let i = match name {
            b":method" => 0,
            b":scheme" => 1,
            b":authority" if self.has_authority => 2,
            b":path" => 3,
            _ => return None,
        };
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        self.text.get(start..self.ends[i])
    }
}
