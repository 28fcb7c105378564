//! A small schema walker over a span-preserving TOML tree.
//!
//! serde stops at the first error and loses the position of values it has already consumed; an
//! operator fixing a config wants every problem at once, each with file:line:col and the key path.
//! So the typed config is read by hand-written `FromNode` impls that record errors and keep going.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use toml_edit::{Item, Table, Value};

use crate::error::{did_you_mean, ConfigError};

/// Collects errors and the source position of every key that was read.
pub struct Cx<'s> {
    file: String,
    line_starts: Vec<usize>,
    src: &'s str,
    pub(crate) errors: Vec<ConfigError>,
    pub(crate) locations: Locations,
    /// Arrays (by key path, such as `pool`) with an element that could not be read at all.
    pub(crate) failed: HashSet<String>,
}

/// Where each key path of a parsed config stands in its file, for errors found after parsing.
#[derive(Debug, Clone, Default)]
pub struct Locations {
    pub file: String,
    map: HashMap<String, (usize, usize)>,
}

impl Locations {
    /// The position of `path`, or of its closest located ancestor.
    pub fn get(&self, path: &str) -> (usize, usize) {
        let mut p = path;
        loop {
            if let Some(&loc) = self.map.get(p) {
                return loc;
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                None => return (0, 0),
            }
        }
    }

    /// Whether the key was written in the file (as opposed to taking its default).
    pub fn contains(&self, path: &str) -> bool {
        self.map.contains_key(path)
    }

    pub fn error(&self, path: &str, message: impl Into<String>) -> ConfigError {
        let (line, column) = self.get(path);
        ConfigError {
            file: self.file.clone(),
            line,
            column,
            key: path.to_string(),
            message: message.into(),
        }
    }
}

impl<'s> Cx<'s> {
    pub fn new(file: &str, src: &'s str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        Cx {
            file: file.to_string(),
            line_starts,
            src,
            errors: Vec::new(),
            locations: Locations {
                file: file.to_string(),
                map: HashMap::new(),
            },
            failed: HashSet::new(),
        }
    }

    pub fn position(&self, offset: usize) -> (usize, usize) {
        let line = self.line_starts.partition_point(|&s| s <= offset).max(1);
        let start = self.line_starts[line - 1];
        let column = self
            .src
            .get(start..offset)
            .map_or(1, |s| s.chars().count() + 1);
        (line, column)
    }

    pub fn error_at(&mut self, span: Option<Range<usize>>, key: &str, message: impl Into<String>) {
        let (line, column) = span.map_or((0, 0), |s| self.position(s.start));
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line,
            column,
            key: key.to_string(),
            message: message.into(),
        });
    }

    pub fn error(&mut self, node: &Node<'_>, message: impl Into<String>) {
        self.error_at(node.span.clone(), &node.path, message);
    }

    /// An error at a key path read earlier, placed where that key (or its closest read
    /// ancestor) stands: for the checks a section runs once its keys are read.
    pub fn error_path(&mut self, path: &str, message: impl Into<String>) {
        let e = self.locations.error(path, message);
        self.errors.push(e);
    }

    /// Whether the key path was written in the file (and read so far).
    pub fn written(&self, path: &str) -> bool {
        self.locations.contains(path)
    }

    fn locate(&mut self, node: &Node<'_>) {
        if let Some(span) = &node.span {
            let pos = self.position(span.start);
            self.locations.map.insert(node.path.clone(), pos);
        }
    }
}

#[derive(Clone, Copy)]
enum Raw<'a> {
    Item(&'a Item),
    Value(&'a Value),
    Table(&'a Table),
}

/// One value of the document with its key path and source span.
#[derive(Clone)]
pub struct Node<'a> {
    raw: Raw<'a>,
    pub path: String,
    pub span: Option<Range<usize>>,
}

/// The shape of a node, for impls to match on.
pub enum Shape<'a> {
    Str(&'a str),
    Int(i64),
    Float(f64),
    Bool(bool),
    Other(&'static str),
    Array(Vec<Node<'a>>),
    Table(Vec<(&'a str, Node<'a>)>),
}

impl<'a> Node<'a> {
    /// The document's root table; errors on it point at the start of the file.
    pub fn root(table: &'a Table) -> Node<'a> {
        Node {
            raw: Raw::Table(table),
            path: String::new(),
            span: Some(0..0),
        }
    }

    fn child(
        &self,
        seg: &str,
        index: bool,
        raw: Raw<'a>,
        key_span: Option<Range<usize>>,
    ) -> Node<'a> {
        let path = if index {
            format!("{}[{}]", self.path, seg)
        } else if self.path.is_empty() {
            seg.to_string()
        } else {
            format!("{}.{}", self.path, seg)
        };
        let own = match raw {
            Raw::Item(Item::Value(v)) | Raw::Value(v) => v.span(),
            Raw::Item(i) => i.span(),
            Raw::Table(t) => t.span(),
        };
        Node {
            raw,
            path,
            span: key_span.or(own).or_else(|| self.span.clone()),
        }
    }

    pub fn type_name(&self) -> &'static str {
        match self.shape() {
            Shape::Str(_) => "a string",
            Shape::Int(_) => "an integer",
            Shape::Float(_) => "a float",
            Shape::Bool(_) => "a boolean",
            Shape::Other(n) => n,
            Shape::Array(_) => "an array",
            Shape::Table(_) => "a table",
        }
    }

    fn table_shape(&self, t: &'a Table) -> Shape<'a> {
        Shape::Table(
            t.iter()
                .map(|(k, item)| {
                    let ks = t.key(k).and_then(|k| k.span());
                    (k, self.child(k, false, Raw::Item(item), ks))
                })
                .collect(),
        )
    }

    pub fn shape(&self) -> Shape<'a> {
        let value = match self.raw {
            Raw::Item(Item::Value(v)) | Raw::Value(v) => v,
            Raw::Table(t) | Raw::Item(Item::Table(t)) => return self.table_shape(t),
            Raw::Item(Item::ArrayOfTables(a)) => {
                return Shape::Array(
                    a.iter()
                        .enumerate()
                        .map(|(i, t)| self.child(&i.to_string(), true, Raw::Table(t), t.span()))
                        .collect(),
                )
            }
            Raw::Item(Item::None) => return Shape::Other("nothing"),
        };
        match value {
            Value::String(s) => Shape::Str(s.value()),
            Value::Integer(i) => Shape::Int(*i.value()),
            Value::Float(f) => Shape::Float(*f.value()),
            Value::Boolean(b) => Shape::Bool(*b.value()),
            Value::Datetime(_) => Shape::Other("a date-time"),
            Value::Array(a) => Shape::Array(
                a.iter()
                    .enumerate()
                    .map(|(i, v)| self.child(&i.to_string(), true, Raw::Value(v), None))
                    .collect(),
            ),
            Value::InlineTable(t) => Shape::Table(
                t.iter()
                    .map(|(k, v)| {
                        let ks = t.key(k).and_then(|k| k.span());
                        (k, self.child(k, false, Raw::Value(v), ks))
                    })
                    .collect(),
            ),
        }
    }
}

/// Reads a value of a config type from a node, recording errors in `cx`; `None` when it failed.
pub trait FromNode: Sized {
    fn from_node(node: &Node<'_>, cx: &mut Cx<'_>) -> Option<Self>;
}

/// Reads the keys of one table and reports every key that nobody asked for.
pub struct TableReader<'a> {
    node: Node<'a>,
    entries: Vec<(&'a str, Node<'a>)>,
    asked: Vec<&'static str>,
}

impl<'a> TableReader<'a> {
    pub fn new(node: &Node<'a>, cx: &mut Cx<'_>) -> Option<Self> {
        match node.shape() {
            Shape::Table(entries) => {
                cx.locate(node);
                Some(TableReader {
                    node: node.clone(),
                    entries,
                    asked: Vec::new(),
                })
            }
            _ => {
                cx.error(
                    node,
                    format!("expected a table, found {}", node.type_name()),
                );
                None
            }
        }
    }

    pub fn path(&self) -> &str {
        &self.node.path
    }

    pub fn has(&self, key: &str) -> bool {
        self.entries.iter().any(|(k, _)| *k == key)
    }

    /// Whether a reader asked for the key (read it, or declared it known).
    pub fn asked(&self, key: &str) -> bool {
        self.asked.contains(&key)
    }

    /// Declares a key known without reading it, so that `finish` does not call it unknown and
    /// suggests it for near misses (e.g. the keys of a variant that failed to read).
    pub fn known(&mut self, key: &'static str) {
        self.asked.push(key);
    }

    /// Refuses a key that belongs to another variant of the table (e.g. a key of another
    /// protocol in a virtual service): the error stands at the key, and `finish` leaves it be.
    /// Returns the key's value, for checks that hold whatever the variant.
    pub fn reject(
        &mut self,
        cx: &mut Cx<'_>,
        key: &'static str,
        message: impl Into<String>,
    ) -> Option<Node<'a>> {
        let node = self.node(key)?;
        cx.locate(&node);
        cx.error(&node, message);
        Some(node)
    }

    /// The raw node of a key, for values whose type depends on their shape.
    pub fn node(&mut self, key: &'static str) -> Option<Node<'a>> {
        self.asked.push(key);
        self.entries
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, n)| n.clone())
    }

    pub fn opt<T: FromNode>(&mut self, cx: &mut Cx<'_>, key: &'static str) -> Option<T> {
        let node = self.node(key)?;
        cx.locate(&node);
        T::from_node(&node, cx)
    }

    pub fn req<T: FromNode>(&mut self, cx: &mut Cx<'_>, key: &'static str) -> Option<T> {
        if !self.has(key) {
            self.asked.push(key);
            let at = self.node.span.clone();
            cx.error_at(at, &self.node.path, format!("missing required key `{key}`"));
            return None;
        }
        self.opt(cx, key)
    }

    /// Reports keys that were never asked for, with a suggestion when one is close.
    pub fn finish(self, cx: &mut Cx<'_>) {
        for (key, node) in &self.entries {
            if self.asked.contains(key) {
                continue;
            }
            let hint = match did_you_mean(key, self.asked.iter().copied()) {
                Some(s) => format!(" (did you mean `{s}`?)"),
                None => {
                    let mut known = self.asked.clone();
                    known.sort_unstable();
                    known.dedup();
                    format!("; known keys here: {}", known.join(", "))
                }
            };
            cx.error(node, format!("unknown key `{key}`{hint}"));
        }
    }
}
