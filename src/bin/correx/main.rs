//! `correx`: read, follow and verify the event log, show a session or a staged run's changes,
//! list and decide approval requests, check the machine, try a tool.
//!
//! Every failure is one line on stderr naming the problem, and a non-zero exit: 2 for a usage
//! error, 1 for anything else (a missing file, a log that is not sound, a tool that failed).

mod approvals;
mod args;
mod doctor;
mod evidence;
mod log;
mod mcp;
mod run;
mod session;
mod style;
mod tool;
mod trace;

use args::{Args, UsageError};
use std::process::ExitCode;

const USAGE: &str = "\
usage:
  correx log show DB [--stream S] [--type T] [--after POS] [--since TIME] [--limit N] [--json]
  correx log tail DB [-f] [-n N] [--json]
  correx log verify DB [--seal FILE [--key-file KEY | --public-key PUB]] [--all]
  correx log seal DB [--key-file KEY | --signing-key KEY] [--append-to FILE]
  correx log erase DB --position N --reason R [--by NAME]
  correx log keygen KEYFILE
  correx log export-session DB SESSION --bundle FILE --signing-key KEY
  correx log verify-bundle FILE --public-key PUB [--checkpoint FILE]
  correx log prove-consistency DB --from FILE --to FILE --public-key PUB > proof.json
  correx log verify-consistency PROOF --public-key PUB
  correx log export DB --otlp URL [--service NAME]
  correx log audit DB [--session S]
  correx log trace DB [--session S] > trace.json
  correx session show DB S [--json]
  correx session signal DB S NAME [PAYLOAD] [--by NAME]
  correx run diff DB INVOCATION [--json]
  correx approvals list DB [--all] [--json]
  correx approvals decide DB SESSION ID approve|deny [--remember] [--by NAME] [--reason R]
  correx mcp pin DB SERVER [TOOL...]
  correx metrics DB
  correx doctor [--config FILE] [--no-serve]
  correx tool run --config FILE [--session S] TOOL JSON

TIME is RFC 3339 (2026-12-01T12:00:00Z) or an age (90s, 10m, 2h, 1d).";

/// What a command failed with.
pub enum Failure {
    /// The command line is wrong.
    Usage(String),
    /// The command ran and could not do its job.
    Run(String),
    /// The command did its job and found something wrong (already printed).
    Found,
}

impl From<UsageError> for Failure {
    fn from(e: UsageError) -> Self {
        Failure::Usage(e.0)
    }
}

fn main() -> ExitCode {
    // A bug must still end in one line, not a backtrace.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("correx: internal error: {info}");
    }));
    // `std::env::args` panics on a word that is not UTF-8: take them as they come.
    let argv: Result<Vec<String>, Failure> = std::env::args_os()
        .skip(1)
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                Failure::Usage(format!(
                    "argument {} ({}) is not valid UTF-8",
                    i + 1,
                    a.to_string_lossy()
                ))
            })
        })
        .collect();
    match argv.and_then(|argv| run(&argv)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("correx: {msg}; run `correx help` for usage");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("correx: {msg}");
            ExitCode::from(1)
        }
        Err(Failure::Found) => ExitCode::from(1),
    }
}

fn run(argv: &[String]) -> Result<(), Failure> {
    let words: Vec<&str> = argv.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] | ["help" | "--help" | "-h", ..] => {
            println!("{USAGE}");
            Ok(())
        }
        ["log", "show", rest @ ..] => log::show(Args::parse(
            rest,
            &["--stream", "--type", "--after", "--since", "--limit"],
            &["--json"],
        )?),
        ["log", "tail", rest @ ..] => {
            log::tail(Args::parse(rest, &["-n"], &["-f", "--follow", "--json"])?)
        }
        ["log", "verify", rest @ ..] => log::verify(Args::parse(
            rest,
            &["--seal", "--key-file", "--public-key"],
            &["--all"],
        )?),
        ["log", "export", rest @ ..] => {
            log::export(Args::parse(rest, &["--otlp", "--service"], &[])?)
        }
        ["log", "seal", rest @ ..] => log::seal(Args::parse(
            rest,
            &["--key-file", "--signing-key", "--append-to"],
            &[],
        )?),
        ["log", "erase", rest @ ..] => {
            evidence::erase(Args::parse(rest, &["--position", "--reason", "--by"], &[])?)
        }
        ["log", "keygen", rest @ ..] => evidence::keygen(Args::parse(rest, &[], &[])?),
        ["log", "export-session", rest @ ..] => {
            evidence::export(Args::parse(rest, &["--bundle", "--signing-key"], &[])?)
        }
        ["log", "verify-bundle", rest @ ..] => {
            evidence::verify(Args::parse(rest, &["--public-key", "--checkpoint"], &[])?)
        }
        ["log", "prove-consistency", rest @ ..] => {
            evidence::prove(Args::parse(rest, &["--from", "--to", "--public-key"], &[])?)
        }
        ["log", "verify-consistency", rest @ ..] => {
            evidence::verify_consistency(Args::parse(rest, &["--public-key"], &[])?)
        }
        ["log", "audit", rest @ ..] => log::audit(Args::parse(rest, &["--session"], &[])?),
        ["log", "trace", rest @ ..] => trace::trace(Args::parse(rest, &["--session"], &[])?),
        ["metrics", rest @ ..] => log::metrics(Args::parse(rest, &[], &[])?),
        ["session", "show", rest @ ..] => session::show(Args::parse(rest, &[], &["--json"])?),
        ["session", "signal", rest @ ..] => session::signal(Args::parse(rest, &["--by"], &[])?),
        ["run", "diff", rest @ ..] => run::diff(Args::parse(rest, &[], &["--json"])?),
        ["run", ..] => Err(Failure::Usage("`correx run` has one command: diff".into())),
        ["approvals", "list", rest @ ..] => {
            approvals::list(Args::parse(rest, &[], &["--all", "--json"])?)
        }
        ["approvals", "decide", rest @ ..] => {
            approvals::decide(Args::parse(rest, &["--by", "--reason"], &["--remember"])?)
        }
        ["mcp", "pin", rest @ ..] => mcp::pin(Args::parse(rest, &[], &[])?),
        ["mcp", ..] => Err(Failure::Usage("`correx mcp` has one command: pin".into())),
        ["approvals", ..] => Err(Failure::Usage(
            "`correx approvals` needs list or decide".into(),
        )),
        ["session", ..] => Err(Failure::Usage(
            "`correx session` needs show or signal".into(),
        )),
        ["doctor", rest @ ..] => doctor::doctor(Args::parse(rest, &["--config"], &["--no-serve"])?),
        ["tool", "run", rest @ ..] => {
            tool::run(Args::parse(rest, &["--config", "--session"], &[])?)
        }
        ["log", other, ..] => Err(Failure::Usage(format!("unknown log command {other:?}"))),
        ["log"] => Err(Failure::Usage(
            "`correx log` needs show, tail, verify, seal, export, audit or trace".into(),
        )),
        ["tool", ..] => Err(Failure::Usage("`correx tool` has one command: run".into())),
        [other, ..] => Err(Failure::Usage(format!("unknown command {other:?}"))),
    }
}
