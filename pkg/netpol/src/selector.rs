//! Label selectors as the API defines them: `matchLabels` and `matchExpressions` (In, NotIn,
//! Exists, DoesNotExist) all holding; an empty selector selects everything. One the API server
//! would refuse (an unknown operator, In or NotIn without values, Exists with values) selects
//! nothing and says why.

use crate::model::{LabelSelector, Labels};

#[derive(Debug, Clone, PartialEq, Eq)]
enum Test {
    Equals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A selector checked once, then matched against many label sets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    tests: Vec<Test>,
}

impl Selector {
    /// Selects everything.
    pub fn everything() -> Selector {
        Selector { tests: Vec::new() }
    }

    pub fn parse(s: &LabelSelector) -> Result<Selector, String> {
        let mut tests: Vec<Test> = s
            .match_labels
            .iter()
            .map(|(k, v)| Test::Equals(k.clone(), v.clone()))
            .collect();
        for r in &s.match_expressions {
            let key = r.key.clone();
            let test = match (r.operator.as_str(), r.values.is_empty()) {
                ("In", false) => Test::In(key, r.values.clone()),
                ("NotIn", false) => Test::NotIn(key, r.values.clone()),
                ("Exists", true) => Test::Exists(key),
                ("DoesNotExist", true) => Test::DoesNotExist(key),
                ("In" | "NotIn", true) => {
                    return Err(format!(
                        "matchExpressions key {:?}: operator {} needs values",
                        r.key, r.operator
                    ))
                }
                ("Exists" | "DoesNotExist", false) => {
                    return Err(format!(
                        "matchExpressions key {:?}: operator {} takes no values",
                        r.key, r.operator
                    ))
                }
                (op, _) => {
                    return Err(format!(
                        "matchExpressions key {:?}: unknown operator {op:?}",
                        r.key
                    ))
                }
            };
            tests.push(test);
        }
        Ok(Selector { tests })
    }

    pub fn selects_everything(&self) -> bool {
        self.tests.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.tests.iter().all(|t| match t {
            Test::Equals(k, v) => labels.get(k) == Some(v),
            Test::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Test::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Test::Exists(k) => labels.contains_key(k),
            Test::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Requirement;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> Requirement {
        Requirement {
            key: key.into(),
            operator: op.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    fn selector(match_labels: &[(&str, &str)], exprs: Vec<Requirement>) -> Selector {
        Selector::parse(&LabelSelector {
            match_labels: labels(match_labels),
            match_expressions: exprs,
        })
        .unwrap()
    }

    #[test]
    fn an_empty_selector_selects_everything() {
        let s = selector(&[], vec![]);
        assert!(s.selects_everything());
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("pod", "a")])));
    }

    #[test]
    fn labels_and_expressions_all_hold() {
        let s = selector(&[("pod", "a")], vec![expr("tier", "In", &["web", "db"])]);
        assert!(s.matches(&labels(&[("pod", "a"), ("tier", "db")])));
        assert!(!s.matches(&labels(&[("pod", "a")])));
        assert!(!s.matches(&labels(&[("pod", "b"), ("tier", "db")])));
    }

    #[test]
    fn not_in_holds_for_a_missing_key_does_not_exist_only_then() {
        let not_in = selector(&[], vec![expr("ns", "NotIn", &["x"])]);
        assert!(not_in.matches(&labels(&[])));
        assert!(not_in.matches(&labels(&[("ns", "y")])));
        assert!(!not_in.matches(&labels(&[("ns", "x")])));
        let exists = selector(&[], vec![expr("ns", "Exists", &[])]);
        assert!(exists.matches(&labels(&[("ns", "")])));
        assert!(!exists.matches(&labels(&[])));
        let absent = selector(&[], vec![expr("ns", "DoesNotExist", &[])]);
        assert!(absent.matches(&labels(&[])));
        assert!(!absent.matches(&labels(&[("ns", "x")])));
    }

    #[test]
    fn what_the_api_server_refuses_is_said() {
        let bad = |e: Requirement| {
            Selector::parse(&LabelSelector {
                match_labels: Labels::new(),
                match_expressions: vec![e],
            })
            .unwrap_err()
        };
        assert_eq!(
            bad(expr("a", "In", &[])),
            "matchExpressions key \"a\": operator In needs values"
        );
        assert_eq!(
            bad(expr("a", "Exists", &["x"])),
            "matchExpressions key \"a\": operator Exists takes no values"
        );
        assert_eq!(
            bad(expr("a", "Gt", &["1"])),
            "matchExpressions key \"a\": unknown operator \"Gt\""
        );
    }
}
