//! A job's output stream: the last `cap` bytes it wrote, addressed by absolute offsets, so a
//! reader with a cursor learns how much it missed when the writer outran it.

use std::collections::VecDeque;

/// One stream's tail.
#[derive(Debug)]
pub(crate) struct Tail {
    cap: usize,
    data: VecDeque<u8>,
    /// The offset of `data[0]` in everything the stream wrote.
    start: u64,
}

/// What a read from a cursor got.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Slice {
    pub bytes: Vec<u8>,
    /// The cursor to read from next.
    pub next: u64,
    /// Bytes between the cursor and the oldest one still held: written, never read, dropped.
    pub dropped: u64,
}

impl Tail {
    pub fn new(cap: usize) -> Tail {
        Tail {
            cap: cap.max(1),
            data: VecDeque::new(),
            start: 0,
        }
    }

    /// Every byte the stream wrote, kept or not.
    pub fn written(&self) -> u64 {
        self.start + self.data.len() as u64
    }

    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= self.cap {
            self.start = self.written() + (bytes.len() - self.cap) as u64;
            self.data.clear();
            self.data.extend(&bytes[bytes.len() - self.cap..]);
            return;
        }
        self.data.extend(bytes);
        let over = self.data.len().saturating_sub(self.cap);
        if over > 0 {
            self.data.drain(..over);
            self.start += over as u64;
        }
    }

    /// Up to `max` bytes from `cursor` (a cursor past the end reads nothing, from the end).
    pub fn read(&self, cursor: u64, max: usize) -> Slice {
        let from = cursor.clamp(self.start, self.written());
        let dropped = from - cursor.min(from);
        let skip = (from - self.start) as usize;
        let take = (self.data.len() - skip).min(max);
        let bytes: Vec<u8> = self.data.range(skip..skip + take).copied().collect();
        Slice {
            next: from + take as u64,
            bytes,
            dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_what_it_has_not_read_and_learns_what_it_missed() {
        let mut t = Tail::new(8);
        t.push(b"hello");
        let a = t.read(0, 100);
        assert_eq!(
            (a.bytes.as_slice(), a.next, a.dropped),
            (&b"hello"[..], 5, 0)
        );
        t.push(b" world");
        // "hello world" is 11 bytes; the last 8 are kept: "lo world".
        let b = t.read(a.next, 100);
        assert_eq!(
            (b.bytes.as_slice(), b.next, b.dropped),
            (&b" world"[..], 11, 0)
        );
        let c = t.read(0, 100);
        assert_eq!(
            (c.bytes.as_slice(), c.next, c.dropped),
            (&b"lo world"[..], 11, 3)
        );
        let d = t.read(0, 2);
        assert_eq!((d.bytes.as_slice(), d.next, d.dropped), (&b"lo"[..], 5, 3));
        // One write larger than the whole tail keeps its own last bytes.
        t.push(b"0123456789abcdef");
        assert_eq!(t.written(), 27);
        let e = t.read(11, 100);
        assert_eq!(
            (e.bytes.as_slice(), e.next, e.dropped),
            (&b"89abcdef"[..], 27, 8)
        );
        // A cursor from the future reads nothing and stays at the end.
        assert_eq!(t.read(1000, 10).next, 27);
    }
}
