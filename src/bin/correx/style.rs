//! Terminal output: aligned columns, colour only on a terminal with `NO_COLOR` unset, and
//! writes that end the program quietly when the reader went away (`| head`).

use std::io::{IsTerminal, Write};

/// How events are printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for people.
    Table { colour: bool },
    /// One JSON object a line.
    JsonLines,
}

impl Format {
    /// A table on a terminal, JSON lines when asked or piped (as `journalctl -o json`).
    pub fn choose(json: bool) -> Format {
        let tty = std::io::stdout().is_terminal();
        if json || !tty {
            Format::JsonLines
        } else {
            Format::Table {
                colour: std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            }
        }
    }
}

/// The ANSI colour of an event type.
pub fn colour_of(type_id: &str) -> &'static str {
    match type_id {
        t if t.ends_with("failed") || t.ends_with("rejected") => "\x1b[31m",
        t if t.ends_with("cancelled") || t.ends_with("failover") => "\x1b[33m",
        t if t.ends_with("completed") => "\x1b[32m",
        t if t.starts_with("model.") => "\x1b[36m",
        _ => "\x1b[35m",
    }
}

/// Writes one line to stdout; a reader that went away ends the program with success, as for
/// `tail -f | head` (Rust ignores SIGPIPE, so the write fails with EPIPE instead).
pub fn line(text: &str) {
    let mut out = std::io::stdout().lock();
    let written = out
        .write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("correx: writing the output: {e}");
        std::process::exit(1);
    }
}

/// Whether stdout is a pipe whose reader closed it (`| head` exited): such a pipe polls as
/// an error even with nothing to write.
pub fn reader_gone() -> bool {
    let mut p = libc::pollfd {
        fd: 1,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd on our own stdout, no timeout; poll only reads and writes it.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLERR | libc::POLLHUP) != 0
}
