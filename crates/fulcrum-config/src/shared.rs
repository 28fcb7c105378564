//! The part of a configuration file two nodes of a pair share (`[ha] config_sync`), and the
//! part that is each node's own: `[admin]`, `[ha]`, `[bgp]` and `[global]` never travel.
//!
//! The split works on the text, section by section, not on a parsed document: what travels is
//! the operator's own text (comments, order, formatting), and a node that takes it writes it
//! back byte for byte, so both files say the same and `fulcrum check` answers the same on both.
//! A section is a table header (`[name]`, `[[name]]`, `[name.sub]`) with the comment lines
//! directly above it and everything up to the next section. The result is verified by parsing
//! (a header-like line inside a multi-line string would otherwise fool the split).

/// Top-level tables that stay on their node.
pub const NODE_LOCAL: [&str; 4] = ["admin", "ha", "bgp", "global"];

/// A file cut into sections; the first may have no header (keys and comments before it).
struct Sections<'a> {
    parts: Vec<(Option<String>, &'a str)>,
}

/// The top-level name of a header line: `[[pool.member]]` → `pool`.
fn header_root(line: &str) -> Option<String> {
    let t = line.trim();
    let inner = t
        .strip_prefix("[[")
        .and_then(|r| r.split_once("]]"))
        .or_else(|| t.strip_prefix('[').and_then(|r| r.split_once(']')))
        .map(|(name, _)| name)?;
    let first = inner.split('.').next()?.trim();
    let first = first.trim_matches(|c| c == '"' || c == '\'');
    (!first.is_empty()).then(|| first.to_string())
}

fn cut(text: &str) -> Sections<'_> {
    // Byte offsets of line starts.
    let mut starts = vec![0];
    starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
    starts.retain(|&s| s < text.len());
    let line = |k: usize| -> &str {
        let end = starts.get(k + 1).copied().unwrap_or(text.len());
        &text[starts[k]..end]
    };
    let mut cuts: Vec<(usize, String)> = Vec::new();
    for k in 0..starts.len() {
        let Some(root) = header_root(line(k)) else {
            continue;
        };
        // The comment lines directly above a header belong to its section.
        let mut first = k;
        while first > 0 && line(first - 1).trim_start().starts_with('#') {
            first -= 1;
        }
        if cuts.last().is_some_and(|(at, _)| *at >= starts[first]) {
            cuts.push((starts[k], root));
        } else {
            cuts.push((starts[first], root));
        }
    }
    let mut parts = Vec::new();
    let head_end = cuts.first().map_or(text.len(), |(at, _)| *at);
    if head_end > 0 {
        parts.push((None, &text[..head_end]));
    }
    for (i, (at, root)) in cuts.iter().enumerate() {
        let end = cuts.get(i + 1).map_or(text.len(), |(next, _)| *next);
        parts.push((Some(root.clone()), &text[*at..end]));
    }
    Sections { parts }
}

fn is_local(root: &Option<String>) -> bool {
    root.as_deref().is_some_and(|r| NODE_LOCAL.contains(&r))
}

/// The top-level keys of `text` as TOML; an error when it does not parse.
fn roots(text: &str) -> Result<Vec<String>, String> {
    let doc = toml_edit::Document::parse(text).map_err(|e| format!("{e}"))?;
    Ok(doc.iter().map(|(k, _)| k.to_string()).collect())
}

/// The shared part of a configuration file's text: every section but the node-local ones (the
/// text before the first header, comments or keys outside any table, travels with it).
pub fn shared_part(text: &str) -> Result<String, String> {
    let sections = cut(text);
    let mut out = String::new();
    for (root, body) in &sections.parts {
        if !is_local(root) {
            out.push_str(body);
        }
    }
    let keys = roots(&out).map_err(|e| format!("the shared part does not parse: {e}"))?;
    if let Some(k) = keys.iter().find(|k| NODE_LOCAL.contains(&k.as_str())) {
        return Err(format!(
            "[{k}] is written in a form the pair cannot split (keep it as a [{k}] table)"
        ));
    }
    Ok(out)
}

/// This node's file with its shared part replaced by `shared` (a peer's): the node-local
/// sections stay as they are, where they are; the shared text goes where this file's first
/// shared section was (or at the end).
pub fn with_shared(local_file: &str, shared: &str) -> Result<String, String> {
    let keys =
        roots(shared).map_err(|e| format!("the peer's configuration does not parse: {e}"))?;
    if let Some(k) = keys.iter().find(|k| NODE_LOCAL.contains(&k.as_str())) {
        return Err(format!("the peer's shared configuration carries [{k}]"));
    }
    let sections = cut(local_file);
    let mut out = String::new();
    let mut placed = false;
    for (root, body) in &sections.parts {
        if is_local(root) {
            out.push_str(body);
            if !body.ends_with('\n') {
                out.push('\n');
            }
        } else if !placed {
            out.push_str(shared);
            placed = true;
        }
    }
    if !placed {
        out.push_str(shared);
    }
    Ok(out)
}

/// A digest of shared text (FNV-1a, 64 bits): tells two versions apart; the sync channel's
/// HMAC, not this, is what protects them.
pub fn digest(shared: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in shared.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE_A: &str = r#"# node a of the pair
[global]
workers = 2

# the admin API of this node
[admin]
listen = "127.0.0.1:9000"

[ha]
node = "a"
priority = 200

# web pool: owned by the web team
[[pool]]
name = "web"
[[pool.member]]
address = "10.0.0.1:80"   # first

[[virtual_service]]
name = "site"
listen = ["0.0.0.0:80"]
pool = "web"

[bgp]
asn = 65001
"#;

    #[test]
    fn the_shared_part_keeps_the_operators_text_and_leaves_node_sections() {
        let shared = shared_part(NODE_A).unwrap();
        assert!(shared.starts_with("# web pool: owned by the web team\n[[pool]]"));
        assert!(shared.contains("address = \"10.0.0.1:80\"   # first"));
        assert!(shared.contains("[[virtual_service]]"));
        for local in [
            "[admin]",
            "[ha]",
            "[bgp]",
            "[global]",
            "node a of the pair",
            "admin API",
        ] {
            assert!(!shared.contains(local), "{local} travelled:\n{shared}");
        }
    }

    #[test]
    fn taking_a_peers_shared_part_keeps_this_nodes_own_sections() {
        let node_b = NODE_A
            .replace("node = \"a\"", "node = \"b\"")
            .replace("priority = 200", "priority = 100")
            .replace("10.0.0.1:80", "10.0.0.9:80");
        let from_a = shared_part(NODE_A).unwrap();
        let merged = with_shared(&node_b, &from_a).unwrap();
        assert!(merged.contains("node = \"b\"") && merged.contains("priority = 100"));
        assert!(merged.contains("10.0.0.1:80") && !merged.contains("10.0.0.9:80"));
        assert!(
            merged.contains("# node a of the pair"),
            "the header comment stays"
        );
        // Both files now share the same text: the same digest on both nodes.
        assert_eq!(shared_part(&merged).unwrap(), from_a);
        assert_eq!(digest(&shared_part(&merged).unwrap()), digest(&from_a));
        assert!(roots(&merged).is_ok());
    }

    #[test]
    fn forms_the_split_cannot_see_are_refused() {
        // A dotted key at the top level puts [ha] keys outside an [ha] section.
        let dotted = "ha.priority = 3\n[[pool]]\nname = \"p\"\n";
        assert!(shared_part(dotted).is_err());
        assert!(with_shared(NODE_A, "[admin]\nlisten = \"x\"\n").is_err());
        assert!(with_shared(NODE_A, "[[pool]\n").is_err());
        // A header-looking line inside a multi-line string does not cut a section.
        let tricky = "[[pool]]\nname = \"\"\"\n[ha]\n\"\"\"\n";
        assert!(shared_part(tricky).is_err());
    }
}
