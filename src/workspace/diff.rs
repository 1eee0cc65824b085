//! A change set as a unified diff of its text files (`diff -u` with three lines of context),
//! rendered while the layer still holds the run's side: binary and large files are named
//! only, and the whole is bounded.

use super::changes::{ChangeKind, ChangeSet, EntryType};
use super::layer::RunLayer;
use std::path::Path;

/// Files larger than this are named, not diffed.
const MAX_FILE: u64 = 1 << 20;
/// The most text a rendering holds; past it, files are named only.
pub(crate) const MAX_TEXT: usize = 256 * 1024;
/// Past this many differing lines, a file's diff is one hunk of all its lines.
const MAX_EDITS: usize = 1000;

/// A rendered diff, and whether files were left out to bound it.
#[derive(Debug, Default)]
pub(crate) struct Rendered {
    pub text: String,
    pub truncated: bool,
}

/// The diff of every text file `set` adds, modifies or deletes.
pub(crate) fn render(layer: &RunLayer, set: &ChangeSet) -> Rendered {
    let mut out = Rendered::default();
    for c in &set.changes {
        if c.entry_type != EntryType::File
            || !matches!(
                c.kind,
                ChangeKind::Added | ChangeKind::Modified | ChangeKind::Deleted
            )
        {
            continue;
        }
        let Some((k, rel)) = layer
            .record
            .roots
            .iter()
            .enumerate()
            .filter_map(|(k, r)| c.path.strip_prefix(r).ok().map(|rel| (k, rel)))
            .max_by_key(|(_, rel)| std::cmp::Reverse(rel.as_os_str().len()))
        else {
            continue;
        };
        let before = (c.kind != ChangeKind::Added).then(|| c.path.clone());
        let after = (c.kind != ChangeKind::Deleted).then(|| layer.upper(k).join(rel));
        let shown = c.path.to_string_lossy();
        let piece = file_diff(&shown, before.as_deref(), after.as_deref());
        if out.text.len() + piece.len() > MAX_TEXT {
            out.truncated = true;
            continue;
        }
        out.text.push_str(&piece);
    }
    out
}

/// A file's text, or `None` for a large or binary one (absent: empty).
fn text_of(p: Option<&Path>) -> Option<String> {
    let Some(p) = p else {
        return Some(String::new());
    };
    let m = std::fs::metadata(p).ok()?;
    if m.len() > MAX_FILE {
        return None;
    }
    let bytes = std::fs::read(p).ok()?;
    if bytes.contains(&0) {
        return None;
    }
    String::from_utf8(bytes).ok()
}

fn file_diff(shown: &str, before: Option<&Path>, after: Option<&Path>) -> String {
    let a_name = if before.is_some() {
        format!("a{shown}")
    } else {
        "/dev/null".to_owned()
    };
    let b_name = if after.is_some() {
        format!("b{shown}")
    } else {
        "/dev/null".to_owned()
    };
    let (Some(a), Some(b)) = (text_of(before), text_of(after)) else {
        return format!("Binary files {a_name} and {b_name} differ\n");
    };
    let body = unified(&a, &b);
    if body.is_empty() {
        return String::new();
    }
    format!("--- {a_name}\n+++ {b_name}\n{body}")
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Edit {
    Same,
    Del,
    Ins,
}

/// The hunks of `a` against `b`, as `diff -u` prints them.
pub(crate) fn unified(a: &str, b: &str) -> String {
    let (x, y): (Vec<&str>, Vec<&str>) = (lines(a), lines(b));
    let script = edits(&x, &y);
    let mut out = String::new();
    // Each hunk: the edits with up to 3 unchanged lines either side.
    let changed: Vec<usize> = script
        .iter()
        .enumerate()
        .filter(|(_, e)| **e != Edit::Same)
        .map(|(i, _)| i)
        .collect();
    let mut i = 0;
    while i < changed.len() {
        let start = changed[i].saturating_sub(3);
        let mut end = changed[i];
        while i < changed.len() && changed[i] <= end + 6 {
            end = changed[i];
            i += 1;
        }
        let end = (end + 3).min(script.len() - 1);
        // Line numbers where the hunk starts in each file.
        let (mut ai, mut bi) = (0, 0);
        for e in &script[..start] {
            match e {
                Edit::Same => {
                    ai += 1;
                    bi += 1;
                }
                Edit::Del => ai += 1,
                Edit::Ins => bi += 1,
            }
        }
        let (mut body, mut alen, mut blen) = (String::new(), 0, 0);
        let (mut ax, mut by) = (ai, bi);
        for e in &script[start..=end] {
            match e {
                Edit::Same => {
                    body.push(' ');
                    body.push_str(x[ax]);
                    ax += 1;
                    by += 1;
                    alen += 1;
                    blen += 1;
                }
                Edit::Del => {
                    body.push('-');
                    body.push_str(x[ax]);
                    ax += 1;
                    alen += 1;
                }
                Edit::Ins => {
                    body.push('+');
                    body.push_str(y[by]);
                    by += 1;
                    blen += 1;
                }
            }
            if !body.ends_with('\n') {
                body.push_str("\n\\ No newline at end of file\n");
            }
        }
        let at = |start: usize, len: usize| if len == 0 { start } else { start + 1 };
        out.push_str(&format!(
            "@@ -{},{alen} +{},{blen} @@\n{body}",
            at(ai, alen),
            at(bi, blen)
        ));
    }
    out
}

/// Lines with their newlines.
fn lines(s: &str) -> Vec<&str> {
    s.split_inclusive('\n').collect()
}

/// A shortest edit script of `x` into `y` (Myers), or, past [`MAX_EDITS`], all of `x` deleted
/// and all of `y` inserted around their common ends.
fn edits(x: &[&str], y: &[&str]) -> Vec<Edit> {
    // Common ends first: most changes are small.
    let pre = x.iter().zip(y).take_while(|(a, b)| a == b).count();
    let suf = x[pre..]
        .iter()
        .rev()
        .zip(y[pre..].iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    let (xm, ym) = (&x[pre..x.len() - suf], &y[pre..y.len() - suf]);
    let mut out = vec![Edit::Same; pre];
    out.extend(myers(xm, ym).unwrap_or_else(|| {
        let mut v = vec![Edit::Del; xm.len()];
        v.extend(std::iter::repeat_n(Edit::Ins, ym.len()));
        v
    }));
    out.extend(std::iter::repeat_n(Edit::Same, suf));
    out
}

fn myers(x: &[&str], y: &[&str]) -> Option<Vec<Edit>> {
    let (n, m) = (x.len() as isize, y.len() as isize);
    let max = (n + m) as usize;
    let off = max as isize + 1;
    let mut v = vec![0isize; 2 * max + 3];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    for d in 0..=max as isize {
        if d as usize > MAX_EDITS {
            return None;
        }
        // The state before this round, where the rounds to come read it: k in -d-1..=d+1.
        trace.push(v[(off - d - 1) as usize..=(off + d + 1) as usize].to_vec());
        let mut k = -d;
        while k <= d {
            let down = k == -d || (k != d && v[(off + k - 1) as usize] < v[(off + k + 1) as usize]);
            let mut xi = if down {
                v[(off + k + 1) as usize]
            } else {
                v[(off + k - 1) as usize] + 1
            };
            let mut yi = xi - k;
            while xi < n && yi < m && x[xi as usize] == y[yi as usize] {
                xi += 1;
                yi += 1;
            }
            v[(off + k) as usize] = xi;
            if xi >= n && yi >= m {
                return Some(backtrack(&trace, x.len(), y.len(), d));
            }
            k += 2;
        }
    }
    None
}

fn backtrack(trace: &[Vec<isize>], n: usize, m: usize, last: isize) -> Vec<Edit> {
    let (mut xi, mut yi) = (n as isize, m as isize);
    let mut out = Vec::new();
    for d in (0..=last).rev() {
        if d == 0 {
            while xi > 0 && yi > 0 {
                out.push(Edit::Same);
                xi -= 1;
                yi -= 1;
            }
            break;
        }
        // The state before round d, and the step that round took.
        let saved = &trace[d as usize];
        let v = |k: isize| saved[(k + d + 1) as usize];
        let k = xi - yi;
        let down = k == -d || (k != d && v(k - 1) < v(k + 1));
        let pk = if down { k + 1 } else { k - 1 };
        let px = v(pk);
        let py = px - pk;
        while xi > px && yi > py {
            out.push(Edit::Same);
            xi -= 1;
            yi -= 1;
        }
        if down {
            out.push(Edit::Ins);
            yi -= 1;
        } else {
            out.push(Edit::Del);
            xi -= 1;
        }
    }
    out.reverse();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Applies a script to `x`, giving what it makes of it.
    fn apply(x: &[&str], y: &[&str], script: &[Edit]) -> Vec<String> {
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        for e in script {
            match e {
                Edit::Same => {
                    assert_eq!(x[i], y[j]);
                    out.push(x[i].to_owned());
                    i += 1;
                    j += 1;
                }
                Edit::Del => i += 1,
                Edit::Ins => {
                    out.push(y[j].to_owned());
                    j += 1;
                }
            }
        }
        assert_eq!((i, j), (x.len(), y.len()));
        out
    }

    #[test]
    fn a_script_turns_one_text_into_the_other() {
        let cases = [
            ("", "a\n"),
            ("a\n", ""),
            ("a\nb\nc\n", "a\nc\n"),
            ("a\nb\nc\n", "x\nb\ny\nz\n"),
            ("a\nb\nc\nd\ne\nf\n", "b\nc\nq\ne\nf\ng\n"),
            ("same\n", "same\n"),
        ];
        for (a, b) in cases {
            let (x, y) = (lines(a), lines(b));
            let s = edits(&x, &y);
            assert_eq!(apply(&x, &y, &s).concat(), b, "{a:?} -> {b:?}");
        }
    }

    #[test]
    fn a_change_renders_as_diff_does() {
        let a = "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\n";
        let b = "one\ntwo\nthree\nFOUR\nfive\nsix\nseven\neight\n";
        assert_eq!(
            unified(a, b),
            "@@ -1,7 +1,7 @@\n one\n two\n three\n-four\n+FOUR\n five\n six\n seven\n"
        );
        assert_eq!(unified("", "new\n"), "@@ -0,0 +1,1 @@\n+new\n");
        assert_eq!(unified("x\n", "x\n"), "");
    }
}
