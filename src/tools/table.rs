//! The built-in tools, one row each: name, tier, description, parameter schema, and the tool
//! type, whose [`BuiltinTool`] impl names its config section and builds it. The registry's
//! listing, `correx_tools_list`, the config reader (`tools.<name>`) and `correx doctor` all read
//! [`BUILTIN_TOOLS`]; adding a tool is its file (whose `BuiltinTool` impl holds its row) and
//! one line here.

use super::{Tier, Tool, ToolError};
use crate::settings::{ConfigError, Section};
use serde_json::{Map, Value};
use std::any::Any;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// A tool the runtime builds from its config section (`tools.<name>`).
pub trait BuiltinTool: Tool + Sized + 'static {
    /// The tool's row: its name, tier, description and schema, said here once (its `impl
    /// Tool` reads them from here).
    const ROW: ToolRow;

    /// The section's type, every field but `enabled` (which the table reads for every tool).
    type Config: Section + fmt::Debug + Clone + Send + Sync + 'static;

    /// Builds the tool as its section says.
    ///
    /// # Errors
    /// [`ToolError`] saying what in the section cannot be honoured (a missing root or
    /// executable, a kernel without a required layer).
    fn build(config: &Self::Config, context: &BuildContext) -> Result<Self, ToolError>;

    /// What `correx doctor` says of an enabled section: pairs of a field beneath the tool
    /// (empty for the tool itself) and a sentence.
    fn explain(config: &Self::Config) -> Vec<(&'static str, String)>;

    /// Files the tools built after this one must never write (the shell's executables).
    fn protects(&self) -> Vec<PathBuf> {
        Vec::new()
    }
}

/// What the tools built earlier leave for those built after them, and what the runtime gives
/// them all.
#[derive(Clone, Debug, Default)]
pub struct BuildContext {
    /// Files no tool may write: the executables a shell may run.
    pub protected: Vec<PathBuf>,
    /// The runtime's background jobs: the shell starts them (`background: true`) and the
    /// `jobs` tool reaches them. Without it, background runs are refused.
    pub jobs: Option<Arc<crate::services::jobs::JobTable>>,
}

/// One row of a tool table.
#[derive(Clone, Copy)]
pub struct ToolRow {
    /// The name requests use, and the key of its config section.
    pub name: &'static str,
    /// Its risk tier.
    pub tier: Tier,
    /// What it does, for a person or a model.
    pub description: &'static str,
    /// A JSON schema of its parameters.
    pub parameters: fn() -> Value,
    read: fn(Value) -> Result<Arc<dyn Configured>, ConfigError>,
    default: fn() -> Arc<dyn Configured>,
}

impl fmt::Debug for ToolRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ToolRow")
            .field("name", &self.name)
            .field("tier", &self.tier)
            .finish_non_exhaustive()
    }
}

impl ToolRow {
    /// The row of tool type `T`.
    pub const fn new<T: BuiltinTool>(
        name: &'static str,
        tier: Tier,
        description: &'static str,
        parameters: fn() -> Value,
    ) -> ToolRow {
        ToolRow {
            name,
            tier,
            description,
            parameters,
            read: read_settings::<T>,
            default: default_settings::<T>,
        }
    }
}

/// The built-in tools. Tools are built in this order: the shell first, because the file tools
/// must not write its executables.
pub static BUILTIN_TOOLS: &[ToolRow] = &[
    <super::ShellTool as BuiltinTool>::ROW,
    <super::FileReadTool as BuiltinTool>::ROW,
    <super::FileWriteTool as BuiltinTool>::ROW,
    <super::FileEditTool as BuiltinTool>::ROW,
    <super::JobsTool as BuiltinTool>::ROW,
];

/// A built-in tool's `name`, `tier`, `description` and `parameters`, as its row says them:
/// written once, in the row, and read from there by the tool's `impl Tool`.
macro_rules! identity_from_row {
    () => {
        fn name(&self) -> &str {
            <Self as $crate::tools::BuiltinTool>::ROW.name
        }

        fn tier(&self) -> $crate::tools::Tier {
            <Self as $crate::tools::BuiltinTool>::ROW.tier
        }

        fn description(&self) -> &str {
            <Self as $crate::tools::BuiltinTool>::ROW.description
        }

        fn parameters(&self) -> serde_json::Value {
            (<Self as $crate::tools::BuiltinTool>::ROW.parameters)()
        }
    };
}
pub(crate) use identity_from_row;

/// A section read for a row's tool type, type-erased so one table holds them all.
trait Configured: fmt::Debug + Send + Sync {
    fn build(&self, context: &BuildContext) -> Result<(Arc<dyn Tool>, Vec<PathBuf>), ToolError>;
    fn explain(&self) -> Vec<(&'static str, String)>;
    fn as_any(&self) -> &dyn Any;
}

struct Settings<T: BuiltinTool>(T::Config);

impl<T: BuiltinTool> fmt::Debug for Settings<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T: BuiltinTool> Configured for Settings<T> {
    fn build(&self, context: &BuildContext) -> Result<(Arc<dyn Tool>, Vec<PathBuf>), ToolError> {
        let tool = T::build(&self.0, context)?;
        let protects = tool.protects();
        Ok((Arc::new(tool), protects))
    }

    fn explain(&self) -> Vec<(&'static str, String)> {
        T::explain(&self.0)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn read_settings<T: BuiltinTool>(v: Value) -> Result<Arc<dyn Configured>, ConfigError> {
    let config: T::Config = crate::settings::read("", Some(v))?;
    Ok(Arc::new(Settings::<T>(config)))
}

fn default_settings<T: BuiltinTool>() -> Arc<dyn Configured> {
    Arc::new(Settings::<T>(T::Config::default()))
}

#[derive(Clone, Debug)]
struct Entry {
    row: ToolRow,
    enabled: bool,
    settings: Arc<dyn Configured>,
}

/// Which tools a runtime offers and how each is set up (config `tools`): a section per row of
/// a tool table, each `{"enabled": false}` unless the config says otherwise.
#[derive(Clone, Debug)]
pub struct ToolConfig {
    entries: Vec<Entry>,
}

impl Default for ToolConfig {
    /// Every built-in tool, disabled, with its defaults.
    fn default() -> Self {
        ToolConfig::defaults_of(BUILTIN_TOOLS)
    }
}

impl ToolConfig {
    fn defaults_of(table: &[ToolRow]) -> Self {
        ToolConfig {
            entries: table
                .iter()
                .map(|row| Entry {
                    row: *row,
                    enabled: false,
                    settings: (row.default)(),
                })
                .collect(),
        }
    }

    /// Reads the `tools` object for the built-in tools.
    ///
    /// # Errors
    /// [`ConfigError`] naming the field, e.g. `tools.shell.timeout_ms`.
    pub fn from_value(v: &Value) -> Result<Self, ConfigError> {
        Self::from_value_in(BUILTIN_TOOLS, v)
    }

    /// Reads the `tools` object for the tools of `table` (the built-in rows and a host's own).
    ///
    /// # Errors
    /// [`ConfigError`] naming the field; a key no row has is `tools.<key>`.
    pub fn from_value_in(table: &[ToolRow], v: &Value) -> Result<Self, ConfigError> {
        Self::read(table, Some(v.clone())).map_err(|e| e.under("tools"))
    }

    /// As [`ToolConfig::from_value_in`], errors relative to `tools`.
    pub(crate) fn read(table: &[ToolRow], v: Option<Value>) -> Result<Self, ConfigError> {
        for (i, row) in table.iter().enumerate() {
            if table[..i].iter().any(|r| r.name == row.name) {
                return Err(ConfigError::new(
                    row.name,
                    "two tools of the table share this name",
                ));
            }
        }
        let mut config = Self::defaults_of(table);
        let sections = match v {
            None | Some(Value::Null) => return Ok(config),
            Some(Value::Object(map)) => map,
            Some(other) => {
                return Err(ConfigError::new(
                    "",
                    format!("must be an object, got {}", super::json_kind(&other)),
                ))
            }
        };
        for (name, section) in sections {
            let Some(entry) = config.entries.iter_mut().find(|e| e.row.name == name) else {
                let names: Vec<&str> = table.iter().map(|r| r.name).collect();
                return Err(ConfigError::new(
                    name,
                    format!("unknown tool; expected one of: {}", names.join(", ")),
                ));
            };
            let (enabled, rest) = split_enabled(section).map_err(|e| e.under(&name))?;
            entry.enabled = enabled;
            entry.settings = (entry.row.read)(rest).map_err(|e| e.under(&name))?;
        }
        Ok(config)
    }

    /// The section of tool type `T`, when its table has a row for it.
    pub fn get<T: BuiltinTool>(&self) -> Option<&T::Config> {
        self.entries.iter().find_map(|e| {
            e.settings
                .as_any()
                .downcast_ref::<Settings<T>>()
                .map(|s| &s.0)
        })
    }

    /// Whether the tool named `name` is enabled.
    pub fn is_enabled(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.enabled && e.row.name == name)
    }

    /// The table this config was read for.
    pub fn rows(&self) -> Vec<ToolRow> {
        self.entries.iter().map(|e| e.row).collect()
    }

    /// What `correx doctor` says of each tool: pairs of a config path and a sentence.
    pub fn explain(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for e in &self.entries {
            let name = e.row.name;
            if !e.enabled {
                out.push((
                    format!("tools.{name}"),
                    "disabled: every request is refused".to_owned(),
                ));
                continue;
            }
            for (field, text) in e.settings.explain() {
                let path = if field.is_empty() {
                    format!("tools.{name}")
                } else {
                    format!("tools.{name}.{field}")
                };
                out.push((path, text));
            }
        }
        out
    }

    /// Builds the enabled tools, in table order.
    ///
    /// # Errors
    /// The name of the tool that could not be built, and why.
    pub(crate) fn build(&self) -> Result<super::ToolRegistry, (&'static str, ToolError)> {
        self.build_with(BuildContext::default())
    }

    /// As [`ToolConfig::build`], starting from `context` (the runtime's job table).
    pub(crate) fn build_with(
        &self,
        mut context: BuildContext,
    ) -> Result<super::ToolRegistry, (&'static str, ToolError)> {
        let mut tools = Vec::new();
        for e in self.entries.iter().filter(|e| e.enabled) {
            let (tool, protects) = e
                .settings
                .build(&context)
                .map_err(|err| (e.row.name, err))?;
            context.protected.extend(protects);
            tools.push(tool);
        }
        super::ToolRegistry::build(tools)
            .map(|r| r.listing(self.rows()))
            .map_err(|e| ("registry", e))
    }
}

/// A section's `enabled` (default false) and the rest, for the tool's own type.
fn split_enabled(section: Value) -> Result<(bool, Value), ConfigError> {
    let Value::Object(mut map) = section else {
        // Not an object: the tool's type says why, by its path.
        return Ok((false, section));
    };
    let enabled = match map.remove("enabled") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => b,
        Some(v) => {
            return Err(ConfigError::new(
                "enabled",
                format!("must be true or false, got {}", super::json_kind(&v)),
            ))
        }
    };
    Ok((enabled, Value::Object(Map::from_iter(map))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each row's tool says of itself what its row says, so a listing of a disabled tool and
    /// of the enabled one agree.
    #[test]
    fn each_row_matches_the_tool_it_builds() {
        let dir = std::env::temp_dir();
        let config = ToolConfig::from_value(&serde_json::json!({
            "shell": {"enabled": true, "allowed_executables": ["sh"],
                      "isolation": {"mode": "none"}},
            "file_read": {"enabled": true, "allowed_paths": [dir]},
            "file_write": {"enabled": true, "allowed_paths": [dir]},
            "file_edit": {"enabled": true, "allowed_paths": [dir]},
            "jobs": {"enabled": true},
        }))
        .expect("a valid config");
        // Without a runtime's job table the jobs tool cannot be built, and says so.
        let (name, e) = config.build().expect_err("no job table");
        assert_eq!(name, "jobs");
        assert!(e.to_string().contains("job table"), "{e}");
        let work = dir.join(format!("correx-table-{}", crate::ids::random_uuid()));
        std::fs::create_dir_all(&work).expect("a temp dir");
        let events =
            crate::events::SqliteEventStore::open(work.join("events.db")).expect("an event log");
        let (table, _) =
            crate::services::jobs::JobTable::open(Arc::new(events), &work.join("sandbox"))
                .expect("a job table");
        let context = BuildContext {
            jobs: Some(Arc::new(table)),
            ..BuildContext::default()
        };
        let registry = config.build_with(context).expect("every tool builds");
        assert_eq!(registry.names().len(), BUILTIN_TOOLS.len());
        for row in BUILTIN_TOOLS {
            let tool = registry.resolve(row.name).expect("built");
            assert_eq!(tool.tier(), row.tier, "{}", row.name);
            assert_eq!(tool.description(), row.description, "{}", row.name);
            assert_eq!(tool.parameters(), (row.parameters)(), "{}", row.name);
        }
        drop(registry);
        let _ = std::fs::remove_dir_all(&work);
    }
}
