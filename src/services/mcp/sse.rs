//! Server-sent events as a Streamable HTTP server sends them: `data:` lines joined into one
//! event's data, its `id:` (what a resumption names in `Last-Event-ID`) and the `retry:` delay
//! a reconnection waits; comments and other fields are skipped.

use std::io::{self, BufRead, Read};
use std::time::Duration;

/// One event: its data (the lines joined with `\n`), and its id when it had one.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Event {
    pub data: String,
    pub id: Option<String>,
}

/// Reads events from a stream, keeping the last id and retry delay seen.
pub(crate) struct Events<R> {
    reader: R,
    /// The longest event (its data) accepted; a longer one is an error.
    max_bytes: usize,
    /// The id of the last event that had one (kept across events, as the spec says).
    pub last_id: Option<String>,
    /// The server's last `retry:` delay.
    pub retry: Option<Duration>,
}

fn too_long(max: usize) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("an event longer than {max} bytes"),
    )
}

impl<R: BufRead> Events<R> {
    pub(crate) fn new(reader: R, max_bytes: usize) -> Events<R> {
        Events {
            reader,
            max_bytes,
            last_id: None,
            retry: None,
        }
    }

    /// The next event; `None` at the end of the stream (an event cut off by the end is
    /// dropped, as the spec says). An event without data (a priming event, carrying only an
    /// id and a retry) is returned with empty data.
    ///
    /// # Errors
    /// A read failure, or an event past the bound.
    pub(crate) fn next_event(&mut self) -> io::Result<Option<Event>> {
        let mut data = String::new();
        let mut seen = false;
        let mut had_data = false;
        let mut line = Vec::new();
        loop {
            line.clear();
            let limit = self.max_bytes as u64 + 2;
            let n = self
                .reader
                .by_ref()
                .take(limit)
                .read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(None);
            }
            if line.last() != Some(&b'\n') && n as u64 >= limit {
                return Err(too_long(self.max_bytes));
            }
            while matches!(line.last(), Some(b'\n' | b'\r')) {
                line.pop();
            }
            if line.is_empty() {
                if seen {
                    return Ok(Some(Event {
                        data,
                        id: self.last_id.clone(),
                    }));
                }
                continue;
            }
            let text = String::from_utf8_lossy(&line);
            let (field, value) = match text.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (text.as_ref(), ""),
            };
            match field {
                "" => {} // a comment
                "data" => {
                    if had_data {
                        data.push('\n');
                    }
                    if data.len() + value.len() > self.max_bytes {
                        return Err(too_long(self.max_bytes));
                    }
                    data.push_str(value);
                    (seen, had_data) = (true, true);
                }
                "id" if !value.contains('\0') => {
                    self.last_id = Some(value.to_owned());
                    seen = true;
                }
                "retry" => {
                    if let Ok(ms) = value.trim().parse::<u64>() {
                        self.retry = Some(Duration::from_millis(ms));
                    }
                }
                _ => seen = true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(text: &str, max: usize) -> (Vec<Event>, Option<String>, Option<Duration>) {
        let mut ev = Events::new(text.as_bytes(), max);
        let mut out = Vec::new();
        while let Some(e) = ev.next_event().expect("events") {
            out.push(e);
        }
        (out, ev.last_id, ev.retry)
    }

    #[test]
    fn events_join_data_lines_and_keep_ids_and_retry() {
        let (got, last, retry) = events(
            ": a comment\nid: e1\nretry: 500\ndata: \n\nevent: message\nid: e2\ndata: {\"a\":\ndata: 1}\r\n\r\ndata: x",
            1024,
        );
        assert_eq!(
            got,
            [
                Event {
                    data: String::new(),
                    id: Some("e1".into())
                },
                Event {
                    data: "{\"a\":\n1}".into(),
                    id: Some("e2".into())
                },
            ]
        );
        // The last event, cut off by the end, is not returned.
        assert_eq!(last.as_deref(), Some("e2"));
        assert_eq!(retry, Some(Duration::from_millis(500)));
    }

    #[test]
    fn an_event_past_the_bound_is_an_error() {
        let long = format!("data: {}\n\n", "x".repeat(100));
        let mut ev = Events::new(long.as_bytes(), 50);
        assert!(ev.next_event().is_err());
        let many = "data: 0123456789\n".repeat(10) + "\n";
        let mut ev = Events::new(many.as_bytes(), 50);
        assert!(ev.next_event().is_err());
    }
}
