//! What `flanneld doctor` prints: one finding per thing looked at, as text or JSON.

use serde::Serialize;
use std::fmt::Write as _;

/// One thing looked at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// `route`, `neighbour`, `fdb`, `device`, `lease`, `subnet.env`, `mtu`, `masquerade`, ...
    pub kind: String,
    /// `missing`, `extra`, `wrong` or `ok`.
    pub state: String,
    pub detail: String,
}

impl Finding {
    pub fn new(kind: &str, state: &str, detail: impl Into<String>) -> Finding {
        Finding {
            kind: kind.into(),
            state: state.into(),
            detail: detail.into(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct Report {
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn problems(&self) -> usize {
        self.findings.iter().filter(|f| f.state != "ok").count()
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        for f in &self.findings {
            let mark = if f.state == "ok" { "ok  " } else { "FAIL" };
            let _ = writeln!(out, "{mark} {:<10} {:<8} {}", f.kind, f.state, f.detail);
        }
        let _ = match self.problems() {
            0 => writeln!(out, "all right"),
            n => writeln!(out, "{n} problem(s)"),
        };
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_marks_each_problem_and_counts_them() {
        let report = Report {
            findings: vec![
                Finding::new(
                    "route",
                    "ok",
                    "10.5.2.0/24 via 10.5.2.0 dev flannel.1 onlink",
                ),
                Finding::new("fdb", "extra", "07:07:07:07:07:07 dst 192.168.0.7"),
            ],
        };
        assert_eq!(report.problems(), 1);
        assert_eq!(
            report.text(),
            "ok   route      ok       10.5.2.0/24 via 10.5.2.0 dev flannel.1 onlink\n\
             FAIL fdb        extra    07:07:07:07:07:07 dst 192.168.0.7\n\
             1 problem(s)\n"
        );
        assert!(Report::default().text().ends_with("all right\n"));
    }
}
