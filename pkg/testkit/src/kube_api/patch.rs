//! The three patch types the API server takes for an object: JSON merge patch (RFC 7386),
//! strategic merge patch (lists merged by the key the schema gives them) and JSON patch
//! (RFC 6902). Pure: a document and a patch in, the patched document or the reason out.

use serde_json::{Map, Value};

/// How a list field of an object is merged by a strategic merge patch; lists not named here are
/// replaced whole, as the schema says for them.
fn list_strategy(path: &str) -> ListStrategy {
    match path {
        "status.conditions" | "status.addresses" => ListStrategy::ByKey("type"),
        "status.podIPs" => ListStrategy::ByKey("ip"),
        "spec.containers" | "status.containerStatuses" => ListStrategy::ByKey("name"),
        "status.volumesAttached" => ListStrategy::ByKey("name"),
        "metadata.ownerReferences" => ListStrategy::ByKey("uid"),
        "metadata.finalizers" | "spec.podCIDRs" => ListStrategy::Union,
        _ => ListStrategy::Replace,
    }
}

enum ListStrategy {
    ByKey(&'static str),
    Union,
    Replace,
}

/// RFC 7386: objects merge, `null` deletes, anything else replaces.
pub fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else { return };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Kubernetes' strategic merge patch: as `merge`, except that the lists the schema
/// marks are merged by their key (conditions by `type`) or as sets, and `$patch` directives.
pub fn strategic(target: &mut Value, patch: &Value) -> Result<(), String> {
    strategic_at(target, patch, "")
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn strategic_at(target: &mut Value, patch: &Value, path: &str) -> Result<(), String> {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return Ok(());
    };
    match p.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            let mut replaced = p.clone();
            replaced.remove("$patch");
            *target = Value::Object(replaced);
            return Ok(());
        }
        Some("delete") => {
            *target = Value::Object(Map::new());
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other} in map")),
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Value::Object(t) = target else {
        return Ok(());
    };
    for (k, v) in p {
        if k == "$patch" || k.starts_with("$setElementOrder/") {
            // The order directive only reorders a merged list; the merge itself is the same.
            continue;
        }
        if k.starts_with('$') {
            return Err(format!("unsupported strategic merge patch directive {k:?}"));
        }
        let here = join(path, k);
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match (v, list_strategy(&here)) {
            (Value::Array(items), ListStrategy::ByKey(key)) => {
                let slot = t.entry(k.clone()).or_insert(Value::Array(vec![]));
                merge_list_by_key(slot, items, key, &here)?;
            }
            (Value::Array(items), ListStrategy::Union) => {
                let slot = t.entry(k.clone()).or_insert(Value::Array(vec![]));
                if !slot.is_array() {
                    *slot = Value::Array(vec![]);
                }
                if let Value::Array(have) = slot {
                    for item in items {
                        if !have.contains(item) {
                            have.push(item.clone());
                        }
                    }
                }
            }
            (Value::Object(_), _) => {
                strategic_at(t.entry(k.clone()).or_insert(Value::Null), v, &here)?;
            }
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

fn merge_list_by_key(
    slot: &mut Value,
    items: &[Value],
    key: &str,
    path: &str,
) -> Result<(), String> {
    if !slot.is_array() {
        *slot = Value::Array(vec![]);
    }
    let Value::Array(have) = slot else {
        return Ok(());
    };
    for item in items {
        let Some(id) = item.get(key) else {
            return Err(format!(
                "map: {item} does not contain declared merge key: {key} (in {path})"
            ));
        };
        let pos = have.iter().position(|h| h.get(key) == Some(id));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                have.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_at(&mut have[i], item, path)?,
            (None, false) => {
                let mut fresh = Value::Null;
                strategic_at(&mut fresh, item, path)?;
                have.push(fresh);
            }
        }
    }
    Ok(())
}

/// RFC 6902: a list of operations applied in order; any failure leaves `target` untouched.
pub fn json_patch(target: &mut Value, ops: &Value) -> Result<(), String> {
    let Value::Array(ops) = ops else {
        return Err("a JSON patch must be a list of operations".into());
    };
    let mut doc = target.clone();
    for op in ops {
        let name = op.get("op").and_then(Value::as_str).unwrap_or_default();
        let path = op
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("operation {op} has no path"))?;
        let value = || {
            op.get("value")
                .cloned()
                .ok_or_else(|| format!("operation {op} has no value"))
        };
        let from = || {
            op.get("from")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("operation {op} has no from"))
        };
        match name {
            "add" => add(&mut doc, path, value()?)?,
            "remove" => {
                remove(&mut doc, path)?;
            }
            "replace" => {
                remove(&mut doc, path)?;
                add(&mut doc, path, value()?)?;
            }
            "move" => {
                let v = remove(&mut doc, from()?)?;
                add(&mut doc, path, v)?;
            }
            "copy" => {
                let v = doc
                    .pointer(from()?)
                    .cloned()
                    .ok_or_else(|| format!("copy from a missing path in {op}"))?;
                add(&mut doc, path, v)?;
            }
            "test" => {
                if doc.pointer(path) != Some(&value()?) {
                    return Err(format!("testing value {path} failed"));
                }
            }
            other => return Err(format!("Unexpected kind: {other}")),
        }
    }
    *target = doc;
    Ok(())
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

fn split_parent(path: &str) -> Result<(&str, String), String> {
    let i = path
        .rfind('/')
        .ok_or_else(|| format!("invalid JSON pointer {path:?}"))?;
    Ok((&path[..i], unescape(&path[i + 1..])))
}

fn add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    if path.is_empty() {
        *doc = value;
        return Ok(());
    }
    let (parent, last) = split_parent(path)?;
    match doc.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(last, value);
            Ok(())
        }
        Some(Value::Array(a)) => {
            let i = if last == "-" {
                a.len()
            } else {
                last.parse::<usize>()
                    .ok()
                    .filter(|i| *i <= a.len())
                    .ok_or_else(|| format!("add operation index {last} out of bounds"))?
            };
            a.insert(i, value);
            Ok(())
        }
        _ => Err(format!(
            "add operation does not apply: doc is missing path: {path:?}"
        )),
    }
}

fn remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let (parent, last) = split_parent(path)?;
    let missing = || format!("remove operation does not apply: doc is missing path: {path:?}");
    match doc.pointer_mut(parent) {
        Some(Value::Object(m)) => m.remove(&last).ok_or_else(missing),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => Ok(a.remove(i)),
            _ => Err(missing()),
        },
        _ => Err(missing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_merges_objects_and_deletes_nulls() {
        let mut doc = json!({"metadata": {"annotations": {"a": "1", "b": "2"}}, "spec": {"x": 1}});
        merge(
            &mut doc,
            &json!({"metadata": {"annotations": {"a": null, "c": "3"}}, "spec": {"x": [1]}}),
        );
        assert_eq!(
            doc,
            json!({"metadata": {"annotations": {"b": "2", "c": "3"}}, "spec": {"x": [1]}})
        );
    }

    #[test]
    fn strategic_merge_keeps_other_conditions_and_merges_by_type() {
        let mut doc = json!({"status": {"conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated"}
        ]}});
        strategic(
            &mut doc,
            &json!({"status": {"conditions": [
                {"type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp"}
            ]}}),
        )
        .unwrap();
        assert_eq!(
            doc["status"]["conditions"],
            json!([
                {"type": "Ready", "status": "True"},
                {"type": "NetworkUnavailable", "status": "False", "reason": "FlannelIsUp"}
            ])
        );
        // A list without a strategy is replaced; a merge-key item can be deleted.
        strategic(
            &mut doc,
            &json!({"spec": {"taints": [{"key": "a"}]}, "status": {"conditions": [
                {"type": "Ready", "$patch": "delete"}]}}),
        )
        .unwrap();
        assert_eq!(doc["spec"]["taints"], json!([{"key": "a"}]));
        assert_eq!(doc["status"]["conditions"].as_array().unwrap().len(), 1);
        assert!(strategic(&mut doc, &json!({"status": {"conditions": [{"x": 1}]}})).is_err());
        assert!(strategic(&mut doc, &json!({"$retainKeys": []})).is_err());
    }

    #[test]
    fn strategic_merge_unites_pod_cidrs() {
        let mut doc = json!({"spec": {"podCIDRs": ["10.0.1.0/24"]}});
        strategic(&mut doc, &json!({"spec": {"podCIDRs": ["fd00::/64"]}})).unwrap();
        assert_eq!(doc["spec"]["podCIDRs"], json!(["10.0.1.0/24", "fd00::/64"]));
    }

    #[test]
    fn json_patch_applies_all_or_nothing() {
        let mut doc = json!({"metadata": {"annotations": {"a/b": "1"}}, "l": [1, 2]});
        json_patch(
            &mut doc,
            &json!([
                {"op": "replace", "path": "/metadata/annotations/a~1b", "value": "2"},
                {"op": "add", "path": "/l/-", "value": 3},
                {"op": "remove", "path": "/l/0"}
            ]),
        )
        .unwrap();
        assert_eq!(
            doc,
            json!({"metadata": {"annotations": {"a/b": "2"}}, "l": [2, 3]})
        );
        let before = doc.clone();
        let bad = json!([
            {"op": "add", "path": "/x", "value": 1},
            {"op": "remove", "path": "/nope"}
        ]);
        assert!(json_patch(&mut doc, &bad).is_err());
        assert_eq!(doc, before);
    }
}
