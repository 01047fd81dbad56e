//! Label and field selectors, as the API server parses them from `labelSelector`/`fieldSelector`.

use std::collections::BTreeMap;

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),h notin (i),j,!k,n>3`). Empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct LabelSelector {
    reqs: Vec<Requirement>,
}

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c);
            }
            ')' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(rest: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set of values, found {rest:?}"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

fn valid_key(k: &str) -> bool {
    !k.is_empty() && !k.contains(char::is_whitespace) && !k.contains(['=', '!', '(', ')', '<', '>'])
}

impl LabelSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let req = parse_requirement(&part)?;
            if !valid_key(&req.key) {
                return Err(format!(
                    "unable to parse requirement: invalid label key {:?}",
                    req.key
                ));
            }
            let values: Vec<&String> = match &req.op {
                Op::Eq(v) | Op::NotEq(v) => vec![v],
                Op::In(vs) | Op::NotIn(vs) => vs.iter().collect(),
                _ => Vec::new(),
            };
            if let Some(bad) = values.into_iter().find(|v| !valid_value(v)) {
                return Err(format!(
                    "unable to parse requirement: invalid label value: {bad:?}"
                ));
            }
            reqs.push(req);
        }
        Ok(Self { reqs })
    }

    /// The first `key=value` requirement, for index lookups.
    pub(crate) fn first_eq(&self) -> Option<(&str, &str)> {
        self.reqs.iter().find_map(|r| match &r.op {
            Op::Eq(v) => Some((r.key.as_str(), v.as_str())),
            _ => None,
        })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| {
            let v = labels.get(&r.key);
            match &r.op {
                Op::Eq(x) => v == Some(x),
                Op::NotEq(x) => v != Some(x),
                Op::In(xs) => v.is_some_and(|v| xs.contains(v)),
                Op::NotIn(xs) => v.is_none_or(|v| !xs.contains(v)),
                Op::Exists => v.is_some(),
                Op::DoesNotExist => v.is_none(),
                Op::Gt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v > *n),
                Op::Lt(n) => v
                    .and_then(|v| v.parse::<i64>().ok())
                    .is_some_and(|v| v < *n),
            }
        })
    }

    pub(crate) fn matches_object(&self, obj: &Value) -> bool {
        self.is_empty() || self.matches(&labels_of(obj))
    }

    /// The selector of a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions`).
    /// `None` for a missing selector; an empty object selects everything.
    pub(crate) fn from_object(sel: &Value) -> Option<Self> {
        let sel = sel.as_object()?;
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(Requirement {
                    key: k.clone(),
                    op: Op::Eq(v.as_str().unwrap_or_default().to_string()),
                });
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e
                    .get("key")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let op = match e
                    .get("operator")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                {
                    "In" => Op::In(values),
                    "NotIn" => Op::NotIn(values),
                    "Exists" => Op::Exists,
                    "DoesNotExist" => Op::DoesNotExist,
                    _ => continue,
                };
                reqs.push(Requirement { key, op });
            }
        }
        Some(Self { reqs })
    }
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    let part = part.trim();
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement {
            key: key.trim().to_string(),
            op: Op::DoesNotExist,
        });
    }
    // Set-based forms: `key in (...)`, `key notin (...)`.
    let mut words = part.splitn(2, char::is_whitespace);
    let first = words.next().unwrap_or_default();
    let rest = words.next().unwrap_or_default().trim_start();
    if let Some(set) = rest.strip_prefix("notin") {
        if set.trim_start().starts_with('(') {
            return Ok(Requirement {
                key: first.to_string(),
                op: Op::NotIn(parse_set(set)?),
            });
        }
    }
    if let Some(set) = rest.strip_prefix("in") {
        if set.trim_start().starts_with('(') {
            return Ok(Requirement {
                key: first.to_string(),
                op: Op::In(parse_set(set)?),
            });
        }
    }
    for (tok, mk) in [
        ("!=", Op::NotEq as fn(String) -> Op),
        ("==", Op::Eq as fn(String) -> Op),
        ("=", Op::Eq as fn(String) -> Op),
    ] {
        if let Some((k, v)) = part.split_once(tok) {
            return Ok(Requirement {
                key: k.trim().to_string(),
                op: mk(v.trim().to_string()),
            });
        }
    }
    for (tok, gt) in [(">", true), ("<", false)] {
        if let Some((k, v)) = part.split_once(tok) {
            let n: i64 = v
                .trim()
                .parse()
                .map_err(|_| format!("unable to parse requirement: {part:?}: not an integer"))?;
            return Ok(Requirement {
                key: k.trim().to_string(),
                op: if gt { Op::Gt(n) } else { Op::Lt(n) },
            });
        }
    }
    Ok(Requirement {
        key: part.to_string(),
        op: Op::Exists,
    })
}

/// A parsed field selector (`metadata.name=x,status.phase!=Running`). Any dotted JSON path is
/// accepted; a missing field compares as the empty string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

impl FieldSelector {
    pub(crate) fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid selector: '{part}'; can't understand '{part}'"
                ));
            };
            reqs.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(Self { reqs })
    }

    pub(crate) fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(path, eq, want)| {
            let mut cur = obj;
            let mut found = true;
            for seg in path.split('.') {
                match cur.get(seg) {
                    Some(v) => cur = v,
                    None => {
                        found = false;
                        break;
                    }
                }
            }
            let have = if !found {
                String::new()
            } else {
                match cur {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                }
            };
            (have == *want) == *eq
        })
    }
}

/// `metadata.labels` as a map (non-string values are ignored).
pub(crate) fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn kube_rs_forms() {
        let s = LabelSelector::parse(
            "app=web,tier!=db,env in (prod, staging),zone notin (a),iris.managed,!gone",
        )
        .unwrap();
        assert!(s.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("iris.managed", "true")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("env", "dev"),
            ("iris.managed", "true")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("iris.managed", "true"),
            ("gone", "x")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("env", "prod"),
            ("iris.managed", "true"),
            ("zone", "a")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("tier", "db"),
            ("env", "prod"),
            ("iris.managed", "true")
        ])));
        assert!(LabelSelector::parse("a==b")
            .unwrap()
            .matches(&labels(&[("a", "b")])));
        assert!(LabelSelector::parse("").unwrap().is_empty());
        assert!(LabelSelector::parse("n>3")
            .unwrap()
            .matches(&labels(&[("n", "4")])));
        assert!(LabelSelector::parse("a=(b").is_err());
    }

    #[test]
    fn object_selectors() {
        let s = LabelSelector::from_object(&json!({
            "matchLabels": {"iris.task_hash": "abc"},
            "matchExpressions": [{"key": "x", "operator": "In", "values": ["1", "2"]}]
        }))
        .unwrap();
        assert!(s.matches(&labels(&[("iris.task_hash", "abc"), ("x", "2")])));
        assert!(!s.matches(&labels(&[("iris.task_hash", "abc")])));
        assert!(LabelSelector::from_object(&Value::Null).is_none());
    }

    #[test]
    fn field_selectors() {
        let pod =
            json!({"metadata": {"name": "p", "namespace": "n"}, "status": {"phase": "Running"}});
        assert!(FieldSelector::parse("metadata.name=p")
            .unwrap()
            .matches(&pod));
        assert!(
            FieldSelector::parse("metadata.name=p,status.phase!=Pending")
                .unwrap()
                .matches(&pod)
        );
        assert!(!FieldSelector::parse("metadata.name==q")
            .unwrap()
            .matches(&pod));
        assert!(FieldSelector::parse("spec.nodeName=")
            .unwrap()
            .matches(&pod));
        assert!(FieldSelector::parse("bogus").is_err());
    }
}
