//! The baseline the benches measure correx against: a minimal HTTP/1.1 client on one
//! kept-alive connection (included by path: each bench is a crate of its own).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

pub struct BareClient {
    reader: BufReader<TcpStream>,
}

impl BareClient {
    pub fn connect(port: u16) -> std::io::Result<Self> {
        let s = TcpStream::connect(("127.0.0.1", port))?;
        s.set_nodelay(true)?;
        Ok(BareClient {
            reader: BufReader::new(s),
        })
    }

    /// Sends a request and reads an answer with a Content-Length: its status and body.
    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &str,
    ) -> std::io::Result<(u16, String)> {
        write!(
            self.reader.get_mut(),
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        let mut status = 0;
        let mut len = 0;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            if status == 0 {
                status = line
                    .split_whitespace()
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(0);
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut buf = vec![0; len];
        self.reader.read_exact(&mut buf)?;
        Ok((status, String::from_utf8_lossy(&buf).into_owned()))
    }

    /// POSTs a JSON body; the answer's body.
    pub fn post(&mut self, path: &str, body: &str) -> std::io::Result<String> {
        self.request("POST", path, body).map(|(_, b)| b)
    }

    /// POSTs a streaming body and reads the chunked event stream to its end, calling
    /// `on_event` with each `data:` payload.
    pub fn post_sse(
        &mut self,
        path: &str,
        body: &str,
        mut on_event: impl FnMut(&str),
    ) -> std::io::Result<()> {
        write!(
            self.reader.get_mut(),
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )?;
        loop {
            let mut line = String::new();
            self.reader.read_line(&mut line)?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut pending = Vec::new();
        loop {
            let mut size = String::new();
            self.reader.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim(), 16).map_err(std::io::Error::other)?;
            if n == 0 {
                let mut end = String::new();
                self.reader.read_line(&mut end)?;
                return Ok(());
            }
            let start = pending.len();
            pending.resize(start + n, 0);
            self.reader.read_exact(&mut pending[start..])?;
            let mut crlf = [0; 2];
            self.reader.read_exact(&mut crlf)?;
            while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                let line = String::from_utf8_lossy(&line);
                if let Some(data) = line.trim_end().strip_prefix("data: ") {
                    on_event(data);
                }
            }
        }
    }
}
