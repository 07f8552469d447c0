//! One plugin invocation: the environment, the config on stdin and its version.

use crate::env::Env;
use crate::error::{CniError, DECODING_FAILURE};
use crate::gokeys::{self, GoKeys};
use crate::result::CniResult;
use crate::version::Version;
use serde::de::DeserializeOwned;
use serde_json::Value;

#[derive(Debug, Clone)]
pub struct Request {
    pub env: Env,
    /// The config exactly as the runtime sent it.
    pub stdin: Vec<u8>,
    /// The same, decoded: always a JSON object.
    pub config: Value,
    pub version: Version,
    /// The network name (`name`), validated.
    pub name: String,
}

/// One entry of GC's list of attachments to keep.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attachment {
    pub container_id: String,
    pub ifname: String,
}

/// Decodes a typed config from JSON, matching keys to fields as the Go plugins do (exact name
/// first, then any case: see [`crate::gokeys`]); a wrong type is code 6 naming the field and
/// the value.
pub fn decode<T: DeserializeOwned>(value: &Value) -> Result<T, CniError> {
    serde_path_to_error::deserialize(GoKeys(value)).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            CniError::new(
                DECODING_FAILURE,
                format!("decoding network config: {inner}"),
            )
        } else {
            CniError::new(
                DECODING_FAILURE,
                format!("decoding network config: field {path:?}: {inner}"),
            )
        }
    })
}

/// DEL's reading of a config: the top-level fields that decode, each on its own; the others
/// are left at their defaults and returned with their error, by key. A cleanup verb uses it so
/// that a config it cannot fully use (broken after ADD, or written by a runtime in a shape we
/// do not read) does not stop it from removing what it can find.
pub fn decode_lenient<T: DeserializeOwned + Default>(
    value: &Value,
) -> (T, Vec<(String, CniError)>) {
    let whole = match decode(value) {
        Ok(t) => return (t, Vec::new()),
        Err(e) => e,
    };
    let Some(fields) = value.as_object() else {
        return (T::default(), vec![(String::new(), whole)]);
    };
    let mut kept = serde_json::Map::new();
    let mut dropped = Vec::new();
    for (key, field) in fields {
        let alone = Value::Object([(key.clone(), field.clone())].into_iter().collect());
        match decode::<T>(&alone) {
            Ok(_) => {
                kept.insert(key.clone(), field.clone());
            }
            Err(e) => dropped.push((key.clone(), e)),
        }
    }
    (decode(&Value::Object(kept)).unwrap_or_default(), dropped)
}

impl Request {
    /// The plugin's typed view of the config.
    pub fn parse_config<T: DeserializeOwned>(&self) -> Result<T, CniError> {
        decode(&self.config)
    }

    /// `prevResult`, converted from whatever version it was written in.
    pub fn prev_result(&self) -> Result<Option<CniResult>, CniError> {
        match self.field("prevResult") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => CniResult::parse(v, self.version)
                .map(Some)
                .map_err(|e| e.context("decoding prevResult")),
        }
    }

    /// `runtimeConfig`, or null.
    pub fn runtime_config(&self) -> &Value {
        self.field("runtimeConfig").unwrap_or(&Value::Null)
    }

    /// A top-level field of the config, its key matched as the Go plugins match it.
    pub fn field(&self, name: &str) -> Option<&Value> {
        self.config.as_object().and_then(|o| gokeys::get(o, name))
    }

    /// GC's `cni.dev/valid-attachments` (or the older `cni.dev/attachments`). The list must be
    /// there: GC releases everything not in it, so a config without it (a GC run by hand, a
    /// runtime bug) is refused rather than read as "keep nothing"; `[]` says that explicitly.
    pub fn valid_attachments(&self) -> Result<Vec<Attachment>, CniError> {
        let list = self
            .field("cni.dev/valid-attachments")
            .or_else(|| self.field("cni.dev/attachments"));
        let Some(list) = list.filter(|v| !v.is_null()) else {
            return Err(CniError::invalid_config(
                "GC needs \"cni.dev/valid-attachments\", the attachments to keep; pass [] to release every one",
            ));
        };
        let items = list.as_array().ok_or_else(|| {
            CniError::decode(format!(
                "cni.dev/valid-attachments: expected a list, got {list}"
            ))
        })?;
        items
            .iter()
            .map(|item| {
                let field = |k: &str| {
                    item.as_object()
                        .and_then(|o| gokeys::get(o, k))
                        .and_then(Value::as_str)
                        .map(str::to_string)
                };
                match (field("containerID"), field("ifname")) {
                    (Some(container_id), Some(ifname)) => Ok(Attachment { container_id, ifname }),
                    _ => Err(CniError::decode(format!(
                        "cni.dev/valid-attachments: entry {item} needs string fields containerID and ifname"
                    ))),
                }
            })
            .collect()
    }
}
