use std::fmt;

/// One problem found in a configuration file, located precisely enough for a user to act on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ConfigError {
    pub file: String,
    /// 1-based; 0 when the problem has no single place in the file (e.g. the file is unreadable).
    pub line: usize,
    pub column: usize,
    /// Dotted key path, e.g. `pool[1].member[0].weight`; empty for the document itself.
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.key.is_empty() {
            write!(f, ": {}", self.key)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found in one configuration, in file order.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl ConfigErrors {
    pub fn messages(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }
}

/// Suggests the closest of `candidates` to a misspelt `word`, if one is close enough to be a likely typo.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let word_lc = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(&word_lc, &c.to_ascii_lowercase()), c))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggests_close_words_only() {
        let keys = ["algorithm", "monitors", "retries", "member"];
        assert_eq!(did_you_mean("algoritm", keys), Some("algorithm"));
        assert_eq!(did_you_mean("monitor", keys), Some("monitors"));
        assert_eq!(did_you_mean("zzz", keys), None);
    }
}
