//! A small argument parser: positionals, flags with a value (`--limit 5`, `--limit=5`) and
//! switches; anything else is a usage error naming it.

use std::collections::HashMap;

/// A usage error's message.
pub struct UsageError(pub String);

/// One command's arguments.
pub struct Args {
    positional: Vec<String>,
    values: HashMap<String, String>,
    switches: Vec<String>,
}

impl Args {
    /// Parses `words` given the flags that take a value and the switches that do not.
    pub fn parse(words: &[&str], valued: &[&str], switches: &[&str]) -> Result<Args, UsageError> {
        let mut out = Args {
            positional: Vec::new(),
            values: HashMap::new(),
            switches: Vec::new(),
        };
        let mut i = 0;
        let mut only_positional = false;
        while i < words.len() {
            let w = words[i];
            i += 1;
            if only_positional || !w.starts_with('-') || w == "-" {
                out.positional.push(w.to_owned());
                continue;
            }
            if w == "--" {
                only_positional = true;
                continue;
            }
            let (name, inline) = match w.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v)),
                _ => (w, None),
            };
            if valued.contains(&name) {
                let value = match inline {
                    Some(v) => v.to_owned(),
                    None => {
                        let v = words
                            .get(i)
                            .ok_or_else(|| UsageError(format!("{name} needs a value")))?;
                        i += 1;
                        (*v).to_owned()
                    }
                };
                out.values.insert(name.to_owned(), value);
            } else if switches.contains(&name) && inline.is_none() {
                out.switches.push(name.to_owned());
            } else {
                return Err(UsageError(format!("unknown flag {name}")));
            }
        }
        Ok(out)
    }

    /// The value of `flag`, if given.
    pub fn value(&self, flag: &str) -> Option<&str> {
        self.values.get(flag).map(String::as_str)
    }

    /// Whether any of `names` was given.
    pub fn switch(&self, names: &[&str]) -> bool {
        self.switches.iter().any(|s| names.contains(&s.as_str()))
    }

    /// The value of `flag` as a number.
    pub fn number(&self, flag: &str) -> Result<Option<u64>, UsageError> {
        self.value(flag)
            .map(|v| {
                v.parse::<u64>().map_err(|_| {
                    UsageError(format!("{flag} takes a non-negative integer, not {v:?}"))
                })
            })
            .transpose()
    }

    /// Exactly `names.len()` positionals, named in the error when some are missing or extra.
    pub fn positionals(&self, names: &[&str]) -> Result<Vec<&str>, UsageError> {
        if self.positional.len() < names.len() {
            return Err(UsageError(format!(
                "missing {}",
                names[self.positional.len()..].join(" and ")
            )));
        }
        if self.positional.len() > names.len() {
            return Err(UsageError(format!(
                "unexpected argument {:?}",
                self.positional[names.len()]
            )));
        }
        Ok(self.positional.iter().map(String::as_str).collect())
    }

    /// As [`Args::positionals`], with `optional` ones allowed after `names`.
    pub fn positionals_between(
        &self,
        names: &[&str],
        optional: &[&str],
    ) -> Result<Vec<&str>, UsageError> {
        if self.positional.len() < names.len() {
            return Err(UsageError(format!(
                "missing {}",
                names[self.positional.len()..].join(" and ")
            )));
        }
        if self.positional.len() > names.len() + optional.len() {
            return Err(UsageError(format!(
                "unexpected argument {:?}",
                self.positional[names.len() + optional.len()]
            )));
        }
        Ok(self.positional.iter().map(String::as_str).collect())
    }
}
