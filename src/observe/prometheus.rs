//! Prometheus text exposition (format 0.0.4): families with `# HELP` and `# TYPE`, samples with
//! escaped label values, histograms as cumulative `_bucket{le}`, `_sum` and `_count`.

use std::fmt::Write;

/// A histogram's state: counts per upper bound (not cumulative), their sum and count.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Upper bounds, increasing; `+Inf` is implied.
    pub bounds: &'static [f64],
    /// Observations at or below each bound and above the one before; one more for `+Inf`.
    pub counts: Vec<u64>,
    /// The sum of every observation.
    pub sum: f64,
}

impl Histogram {
    /// An empty histogram over `bounds`.
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    /// Counts one observation.
    pub fn observe(&mut self, value: f64) {
        let i = self
            .bounds
            .iter()
            .position(|b| value <= *b)
            .unwrap_or(self.bounds.len());
        if let Some(c) = self.counts.get_mut(i) {
            *c += 1;
        }
        self.sum += value;
    }

    /// How many observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Durations of runs and requests, in seconds.
pub const SECONDS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// A text being written.
#[derive(Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// Starts the family `name` (`kind`: counter, gauge or histogram).
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// One sample.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        write_labels(&mut self.text, labels, None);
        let _ = writeln!(self.text, " {}", number(value));
    }

    /// A histogram's samples under `name`.
    pub fn histogram(&mut self, name: &str, labels: &[(&str, &str)], h: &Histogram) {
        let mut cumulative = 0;
        for (i, count) in h.counts.iter().enumerate() {
            cumulative += count;
            let le = h.bounds.get(i).map_or("+Inf".to_owned(), |b| number(*b));
            let _ = write!(self.text, "{name}_bucket");
            write_labels(&mut self.text, labels, Some(&le));
            let _ = writeln!(self.text, " {cumulative}");
        }
        self.sample(&format!("{name}_sum"), labels, h.sum);
        self.sample(&format!("{name}_count"), labels, cumulative as f64);
    }

    /// The text. A NUL byte (which a C string cannot carry) is dropped from it.
    pub fn finish(self) -> String {
        if self.text.contains('\0') {
            self.text.replace('\0', "")
        } else {
            self.text
        }
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        let v = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        let _ = write!(out, "{k}=\"{v}\"");
    }
    out.push('}');
}

/// A value as Prometheus reads it: whole numbers without a fraction, no exponent.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped_and_buckets_cumulate() {
        let mut x = Exposition::default();
        x.family("t_total", "counter", "a\nb");
        x.sample("t_total", &[("tool", "a\"b\\c\nd")], 3.0);
        let mut h = Histogram::new(&[0.5, 1.0]);
        for v in [0.25, 0.75, 2.0, 0.5] {
            h.observe(v);
        }
        x.histogram("d", &[("m", "x")], &h);
        let text = x.finish();
        assert!(text.contains("# HELP t_total a\\nb\n"), "{text}");
        assert!(text.contains(r#"t_total{tool="a\"b\\c\nd"} 3"#), "{text}");
        assert!(text.contains("d_bucket{m=\"x\",le=\"0.5\"} 2\n"), "{text}");
        assert!(text.contains("d_bucket{m=\"x\",le=\"1\"} 3\n"), "{text}");
        assert!(text.contains("d_bucket{m=\"x\",le=\"+Inf\"} 4\n"), "{text}");
        assert!(text.contains("d_sum{m=\"x\"} 3.5\n"), "{text}");
        assert!(text.contains("d_count{m=\"x\"} 4\n"), "{text}");
    }
}
