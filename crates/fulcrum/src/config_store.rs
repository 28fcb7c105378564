//! The configuration API's store: the versions of the configuration file this node applied,
//! with who made each, from where and what changed, kept in `<file>.history/` beside the file
//! (the last `KEEP`), and the one path every API write takes: check the version the writer
//! read, validate as `fulcrum check` does, write the file atomically, apply it by the same
//! reload as `SIGHUP`, and put the file back if the reload is refused — all or nothing.

use std::path::{Path, PathBuf};

use fulcrum_admin::{Author, ConfigRefusal, ConfigWrite};
use parking_lot::Mutex;
use serde_json::{json, Value};

use fulcrum_ha::sync::now_ms;

/// Versions kept (their text and their history entry).
const KEEP: usize = 50;

#[derive(Clone)]
struct Entry {
    version: u64,
    at_ms: u64,
    who: String,
    from: String,
    changes: Vec<String>,
}

impl Entry {
    fn to_json(&self) -> Value {
        json!({
            "version": self.version, "at_ms": self.at_ms, "who": self.who,
            "from": self.from, "changes": self.changes,
        })
    }

    fn from_json(v: &Value) -> Option<Entry> {
        Some(Entry {
            version: v["version"].as_u64()?,
            at_ms: v["at_ms"].as_u64()?,
            who: v["who"].as_str()?.to_string(),
            from: v["from"].as_str()?.to_string(),
            changes: v["changes"]
                .as_array()?
                .iter()
                .filter_map(|c| c.as_str().map(str::to_string))
                .collect(),
        })
    }
}

struct State {
    /// Oldest first.
    entries: Vec<Entry>,
    /// The text of the newest version: what runs.
    text: String,
}

pub struct ConfigStore {
    file: PathBuf,
    dir: PathBuf,
    state: Mutex<State>,
    /// One write at a time: check, write, apply and record belong together.
    writing: Mutex<()>,
    /// The author of the write whose reload runs now (`applied` records it).
    pending: Mutex<Option<Author>>,
}

fn history_dir(file: &Path) -> PathBuf {
    let mut name = file.file_name().unwrap_or_default().to_os_string();
    name.push(".history");
    file.with_file_name(name)
}

impl ConfigStore {
    /// Opens the history beside `file`; the file as it is now (the configuration this process
    /// starts with) becomes a version of its own when it differs from the newest kept.
    pub fn open(file: &Path) -> Result<ConfigStore, String> {
        let dir = history_dir(file);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let entries: Vec<Entry> = std::fs::read(dir.join("index.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            .and_then(|v| {
                v.as_array()
                    .map(|a| a.iter().filter_map(Entry::from_json).collect())
            })
            .unwrap_or_default();
        let text = entries
            .last()
            .and_then(|e| std::fs::read_to_string(dir.join(format!("{}.toml", e.version))).ok())
            .unwrap_or_default();
        let store = ConfigStore {
            file: file.to_path_buf(),
            dir,
            state: Mutex::new(State { entries, text }),
            writing: Mutex::new(()),
            pending: Mutex::new(None),
        };
        store.record_if_changed(Author {
            who: "file".into(),
            from: "start".into(),
        });
        Ok(store)
    }

    /// After every configuration applied from the file (a reload, an API write, a peer's
    /// version): a new version when the text changed.
    pub fn applied(&self) {
        let author = self.pending.lock().take().unwrap_or(Author {
            who: "reload".into(),
            from: "file".into(),
        });
        self.record_if_changed(author);
    }

    fn record_if_changed(&self, author: Author) {
        let Ok(text) = std::fs::read_to_string(&self.file) else {
            return;
        };
        let mut st = self.state.lock();
        if !st.entries.is_empty() && st.text == text {
            return;
        }
        let version = st.entries.last().map_or(1, |e| e.version + 1);
        let changes = if st.entries.is_empty() {
            vec!["first version kept".into()]
        } else {
            fulcrum_config::edit::changes(&st.text, &text)
        };
        if let Err(e) = crate::state_file::write_bytes(
            &self.dir.join(format!("{version}.toml")),
            text.as_bytes(),
        ) {
            tracing::warn!(error = %e, "configuration history: cannot keep version {version}");
        }
        st.entries.push(Entry {
            version,
            at_ms: now_ms(),
            who: author.who,
            from: author.from,
            changes,
        });
        while st.entries.len() > KEEP {
            let old = st.entries.remove(0);
            let _ = std::fs::remove_file(self.dir.join(format!("{}.toml", old.version)));
        }
        st.text = text;
        let index = Value::Array(st.entries.iter().map(Entry::to_json).collect());
        if let Err(e) = crate::state_file::write(&self.dir.join("index.json"), &index) {
            tracing::warn!(error = %e, "configuration history: cannot write its index");
        }
    }

    /// Runs `f` (a reload) as a change `author` made.
    fn as_author<T>(&self, author: Author, f: impl FnOnce() -> T) -> T {
        *self.pending.lock() = Some(author);
        let r = f();
        self.pending.lock().take();
        r
    }

    /// The running configuration's text and version.
    pub fn current(&self) -> (String, u64) {
        let st = self.state.lock();
        (st.text.clone(), st.entries.last().map_or(0, |e| e.version))
    }

    /// The running configuration's version.
    fn version(&self) -> u64 {
        self.state.lock().entries.last().map_or(0, |e| e.version)
    }

    /// `GET /api/v1/config/history`: newest first.
    pub fn history(&self) -> Value {
        let st = self.state.lock();
        json!({ "versions": st.entries.iter().rev().map(Entry::to_json).collect::<Vec<_>>() })
    }

    /// The text of a kept version.
    pub fn version_text(&self, version: u64) -> Option<String> {
        let kept = self
            .state
            .lock()
            .entries
            .iter()
            .any(|e| e.version == version);
        kept.then(|| std::fs::read_to_string(self.dir.join(format!("{version}.toml"))).ok())
            .flatten()
    }

    /// The one write path: `if_match` (the version the writer read) must be the current one;
    /// `validate` answers as `fulcrum check`; `reload` applies the written file.
    pub fn write(
        &self,
        text: &str,
        if_match: Option<u64>,
        dry_run: bool,
        author: Author,
        validate: impl FnOnce(&str) -> Result<(), Vec<String>>,
        reload: impl FnOnce() -> Result<u64, Vec<String>>,
    ) -> Result<ConfigWrite, ConfigRefusal> {
        let _one = self.writing.lock();
        let current = self.version();
        if let Some(m) = if_match {
            if m != current {
                return Err(ConfigRefusal::Stale { current });
            }
        }
        validate(text).map_err(ConfigRefusal::Invalid)?;
        if dry_run {
            return Ok(ConfigWrite {
                generation: None,
                version: current,
            });
        }
        let old = std::fs::read(&self.file).map_err(|e| {
            ConfigRefusal::Unavailable(format!("cannot read {}: {e}", self.file.display()))
        })?;
        crate::state_file::write_bytes(&self.file, text.as_bytes()).map_err(|e| {
            ConfigRefusal::Unavailable(format!("cannot write {}: {e}", self.file.display()))
        })?;
        match self.as_author(author, reload) {
            Ok(generation) => Ok(ConfigWrite {
                generation: Some(generation),
                version: self.version(),
            }),
            Err(errors) => {
                // Refused by a later step (a port in use): the file says what runs.
                if let Err(e) = crate::state_file::write_bytes(&self.file, &old) {
                    tracing::error!(error = %e, "cannot restore the configuration file after a refused API write");
                }
                Err(ConfigRefusal::Invalid(errors))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn author(who: &str) -> Author {
        Author {
            who: who.into(),
            from: "127.0.0.1:1".into(),
        }
    }

    #[test]
    fn versions_history_stale_writes_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f.toml");
        std::fs::write(&file, "[[pool]]\nname = \"a\"\n").unwrap();
        let s = ConfigStore::open(&file).unwrap();
        assert_eq!(s.current().1, 1);
        let ok = |_: &str| Ok(());
        let new = "[[pool]]\nname = \"a\"\n\n[[pool]]\nname = \"b\"\n";
        let w = s
            .write(new, Some(1), false, author("api"), ok, || {
                s.applied();
                Ok(7)
            })
            .unwrap();
        assert_eq!((w.generation, w.version), (Some(7), 2));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), new);
        let h = s.history();
        assert_eq!(h["versions"][0]["who"], "api");
        assert_eq!(h["versions"][0]["changes"][0], "pool \"b\" added");
        // Stale, invalid and refused writes change nothing.
        assert!(matches!(
            s.write("x", Some(1), false, author("api"), ok, || Ok(0)),
            Err(ConfigRefusal::Stale { current: 2 })
        ));
        assert!(matches!(
            s.write(
                "x",
                Some(2),
                false,
                author("api"),
                |_| Err(vec!["bad".into()]),
                || Ok(0)
            ),
            Err(ConfigRefusal::Invalid(_))
        ));
        assert!(matches!(
            s.write("x", Some(2), false, author("api"), ok, || Err(vec![
                "port in use".into()
            ])),
            Err(ConfigRefusal::Invalid(_))
        ));
        assert_eq!(std::fs::read_to_string(&file).unwrap(), new);
        assert_eq!(s.current().1, 2);
        // A restart keeps the history; the first version's text is still there to roll back to.
        drop(s);
        let s = ConfigStore::open(&file).unwrap();
        assert_eq!(s.current().1, 2);
        assert_eq!(s.version_text(1).unwrap(), "[[pool]]\nname = \"a\"\n");
    }
}
