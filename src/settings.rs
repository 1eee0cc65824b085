//! Config sections: each component's settings type reads its own part of the config with serde
//! ([`crate::strict_json`]'s config rules: unknown fields, arrays for objects and NUL bytes
//! refused, `null` the same as absent) and checks what types cannot say in [`Section::validate`].
//! The runtime's config composes the sections and names every error by its whole path
//! (`tools.shell.timeout_ms: must be greater than 0`).

use serde::de::{DeserializeOwned, Deserializer};
use serde::Deserialize;
use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A config field that is missing, mistyped or out of range.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// The field's path, e.g. `tools.shell.timeout_ms`.
    pub field: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "config field {}: {}", self.field, self.reason)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// An error about `field` (a path relative to the section that finds it).
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The same error seen from `section` above it: `timeout_ms` under `tools.shell` is
    /// `tools.shell.timeout_ms`.
    pub fn under(mut self, section: &str) -> Self {
        self.field = match (section.is_empty(), self.field.is_empty()) {
            (true, _) => self.field,
            (false, true) => section.to_owned(),
            (false, false) if self.field.starts_with('[') => format!("{section}{}", self.field),
            (false, false) => format!("{section}.{}", self.field),
        };
        self
    }
}

impl From<crate::strict_json::JsonError> for ConfigError {
    fn from(e: crate::strict_json::JsonError) -> Self {
        ConfigError {
            field: e.path,
            reason: e.reason,
        }
    }
}

/// A component's config section: read with serde, absent fields taking their defaults, then
/// checked.
pub trait Section: DeserializeOwned + Default {
    /// Checks what the types cannot: ranges, absolute paths, relations between fields. Errors
    /// name fields relative to the section, as spelled in the config.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first bad field.
    fn validate(&self) -> Result<(), ConfigError>;
}

/// Reads the section found at `path` (absent or `null`: every default) and validates it.
///
/// # Errors
/// [`ConfigError`] naming the field by its whole path.
pub(crate) fn read<T: Section>(path: &str, value: Option<Value>) -> Result<T, ConfigError> {
    let section: T = match value {
        None | Some(Value::Null) => T::default(),
        Some(v) => crate::strict_json::config_from_value(v)
            .map_err(|e| ConfigError::from(e).under(path))?,
    };
    section.validate().map_err(|e| e.under(path))?;
    Ok(section)
}

/// Fails with `reason` about `field` unless `ok`.
pub(crate) fn check(ok: bool, field: &str, reason: impl Into<String>) -> Result<(), ConfigError> {
    if ok {
        Ok(())
    } else {
        Err(ConfigError::new(field, reason))
    }
}

/// A count or size that must not be 0.
pub(crate) fn positive(field: &str, n: u64) -> Result<(), ConfigError> {
    check(n > 0, field, "must be greater than 0")
}

/// A duration set in milliseconds that must not be 0.
pub(crate) fn positive_ms(field: &str, d: Duration) -> Result<(), ConfigError> {
    check(!d.is_zero(), field, "must be greater than 0")
}

/// A path given as a string must not be empty.
pub(crate) fn non_empty(field: &str, p: &Path) -> Result<(), ConfigError> {
    check(!p.as_os_str().is_empty(), field, "must not be empty")
}

/// Every path of a list must be absolute: they are roots, read before any working directory.
pub(crate) fn absolute(field: &str, paths: &[PathBuf]) -> Result<(), ConfigError> {
    for (i, p) in paths.iter().enumerate() {
        check(
            p.is_absolute(),
            &format!("{field}[{i}]"),
            format!("{:?} must be an absolute path", p.display().to_string()),
        )?;
    }
    Ok(())
}

/// `#[serde(with = "crate::settings::millis")]`: a duration written as whole milliseconds.
pub(crate) mod millis {
    use super::*;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

/// `#[serde(deserialize_with = "crate::settings::mebibytes")]`: a byte count written in MiB.
pub(crate) fn mebibytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d).map(|mb| mb.map(|mb| mb.saturating_mul(1 << 20)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_compose_from_the_section_down() {
        let e = ConfigError::new("timeout_ms", "bad").under("shell");
        assert_eq!(e.under("tools").field, "tools.shell.timeout_ms");
        assert_eq!(
            ConfigError::new("[0].action", "x").under("rules").field,
            "rules[0].action"
        );
        assert_eq!(ConfigError::new("", "x").under("models").field, "models");
        assert_eq!(ConfigError::new("a", "x").under("").field, "a");
    }
}
