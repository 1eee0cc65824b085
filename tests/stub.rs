//! A STUB HTTP server, for what a real llama-server will not do on demand (a 500, a malformed
//! body, a context error) and to capture the exact request a client sent. Never used where the
//! real server can answer.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc;
use std::time::Duration;

/// One canned answer.
pub struct Canned {
    pub status: u16,
    pub body: String,
    /// Wait this long before answering (to trigger client timeouts).
    pub delay: Duration,
    /// The Content-Type sent.
    pub content_type: &'static str,
}

/// A stub answering each connection's first request with the next canned answer and sending
/// each request body it got on the returned channel.
pub struct StubServer {
    pub port: u16,
    pub requests: mpsc::Receiver<String>,
}

impl StubServer {
    pub fn start(answers: Vec<Canned>) -> StubServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("stub bind");
        let port = listener.local_addr().expect("stub addr").port();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for answer in answers {
                let Ok((stream, _)) = listener.accept() else {
                    return;
                };
                let mut reader = BufReader::new(stream);
                let mut len = 0usize;
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        break;
                    }
                    let lower = line.to_ascii_lowercase();
                    if let Some(v) = lower.strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    if line == "\r\n" {
                        break;
                    }
                }
                let mut body = vec![0u8; len];
                let _ = reader.read_exact(&mut body);
                let _ = tx.send(String::from_utf8_lossy(&body).into_owned());
                std::thread::sleep(answer.delay);
                let mut stream = reader.into_inner();
                let _ = write!(
                    stream,
                    "HTTP/1.1 {} X\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                    answer.status,
                    answer.content_type,
                    answer.body.len(),
                    answer.body
                );
            }
        });
        StubServer { port, requests: rx }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

pub fn canned(status: u16, body: &str) -> Canned {
    Canned {
        status,
        body: body.to_owned(),
        delay: Duration::ZERO,
        content_type: "application/json",
    }
}

/// A 200 event stream with this body, as a streaming server frames it.
pub fn sse(body: &str) -> Canned {
    Canned {
        content_type: "text/event-stream",
        ..canned(200, body)
    }
}
