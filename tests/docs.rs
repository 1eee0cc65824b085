//! The generated reference pages (`docs/reference/config.md`, `docs/reference/events.md`) must
//! be exactly what the sources say: the config sections' types and the typed domain events,
//! read with their doc comments. A stale page fails here, as a stale header does;
//! `CORREX_BLESS=1 cargo test --test tests docs` writes them anew.

use std::path::Path;

/// A field of a struct (or of an enum variant) as the config or the payload spells it.
#[derive(Debug)]
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// An enum variant that serde renames (a domain event: its type id), with its fields.
#[derive(Debug)]
struct Variant {
    id: String,
    doc: String,
    fields: Vec<Field>,
}

/// A config section: where it sits in the config, and the type that reads it.
struct Section {
    path: &'static str,
    file: &'static str,
    ty: &'static str,
    /// Fields every section of this kind has besides its type's (a tool's `enabled`).
    extra: &'static [(&'static str, &'static str, &'static str)],
}

const ENABLED: &[(&str, &str, &str)] = &[(
    "enabled",
    "bool",
    "Whether the tool is built; default false (every tool is disabled unless the config enables it).",
)];

/// Every section of the runtime config, in the order the page shows them.
const SECTIONS: &[Section] = &[
    Section {
        path: "models",
        file: "src/inference/manager/options.rs",
        ty: "ManagerOptions",
        extra: &[],
    },
    Section {
        path: "models.prompt_cache",
        file: "src/inference/manager/options.rs",
        ty: "PromptCacheOptions",
        extra: &[],
    },
    Section {
        path: "approvals",
        file: "src/approvals/config.rs",
        ty: "ApprovalsConfig",
        extra: &[],
    },
    Section {
        path: "approvals.rules[]",
        file: "src/approvals/policy.rs",
        ty: "ApprovalRule",
        extra: &[],
    },
    Section {
        path: "tools.shell",
        file: "src/tools/shell/options.rs",
        ty: "ShellOptions",
        extra: ENABLED,
    },
    Section {
        path: "tools.shell.isolation",
        file: "src/confine/options.rs",
        ty: "IsolationOptions",
        extra: &[],
    },
    Section {
        path: "tools.shell.isolation.limits",
        file: "src/confine/options.rs",
        ty: "ResourceLimits",
        extra: &[],
    },
    Section {
        path: "tools.shell.isolation.network (an allowlist)",
        file: "src/confine/net/policy.rs",
        ty: "Allowlist",
        extra: &[],
    },
    Section {
        path: "tools.shell.jobs",
        file: "src/tools/shell/jobs.rs",
        ty: "JobsOptions",
        extra: &[],
    },
    Section {
        path: "tools.shell.staging",
        file: "src/workspace/options.rs",
        ty: "StagingOptions",
        extra: &[],
    },
    Section {
        path: "tools.file_read, tools.file_write, tools.file_edit",
        file: "src/tools/fs/config.rs",
        ty: "FileToolConfig",
        extra: ENABLED,
    },
    Section {
        path: "tools.jobs",
        file: "src/tools/jobs.rs",
        ty: "JobsToolOptions",
        extra: ENABLED,
    },
    Section {
        path: "mcp_servers.NAME",
        file: "src/services/mcp/config.rs",
        ty: "McpServerConfig",
        extra: &[],
    },
    Section {
        path: "mcp_servers.NAME.oauth",
        file: "src/services/mcp/oauth/mod.rs",
        ty: "McpOAuthConfig",
        extra: &[],
    },
    Section {
        path: "mcp_servers.NAME.tools.TOOL",
        file: "src/services/mcp/config.rs",
        ty: "McpToolSettings",
        extra: &[],
    },
    Section {
        path: "seal",
        file: "src/events/seal.rs",
        ty: "SealConfig",
        extra: &[],
    },
    Section {
        path: "otlp",
        file: "src/observe/otlp/mod.rs",
        ty: "OtlpConfig",
        extra: &[],
    },
];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(file: &str) -> String {
    std::fs::read_to_string(root().join(file)).unwrap_or_default()
}

/// Doc text as one Markdown table cell: lines joined, intra-doc links reduced to their text,
/// pipes escaped.
fn cell(doc: &str) -> String {
    let mut out = String::new();
    let mut rest = doc;
    // `[`Name`](target)` and `[`Name`]` become `Name` in backticks.
    while let Some(start) = rest.find("[`") {
        let Some(end) = rest[start..].find("`]").map(|e| start + e) else {
            break;
        };
        out.push_str(&rest[..start]);
        out.push_str(&rest[start + 1..end + 1]);
        rest = &rest[end + 2..];
        if rest.starts_with('(') {
            if let Some(close) = rest.find(')') {
                rest = &rest[close + 1..];
            }
        }
    }
    out.push_str(rest);
    out.replace('|', "\\|")
}

/// The `rename = "..."` of a serde attribute, if any.
fn renamed(attr: &str) -> Option<String> {
    let at = attr.find("rename = \"")? + "rename = \"".len();
    let end = attr[at..].find('"')?;
    Some(attr[at..at + end].to_owned())
}

/// The fields of the braced body starting after line `open` (which ends with `{`), at
/// `indent` spaces: doc comments, attributes (`rename`, `skip`, test-hook `cfg`s) and
/// `name: Type,` lines. Returns them and the line after the body's closing brace.
fn fields_from(lines: &[&str], open: usize, indent: usize) -> (Vec<Field>, usize) {
    let pad = " ".repeat(indent);
    let close = format!("{}}}", " ".repeat(indent.saturating_sub(4)));
    let mut fields = Vec::new();
    let (mut doc, mut attrs) = (String::new(), String::new());
    let mut i = open + 1;
    while i < lines.len() {
        let line = lines[i];
        if line.starts_with(&close) && line.trim_start().starts_with('}') {
            return (fields, i + 1);
        }
        let body = line.strip_prefix(&pad).unwrap_or("");
        if let Some(d) = body.strip_prefix("///") {
            if !doc.is_empty() {
                doc.push(' ');
            }
            doc.push_str(d.trim());
        } else if body.starts_with("#[") {
            // An attribute may span lines: read to its closing bracket.
            let mut a = body.to_owned();
            while !a.trim_end().ends_with(']') && i + 1 < lines.len() {
                i += 1;
                a.push_str(lines[i].trim());
            }
            attrs.push_str(&a);
        } else if !body.is_empty() && !body.starts_with(' ') && body.contains(':') {
            let decl = body
                .trim_start_matches("pub ")
                .trim_start_matches("pub(crate) ");
            let (name, ty) = decl.split_once(':').unwrap_or((decl, ""));
            let hidden = attrs.contains("skip)") || attrs.contains("test-hooks");
            if !hidden {
                fields.push(Field {
                    name: renamed(&attrs).unwrap_or_else(|| name.trim().to_owned()),
                    ty: ty.trim().trim_end_matches(',').to_owned(),
                    doc: std::mem::take(&mut doc),
                });
            }
            doc.clear();
            attrs.clear();
        }
        i += 1;
    }
    (fields, i)
}

/// The fields of `pub struct name` in `src`, or `None` when it is not there.
fn struct_fields(src: &str, name: &str) -> Option<Vec<Field>> {
    let lines: Vec<&str> = src.lines().collect();
    let head = format!("pub struct {name} {{");
    if lines.iter().any(|l| l.trim_start() == format!("{head}}}")) {
        return Some(Vec::new());
    }
    let open = lines.iter().position(|l| l.trim_start() == head)?;
    let indent = lines[open].len() - lines[open].trim_start().len() + 4;
    Some(fields_from(&lines, open, indent).0)
}

/// The renamed variants of `pub enum name` in `src`, each with its doc and fields.
fn enum_variants(src: &str, name: &str) -> Vec<Variant> {
    let lines: Vec<&str> = src.lines().collect();
    let head = format!("pub enum {name} {{");
    let Some(open) = lines.iter().position(|l| l.trim_start() == head) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let (mut doc, mut id) = (String::new(), None);
    let mut i = open + 1;
    while i < lines.len() && lines[i] != "}" {
        let t = lines[i].trim();
        if let Some(d) = t.strip_prefix("///") {
            if !doc.is_empty() {
                doc.push(' ');
            }
            doc.push_str(d.trim());
        } else if t.starts_with("#[serde(rename") {
            id = renamed(t);
        } else if t.ends_with('{') {
            let (fields, next) = fields_from(&lines, i, 8);
            if let Some(id) = id.take() {
                out.push(Variant {
                    id,
                    doc: std::mem::take(&mut doc),
                    fields,
                });
            }
            doc.clear();
            i = next;
            continue;
        }
        i += 1;
    }
    out
}

fn table(out: &mut String, fields: impl IntoIterator<Item = (String, String, String)>) {
    out.push_str("| field | type | what |\n|---|---|---|\n");
    for (name, ty, doc) in fields {
        out.push_str(&format!(
            "| `{name}` | `{}` | {} |\n",
            ty.replace('|', "\\|"),
            cell(&doc)
        ));
    }
    out.push('\n');
}

const NOTE: &str = "<!-- Generated from the sources by tests/docs.rs: do not edit. \
CORREX_BLESS=1 cargo test --test tests docs writes it anew. -->\n\n";

/// The config reference: the top level, then each section's fields.
fn config_page() -> Result<String, String> {
    let mut out = String::from("# Config reference (generated)\n\n");
    out.push_str(NOTE);
    out.push_str(
        "Every field of the runtime config (JSON, `\"v\": 1`), read from the types that read \
         it. Unknown fields are refused, `null` is the same as absent, and an absent field \
         takes its default. See [the config guide](../config.md) for a whole example.\n\n",
    );
    let top_src = read("src/runtime/config.rs");
    let top = struct_fields(&top_src, "RuntimeConfig")
        .ok_or("src/runtime/config.rs has no `pub struct RuntimeConfig`")?;
    out.push_str("## The top level (`RuntimeConfig`, src/runtime/config.rs)\n\n");
    let v = (
        "v".to_owned(),
        "u64".to_owned(),
        "The config format version; must be 1.".to_owned(),
    );
    table(
        &mut out,
        std::iter::once(v).chain(top.into_iter().map(|f| (f.name, f.ty, f.doc))),
    );
    for s in SECTIONS {
        let src = read(s.file);
        let fields = struct_fields(&src, s.ty)
            .ok_or_else(|| format!("{} has no `pub struct {}`", s.file, s.ty))?;
        out.push_str(&format!("## `{}` (`{}`, {})\n\n", s.path, s.ty, s.file));
        let extra = s
            .extra
            .iter()
            .map(|(n, t, d)| ((*n).to_owned(), (*t).to_owned(), (*d).to_owned()));
        let rows: Vec<_> = extra
            .chain(fields.into_iter().map(|f| (f.name, f.ty, f.doc)))
            .collect();
        if rows.is_empty() {
            out.push_str("No fields.\n\n");
        } else {
            table(&mut out, rows);
        }
    }
    Ok(out)
}

/// The event catalogue: every domain event's type id, what it records, and its payload.
fn events_page() -> Result<String, String> {
    let src = read("src/domain/events.rs");
    let variants = enum_variants(&src, "DomainEvent");
    for id in correx::DomainEvent::TYPE_IDS {
        if !variants.iter().any(|v| v.id == *id) {
            return Err(format!("the catalogue found no variant for type id {id}"));
        }
    }
    let mut out = String::from("# Event catalogue (generated)\n\n");
    out.push_str(NOTE);
    out.push_str(
        "Every event correx appends itself, by type id (schema version 1), with its payload's \
         fields, read from `DomainEvent` in src/domain/events.rs. Readers ignore fields they \
         do not know; an optional field is absent rather than `null` when it has nothing to \
         say.\n\n",
    );
    for v in &variants {
        out.push_str(&format!("## `{}`\n\n{}\n\n", v.id, cell(&v.doc)));
        let rows: Vec<_> = v
            .fields
            .iter()
            .map(|f| (f.name.clone(), f.ty.clone(), f.doc.clone()))
            .collect();
        table(&mut out, rows);
    }
    Ok(out)
}

fn check(path: &str, generated: &str) -> Result<(), Box<dyn std::error::Error>> {
    let path = root().join(path);
    if std::env::var_os("CORREX_BLESS").is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(&path, generated)?;
        return Ok(());
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is stale; regenerate it with CORREX_BLESS=1 cargo test --test tests docs",
        path.display()
    );
    Ok(())
}

#[test]
fn docs_config_reference_matches_the_sections() -> Result<(), Box<dyn std::error::Error>> {
    let page = config_page()?;
    // Every built-in tool has its section on the page.
    for row in correx::BUILTIN_TOOLS {
        assert!(
            page.contains(&format!("tools.{}", row.name)),
            "tools.{} has no section in the config reference",
            row.name
        );
    }
    check("docs/reference/config.md", &page)
}

#[test]
fn docs_event_catalogue_matches_the_domain_events() -> Result<(), Box<dyn std::error::Error>> {
    check("docs/reference/events.md", &events_page()?)
}

#[test]
fn docs_generator_reads_fields_docs_and_renames() {
    let src = "/// A thing.\npub struct T {\n    /// The name,\n    /// in two lines.\n    \
               #[serde(rename = \"n_ms\", with = \"x\")]\n    pub n: Duration,\n    \
               #[cfg(feature = \"test-hooks\")]\n    pub hook: bool,\n    #[serde(skip)]\n    \
               pub skipped: u8,\n    /// See [`Other`](crate::Other).\n    pub other: Option<u32>,\n}\n";
    let fields = struct_fields(src, "T").unwrap_or_default();
    let names: Vec<_> = fields.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["n_ms", "other"]);
    assert_eq!(fields[0].doc, "The name, in two lines.");
    assert_eq!(fields[0].ty, "Duration");
    assert_eq!(cell(&fields[1].doc), "See `Other`.");
}
