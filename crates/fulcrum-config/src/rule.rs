//! Content-switching rules of http / https services (`[[virtual_service.rule]]`): the
//! conditions a request must all match, exactly one action, and the header edits and path
//! rewrite that go with it.

use ipnet::IpNet;

use crate::reader::{Cx, FromNode, Node, TableReader};
use crate::types::{read_table, KeyValues, OneOrMany};

/// One L7 content-switching rule: conditions (all must match) and exactly one action.
#[derive(Debug, Clone, Default)]
pub struct Rule {
    pub name: Option<String>,
    pub host: Option<String>,
    pub path: Option<String>,
    pub path_prefix: Option<String>,
    pub path_regex: Option<String>,
    pub method: Vec<String>,
    pub header: KeyValues<String>,
    pub cookie: KeyValues<String>,
    pub query: KeyValues<String>,
    pub user_agent: Option<String>,
    pub source: Vec<IpNet>,
    pub action: RuleAction,
    pub request_headers: Option<HeaderEdits>,
    pub response_headers: Option<HeaderEdits>,
    pub rewrite_path: Option<Rewrite>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RuleAction {
    Pool(String),
    Redirect {
        location: String,
        status: u16,
    },
    Respond {
        status: u16,
        body: String,
    },
    #[default]
    Drop,
}

impl FromNode for Rule {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let mut rule = Rule {
                name: t.opt(cx, "name"),
                host: t.opt(cx, "host"),
                path: t.opt(cx, "path"),
                path_prefix: t.opt(cx, "path_prefix"),
                path_regex: t.opt(cx, "path_regex"),
                method: t
                    .opt::<OneOrMany<String>>(cx, "method")
                    .map(|m| m.0)
                    .unwrap_or_default(),
                header: t.opt(cx, "header").unwrap_or_default(),
                cookie: t.opt(cx, "cookie").unwrap_or_default(),
                query: t.opt(cx, "query").unwrap_or_default(),
                user_agent: t.opt(cx, "user_agent"),
                source: t
                    .opt::<OneOrMany<IpNet>>(cx, "source")
                    .map(|m| m.0)
                    .unwrap_or_default(),
                request_headers: t.opt(cx, "request_headers"),
                response_headers: t.opt(cx, "response_headers"),
                rewrite_path: t.opt(cx, "rewrite_path"),
                ..Rule::default()
            };
            let paths = [&rule.path, &rule.path_prefix, &rule.path_regex];
            if paths.iter().filter(|p| p.is_some()).count() > 1 {
                cx.error_at(
                    node.span.clone(),
                    t.path(),
                    "use only one of `path`, `path_prefix` and `path_regex` in a rule",
                );
            }
            rule.action = read_rule_action(t, cx, node)?;
            Some(rule)
        })
    }
}

fn read_rule_action(
    t: &mut TableReader<'_>,
    cx: &mut Cx<'_>,
    node: &Node<'_>,
) -> Option<RuleAction> {
    let pool: Option<String> = t.opt(cx, "pool");
    let redirect: Option<String> = t.opt(cx, "redirect");
    let redirect_status: Option<u16> = t.opt(cx, "redirect_status");
    let respond: Option<u16> = t.opt(cx, "respond");
    let body: Option<String> = t.opt(cx, "body");
    let drop: Option<bool> = t.opt(cx, "drop");
    let count = [
        pool.is_some(),
        redirect.is_some(),
        respond.is_some(),
        drop == Some(true),
    ]
    .iter()
    .filter(|b| **b)
    .count();
    if count != 1 {
        cx.error_at(
            node.span.clone(),
            t.path(),
            format!(
                "a rule needs exactly one action (`pool`, `redirect`, `respond` or `drop = true`); found {count}"
            ),
        );
        return None;
    }
    if redirect_status.is_some() && redirect.is_none() {
        cx.error_at(
            node.span.clone(),
            t.path(),
            "`redirect_status` needs `redirect`",
        );
    }
    if body.is_some() && respond.is_none() {
        cx.error_at(node.span.clone(), t.path(), "`body` needs `respond`");
    }
    if let Some(p) = pool {
        return Some(RuleAction::Pool(p));
    }
    if let Some(location) = redirect {
        let status = redirect_status.unwrap_or(302);
        if ![301, 302, 303, 307, 308].contains(&status) {
            cx.error_at(
                node.span.clone(),
                &format!("{}.redirect_status", t.path()),
                format!("{status} is not a redirect status; expected 301, 302, 303, 307 or 308"),
            );
            return None;
        }
        return Some(RuleAction::Redirect { location, status });
    }
    if let Some(status) = respond {
        if !(200..=599).contains(&status) {
            cx.error_at(
                node.span.clone(),
                &format!("{}.respond", t.path()),
                format!("{status} is not an HTTP status from 200 to 599"),
            );
            return None;
        }
        return Some(RuleAction::Respond {
            status,
            body: body.unwrap_or_default(),
        });
    }
    Some(RuleAction::Drop)
}

#[derive(Debug, Clone, Default)]
pub struct HeaderEdits {
    pub set: KeyValues<String>,
    pub add: KeyValues<String>,
    pub remove: Vec<String>,
}

impl FromNode for HeaderEdits {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            Some(HeaderEdits {
                set: t.opt(cx, "set").unwrap_or_default(),
                add: t.opt(cx, "add").unwrap_or_default(),
                remove: t.opt(cx, "remove").unwrap_or_default(),
            })
        })
    }
}

#[derive(Debug, Clone)]
pub struct Rewrite {
    pub regex: String,
    pub replace: String,
}

impl FromNode for Rewrite {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self> {
        read_table(node, cx, |t, cx| {
            let regex = t.req(cx, "regex");
            let replace = t.req(cx, "replace");
            Some(Rewrite {
                regex: regex?,
                replace: replace?,
            })
        })
    }
}
