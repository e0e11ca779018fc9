//! Label and field selectors, as LIST and WATCH take them in their query.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum Req {
    Eq(String, String),
    NotEq(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LabelSelector(Vec<Req>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (vec![], String::new(), 0);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn set(s: &str) -> Result<BTreeSet<String>, ApiError> {
    let inner = s.trim().strip_prefix('(').and_then(|r| r.strip_suffix(')'));
    let inner = inner.ok_or_else(|| {
        ApiError::bad_request(format!("unable to parse requirement: found '{s}', expected: '('"))
    })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    /// Parses the query form (`a=b,c in (x,y),!d`).
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for part in split_top(s) {
            let req = if let Some(k) = part.strip_prefix('!') {
                Req::NotExists(k.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                Req::NotIn(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                Req::In(k.trim().into(), set(v)?)
            } else if let Some((k, v)) = part.split_once("!=") {
                Req::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Req::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Req::Eq(k.trim().into(), v.trim().into())
            } else {
                Req::Exists(part.trim().into())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Builds one from a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_object(sel: &Value) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(Req::Eq(k.clone(), v.as_str().unwrap_or_default().into()));
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: BTreeSet<String> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(String::from))
                .collect();
            reqs.push(match e.get("operator").and_then(Value::as_str) {
                Some("In") => Req::In(key, values),
                Some("NotIn") => Req::NotIn(key, values),
                Some("Exists") => Req::Exists(key),
                Some("DoesNotExist") => Req::NotExists(key),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "invalid selector operator {other:?}"
                    )));
                }
            });
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the labels (a JSON object or null) match.
    pub fn matches(&self, labels: Option<&Value>) -> bool {
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Req::Eq(k, v) => get(k) == Some(v.as_str()),
            Req::NotEq(k, v) => get(k) != Some(v.as_str()),
            Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(x)),
            Req::NotIn(k, vs) => !get(k).is_some_and(|x| vs.contains(x)),
            Req::Exists(k) => get(k).is_some(),
            Req::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed `fieldSelector`: `metadata.name=x,status.phase!=Running`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses the query form.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = vec![];
        for part in split_top(s) {
            let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid field selector: '{part}'")));
            };
            reqs.push((k.trim().to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object matches; any dotted path is looked up, absent fields compare as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut cur = Some(obj);
            for seg in path.split('.') {
                cur = cur.and_then(|c| c.get(seg));
            }
            let got = match cur {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (got == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn set_based_label_selectors_match_like_the_api_server() {
        let labels = json!({"app": "web", "tier": "front"});
        assert!(
            LabelSelector::parse("app=web,tier in (front, back)")
                .unwrap()
                .matches(Some(&labels))
        );
        assert!(!LabelSelector::parse("app!=web").unwrap().matches(Some(&labels)));
        assert!(
            LabelSelector::parse("!missing,app")
                .unwrap()
                .matches(Some(&labels))
        );
        assert!(
            !LabelSelector::parse("tier notin (front)")
                .unwrap()
                .matches(Some(&labels))
        );
        assert!(LabelSelector::parse("").unwrap().matches(None));
    }

    #[test]
    fn field_selectors_read_dotted_paths() {
        let obj = json!({"metadata": {"name": "a", "namespace": "n"}, "status": {"phase": "Running"}});
        assert!(
            FieldSelector::parse("metadata.name=a,metadata.namespace==n")
                .unwrap()
                .matches(&obj)
        );
        assert!(
            !FieldSelector::parse("status.phase!=Running")
                .unwrap()
                .matches(&obj)
        );
    }
}
