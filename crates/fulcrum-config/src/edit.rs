//! Changes to a configuration file's text that keep what the operator wrote (comments, order,
//! formatting) everywhere the change does not reach: the configuration API's object writes
//! (`/api/v1/config/pools/{name}`, …) and whole-configuration writes in JSON.
//!
//! Objects are the named tables of the file: `[[virtual_service]]`, `[[pool]]`, `[[monitor]]`
//! by `name`, and a pool's `[[pool.member]]` by `address`. An object is read and written as
//! JSON with the file's own keys. A write changes only the keys whose value differs, so the
//! comments on the others stay.

use serde_json::{Map, Value as Json};
use toml_edit::{ArrayOfTables, DocumentMut, InlineTable, Item, Table, Value};

/// The named objects the API edits: the path segment and the file's array of tables.
pub const KINDS: [(&str, &str); 3] = [
    ("virtual_services", "virtual_service"),
    ("pools", "pool"),
    ("monitors", "monitor"),
];

/// Keys whose arrays of objects the file writes as arrays of tables (`[[pool.member]]`)
/// rather than inline.
const TABLE_ARRAYS: [&str; 3] = ["member", "rule", "filter"];

/// Which key names an element of an array of tables: `address` for members, else `name`.
fn identity(key: &str) -> &'static str {
    if key == "member" {
        "address"
    } else {
        "name"
    }
}

pub fn parse(text: &str) -> Result<DocumentMut, String> {
    text.parse::<DocumentMut>().map_err(|e| e.to_string())
}

/// The array-of-tables key of an API kind (`pools` → `pool`).
pub fn table_key(kind: &str) -> Option<&'static str> {
    KINDS.iter().find(|(k, _)| *k == kind).map(|(_, t)| *t)
}

// ---- TOML → JSON -------------------------------------------------------------------------

fn value_json(v: &Value) -> Json {
    match v {
        Value::String(s) => Json::String(s.value().clone()),
        Value::Integer(i) => Json::from(*i.value()),
        Value::Float(f) => {
            serde_json::Number::from_f64(*f.value()).map_or(Json::Null, Json::Number)
        }
        Value::Boolean(b) => Json::Bool(*b.value()),
        Value::Datetime(d) => Json::String(d.value().to_string()),
        Value::Array(a) => Json::Array(a.iter().map(value_json).collect()),
        Value::InlineTable(t) => Json::Object(
            t.iter()
                .map(|(k, v)| (k.to_string(), value_json(v)))
                .collect(),
        ),
    }
}

pub fn item_json(item: &Item) -> Json {
    match item {
        Item::None => Json::Null,
        Item::Value(v) => value_json(v),
        Item::Table(t) => table_json(t),
        Item::ArrayOfTables(a) => Json::Array(a.iter().map(table_json).collect()),
    }
}

pub fn table_json(t: &Table) -> Json {
    Json::Object(
        t.iter()
            .map(|(k, v)| (k.to_string(), item_json(v)))
            .collect(),
    )
}

/// The whole document as JSON.
pub fn document_json(doc: &DocumentMut) -> Json {
    table_json(doc.as_table())
}

// ---- JSON → TOML -------------------------------------------------------------------------

fn json_value(j: &Json) -> Result<Value, String> {
    Ok(match j {
        Json::Null => return Err("null is not a TOML value (leave the key out)".into()),
        Json::Bool(b) => Value::from(*b),
        Json::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Value::from(i),
            (None, Some(f)) => Value::from(f),
            _ => return Err(format!("{n} is out of range")),
        },
        Json::String(s) => Value::from(s.as_str()),
        Json::Array(a) => {
            let mut arr = toml_edit::Array::new();
            for v in a {
                arr.push(json_value(v)?);
            }
            Value::Array(arr)
        }
        Json::Object(o) => {
            let mut t = InlineTable::new();
            for (k, v) in o {
                t.insert(k, json_value(v)?);
            }
            Value::InlineTable(t)
        }
    })
}

fn is_table_array(key: &str, j: &Json, existing: Option<&Item>) -> bool {
    let objects = j
        .as_array()
        .is_some_and(|a| !a.is_empty() && a.iter().all(Json::is_object));
    objects && (matches!(existing, Some(Item::ArrayOfTables(_))) || TABLE_ARRAYS.contains(&key))
}

/// Makes `table` say what `json` says, touching only the keys whose value differs (their
/// comments and the others' stay). Arrays of tables are matched element by element on their
/// identity key, so a changed member leaves its neighbours' text alone.
pub fn update_table(table: &mut Table, json: &Map<String, Json>) -> Result<(), String> {
    update(table, json, false)
}

/// `root`: `table` is the document, where a new object is a `[section]`, not an inline table.
fn update(table: &mut Table, json: &Map<String, Json>, root: bool) -> Result<(), String> {
    let stale: Vec<String> = table
        .iter()
        .map(|(k, _)| k.to_string())
        .filter(|k| !json.contains_key(k))
        .collect();
    for k in stale {
        table.remove(&k);
    }
    for (key, j) in json {
        let existing = table.get(key);
        if existing.is_some_and(|item| item_json(item) == *j) {
            continue;
        }
        let is_new = existing.is_none();
        let is_section = matches!(existing, Some(Item::Table(_)));
        if is_table_array(key, j, existing) {
            let wanted = j.as_array().map(Vec::as_slice).unwrap_or_default();
            let id = identity(key);
            let mut old: Vec<Table> = match table.remove(key) {
                Some(Item::ArrayOfTables(a)) => a.into_iter().collect(),
                _ => Vec::new(),
            };
            let mut aot = ArrayOfTables::new();
            for w in wanted {
                let obj = w.as_object().ok_or("expected an object")?;
                let pos = old
                    .iter()
                    .position(|t| t.get(id).map(item_json).as_ref() == obj.get(id));
                let mut t = match pos {
                    Some(p) => old.remove(p),
                    None => Table::new(),
                };
                update_table(&mut t, obj).map_err(|e| format!("{key}: {e}"))?;
                aot.push(t);
            }
            table.insert(key, Item::ArrayOfTables(aot));
        } else if let (true, Json::Object(o)) = (is_section, j) {
            if let Some(Item::Table(t)) = table.get_mut(key) {
                update_table(t, o).map_err(|e| format!("{key}: {e}"))?;
            }
        } else if let (true, Json::Object(o), true) = (is_new, j, root) {
            // A new section (`[global]` in a whole-file write) is a table, not an inline one.
            let mut t = Table::new();
            update_table(&mut t, o).map_err(|e| format!("{key}: {e}"))?;
            table.insert(key, Item::Table(t));
        } else {
            let v = json_value(j).map_err(|e| format!("{key}: {e}"))?;
            match table.get_mut(key).and_then(Item::as_value_mut) {
                // Keeps the key's place and its comment.
                Some(old) => {
                    let decor = old.decor().clone();
                    *old = v;
                    *old.decor_mut() = decor;
                }
                None => {
                    table.insert(key, Item::Value(v));
                }
            }
        }
    }
    Ok(())
}

/// A whole configuration written as JSON: the current text changed only where the JSON
/// differs.
pub fn apply_json(text: &str, json: &Json) -> Result<String, String> {
    let obj = json.as_object().ok_or("expected a JSON object")?;
    let mut doc = parse(text)?;
    update(doc.as_table_mut(), obj, true)?;
    Ok(doc.to_string())
}

// ---- objects -----------------------------------------------------------------------------

fn find<'a>(aot: &'a ArrayOfTables, id: &str, value: &str) -> Option<&'a Table> {
    aot.iter()
        .find(|t| t.get(id).and_then(Item::as_str) == Some(value))
}

/// `GET /api/v1/config/{kind}/{name}`: the object, or `None`.
pub fn get_object(text: &str, kind: &str, name: &str) -> Result<Option<Json>, String> {
    let key = table_key(kind).ok_or("no such kind of object")?;
    let doc = parse(text)?;
    Ok(doc
        .get(key)
        .and_then(Item::as_array_of_tables)
        .and_then(|a| find(a, "name", name))
        .map(table_json))
}

/// `PUT`: creates or replaces the object (its `name` is the path's); `DELETE` (`json` None):
/// removes it. Returns the new text and whether the object existed.
pub fn put_object(
    text: &str,
    kind: &str,
    name: &str,
    json: Option<&Json>,
) -> Result<(String, bool), String> {
    let key = table_key(kind).ok_or("no such kind of object")?;
    let mut doc = parse(text)?;
    let mut wanted = match json {
        Some(j) => Some(j.as_object().ok_or("expected a JSON object")?.clone()),
        None => None,
    };
    if let Some(w) = &mut wanted {
        match w.get("name") {
            Some(n) if n.as_str() != Some(name) => {
                return Err(format!(
                    "name: {n} differs from the name in the path ({name:?})"
                ));
            }
            _ => {}
        }
        w.insert("name".into(), Json::String(name.into()));
    }
    let existed = edit_array(doc.as_table_mut(), key, "name", name, wanted.as_ref())?;
    Ok((doc.to_string(), existed))
}

/// A pool member by address: `GET` (json None and `get`), `PUT`, `DELETE`.
pub fn get_member(text: &str, pool: &str, address: &str) -> Result<Option<Json>, String> {
    let doc = parse(text)?;
    Ok(doc
        .get("pool")
        .and_then(Item::as_array_of_tables)
        .and_then(|a| find(a, "name", pool))
        .and_then(|p| p.get("member"))
        .and_then(Item::as_array_of_tables)
        .and_then(|m| find(m, "address", address))
        .map(table_json))
}

pub fn put_member(
    text: &str,
    pool: &str,
    address: &str,
    json: Option<&Json>,
) -> Result<(String, bool), String> {
    let mut doc = parse(text)?;
    let pool_table = doc
        .get_mut("pool")
        .and_then(Item::as_array_of_tables_mut)
        .and_then(|a| {
            a.iter_mut()
                .find(|t| t.get("name").and_then(Item::as_str) == Some(pool))
        })
        .ok_or_else(|| format!("no pool named {pool:?}"))?;
    let mut wanted = match json {
        Some(j) => Some(j.as_object().ok_or("expected a JSON object")?.clone()),
        None => None,
    };
    if let Some(w) = &mut wanted {
        match w.get("address") {
            Some(a) if a.as_str() != Some(address) => {
                return Err(format!(
                    "address: {a} differs from the address in the path ({address:?})"
                ));
            }
            _ => {}
        }
        w.insert("address".into(), Json::String(address.into()));
    }
    let existed = edit_array(pool_table, "member", "address", address, wanted.as_ref())?;
    Ok((doc.to_string(), existed))
}

/// In `table`'s array of tables `key`, the element whose `id` is `value`: updated to
/// `wanted`, appended when new, removed when `wanted` is None. Whether it existed.
fn edit_array(
    table: &mut Table,
    key: &str,
    id: &str,
    value: &str,
    wanted: Option<&Map<String, Json>>,
) -> Result<bool, String> {
    if table.get(key).is_some_and(|i| !i.is_array_of_tables()) {
        return Err(format!(
            "`{key}` is written inline in the file; the API edits [[{key}]] tables only"
        ));
    }
    let aot = table
        .entry(key)
        .or_insert(Item::ArrayOfTables(ArrayOfTables::new()))
        .as_array_of_tables_mut()
        .ok_or_else(|| format!("`{key}` is not an array of tables"))?;
    let pos = aot
        .iter()
        .position(|t| t.get(id).and_then(Item::as_str) == Some(value));
    match (pos, wanted) {
        (Some(p), Some(w)) => {
            let t = aot.get_mut(p).ok_or("lost the object")?;
            update_table(t, w)?;
            Ok(true)
        }
        (None, Some(w)) => {
            let mut t = Table::new();
            update_table(&mut t, w)?;
            aot.push(t);
            Ok(false)
        }
        (Some(p), None) => {
            aot.remove(p);
            if aot.is_empty() {
                table.remove(key);
            }
            Ok(true)
        }
        (None, None) => Ok(false),
    }
}

// ---- what changed ------------------------------------------------------------------------

/// What differs between two versions of a file, by object: `pool "web" changed`,
/// `virtual_service "api" added`, `[global] changed`.
pub fn changes(old: &str, new: &str) -> Vec<String> {
    let (Ok(a), Ok(b)) = (parse(old), parse(new)) else {
        return vec!["the file".into()];
    };
    let mut out = Vec::new();
    let keys: Vec<String> = {
        let mut k: Vec<String> = a.iter().map(|(k, _)| k.to_string()).collect();
        for (key, _) in b.iter() {
            if !k.iter().any(|x| x == key) {
                k.push(key.to_string());
            }
        }
        k
    };
    for key in keys {
        let (x, y) = (a.get(&key), b.get(&key));
        match (
            x.and_then(Item::as_array_of_tables),
            y.and_then(Item::as_array_of_tables),
        ) {
            (xa, ya) if xa.is_some() || ya.is_some() => {
                let named = |aot: Option<&ArrayOfTables>| -> Vec<(String, Json)> {
                    aot.into_iter()
                        .flat_map(|a| a.iter())
                        .enumerate()
                        .map(|(i, t)| {
                            let n = t
                                .get("name")
                                .and_then(Item::as_str)
                                .map_or_else(|| format!("#{i}"), str::to_string);
                            (n, table_json(t))
                        })
                        .collect()
                };
                let (xs, ys) = (named(xa), named(ya));
                for (n, j) in &ys {
                    match xs.iter().find(|(m, _)| m == n) {
                        None => out.push(format!("{key} {n:?} added")),
                        Some((_, old)) if old != j => out.push(format!("{key} {n:?} changed")),
                        _ => {}
                    }
                }
                for (n, _) in &xs {
                    if !ys.iter().any(|(m, _)| m == n) {
                        out.push(format!("{key} {n:?} removed"));
                    }
                }
            }
            _ => {
                let (xj, yj) = (x.map(item_json), y.map(item_json));
                if xj != yj {
                    let what = match (xj.is_some(), yj.is_some()) {
                        (false, true) => "added",
                        (true, false) => "removed",
                        _ => "changed",
                    };
                    out.push(format!("[{key}] {what}"));
                }
            }
        }
    }
    if out.is_empty() && old != new {
        out.push("comments or formatting".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FILE: &str = r#"# the operator's header
[admin]
listen = "127.0.0.1:9000"   # loopback only

# web pool
[[pool]]
name = "web"
algorithm = "round_robin"  # keep it simple
[[pool.member]]
address = "10.0.0.1:80"    # first
[[pool.member]]
address = "10.0.0.2:80"
weight = 2

[[virtual_service]]
name = "site"
listen = ["0.0.0.0:80"]
pool = "web"
"#;

    #[test]
    fn a_member_added_changed_and_removed_leaves_the_rest_of_the_text() {
        let (t, existed) =
            put_member(FILE, "web", "10.0.0.3:80", Some(&json!({"weight": 5}))).unwrap();
        assert!(!existed);
        assert!(
            t.contains("address = \"10.0.0.3:80\"") && t.contains("weight = 5"),
            "{t}"
        );
        for kept in [
            "# the operator's header",
            "# loopback only",
            "# web pool",
            "# keep it simple",
            "# first",
        ] {
            assert!(t.contains(kept), "{kept} lost:\n{t}");
        }
        assert_eq!(
            get_member(&t, "web", "10.0.0.3:80").unwrap(),
            Some(json!({"address": "10.0.0.3:80", "weight": 5}))
        );
        let (t, existed) =
            put_member(&t, "web", "10.0.0.2:80", Some(&json!({"weight": 7}))).unwrap();
        assert!(
            existed && t.contains("weight = 7") && !t.contains("weight = 2"),
            "{t}"
        );
        let (t, _) = put_member(&t, "web", "10.0.0.1:80", None).unwrap();
        assert!(
            !t.contains("10.0.0.1:80") && t.contains("# web pool"),
            "{t}"
        );
        assert!(put_member(&t, "nope", "10.0.0.1:80", Some(&json!({}))).is_err());
        assert!(put_member(
            &t,
            "web",
            "10.0.0.9:80",
            Some(&json!({"address": "10.0.0.8:80"}))
        )
        .is_err());
    }

    #[test]
    fn objects_by_name_and_what_changed() {
        let (t, existed) = put_object(
            FILE,
            "virtual_services",
            "api",
            Some(&json!({"listen": ["0.0.0.0:81"], "protocol": "tcp", "pool": "web"})),
        )
        .unwrap();
        assert!(!existed);
        let got = get_object(&t, "virtual_services", "api").unwrap().unwrap();
        assert_eq!(got["listen"], json!(["0.0.0.0:81"]));
        assert_eq!(got["name"], "api");
        assert_eq!(changes(FILE, &t), vec!["virtual_service \"api\" added"]);
        let (t2, _) = put_object(
            &t,
            "pools",
            "web",
            Some(&json!({
                "algorithm": "least_connections",
                "member": [{"address": "10.0.0.1:80"}, {"address": "10.0.0.2:80", "weight": 2}],
            })),
        )
        .unwrap();
        assert!(
            t2.contains("algorithm = \"least_connections\"  # keep it simple"),
            "{t2}"
        );
        assert!(t2.contains("# first"), "{t2}");
        assert_eq!(changes(&t, &t2), vec!["pool \"web\" changed"]);
        let (t3, existed) = put_object(&t2, "virtual_services", "api", None).unwrap();
        assert!(existed);
        assert_eq!(changes(&t2, &t3), vec!["virtual_service \"api\" removed"]);
        assert!(get_object(&t3, "monitors", "x").unwrap().is_none());
        assert!(get_object(&t3, "nothing", "x").is_err());
    }

    #[test]
    fn a_whole_file_in_json_changes_only_what_differs() {
        let mut j = document_json(&parse(FILE).unwrap());
        j["admin"]["listen"] = json!("127.0.0.1:9001");
        j["global"] = json!({"workers": 2});
        let t = apply_json(FILE, &j).unwrap();
        assert!(
            t.contains("listen = \"127.0.0.1:9001\"   # loopback only"),
            "{t}"
        );
        assert!(t.contains("# first") && t.contains("[global]"), "{t}");
        assert_eq!(changes(FILE, &t), vec!["[admin] changed", "[global] added"]);
        assert!(parse(&t).is_ok());
    }
}
